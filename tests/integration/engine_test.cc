// The step-at-a-time Engine on stories260K: logprobs against Hugging Face transformers' logits
// (tests/data/golden), speculative logprobs equal plain ones, n > 1 samples fork the prompt's KV
// (prefilled once) and, with speculation, the proposer state; cancellation frees blocks at once.
#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <set>
#include <thread>

#include "engine/backend/backend.h"
#include "engine/backend/step_graphs.h"
#include "engine/core/error.h"
#include "engine/model/llama_model.h"
#include "engine/runner/engine.h"
#include "engine/runner/model_bundle.h"
#include "engine/spec/eagle_proposer.h"
#include "engine/spec/proposer_factory.h"
#include "engine/verify/device_verify.h"
#include "tests/common/golden.h"

namespace arbor {
namespace {

class EngineTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    bundle_ = new ModelBundle(
        load_model_bundle(std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.bin"));
  }
  static void TearDownTestSuite() { delete bundle_; }

  void SetUp() override {
    backend_ = make_cpu_backend(1);
    model_ = std::make_unique<LlamaModel>(*backend_, bundle_->weights);
  }

  std::unique_ptr<Proposer> eagle() {
    SpecConfig sc;
    sc.method = SpecMethod::kEagle;
    sc.head_path = std::string(ARBOR_TEST_DATA_DIR) + "/heads/stories260K/eagle";
    return make_proposer(sc, bundle_->weights);
  }

  // Runs to completion; events grouped per (id, choice).
  static std::map<std::pair<ReqId, int32_t>, std::vector<EngineEvent>> drain(Engine& e) {
    std::map<std::pair<ReqId, int32_t>, std::vector<EngineEvent>> out;
    for (int guard = 0; !e.idle() && guard < 100000; ++guard)
      for (EngineEvent& ev : e.step()) out[{ev.id, ev.choice}].push_back(std::move(ev));
    EXPECT_TRUE(e.idle());
    return out;
  }
  // Adaptive trees of up to 12 nodes, depth 4, every step padded to a graph size, under a fixed
  // linear cost (4 ms + 0.05 a tree token).
  static EngineConfig adaptive_12_node_trees() {
    EngineConfig ec;
    ec.adaptive_trees = true;
    ec.pad_trees = 1;
    ec.tree_budget = {12, 4};
    ec.cost.fixed_ms = 4.0;
    ec.cost.per_token_ms = 0.05;
    ec.cost.online = false;
    return ec;
  }
  static std::vector<int32_t> tokens_of(const std::vector<EngineEvent>& evs) {
    std::vector<int32_t> t;
    for (const auto& e : evs) t.insert(t.end(), e.tokens.begin(), e.tokens.end());
    return t;
  }
  static std::vector<TokenLogprob> logprobs_of(const std::vector<EngineEvent>& evs) {
    std::vector<TokenLogprob> t;
    for (const auto& e : evs) t.insert(t.end(), e.logprobs.begin(), e.logprobs.end());
    return t;
  }

  GenerationRequest greedy(std::vector<int32_t> prompt, int32_t n) {
    GenerationRequest r;
    r.prompt = std::move(prompt);
    r.sampling.temperature = 0;
    r.max_tokens = n;
    r.ignore_eos = true;
    return r;
  }

  static ModelBundle* bundle_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  std::vector<std::unique_ptr<Backend>> backends_;  // kept for tests that inspect them later
  std::vector<std::unique_ptr<LlamaModel>> models_;
};
ModelBundle* EngineTest::bundle_ = nullptr;

TEST_F(EngineTest, LogprobsMatchTransformers) {
  const nlohmann::json g =
      testing::read_json(std::string(ARBOR_TEST_DATA_DIR) + "/golden/stories260K.json");
  const auto ids = g["input_ids"].get<std::vector<int32_t>>();
  const auto ref = g["logits"].get<std::vector<std::vector<float>>>();
  Engine engine(*model_, EngineConfig{});
  for (size_t k : {size_t{5}, size_t{17}, ids.size()}) {
    GenerationRequest r = greedy(std::vector<int32_t>(ids.begin(), ids.begin() + k), 1);
    r.logprobs = 5;
    engine.add(k, r);
    const auto evs = drain(engine)[{k, 0}];
    const auto lps = logprobs_of(evs);
    ASSERT_EQ(lps.size(), 1u);
    // log_softmax of transformers' logits at the last prompt position.
    const std::vector<float>& row = ref[k - 1];
    double mx = -INFINITY, sum = 0;
    for (float v : row) mx = std::max<double>(mx, v);
    for (float v : row) sum += std::exp(v - mx);
    const double lse = mx + std::log(sum);
    std::vector<int32_t> order(row.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return row[a] > row[b]; });
    EXPECT_EQ(lps[0].token, order[0]);
    EXPECT_NEAR(lps[0].logprob, row[order[0]] - lse, 1e-4);
    ASSERT_EQ(lps[0].top.size(), 5u);
    for (size_t i = 0; i < 5; ++i) {
      EXPECT_EQ(lps[0].top[i].first, order[i]) << "rank " << i;
      EXPECT_NEAR(lps[0].top[i].second, row[order[i]] - lse, 1e-4) << "rank " << i;
    }
  }
}

TEST_F(EngineTest, SpeculativeLogprobsEqualPlain) {
  const std::vector<int32_t> prompt = bundle_->tokenizer->encode("Once upon a time", true, false);
  GenerationRequest r = greedy(prompt, 60);
  r.logprobs = 3;
  Engine plain(*model_, EngineConfig{});
  plain.add(1, r);
  const auto p = drain(plain)[{1, 0}];
  auto backend2 = make_cpu_backend(1);
  LlamaModel model2(*backend2, bundle_->weights);
  auto proposer = eagle();
  Engine spec(model2, EngineConfig{}, proposer.get());
  spec.add(1, r);
  const auto s = drain(spec)[{1, 0}];
  ASSERT_EQ(tokens_of(p), tokens_of(s));
  const auto lp = logprobs_of(p), ls = logprobs_of(s);
  ASSERT_EQ(lp.size(), 60u);
  ASSERT_EQ(ls.size(), 60u);
  for (size_t i = 0; i < lp.size(); ++i) {
    EXPECT_NEAR(lp[i].logprob, ls[i].logprob, 1e-4) << i;
    for (size_t j = 0; j < 3; ++j) EXPECT_EQ(lp[i].top[j].first, ls[i].top[j].first) << i;
  }
  EXPECT_LT(s.size(), p.size()) << "speculation should emit several tokens per step";
}

// Forwards every op to the CPU backend and counts the host copies of logits-sized tensors
// ([rows, vocab]), the rows of [rows, hidden] tensors copied (with hidden > 0) and the
// argmax_rows calls.
class CountingBackend final : public Backend {
 public:
  CountingBackend(std::unique_ptr<Backend> inner, int64_t vocab, int64_t hidden = 0)
      : inner_(std::move(inner)), vocab_(vocab), hidden_(hidden) {}
  int64_t logits_downloads = 0, argmax_calls = 0, sample_calls = 0, hidden_rows_downloaded = 0;

