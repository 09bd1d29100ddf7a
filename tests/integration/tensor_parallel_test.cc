// Tensor parallelism on the CPU backend (make_cpu_tp_backends: ranks are threads, the
// collectives sum in host memory): the sharded forward at 2 and 4 ranks against Hugging Face
// transformers' logits and greedy tokens (the golden fixtures), with KV heads split and
// replicated and attention biases; a vocabulary that does not divide by the ranks; greedy
// output with speculation (n-gram, the trained stories260K Medusa and EAGLE heads) equal to
// one rank's plain output; splits that cannot work are errors naming the dimension.
#include <gtest/gtest.h>

#include <filesystem>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/runner/generator.h"
#include "engine/spec/proposer_factory.h"
#include "tests/common/direct_batch.h"
#include "tests/common/golden.h"
#include "tests/common/model_runs.h"

namespace arbor {
namespace {

using testing::DirectBatch;

std::string data(const std::string& p) {
  return std::string(ARBOR_TEST_DATA_DIR) + "/" + p;
}
std::string stories() {
  return std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.bin";
}

// A model on `ranks` CPU ranks (1: a plain backend), owning its backends.
struct TpModel : testing::TpModel {
  TpModel(const ModelWeights& w, int ranks) : testing::TpModel(make_cpu_tp_backends(ranks, 1), w) {}
};

std::vector<int32_t> greedy(LlamaModel& model, const std::vector<int32_t>& prompt, int n) {
  return testing::greedy_decode(model, prompt, n);
}

struct GoldenCase {
  std::string golden, model_path;
  int ranks;
};

class TpGolden : public ::testing::TestWithParam<GoldenCase> {};

TEST_P(TpGolden, MatchesTransformers) {
  const GoldenCase& c = GetParam();
  const nlohmann::json g = testing::read_json(data("golden/" + c.golden + ".json"));
  const ModelWeights weights = load_model_weights(c.model_path);
  TpModel tp(weights, c.ranks);
  LlamaModel& model = *tp.model;
  ASSERT_EQ(model.tensor_parallel(), c.ranks);
  const KvCacheShape kv = model.kv_shape(256, 16);
  EXPECT_EQ(kv.num_kv_heads, std::max<int64_t>(1, weights.config.num_kv_heads / c.ranks));
  model.allocate_kv(kv);

  const std::vector<int32_t> ids = g["input_ids"].get<std::vector<int32_t>>();
  DirectBatch batch(256, 16, /*seed=*/7);
  const int seq = batch.add_sequence();
  ForwardOutput out;
  model.forward(batch.step({{seq, ids, true}}), &out);
  const int64_t vocab = model.config().vocab_size;
  const auto ref = g["logits"].get<std::vector<std::vector<float>>>();
  ASSERT_EQ(out.logits.size(), ids.size() * vocab);
  double worst = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    const double err = testing::row_rel_error(out.logits.data() + r * vocab, ref[r]);
    worst = std::max(worst, err);
    EXPECT_LE(err, 1e-4) << c.golden << " at " << c.ranks << " ranks, row " << r;
  }
  std::printf("%s, %d ranks: worst relative logit error %.3g\n", c.golden.c_str(), c.ranks, worst);
  const auto prompt = g["greedy_prompt"].get<std::vector<int32_t>>();
  const auto expect = g["greedy_tokens"].get<std::vector<int32_t>>();
  const int n = static_cast<int>(std::min<size_t>(expect.size(), 64));
  EXPECT_EQ(greedy(model, prompt, n), std::vector<int32_t>(expect.begin(), expect.begin() + n));
}

std::vector<GoldenCase> golden_cases() {
  std::vector<GoldenCase> out;
  // 4 query heads; 2 KV heads (1 per rank at 2, replicated at 4), 1 (mistral: replicated),
  // tied embeddings, biases (qwen2), llama3 RoPE.
  for (const char* m :
       {"llama_gqa", "llama_tied_bf16", "llama3_rope_f16", "mistral_sharded", "qwen2"})
    for (int ranks : {2, 4}) out.push_back({m, data(std::string("models/") + m), ranks});
  out.push_back({"stories260K", stories(), 2});
  out.push_back({"stories260K", stories(), 4});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Models, TpGolden, ::testing::ValuesIn(golden_cases()),
                         [](const auto& info) {
                           return info.param.golden + "_tp" + std::to_string(info.param.ranks);
                         });

// A vocabulary of 317 on 2 ranks: shards of 159 rows, the last padded by one.
TEST(TensorParallel, VocabularyThatDoesNotDivide) {
  ModelWeights w = load_model_weights(data("models/llama_gqa"));
  const int64_t vocab = 317, hidden = w.config.hidden_size;
  w.config.vocab_size = vocab;
  w.embed.shape = {vocab, hidden};
  w.embed.data.resize(static_cast<size_t>(vocab * hidden));
  w.lm_head.shape = {vocab, hidden};
  w.lm_head.data.resize(static_cast<size_t>(vocab * hidden));
  TpModel one(w, 1), two(w, 2);
  const std::vector<int32_t> prompt = {1, 300, 316, 7, 250, 9, 300, 316};
  for (TpModel* m : {&one, &two}) m->model->allocate_kv(m->model->kv_shape(256, 16));
  DirectBatch b1(256, 16, 5), b2(256, 16, 5);
  ForwardOutput o1, o2;
  one.model->forward(b1.step({{b1.add_sequence(), prompt, true}}), &o1);
  two.model->forward(b2.step({{b2.add_sequence(), prompt, true}}), &o2);
  ASSERT_EQ(o1.logits.size(), prompt.size() * vocab);
  ASSERT_EQ(o2.logits.size(), o1.logits.size());
  for (size_t r = 0; r < prompt.size(); ++r) {
    const std::vector<float> ref(o1.logits.begin() + r * vocab,
                                 o1.logits.begin() + (r + 1) * vocab);
    EXPECT_LE(testing::row_rel_error(o2.logits.data() + r * vocab, ref), 1e-5) << "row " << r;
  }
  EXPECT_EQ(greedy(*two.model, prompt, 24), greedy(*one.model, prompt, 24));
}

// Speculation on 2 ranks: the verify forward is sharded, the drafts come from rank 0 (the
// heads read rank 0's final hidden states, which the all-reduce made whole). Greedy output
// equals one rank's plain greedy output.
TEST(TensorParallel, SpeculativeGreedyEqualsPlain) {
  const ModelWeights w = load_model_weights(stories());
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.prompt = {1};
    for (int k = 0; k < 10 + 7 * i; ++k) r.prompt.push_back(3 + (k * (5 + i)) % 40);
    r.sampling.temperature = 0;
    r.max_tokens = 96;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  GeneratorConfig gc;
  gc.num_blocks = 256;
  gc.block_size = 16;
  gc.max_step_tokens = 96;
  TpModel plain(w, 1);
  Generator plain_gen(*plain.model, gc);
  const auto expect = plain_gen.run(reqs);
  for (const auto& [method, heads] :
       std::vector<std::pair<std::string, std::string>>{{"", ""},
                                                        {"ngram", ""},
                                                        {"medusa", "heads/stories260K/medusa"},
                                                        {"eagle", "heads/stories260K/eagle"},
                                                        {"eagle3", "heads/stories260K/eagle3"}}) {
    std::unique_ptr<Proposer> proposer;
    if (!method.empty()) {
      SpecConfig sc;
      sc.method = parse_spec_method(method);
      if (!heads.empty()) {
        sc.head_path = data(heads);
        ASSERT_TRUE(std::filesystem::exists(sc.head_path)) << sc.head_path;
      }
      proposer = make_proposer(sc, w);
    }
    TpModel tp(w, 2);
    Generator gen(*tp.model, gc, proposer.get());
    const auto got = gen.run(reqs);
    AcceptanceStats total;
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(got[i].tokens, expect[i].tokens)
          << (method.empty() ? "plain" : method) << " request " << i;
      total.steps += got[i].acceptance.steps;
      total.emitted += got[i].acceptance.emitted;
    }
    EXPECT_EQ(gen.kv().stats().used_blocks, 0);
    if (!method.empty()) {
      std::printf("%s on 2 ranks: %.2f tokens per step\n", method.c_str(),
                  total.mean_emitted_per_step());
      EXPECT_GT(total.mean_emitted_per_step(), 1.1) << method;
    }
  }
}

