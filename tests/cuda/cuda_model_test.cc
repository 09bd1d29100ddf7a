// The full Llama forward on the GPU against the CPU reference: the committed tiny models
// (GQA, Qwen2 biases, tied bf16 embeddings, Mistral, f16), stories260K (head_dim 8), and random
// Llama-3-style models with head_dim 64 and 128 (llama3 RoPE scaling) made in the test. The CPU
// runs the bf16-rounded weights the GPU stores, so the difference is the GPU's arithmetic:
// bf16-rounded GEMM inputs, bf16 K/V, bf16 P in attention. Checked: logits of a flat batch
// (prefill chunks resuming mid-block, trees of 7..70 nodes beside a fresh prefill), greedy
// decoding (equal tokens except documented near-ties), and on the GPU alone greedy output with
// speculation (n-gram, Medusa) equal to plain greedy decoding.
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <random>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/runner/generator.h"
#include "engine/spec/proposer_factory.h"
#include "tests/common/direct_batch.h"
#include "tests/common/golden.h"
#include "tests/cuda/cuda_model_util.h"
#include "tests/cuda/cuda_test_util.h"

namespace arbor {
namespace {

using testing::DirectBatch;
using testing::expect_equal_tokens;
using testing::motif_prompts;
using testing::random_model;

const ModelWeights& weights_of(const std::string& name) {
  static std::map<std::string, ModelWeights> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  ModelWeights w;
  if (name == "stories260K")
    w = load_model_weights(testing::stories260k_path());
  else if (name == "SmolLM2")
    w = load_model_weights(testing::smollm2_path());
  else if (name == "random_d64")
    w = random_model(64, 8, 2, 64);
  else if (name == "random_d128")
    w = random_model(128, 8, 2, 128);
  else
    w = load_model_weights(testing::test_data_dir() + "/models/" + name);
  return cache.emplace(name, std::move(w)).first->second;
}

// The weights as the GPU stores them: matrices rounded to bf16, vectors kept.
ModelWeights bf16_rounded(const ModelWeights& w) {
  ModelWeights r = w;
  auto round = [](HostTensor& t) {
    if (t.shape.size() >= 2)
      for (auto& x : t.data) x = testing::round_bf16(x);
  };
  round(r.embed);
  round(r.lm_head);
  for (auto& l : r.layers)
    for (HostTensor* t : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) round(*t);
  return r;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int64_t vocab) {
  std::uniform_int_distribution<int32_t> d(3, static_cast<int32_t>(vocab) - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

class CudaModel : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ARBOR_REQUIRE_GPU();
    if (GetParam() == "stories260K" && !std::filesystem::exists(testing::stories260k_path()))
      GTEST_SKIP() << "stories260K not found at " << testing::stories260k_path();
    if (GetParam() == "SmolLM2" && !std::filesystem::exists(testing::smollm2_path()))
      GTEST_SKIP() << "SmolLM2 GGUF not found at " << testing::smollm2_path()
                   << " (stage it and set ARBOR_SMOLLM2_GGUF)";
    const ModelWeights& w = weights_of(GetParam());
    cpu_backend_ = make_cpu_backend(1);
    cpu_model_ = std::make_unique<LlamaModel>(*cpu_backend_, bf16_rounded(w));
    gpu_backend_ = make_cuda_backend();
    gpu_model_ = std::make_unique<LlamaModel>(*gpu_backend_, w);
    cpu_backend_->allocate_kv(cpu_model_->kv_shape(kBlocks, kBlock));
    gpu_backend_->allocate_kv(gpu_model_->kv_shape(kBlocks, kBlock));
    vocab_ = w.config.vocab_size;
  }
  static constexpr int64_t kBlock = 16, kBlocks = 256;
  std::unique_ptr<Backend> cpu_backend_, gpu_backend_;
  std::unique_ptr<LlamaModel> cpu_model_, gpu_model_;
  int64_t vocab_ = 0;
};

double row_error(const std::vector<float>& got, const std::vector<float>& ref, size_t row,
                 int64_t vocab) {
  std::vector<float> a(got.begin() + row * vocab, got.begin() + (row + 1) * vocab);
  std::vector<float> b(ref.begin() + row * vocab, ref.begin() + (row + 1) * vocab);
  return testing::max_rel_error(a, b);
}

// bf16 tolerance on the logits: max |gpu - cpu| / max |cpu| per row.
constexpr double kLogitTol = 5e-2;

TEST_P(CudaModel, FlatBatchLogitsMatchCpu) {
  std::mt19937 rng(1);
  const std::vector<std::pair<int, int>> shapes = {{13, 7}, {16, 1}, {30, 40}, {5, 70}, {47, 12}};
  DirectBatch b(kBlocks, kBlock, 11);
  std::vector<int> seqs;
  std::vector<DirectBatch::Chunk> prefill1, prefill2;
  for (auto [len, t] : shapes) {
    seqs.push_back(b.add_sequence());
    const auto toks = random_tokens(rng, len, vocab_);
    const size_t split = std::max<size_t>(1, toks.size() * 2 / 3);  // resume mid-block
    prefill1.push_back({seqs.back(), {toks.begin(), toks.begin() + split}, true});
    if (split < toks.size())
      prefill2.push_back({seqs.back(), {toks.begin() + split, toks.end()}, true});
  }
  std::vector<StepInputs> steps = {b.step(prefill1), b.step(prefill2)};
  std::vector<DirectBatch::Chunk> tree_step;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int t = shapes[i].second;
    std::vector<int32_t> par(t, -1);
    for (int n = 1; n < t; ++n) par[n] = std::uniform_int_distribution<int>(0, n - 1)(rng);
    tree_step.push_back({seqs[i], random_tokens(rng, t, vocab_), true, par});
  }
  tree_step.push_back({b.add_sequence(), random_tokens(rng, 9, vocab_), true});
  steps.push_back(b.step(tree_step));