  std::string name() const override { return inner_->name(); }
  Tensor upload_weight(const HostTensor& w) override { return inner_->upload_weight(w); }
  Tensor scratch(int64_t rows, int64_t cols) override { return inner_->scratch(rows, cols); }
  void reset_scratch() override { inner_->reset_scratch(); }
  void download(const Tensor& src, float* dst) override {
    logits_downloads += src.cols == vocab_;
    if (src.cols == hidden_) hidden_rows_downloaded += src.rows;
    inner_->download(src, dst);
  }
  void upload(const float* src, const Tensor& dst) override { inner_->upload(src, dst); }
  void gather_rows(const Tensor& src, std::span<const int32_t> rows, const Tensor& out) override {
    inner_->gather_rows(src, rows, out);
  }
  void allocate_kv(const KvCacheShape& shape) override { inner_->allocate_kv(shape); }
  const KvCacheShape& kv_shape() const override { return inner_->kv_shape(); }
  int64_t kv_cache_bytes(const KvCacheShape& shape) const override {
    return inner_->kv_cache_bytes(shape);
  }
  MemoryInfo memory_info() const override { return inner_->memory_info(); }
  void set_step(const StepInputs& step) override { inner_->set_step(step); }
  void embedding(const Tensor& table, const Tensor& out) override { inner_->embedding(table, out); }
  void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out) override {
    inner_->rms_norm(x, weight, eps, out);
  }
  void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) override {
    inner_->linear(x, w, bias, out);
  }
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override { inner_->add(a, b, out); }
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override {
    inner_->silu_mul(gate, up, out);
  }
  void rope(const Tensor& q, const Tensor& k, const RopeParams& p) override {
    inner_->rope(q, k, p);
  }
  void write_kv(int64_t layer, const Tensor& k, const Tensor& v) override {
    inner_->write_kv(layer, k, v);
  }
  void paged_tree_attention(int64_t layer, const Tensor& q, int64_t num_heads,
                            const Tensor& out) override {
    inner_->paged_tree_attention(layer, q, num_heads, out);
  }
  void gather_logit_rows(const Tensor& x, const Tensor& out) override {
    inner_->gather_logit_rows(x, out);
  }
  void argmax_rows(const Tensor& logits, std::vector<int32_t>* out) override {
    ++argmax_calls;
    inner_->argmax_rows(logits, out);
  }
  void gather_values(const Tensor& x, const std::vector<int64_t>& index,
                     std::vector<float>* out) override {
    inner_->gather_values(x, index, out);
  }
  void split_cols(const Tensor& x, const std::vector<Tensor>& outs) override {
    inner_->split_cols(x, outs);
  }
  void top_k_log_softmax(const Tensor& logits, int32_t k, std::vector<int32_t>* ids,
                         std::vector<float>* values) override {
    inner_->top_k_log_softmax(logits, k, ids, values);
  }
  // The host reference on the downloaded logits, as LlamaModel runs it for the CPU backend,
  // counted.
  bool has_sample_trees() const override { return true; }
  void sample_trees(const Tensor& logits, const TreeSampleBatch& batch,
                    TreeSampleResult* out) override {
    ++sample_calls;
    std::vector<float> host(static_cast<size_t>(logits.numel()));
    inner_->download(logits, host.data());
    sample_trees_on_host(host, logits.cols, batch, out);
  }
  void copy_kv(const std::vector<int64_t>& src_slots,
               const std::vector<int64_t>& dst_slots) override {
    inner_->copy_kv(src_slots, dst_slots);
  }

 private:
  std::unique_ptr<Backend> inner_;
  int64_t vocab_, hidden_;
};

// copy_cols writes x into a column range of a wider tensor and leaves the other columns: the
// CPU backend's own and Backend's default (download, place, upload; CountingBackend keeps it)
// against values written out by hand; a range past the last column is refused.
TEST(BackendOps, CopyColsPlacesRowsInAColumnRange) {
  auto check = [](Backend& b, const std::string& which) {
    b.reset_scratch();
    Tensor x = b.scratch(2, 2), out = b.scratch(2, 5);
    const std::vector<float> xs = {1, 2, 3, 4}, base = {9, 9, 9, 9, 9, 8, 8, 8, 8, 8};
    b.upload(xs.data(), x);
    b.upload(base.data(), out);
    b.copy_cols(x, out, 3);
    std::vector<float> got(10);
    b.download(out, got.data());
    EXPECT_EQ(got, (std::vector<float>{9, 9, 9, 1, 2, 8, 8, 8, 3, 4})) << which;
    b.copy_cols(x, out, 0);
    b.download(out, got.data());
    EXPECT_EQ(got, (std::vector<float>{1, 2, 9, 1, 2, 3, 4, 8, 3, 4})) << which;
    try {
      b.copy_cols(x, out, 4);
      ADD_FAILURE() << which << ": columns 4..6 of 5 accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << which;
      EXPECT_NE(std::string(e.what()).find("copy_cols"), std::string::npos) << e.what();
    }
  };
  auto cpu = make_cpu_backend(1);
  check(*cpu, "cpu");
  CountingBackend counted(make_cpu_backend(1), 512);
  check(counted, "Backend default");
}