template <typename F>
std::string error_of(F&& f) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST(TensorParallel, SplitsThatDoNotWorkAreErrors) {
  const ModelWeights w = load_model_weights(data("models/llama_gqa"));  // 4 / 2 heads, FFN 96
  EXPECT_NE(error_of([&] { TpModel m(w, 3); }).find("num_heads 4 is not divisible by 3"),
            std::string::npos);
  ModelWeights odd = w;
  odd.config.intermediate_size = 95;
  for (auto& l : odd.layers) {
    l.w_gate.shape[0] = l.w_up.shape[0] = 95;
    l.w_down.shape[1] = 95;
  }
  EXPECT_NE(error_of([&] { TpModel m(odd, 2); }).find("intermediate_size 95"), std::string::npos);
  ModelWeights three_kv = load_model_weights(data("models/llama_gqa"));
  three_kv.config.num_heads = 12;
  three_kv.config.num_kv_heads = 3;
  three_kv.config.head_dim = 16;
  EXPECT_NE(error_of([&] { TpModel m(three_kv, 2); }).find("num_kv_heads 3"), std::string::npos);
  // Backends of another group size than the ranks given.
  auto group = make_cpu_tp_backends(2, 1);
  EXPECT_NE(error_of([&] { LlamaModel m(*group[0], w); }).find("rank 0 of 2"), std::string::npos);
  EXPECT_NE(error_of([&] { make_cpu_tp_backends(0, 1); }).find("tensor parallel size 0"),
            std::string::npos);
}

}  // namespace
}  // namespace arbor