  double worst = 0;
  for (size_t k = 0; k < steps.size(); ++k) {
    ForwardOutput c, g;
    cpu_model_->forward(steps[k], &c);
    gpu_model_->forward(steps[k], &g);
    ASSERT_EQ(c.logits.size(), g.logits.size());
    EXPECT_EQ(testing::count_non_finite(g.logits), 0u);
    for (size_t row = 0; row < steps[k].logits_rows.size(); ++row) {
      const double e = row_error(g.logits, c.logits, row, vocab_);
      worst = std::max(worst, e);
      EXPECT_LE(e, kLogitTol) << GetParam() << " step " << k << " row " << row;
    }
  }
  std::printf(
      "  %-16s flat batch (prefill, resumed prefill, trees + prefill): worst logits "
      "row rel err %.3g\n",
      GetParam().c_str(), worst);
}

// Greedy decoding of three sequences in one batch on both backends, the CPU's token fed to
// both. A step where the argmaxes differ must be a near-tie: the CPU's top-2 gap under
// kLogitTol of the row's scale.
TEST_P(CudaModel, GreedyTokensMatchCpu) {
  std::mt19937 rng(2);
  DirectBatch b(kBlocks, kBlock, 3);
  std::vector<int> seqs;
  std::vector<DirectBatch::Chunk> prefill;
  for (int len : {9, 16, 21}) {
    seqs.push_back(b.add_sequence());
    prefill.push_back({seqs.back(), random_tokens(rng, len, vocab_), false});
  }
  StepInputs step = b.step(prefill);
  int mismatches = 0, near_ties = 0, tokens = 0;
  for (int it = 0; it < 32; ++it) {
    ForwardOutput c, g;
    cpu_model_->forward(step, &c);
    gpu_model_->forward(step, &g);
    std::vector<DirectBatch::Chunk> next;
    for (size_t i = 0; i < seqs.size(); ++i) {
      const float* cr = c.logits.data() + i * vocab_;
      const float* gr = g.logits.data() + i * vocab_;
      const int32_t ct = arbor::testing::argmax(cr, vocab_);
      const int32_t gt = arbor::testing::argmax(gr, vocab_);
      ++tokens;
      if (ct != gt) {
        float scale = 0;
        for (int64_t v = 0; v < vocab_; ++v) scale = std::max(scale, std::fabs(cr[v]));
        const float gap = cr[ct] - cr[gt];
        if (gap <= kLogitTol * scale) {
          ++near_ties;
        } else {
          ++mismatches;
          ADD_FAILURE() << GetParam() << " step " << it << " seq " << i << ": cpu " << ct << " gpu "
                        << gt << " gap " << gap << " scale " << scale;
        }
      }
      next.push_back({seqs[i], {ct}, false});
    }
    step = b.step(next);
  }
  std::printf("  %-16s greedy: %d tokens, %d near-tie flips, %d mismatches\n", GetParam().c_str(),
              tokens, near_ties, mismatches);
}

// ForwardRequest::argmax_only on the GPU: the device argmax ids of a flat batch of prefill
// chunks equal the host argmax() of the same step's downloaded logits, bit for bit.
TEST_P(CudaModel, ArgmaxOnlyEqualsHostArgmaxOfLogits) {
  std::mt19937 rng(3);
  DirectBatch b(kBlocks, kBlock, 3);
  const int s0 = b.add_sequence(), s1 = b.add_sequence();
  StepInputs step = b.step(
      {{s0, random_tokens(rng, 19, vocab_), true}, {s1, random_tokens(rng, 5, vocab_), false}});
  ForwardOutput full, ids;
  gpu_model_->forward(step, &full);
  ForwardRequest want;
  want.argmax_only = true;
  gpu_model_->forward(step, &ids, want);  // rewrites the same K/V: same logits
  EXPECT_TRUE(ids.logits.empty());
  ASSERT_EQ(ids.argmax.size(), step.logits_rows.size());
  for (size_t r = 0; r < ids.argmax.size(); ++r)
    EXPECT_EQ(ids.argmax[r], arbor::testing::argmax(full.logits.data() + r * vocab_, vocab_))
        << GetParam() << " row " << r;
}

// On the GPU alone: speculation (verify trees + compaction through copy_kv) gives the tokens of
// plain greedy decoding.
TEST_P(CudaModel, SpeculativeGreedyEqualsPlainOnGpu) {
  const ModelWeights& w = weights_of(GetParam());
  const std::vector<GenerationRequest> reqs =
      motif_prompts(777, {15, 16, 17, 31, 5}, 5, vocab_, 40);
  GeneratorConfig gc;
  gc.num_blocks = kBlocks;
  gc.block_size = kBlock;
  gc.max_step_tokens = 96;
  Generator plain(*gpu_model_, gc);
  const auto expect = plain.run(reqs);
  {
    // Logprobs make every step download full logits and argmax on the host: the same tokens
    // as the argmax-only steps above (device argmax ids).
    std::vector<GenerationRequest> with_logprobs = reqs;
    for (auto& r : with_logprobs) r.logprobs = 0;
    auto host_backend = make_cuda_backend();
    LlamaModel host_model(*host_backend, w);
    Generator host(host_model, gc);
    const auto got = host.run(with_logprobs);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got[i].tokens, expect[i].tokens) << GetParam() << " host argmax, request " << i;
  }