// EAGLE trees grown and picked on the draft's backend (EagleOptions::pick_on_backend: tokens and
// parents left in its memory, the verify step's positions and tree masks rebuilt from them in
// set_step) give plain greedy decoding's tokens and the same accepted lengths as the trees the
// host's grower picks, batched, with adaptive trees padded to step buckets (padding nodes laid
// out by the host beside the picked ones) and without; a sampled request beside them (verified
// by the host reference of the backend's tree sampling, the parents read back there) draws the
// same tokens from the same trees and seed either way.
TEST_F(EngineTest, EagleTreesPickedOnTheBackendEqualTheHostsPicks) {
  const std::vector<std::string> texts = {"Once upon a time", "The little dog", "Lily went to the",
                                          "One day, a boy"};
  std::vector<GenerationRequest> reqs;
  for (const std::string& t : texts)
    reqs.push_back(greedy(bundle_->tokenizer->encode(t, true, false), 40));
  Engine plain(*model_, EngineConfig{});
  for (size_t i = 0; i < reqs.size(); ++i) plain.add(i + 1, reqs[i]);
  auto want = drain(plain);
  GenerationRequest sampled = greedy(reqs[0].prompt, 40);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 12;
  const ReqId sampled_id = 99;
  for (bool adaptive : {false, true}) {
    std::vector<int64_t> accepted;
    std::vector<std::vector<int32_t>> sampled_tokens;
    for (int32_t pick : {0, 1}) {
      SCOPED_TRACE(std::string(pick ? "picked on the backend" : "picked on the host") +
                   (adaptive ? ", adaptive trees padded" : ""));
      SpecConfig sc;
      sc.method = SpecMethod::kEagle;
      sc.head_path = std::string(ARBOR_TEST_DATA_DIR) + "/heads/stories260K/eagle";
      sc.total_tokens = 12;
      sc.depth = 3;
      sc.top_k = 3;
      sc.grow_on_device = 1;
      sc.pick_on_device = pick;
      auto proposer = make_proposer(sc, bundle_->weights);
      const EngineConfig ec = adaptive ? adaptive_12_node_trees() : EngineConfig{};
      auto backend = make_cpu_backend(1);
      LlamaModel model(*backend, bundle_->weights);
      Engine e(model, ec, proposer.get());
      for (size_t i = 0; i < reqs.size(); ++i) e.add(i + 1, reqs[i]);
      e.add(sampled_id, sampled);
      auto got = drain(e);
      for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(tokens_of(got[{i + 1, 0}]), tokens_of(want[{i + 1, 0}])) << "request " << i + 1;
      sampled_tokens.push_back(tokens_of(got[{sampled_id, 0}]));
      EXPECT_EQ(sampled_tokens.back().size(), 40u);
      EXPECT_GT(e.stats().acceptance.mean_emitted_per_step(), 1.2);
      // Picked on the backend, every tree step read its tokens from the draft's memory.
      if (pick) {
        EXPECT_GT(e.stats().device_token_steps, 10);
      }
      accepted.push_back(e.stats().decode_tokens);
      accepted.push_back(e.stats().steps);
    }
    EXPECT_EQ(accepted[0], accepted[2]);
    EXPECT_EQ(accepted[1], accepted[3]) << "the same trees take the same steps";
    EXPECT_EQ(sampled_tokens[0], sampled_tokens[1]) << "the same trees and uniforms";
  }
}

// Verified paths run through the drafter from the verify step's results in backend memory before
// the step's wait (SpecConfig::paths_on_device; EAGLE: draft rows reserved for each tree's depth +
// 1, the path's length committed after the wait; Medusa: every row through the heads, the path's
// last one read) give the same trees as the paths folded in from the host's copy after it: the same
// tokens as plain greedy decoding, and with fixed trees the same steps and accepted lengths and the
// same draws for a sampled request. So do EAGLE's next trees grown before the wait too
// (SpecConfig::grow_before_wait), which fixed trees take at most steps. Requests arrive while
// others decode, so steps mix trees rooted on the device with backlogs run on the host (a new
// request's prompt rows); with adaptive trees some steps have no tree (their paths go to the
// backlog) or trees for some requests only.
TEST_F(EngineTest, PathsFoldedInOnTheBackendEqualTheHostsFeedback) {
  const std::vector<std::string> texts = {"Once upon a time", "The little dog", "Lily went to the",
                                          "One day, a boy", "Tom and his mom"};
  std::vector<GenerationRequest> reqs;
  for (const std::string& t : texts)
    reqs.push_back(greedy(bundle_->tokenizer->encode(t, true, false), 40));
  GenerationRequest sampled = greedy(reqs[0].prompt, 40);
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 5;
  const ReqId sampled_id = 99;
  // Two requests first; the others join after `late` steps each.
  const auto run = [&](Engine& e, int late) {
    std::map<std::pair<ReqId, int32_t>, std::vector<EngineEvent>> out;
    e.add(1, reqs[0]);
    e.add(sampled_id, sampled);
    for (size_t i = 1; i < reqs.size(); ++i) {
      for (int s = 0; s < late; ++s)
        for (EngineEvent& ev : e.step()) out[{ev.id, ev.choice}].push_back(std::move(ev));
      e.add(i + 1, reqs[i]);
    }
    for (auto& [key, evs] : drain(e))
      for (EngineEvent& ev : evs) out[key].push_back(std::move(ev));
    return out;
  };
  Engine plain(*model_, EngineConfig{});
  auto want = run(plain, 3);
  const std::string dir = std::string(ARBOR_TEST_DATA_DIR) + "/heads/stories260K/";
  for (const SpecMethod method : {SpecMethod::kEagle, SpecMethod::kMedusa})
    for (bool adaptive : {false, true}) {
      std::vector<int64_t> counts;
      std::vector<std::vector<int32_t>> sampled_tokens;
      const bool eagle = method == SpecMethod::kEagle;
      // 2: EAGLE's next trees also grown before the wait (EagleOptions::grow_before_wait).
      for (int32_t on_device : {0, 1, 2}) {
        if (on_device == 2 && !eagle) continue;
        SCOPED_TRACE(std::string(spec_method_name(method)) +
                     (on_device ? ", paths on the backend" : ", paths from the host") +
                     (on_device == 2 ? ", trees grown before the wait" : "") +
                     (adaptive ? ", adaptive trees" : ""));
        SpecConfig sc;
        sc.method = method;
        sc.head_path = dir + (eagle ? "eagle" : "medusa");
        sc.total_tokens = 12;
        sc.depth = 3;
        sc.top_k = 3;
        sc.grow_on_device = 1;
        sc.pick_on_device = 1;
        sc.paths_on_device = on_device > 0 ? 1 : 0;
        sc.grow_before_wait = on_device == 2 ? 1 : 0;
        // Medusa's heads on a backend of their own: their ids stay there (DraftTree::device).
        auto proposer = make_proposer(sc, bundle_->weights, eagle ? nullptr : make_cpu_backend(1));
        const EngineConfig ec = adaptive ? adaptive_12_node_trees() : EngineConfig{};
        auto backend = make_cpu_backend(1);
        LlamaModel model(*backend, bundle_->weights);
        Engine e(model, ec, proposer.get());
        auto got = run(e, 3);
        for (size_t i = 0; i < reqs.size(); ++i)
          EXPECT_EQ(tokens_of(got[{i + 1, 0}]), tokens_of(want[{i + 1, 0}])) << "request " << i + 1;
        sampled_tokens.push_back(tokens_of(got[{sampled_id, 0}]));
        EXPECT_EQ(sampled_tokens.back().size(), 40u);
        EXPECT_GT(e.stats().acceptance.mean_emitted_per_step(), eagle ? 1.2 : 1.05);
        if (on_device)
          EXPECT_GT(e.stats().device_path_steps, 10);
        else
          EXPECT_EQ(e.stats().device_path_steps, 0);
        if (eagle) {
          const int64_t pregrown =
              dynamic_cast<EagleProposer&>(*proposer).trees_grown_before_wait();
          if (on_device < 2) {
            EXPECT_EQ(pregrown, 0);
          } else if (!adaptive) {
            EXPECT_GT(pregrown, 10) << "fixed trees repeat their budgets";
          }
        }
        counts.push_back(e.stats().decode_tokens);
        counts.push_back(e.stats().steps);
        counts.push_back(e.stats().acceptance.emitted);
      }
      // (Adaptive trees follow the measured draft cost, which the paths' place moves: their
      // trees may differ, their tokens may not.)
      if (adaptive) continue;
      for (size_t run = 1; run < sampled_tokens.size(); ++run) {
        EXPECT_EQ(counts[0], counts[3 * run]);
        EXPECT_EQ(counts[1], counts[3 * run + 1]) << "the same trees take the same steps";
        EXPECT_EQ(counts[2], counts[3 * run + 2]);
        EXPECT_EQ(sampled_tokens[0], sampled_tokens[run]) << "the same trees and uniforms";
      }
    }
}