  std::vector<std::pair<std::string, std::string>> methods = {{"ngram", ""}};
  const std::string medusa = testing::test_data_dir() + "/spec/random/medusa_" + GetParam();
  if (std::filesystem::exists(medusa)) methods.push_back({"medusa", medusa});
  if (GetParam() == "SmolLM2") {  // the trained heads (docs/heads.md)
    methods.push_back({"medusa", testing::test_data_dir() + "/heads/smollm2/medusa"});
    methods.push_back({"eagle", testing::test_data_dir() + "/heads/smollm2/eagle"});
  }
  for (const auto& [method, heads] : methods) {
    // Medusa heads and the EAGLE draft on the host / a private CPU backend, then on a CUDA
    // backend (what serving on the GPU uses).
    for (bool draft_on_gpu : {false, true}) {
      if (draft_on_gpu && method == "ngram") continue;
      SpecConfig sc;
      sc.method = parse_spec_method(method);
      sc.head_path = heads;
      if (method == "medusa")
        sc.tree = GetParam() == "stories260K" ? "product-4-3-2" : "mc_sim_7b_63";
      auto proposer = make_proposer(sc, w, draft_on_gpu ? make_cuda_backend() : nullptr);
      auto spec_backend = make_cuda_backend();
      LlamaModel spec_model(*spec_backend, w);
      Generator spec(spec_model, gc, proposer.get());
      const auto got = spec.run(reqs);
      const std::string what = method + (draft_on_gpu ? " (draft on GPU)" : "");
      const int equal = expect_equal_tokens(got, expect, GetParam() + " " + what);
      std::printf("  %-16s %s speculation on GPU: %d/%zu requests equal to plain greedy\n",
                  GetParam().c_str(), what.c_str(), equal, reqs.size());
    }
  }
}