// Greedy steps without penalties or logprobs take only argmax ids from the backend
// (ForwardRequest::argmax_only) and verify trees from them; the tokens equal those of steps that
// download the logits: the same request with logprobs, and beside a sampled request (a mixed
// step keeps the logits). n = 2 greedy choices fork from the argmax of the prompt's last row.
TEST_F(EngineTest, GreedyArgmaxStepsEqualFullLogitsSteps) {
  const std::vector<int32_t> prompt = bundle_->tokenizer->encode("Once upon a time", true, false);
  const int64_t vocab = bundle_->weights.config.vocab_size;
  auto run = [&](bool logprobs, bool beside_sampled, int32_t n, CountingBackend** counted,
                 bool backend_sampling = true) {
    auto backend = std::make_unique<CountingBackend>(make_cpu_backend(1), vocab);
    *counted = backend.get();
    auto model = std::make_unique<LlamaModel>(*backend, bundle_->weights);
    auto proposer = eagle();
    EngineConfig config;
    config.backend_sampling = backend_sampling;
    Engine engine(*model, config, proposer.get());
    GenerationRequest r = greedy(prompt, 40);
    r.n = n;
    if (logprobs) r.logprobs = 0;
    engine.add(1, r);
    if (beside_sampled) {
      GenerationRequest s = greedy(prompt, 60);
      s.sampling.temperature = 0.8f;
      s.sampling.seed = 9;
      engine.add(2, s);
    }
    auto events = drain(engine);
    std::vector<std::vector<int32_t>> tokens;
    for (int32_t c = 0; c < n; ++c) tokens.push_back(tokens_of(events[{1, c}]));
    // Keep the backend alive for the counters until the caller reads them.
    backends_.push_back(std::move(backend));
    models_.push_back(std::move(model));
    return tokens;
  };
  CountingBackend *argmax_backend = nullptr, *logprobs_backend = nullptr, *mixed_backend = nullptr,
                  *forked_backend = nullptr, *host_mixed_backend = nullptr;
  const auto argmax_tokens = run(false, false, 1, &argmax_backend);
  const auto logprobs_tokens = run(true, false, 1, &logprobs_backend);
  const auto mixed_tokens = run(false, true, 1, &mixed_backend);
  const auto host_mixed_tokens = run(false, true, 1, &host_mixed_backend, false);
  const auto forked_tokens = run(false, false, 2, &forked_backend);
  ASSERT_EQ(argmax_tokens[0].size(), 40u);
  EXPECT_EQ(argmax_tokens, logprobs_tokens);
  EXPECT_EQ(argmax_tokens, mixed_tokens);
  EXPECT_EQ(argmax_tokens, host_mixed_tokens);
  EXPECT_EQ(forked_tokens[0], argmax_tokens[0]);
  EXPECT_EQ(forked_tokens[1], argmax_tokens[0]);
  EXPECT_EQ(argmax_backend->logits_downloads, 0);
  EXPECT_GT(argmax_backend->argmax_calls, 0);
  EXPECT_EQ(forked_backend->logits_downloads, 0);
  // Logprobs come from the backend too (top-k of the raw log-softmax, the emitted tokens'
  // values): no [M, vocab] download.
  EXPECT_EQ(logprobs_backend->argmax_calls, 0);
  EXPECT_EQ(logprobs_backend->logits_downloads, 0);
  EXPECT_GT(logprobs_backend->sample_calls, 0);
  // Beside a sampled request the step samples on the backend (Backend::sample_trees); with
  // backend sampling off it downloads the logits.
  EXPECT_EQ(mixed_backend->logits_downloads, 0);
  EXPECT_GT(mixed_backend->sample_calls, 0);
  EXPECT_GT(host_mixed_backend->logits_downloads, 0);
  EXPECT_EQ(host_mixed_backend->sample_calls, 0);
}