// The device probe (Backend::transfer_stats): in steady state a step waits for the device once
// and downloads only ids, never [rows, vocab] logits: plain greedy decoding (argmax ids), plain
// sampling and n-gram speculation (ids from Backend::sample_trees / argmax rows), 4 requests in
// a batch; so do the trained-head EAGLE and Medusa drafts on the GPU (their accepted paths'
// hidden states come back with the ids).
TEST_P(CudaModel, OneHostSyncPerStep) {
  const ModelWeights& w = weights_of(GetParam());
  std::vector<GenerationRequest> reqs = motif_prompts(4242, {12, 20, 9, 33}, 4, vocab_, 48);
  GeneratorConfig gc;
  gc.num_blocks = kBlocks;
  gc.block_size = kBlock;
  gc.max_step_tokens = 256;
  struct Probe {
    int64_t steps;
    TransferStats x;
  };
  auto probe = [&](Proposer* p, const std::vector<GenerationRequest>& rs) {
    auto total = [&] {
      return gpu_backend_->transfer_stats() +
             (p != nullptr ? p->draft_transfer_stats() : TransferStats{});
    };
    Generator(*gpu_model_, gc, p).run(rs);  // warm-up: GEMM tuning, step graph recordings
    Generator g(*gpu_model_, gc, p);        // allocates the KV cache (waits for the device)
    const TransferStats x0 = total();
    g.run(rs);
    return Probe{g.stats().steps, total() - x0};
  };
  auto report = [&](const std::string& what, const Probe& pr) {
    std::printf("  %-12s %-22s %lld steps: %.2f host syncs, %.0f B device->host per step\n",
                GetParam().c_str(), what.c_str(), static_cast<long long>(pr.steps),
                double(pr.x.syncs) / pr.steps, double(pr.x.d2h_bytes) / pr.steps);
  };
  const Probe greedy = probe(nullptr, reqs);
  report("plain greedy", greedy);
  EXPECT_EQ(greedy.x.syncs, greedy.steps);
  EXPECT_LE(greedy.x.d2h_bytes, greedy.steps * 4 * static_cast<int64_t>(reqs.size()));
  std::vector<GenerationRequest> sampled = reqs;
  for (size_t i = 0; i < sampled.size(); ++i) {
    sampled[i].sampling.temperature = 0.8f;
    sampled[i].sampling.seed = 100 + i;
  }
  const Probe plain_sampled = probe(nullptr, sampled);
  report("plain sampled", plain_sampled);
  EXPECT_EQ(plain_sampled.x.syncs, plain_sampled.steps);
  EXPECT_LT(plain_sampled.x.d2h_bytes, plain_sampled.steps * 1024);
  SpecConfig ngram;
  ngram.method = SpecMethod::kNgram;
  auto ng = make_proposer(ngram, w);
  for (const auto* rs : {&reqs, &sampled}) {
    const Probe pr = probe(ng.get(), *rs);
    report(rs == &reqs ? "ngram greedy" : "ngram sampled", pr);
    EXPECT_EQ(pr.x.syncs, pr.steps);
    EXPECT_LT(pr.x.d2h_bytes, pr.steps * 4 * gc.max_step_tokens);  // ids, not logits rows
  }
  if (GetParam() != "SmolLM2") return;
  for (const char* method : {"eagle", "medusa"}) {
    SpecConfig sc;
    sc.method = parse_spec_method(method);
    sc.head_path = testing::test_data_dir() + "/heads/smollm2/" + method;
    auto proposer = make_proposer(sc, w, make_cuda_backend());
    for (const auto* rs : {&reqs, &sampled}) {
      const Probe pr = probe(proposer.get(), *rs);
      report(std::string(method) + (rs == &reqs ? " greedy" : " sampled"), pr);
      // Medusa's tree tokens stay on the device (DraftTree::device), and EAGLE's trees are
      // grown and picked there (tokens and parents): one wait per step, but for the prefill
      // step's features (every row of the prompts comes back).
      EXPECT_LE(pr.x.syncs, pr.steps + 2) << method;
    }
  }
}

// Batch invariance at the model level (CudaBackendOptions::batch_invariant, the default): 16
// prompts x 64 greedy tokens; speculation (n-gram trees; Medusa and EAGLE where the test data
// has heads) must give exactly the plain greedy tokens, and the 16 prompts run as one batch
// exactly what each gives alone (plain and with n-gram speculation).
// Instantiated for stories260K, SmolLM2 and the random head_dim 64 / 128 models only.
class CudaModelInvariance : public CudaModel {};

TEST_P(CudaModelInvariance, BatchInvariantSpeculationAndBatching) {
  const ModelWeights& w = weights_of(GetParam());
  std::vector<GenerationRequest> reqs;
  std::mt19937 rng(4242);
  for (int i = 0; i < 16; ++i) {
    GenerationRequest r;
    r.prompt.push_back(1);
    const int len = 6 + 5 * i % 37;
    if (i % 2 == 0) {  // repetitive prompts: n-gram proposals get accepted
      const auto motif = random_tokens(rng, 3 + i % 5, vocab_);
      while (static_cast<int>(r.prompt.size()) < len)
        r.prompt.push_back(motif[r.prompt.size() % motif.size()]);
    } else {
      for (int32_t t : random_tokens(rng, len - 1, vocab_)) r.prompt.push_back(t);
    }
    r.sampling.temperature = 0;
    r.max_tokens = 64;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  GeneratorConfig gc;
  gc.num_blocks = kBlocks;
  gc.block_size = kBlock;
  gc.max_step_tokens = 128;  // prompts are chunked differently alone and in the batch
  auto count_equal = [&](const std::vector<GenerationResult>& got,
                         const std::vector<GenerationResult>& want, const std::string& what) {
    const int equal = expect_equal_tokens(got, want, GetParam() + " " + what);
    std::printf("  %-16s batch-invariant: %-34s %d/%zu requests bitwise-equal tokens\n",
                GetParam().c_str(), what.c_str(), equal, reqs.size());
  };
  auto run_alone = [&](LlamaModel& model, Proposer* proposer) {
    std::vector<GenerationResult> out;
    for (const auto& r : reqs) {
      Generator g(model, gc, proposer);
      out.push_back(g.run({r})[0]);
    }
    return out;
  };
  Generator plain(*gpu_model_, gc);
  const auto expect = plain.run(reqs);
  {
    // Logprobs make every step download full logits and argmax on the host: the same tokens
    // as the argmax-only steps above (device argmax ids).
    std::vector<GenerationRequest> with_logprobs = reqs;
    for (auto& r : with_logprobs) r.logprobs = 0;
    auto host_backend = make_cuda_backend();
    LlamaModel host_model(*host_backend, w);
    Generator host(host_model, gc);
    const auto got = host.run(with_logprobs);
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got[i].tokens, expect[i].tokens) << GetParam() << " host argmax, request " << i;
  }
  count_equal(run_alone(*gpu_model_, nullptr), expect, "plain: each alone == batch of 16");

  std::vector<std::pair<std::string, std::string>> methods = {{"ngram", ""}};
  const std::string spec_dir = testing::test_data_dir() + "/spec/random/";
  if (std::filesystem::exists(spec_dir + "medusa_" + GetParam()))
    methods.push_back({"medusa", spec_dir + "medusa_" + GetParam()});
  if (std::filesystem::exists(spec_dir + "eagle_" + GetParam()))
    methods.push_back({"eagle", spec_dir + "eagle_" + GetParam()});
  if (GetParam() == "SmolLM2")  // the trained EAGLE head (docs/heads.md)
    methods.push_back({"eagle", testing::test_data_dir() + "/heads/smollm2/eagle"});
  if (GetParam() == "SmolLM2")  // the trained Medusa heads
    methods.push_back({"medusa", testing::test_data_dir() + "/heads/smollm2/medusa"});
  for (const auto& [method, heads] : methods) {
    SpecConfig sc;
    sc.method = parse_spec_method(method);
    sc.head_path = heads;
    if (method == "medusa" && heads.find("/spec/random/") != std::string::npos)
      sc.tree = "product-4-3-2";
    // Medusa's heads also on a GPU backend of their own: the trees' tokens stay on the device
    // (DraftTree::device), read there by the verify step and its tree sampling.
    for (bool draft_on_gpu :
         method == "medusa" ? std::vector<bool>{false, true} : std::vector<bool>{false}) {
      auto proposer = make_proposer(sc, w, draft_on_gpu ? make_cuda_backend() : nullptr);
      auto spec_backend = make_cuda_backend();
      LlamaModel spec_model(*spec_backend, w);
      Generator spec(spec_model, gc, proposer.get());
      count_equal(
          spec.run(reqs), expect,
          method + (draft_on_gpu ? " (heads on the GPU)" : "") + " speculation (batch) == plain");
      if (method == "ngram")
        count_equal(run_alone(spec_model, proposer.get()), expect,
                    "ngram speculation alone == plain batch");
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Models, CudaModel,
                         ::testing::Values("llama_gqa", "qwen2", "llama_tied_bf16",
                                           "mistral_sharded", "llama3_rope_f16", "stories260K",
                                           "random_d64", "random_d128", "SmolLM2"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Models, CudaModelInvariance,
                         ::testing::Values("stories260K", "random_d64", "random_d128", "SmolLM2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace arbor