// A step with prefill chunks brings back only the features of the requests whose drafter reads
// them (ForwardRequest::feature_rows, gathered on the backend): a long prompt that does not
// speculate, prefilled in the same step as a short one that does, sends none of its rows. Both
// outputs equal plain greedy decoding, and the speculating request drafts as it does alone.
TEST_F(EngineTest, PrefillStepsBringBackOnlyTheSpeculatingRequestsFeatures) {
  std::string text;
  for (int i = 0; i < 8; ++i)
    text += "Once upon a time there was a little girl who liked to play. ";
  const std::vector<int32_t> long_prompt = bundle_->tokenizer->encode(text, true, false);
  const std::vector<int32_t> short_prompt =
      bundle_->tokenizer->encode("Lily and Ben went to the park", true, false);
  ASSERT_GT(long_prompt.size(), 100u);
  const int64_t vocab = bundle_->weights.config.vocab_size;
  const int64_t hidden = bundle_->weights.config.hidden_size;
  struct Run {
    std::vector<int32_t> long_tokens, short_tokens;
    int64_t first_step_rows = 0;  // feature rows copied back by the first step (both prefills)
    AcceptanceStats acceptance;
  };
  auto run = [&](bool speculate, bool with_long) {
    CountingBackend backend(make_cpu_backend(1), vocab, hidden);
    LlamaModel model(backend, bundle_->weights);
    auto proposer = eagle();
    Engine engine(model, EngineConfig{}, speculate ? proposer.get() : nullptr);
    GenerationRequest l = greedy(long_prompt, 24);
    l.speculate = false;
    if (with_long) engine.add(1, l);
    engine.add(2, greedy(short_prompt, 24));
    Run out;
    std::map<std::pair<ReqId, int32_t>, std::vector<EngineEvent>> events;
    for (int guard = 0; !engine.idle() && guard < 10000; ++guard) {
      for (EngineEvent& ev : engine.step()) events[{ev.id, ev.choice}].push_back(std::move(ev));
      if (guard == 0) out.first_step_rows = backend.hidden_rows_downloaded;
    }
    EXPECT_TRUE(engine.idle());
    out.long_tokens = tokens_of(events[{1, 0}]);
    out.short_tokens = tokens_of(events[{2, 0}]);
    out.acceptance = engine.stats().acceptance;
    return out;
  };
  const Run plain = run(false, true), both = run(true, true), alone = run(true, false);
  ASSERT_EQ(plain.long_tokens.size(), 24u);
  EXPECT_EQ(both.long_tokens, plain.long_tokens);
  EXPECT_EQ(both.short_tokens, plain.short_tokens);
  EXPECT_EQ(alone.short_tokens, plain.short_tokens);
  // The first step prefilled both prompts (one chunk each) and copied back the short one's rows.
  EXPECT_EQ(both.first_step_rows, static_cast<int64_t>(short_prompt.size()));
  EXPECT_EQ(alone.first_step_rows, static_cast<int64_t>(short_prompt.size()));
  EXPECT_EQ(plain.first_step_rows, 0);
  EXPECT_EQ(both.acceptance.steps, alone.acceptance.steps);
  EXPECT_EQ(both.acceptance.emitted, alone.acceptance.emitted);
  EXPECT_GT(alone.acceptance.mean_emitted_per_step(), 1.2);
}

// Sampled requests (temperature, top-k, top-p, min-p, every penalty) with and without EAGLE
// trees: sampling and verifying on the backend (Backend::sample_trees, no logits downloaded)
// gives the same tokens for the same seeds as downloading the logits and running verify() on
// the host, since both consume the request's Rng identically. Two requests share each step.
TEST_F(EngineTest, BackendSamplingEqualsHostSampling) {
  const std::vector<int32_t> prompt =
      bundle_->tokenizer->encode("Lily and Ben went to the park. They saw a big dog", true, false);
  const int64_t vocab = bundle_->weights.config.vocab_size;
  std::vector<SamplingParams> params(4);
  params[0].temperature = 0.8f;
  params[1].temperature = 1.0f;
  params[1].top_k = 20;
  params[1].top_p = 0.9f;
  params[2].temperature = 0.7f;
  params[2].min_p = 0.05f;
  params[2].repetition_penalty = 1.3f;
  params[3].temperature = 1.2f;
  params[3].presence_penalty = 0.5f;
  params[3].frequency_penalty = 0.4f;
  params[3].top_p = 0.95f;
  for (bool speculate : {false, true}) {
    std::vector<std::vector<TokenLogprob>> logprobs;  // per run: requests 2 and 4, in order
    auto run = [&](bool backend_sampling, CountingBackend** counted) {
      auto backend = std::make_unique<CountingBackend>(make_cpu_backend(1), vocab);
      *counted = backend.get();
      auto model = std::make_unique<LlamaModel>(*backend, bundle_->weights);
      auto proposer = speculate ? eagle() : nullptr;
      EngineConfig config;
      config.backend_sampling = backend_sampling;
      Engine engine(*model, config, proposer.get());
      for (size_t i = 0; i < params.size(); ++i) {
        GenerationRequest r = greedy(prompt, 48);
        r.sampling = params[i];
        r.sampling.seed = 100 + i;
        r.speculate = speculate;
        if (i % 2 == 1) r.logprobs = 3;
        engine.add(i + 1, r);
      }
      auto events = drain(engine);
      std::vector<std::vector<int32_t>> tokens;
      for (size_t i = 0; i < params.size(); ++i) tokens.push_back(tokens_of(events[{i + 1, 0}]));
      logprobs.emplace_back();
      for (size_t i = 1; i < params.size(); i += 2)
        for (const EngineEvent& ev : events[{i + 1, 0}])
          logprobs.back().insert(logprobs.back().end(), ev.logprobs.begin(), ev.logprobs.end());
      backends_.push_back(std::move(backend));
      models_.push_back(std::move(model));
      return tokens;
    };
    CountingBackend *on = nullptr, *off = nullptr;
    const auto device_tokens = run(true, &on);
    const auto host_tokens = run(false, &off);
    ASSERT_EQ(logprobs.size(), 2u);
    ASSERT_EQ(logprobs[0].size(), logprobs[1].size());
    EXPECT_EQ(logprobs[0].size(), 96u);
    for (size_t j = 0; j < logprobs[0].size(); ++j) {
      EXPECT_EQ(logprobs[0][j].token, logprobs[1][j].token);
      EXPECT_NEAR(logprobs[0][j].logprob, logprobs[1][j].logprob, 1e-5) << j;
      ASSERT_EQ(logprobs[0][j].top.size(), 3u);
      ASSERT_EQ(logprobs[1][j].top.size(), 3u);
      for (size_t t = 0; t < 3; ++t) {
        EXPECT_EQ(logprobs[0][j].top[t].first, logprobs[1][j].top[t].first) << j;
        EXPECT_NEAR(logprobs[0][j].top[t].second, logprobs[1][j].top[t].second, 1e-5) << j;
      }
    }
    for (size_t i = 0; i < params.size(); ++i) {
      EXPECT_EQ(device_tokens[i].size(), 48u) << i;
      EXPECT_EQ(device_tokens[i], host_tokens[i]) << "request " << i << " speculate " << speculate;
    }
    EXPECT_EQ(on->logits_downloads, 0);
    EXPECT_GT(on->sample_calls, 0);
    EXPECT_GT(off->logits_downloads, 0);
    EXPECT_EQ(off->sample_calls, 0);
  }
}

TEST_F(EngineTest, SamplesForkThePromptOnceAndEqualAlone) {
  const std::vector<int32_t> prompt =
      bundle_->tokenizer->encode("Lily and Ben went to the park. They saw a big dog", true, false);
  for (bool speculate : {false, true}) {
    auto proposer = speculate ? eagle() : nullptr;
    auto backend = make_cpu_backend(1);
    LlamaModel model(*backend, bundle_->weights);
    Engine alone(model, EngineConfig{}, proposer.get());
    alone.add(1, greedy(prompt, 40));
    const auto a = tokens_of(drain(alone)[{1, 0}]);

    auto backend2 = make_cpu_backend(1);
    LlamaModel model2(*backend2, bundle_->weights);
    Engine engine(model2, EngineConfig{}, proposer.get());
    GenerationRequest r = greedy(prompt, 40);
    r.n = 4;
    engine.add(7, r);
    const auto evs = drain(engine);
    ASSERT_EQ(evs.size(), 4u);
    EXPECT_EQ(engine.stats().prefill_tokens, static_cast<int64_t>(prompt.size()))
        << "the prompt is prefilled once for all choices";
    for (int32_t c = 0; c < 4; ++c) {
      const auto& ev = evs.at({7, c});
      EXPECT_EQ(tokens_of(ev), a) << "choice " << c << " speculate " << speculate;
      ASSERT_TRUE(ev.back().finished);
      if (c > 0) {
        EXPECT_EQ(ev.back().result.cached_prompt_tokens, static_cast<int32_t>(prompt.size()));
      }
      if (speculate) {
        EXPECT_GT(ev.back().result.acceptance.mean_emitted_per_step(), 1.5) << c;
      }
    }
    EXPECT_EQ(engine.kv().stats().used_blocks, 0);
    engine.kv().check_invariants();
  }
}

// EngineConfig::pad_trees takes -1 (auto), 0 or 1; anything else names itself.
TEST_F(EngineTest, PadTreesOutOfRangeIsRefused) {
  for (int32_t bad : {-2, 2}) {
    EngineConfig config;
    config.pad_trees = bad;
    try {
      Engine e(*model_, config);
      ADD_FAILURE() << "pad_trees " << bad << " was accepted";
    } catch (const Error& err) {
      EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(err.what())
                    .find("pad_trees must be -1 (auto), 0 or 1, got " + std::to_string(bad)),
                std::string::npos)
          << err.what();
    }
  }
}

TEST_F(EngineTest, SeededSamplesAreReproducibleAndDistinct) {
  const std::vector<int32_t> prompt = bundle_->tokenizer->encode("The cat", true, false);
  auto run = [&]() {
    Engine e(*model_, EngineConfig{});
    GenerationRequest r = greedy(prompt, 30);
    r.sampling.temperature = 1.0f;
    r.sampling.seed = 42;
    r.n = 3;
    e.add(1, r);
    auto evs = drain(e);
    std::vector<std::vector<int32_t>> out;
    for (int32_t c = 0; c < 3; ++c) out.push_back(tokens_of(evs[{1, c}]));
    return out;
  };
  const auto x = run(), y = run();
  EXPECT_EQ(x, y);
  EXPECT_TRUE(x[0] != x[1] || x[1] != x[2]);
}

TEST_F(EngineTest, CancellationFreesBlocksAtOnce) {
  auto proposer = eagle();
  Engine e(*model_, EngineConfig{}, proposer.get());
  const std::vector<int32_t> prompt = bundle_->tokenizer->encode("Once upon a time", true, false);
  for (ReqId id = 1; id <= 3; ++id) {
    GenerationRequest r = greedy(prompt, 200);
    r.n = id == 3 ? 2 : 1;
    e.add(id, r);
  }
  for (int i = 0; i < 5; ++i) e.step();
  const int32_t before = e.kv().stats().used_blocks;
  ASSERT_GT(before, 0);
  EXPECT_TRUE(e.cancel(2));
  EXPECT_FALSE(e.cancel(2));
  EXPECT_LT(e.kv().stats().used_blocks, before);
  EXPECT_TRUE(e.cancel_choice(3, 1));
  e.step();
  EXPECT_TRUE(e.cancel(1));
  EXPECT_TRUE(e.cancel(3));
  EXPECT_TRUE(e.idle());
  EXPECT_EQ(e.kv().stats().used_blocks, 0);
  EXPECT_EQ(e.kv().stats().num_sequences, 0);
  e.kv().check_invariants();
  // The ids (and the proposer's per-request state) can be used again.
  e.add(1, greedy(prompt, 5));
  EXPECT_EQ(tokens_of(drain(e)[{1, 0}]).size(), 5u);
  EXPECT_THROW(e.add(9, greedy({}, 5)), Error);
  GenerationRequest bad = greedy(prompt, 5);
  bad.n = 0;
  EXPECT_THROW(e.add(9, bad), Error);
  // A logit_bias id outside the vocabulary is refused at add, not by the sampler mid-step.
  bad = greedy(prompt, 5);
  bad.sampling.logit_bias = {{3, 1.0f}, {1 << 20, 5.0f}};
  try {
    e.add(9, bad);
    ADD_FAILURE() << "logit_bias id 1048576 accepted";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(err.what()).find("logit_bias token id 1048576"), std::string::npos)
        << err.what();
  }
  EXPECT_TRUE(e.idle());
}

// The real EAGLE proposer on the CPU, reporting a draft graph recorded in each of its first
// `warm` drafting steps, which take `warm_ms` longer (what a recording costs on the GPU).
class WarmingProposer final : public Proposer {
 public:
  WarmingProposer(std::unique_ptr<Proposer> inner, int warm, double warm_ms)
      : inner_(std::move(inner)), warm_(warm), warm_ms_(warm_ms) {}
  std::string name() const override { return inner_->name(); }
  bool needs_hidden() const override { return inner_->needs_hidden(); }
  std::vector<int32_t> capture_layers() const override { return inner_->capture_layers(); }
  void begin(RequestId r, std::span<const int32_t> p) override { inner_->begin(r, p); }
  void observe(const TargetFeedback& f) override { inner_->observe(f); }
  void observe_batch(std::span<const TargetFeedback> f) override { inner_->observe_batch(f); }
  DraftTree propose(RequestId r, const TreeBudget& b) override { return inner_->propose(r, b); }
  std::vector<DraftTree> propose_batch(
      const std::vector<std::pair<RequestId, TreeBudget>>& requests) override {
    auto out = inner_->propose_batch(requests);
    if (calls_++ < warm_) {
      stats_.captures++;
      std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(warm_ms_));
    }
    return out;
  }
  void end(RequestId r) override { inner_->end(r); }
  StepGraphStats draft_graph_stats() const override { return stats_; }

 private:
  std::unique_ptr<Proposer> inner_;
  int warm_;
  double warm_ms_;
  int calls_ = 0;
  StepGraphStats stats_;
};

// With adaptive trees the policy's budgets change from step to step; with step graphs
// (EngineConfig::pad_trees, forced on here) the engine raises them and pads the drafted trees so
// that every decode step that verifies a tree scores graph_bucket(tokens, kStepTokenBuckets)
// tokens: a few recorded sizes instead of one per total. The padding is lossless (greedy output
// equals plain), for a proposer whose trees come to the host (EAGLE), one whose tokens stay on
// its own backend (Medusa on a second CPU backend: the extra nodes' ids come from the host) and
// one whose trees vary by themselves (n-gram). Without the padding some totals are off-bucket,
// so the check can fail. (The policy weighs the drafting time it measures, so how many steps
// draft trees depends on the machine's load: the counts are checked over all three methods.)
TEST_F(EngineTest, AdaptiveTreesPadDecodeStepsToGraphSizes) {
  const char* texts[] = {"Once upon a time", "The little dog",     "Lily and Ben went to the park",
                         "One day, a girl",  "Tom had a red ball", "The sun was hot and"};
  std::vector<GenerationRequest> reqs;
  for (const char* t : texts) {
    GenerationRequest r = greedy(bundle_->tokenizer->encode(t, true, false), 40);
    r.speculate = true;
    reqs.push_back(r);
  }
  Engine plain(*model_, EngineConfig{});
  for (size_t i = 0; i < reqs.size(); ++i) plain.add(i + 1, reqs[i]);
  const auto expect = drain(plain);

  struct Method {
    SpecMethod method;
    std::string heads;
    bool draft_backend;
    double per_token_ms;  // tree tokens cheap, not free: budgets differ per request and step
  };
  const std::string dir = std::string(ARBOR_TEST_DATA_DIR) + "/heads/stories260K/";
  int64_t padded_tree_steps = 0, off_bucket_unpadded = 0;
  for (const Method& m : {Method{SpecMethod::kEagle, dir + "eagle", false, 0.3},
                          Method{SpecMethod::kMedusa, dir + "medusa", true, 0.3},
                          Method{SpecMethod::kNgram, "", false, 0.02}}) {
    for (int32_t pad : {1, 0}) {
      SCOPED_TRACE(std::string(spec_method_name(m.method)) + (pad ? " padded" : " unpadded"));
      SpecConfig sc;
      sc.method = m.method;
      sc.head_path = m.heads;
      auto proposer =
          make_proposer(sc, bundle_->weights, m.draft_backend ? make_cpu_backend(1) : nullptr);
      EngineConfig ec;
      ec.adaptive_trees = true;
      ec.pad_trees = pad;
      ec.tree_budget = {16, 4};
      ec.cost.fixed_ms = 4.0;
      ec.cost.per_token_ms = m.per_token_ms;
      ec.cost.online = false;
      auto backend = make_cpu_backend(1);
      LlamaModel model(*backend, bundle_->weights);
      Engine e(model, ec, proposer.get());
      for (size_t i = 0; i < reqs.size(); ++i) e.add(i + 1, reqs[i]);
      std::map<std::pair<ReqId, int32_t>, std::vector<EngineEvent>> out;
      int64_t tree_steps = 0, off_bucket = 0;
      std::set<int64_t> sizes;
      for (int guard = 0; !e.idle() && guard < 10000; ++guard) {
        const EngineStats before = e.stats();
        const auto decoding = static_cast<int64_t>(e.scheduler().num_running());
        for (EngineEvent& ev : e.step()) out[{ev.id, ev.choice}].push_back(std::move(ev));
        const int64_t tokens = e.stats().tree_tokens - before.tree_tokens;
        if (e.stats().prefill_tokens != before.prefill_tokens || tokens <= decoding) continue;
        ++tree_steps;  // a decode-only step with at least one tree
        sizes.insert(tokens);
        if (graph_bucket(tokens, kStepTokenBuckets) != tokens) ++off_bucket;
      }
      ASSERT_TRUE(e.idle());
      for (size_t i = 0; i < reqs.size(); ++i)
        EXPECT_EQ(tokens_of(out[{i + 1, 0}]), tokens_of(expect.at({i + 1, 0}))) << i;
      std::printf("%s pad %d: %lld tree steps, %zu step sizes, %lld off-bucket\n",
                  spec_method_name(m.method), pad, static_cast<long long>(tree_steps), sizes.size(),
                  static_cast<long long>(off_bucket));
      if (pad == 1) {
        EXPECT_EQ(off_bucket, 0);
        padded_tree_steps += tree_steps;
      } else {
        off_bucket_unpadded += off_bucket;
      }
    }
  }
  EXPECT_GT(padded_tree_steps, 20);
  EXPECT_GT(off_bucket_unpadded, 0);
}

// Counts how feedback reaches the proposer (observe / observe_batch, and prompt feedback: a
// call whose first feedback starts at position 0).
class CountingProposer final : public Proposer {
 public:
  explicit CountingProposer(std::unique_ptr<Proposer> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  bool needs_hidden() const override { return inner_->needs_hidden(); }
  std::vector<int32_t> capture_layers() const override { return inner_->capture_layers(); }
  void begin(RequestId r, std::span<const int32_t> p) override { inner_->begin(r, p); }
  void observe(const TargetFeedback& f) override {
    single_calls++;
    inner_->observe(f);
  }
  void observe_batch(std::span<const TargetFeedback> f) override {
    size_t prompts = 0;
    for (const TargetFeedback& x : f) prompts += x.start == 0 ? 1 : 0;
    if (prompts > 0) prompt_batches.push_back(prompts);
    inner_->observe_batch(f);
  }
  DraftTree propose(RequestId r, const TreeBudget& b) override { return inner_->propose(r, b); }
  std::vector<DraftTree> propose_batch(
      const std::vector<std::pair<RequestId, TreeBudget>>& requests) override {
    return inner_->propose_batch(requests);
  }
  void end(RequestId r) override { inner_->end(r); }
  int single_calls = 0;
  std::vector<size_t> prompt_batches;  // prompt feedbacks per observe_batch call holding any

 private:
  std::unique_ptr<Proposer> inner_;
};

// A step's prompt chunks reach the proposer together, in one observe_batch call with its other
// feedback (EAGLE runs one draft forward for all of them), not one observe per chunk; greedy
// output is unchanged (the proposer is lossless either way).
TEST_F(EngineTest, PromptChunksOfAStepReachTheProposerInOneBatch) {
  const char* texts[] = {"Once upon a time", "The little dog", "Lily and Ben went to the park",
                         "One day, a girl"};
  CountingProposer proposer(eagle());
  EngineConfig ec;
  ec.adaptive_trees = false;
  Engine e(*model_, ec, &proposer);
  Engine plain_engine(*model_, ec, nullptr);
  for (ReqId id = 1; id <= 4; ++id) {
    const GenerationRequest r = greedy(bundle_->tokenizer->encode(texts[id - 1], true, false), 16);
    e.add(id, r);
    plain_engine.add(id, r);
  }
  auto spec = drain(e);
  auto plain = drain(plain_engine);
  for (ReqId id = 1; id <= 4; ++id)
    EXPECT_EQ(tokens_of(spec[{id, 0}]), tokens_of(plain[{id, 0}])) << id;
  EXPECT_EQ(proposer.single_calls, 0);
  ASSERT_EQ(proposer.prompt_batches.size(), 1u);  // every prompt prefilled in the first step
  EXPECT_EQ(proposer.prompt_batches[0], 4u);
}

TEST_F(EngineTest, DraftStepsThatRecordAGraphDoNotSetTheDraftCost) {
  const std::vector<int32_t> prompt = bundle_->tokenizer->encode("Once upon a time", true, false);
  for (int warm : {0, 3}) {
    SCOPED_TRACE(warm);
    WarmingProposer proposer(eagle(), warm, 200.0);
    EngineConfig ec;
    ec.adaptive_trees = false;  // every step drafts the same tree
    auto backend = make_cpu_backend(1);
    LlamaModel model(*backend, bundle_->weights);
    Engine e(model, ec, &proposer);
    e.add(1, greedy(prompt, 24));
    drain(e);
    const DraftCostEstimate& dc = e.scheduler().draft_cost();
    EXPECT_GT(dc.samples(), 0);
    // The three 200 ms steps are not drafting costs (a step of this draft takes ~1 ms).
    EXPECT_LT(dc.cost().ms(5), 50.0);
  }
}

}  // namespace
}  // namespace arbor

namespace arbor {
namespace {

// The start-up probe of the verify-step cost (runner/cost_probe.h) measures exactly the grid
// points the limits allow: requests <= max_running, B * T <= max_step_tokens, T <= max_tree, and
// B requests of ceil((context + T) / block_size) blocks within the KV cache.
TEST_F(EngineTest, CostProbeMeasuresThePointsTheLimitsAllow) {
  constexpr int32_t kBlocks = 12, kBlockSize = 16, kContext = 64;
  backend_->allocate_kv(model_->kv_shape(kBlocks, kBlockSize));
  CostProbeOptions o;
  o.batches = {1, 2, 4, 8};
  o.tree_sizes = {1, 2, 4, 8, 16, 32};
  o.context = kContext;
  o.warmup = 1;
  o.iters = 2;
  const auto curves = measure_verify_cost(*model_, nullptr, o, /*max_step_tokens=*/24,
                                          /*max_running=*/4, /*max_tree=*/16);
  std::map<int32_t, std::vector<int32_t>> want;
  for (int32_t b : o.batches) {
    if (b > 4) continue;
    for (int32_t t : o.tree_sizes) {
      const int32_t blocks = b * ((kContext + t + kBlockSize - 1) / kBlockSize);
      if (t <= 16 && b * t <= 24 && blocks <= kBlocks) want[b].push_back(b * t);
    }
  }
  ASSERT_EQ(want.size(), 2u);  // batch 4 needs 20 blocks at T = 1
  ASSERT_EQ(curves.size(), want.size());
  for (const auto& [b, tokens] : want) {
    ASSERT_TRUE(curves.count(b)) << b;
    const auto& pts = curves.at(b);
    ASSERT_EQ(pts.size(), tokens.size()) << b;
    for (size_t i = 0; i < pts.size(); ++i) {
      EXPECT_EQ(pts[i].tokens, tokens[i]) << b;
      EXPECT_GT(pts[i].ms, 0.0) << b;
    }
  }
  // The curve is a valid cost model.
  CostModelConfig c;
  c.curves = curves;
  EXPECT_NO_THROW(c.validate());
}

TEST_F(EngineTest, CostProbeOptionsAreChecked) {
  auto message = [](const CostProbeOptions& o) {
    try {
      o.validate();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  CostProbeOptions o;
  o.batches = {1, 4, 2};
  EXPECT_NE(message(o).find("batches"), std::string::npos) << message(o);
  o = CostProbeOptions{};
  o.tree_sizes = {};
  EXPECT_NE(message(o).find("tree_sizes"), std::string::npos) << message(o);
  o = CostProbeOptions{};
  o.iters = 0;
  EXPECT_NE(message(o).find("iters"), std::string::npos) << message(o);
  EngineConfig ec;
  ec.measure_cost = true;
  ec.cost_probe.context = -1;
  EXPECT_THROW(Engine(*model_, ec), Error);
}

// An engine that measures its cost curve at start-up (the probe writes K/V into the empty cache)
// plans adaptive EAGLE trees with it and still emits exactly the plain greedy tokens.
TEST_F(EngineTest, MeasuredCostCurveKeepsGreedyOutput) {
  const std::vector<int32_t> prompt = bundle_->tokenizer->encode("Once upon a time", true, false);
  const GenerationRequest r = greedy(prompt, 48);
  Engine plain(*model_, EngineConfig{});
  plain.add(1, r);
  const auto p = tokens_of(drain(plain)[{1, 0}]);

  auto backend2 = make_cpu_backend(1);
  LlamaModel model2(*backend2, bundle_->weights);
  auto proposer = eagle();
  EngineConfig ec;
  ec.adaptive_trees = true;
  ec.measure_cost = true;
  ec.cost_probe.batches = {1, 2};
  ec.cost_probe.tree_sizes = {1, 4, 16};
  ec.cost_probe.iters = 2;
  Engine spec(model2, ec, proposer.get());
  const auto& curves = spec.scheduler().cost().config().curves;
  ASSERT_EQ(curves.size(), 2u);
  EXPECT_EQ(curves.at(2).back().tokens, 32);
  spec.add(1, r);
  spec.add(2, r);
  const auto out = drain(spec);
  EXPECT_EQ(tokens_of(out.at({1, 0})), p);
  EXPECT_EQ(tokens_of(out.at({2, 0})), p);
}

}  // namespace
}  // namespace arbor
