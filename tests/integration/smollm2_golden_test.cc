// SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to fp32 at load) against Hugging Face
// transformers reading the same GGUF (also dequantized to fp32): per-position argmax, logits at
// 256 fixed vocabulary ids, the full last row, and 32 greedy tokens after a chat prompt.
// Both sides compute in fp32 on identical dequantized weights, so the tolerance is the fp32
// one: 1e-4 relative (max |diff| / max |ref|).
#include <gtest/gtest.h>

#include "engine/backend/backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "tests/common/direct_batch.h"
#include "tests/common/golden.h"

namespace arbor {
namespace {

constexpr double kRelTol = 1e-4;

std::string gguf_path() {
  return std::string(ARBOR_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}

TEST(SmolLM2Golden, LogitsAndGreedyMatchTransformers) {
  const nlohmann::json g =
      testing::read_json(std::string(ARBOR_TEST_DATA_DIR) + "/golden/smollm2.json");
  const ModelWeights weights = load_model_weights(gguf_path());
  auto backend = make_cpu_backend();
  LlamaModel model(*backend, weights);
  backend->allocate_kv(model.kv_shape(64, 16));
  const int64_t vocab = model.config().vocab_size;

  const auto ids = g["input_ids"].get<std::vector<int32_t>>();
  testing::DirectBatch batch(64, 16, 5);
  const int seq = batch.add_sequence();
  ForwardOutput out;
  model.forward(batch.step({{seq, ids, true}}), &out);
  const auto subset = g["vocab_subset"].get<std::vector<int32_t>>();
  const auto subset_ref = g["subset_logits"].get<std::vector<std::vector<float>>>();
  const auto argmax_ref = g["argmax"].get<std::vector<int32_t>>();
  const auto row_max = g["row_max"].get<std::vector<float>>();
  double worst = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    const float* row = out.logits.data() + r * vocab;
    EXPECT_EQ(testing::argmax(row, vocab), argmax_ref[r]) << "row " << r;
    double max_diff = 0, max_ref = std::fabs(row_max[r]);
    for (size_t k = 0; k < subset.size(); ++k) {
      max_diff = std::max(max_diff, std::fabs(double(row[subset[k]]) - subset_ref[r][k]));
      max_ref = std::max(max_ref, std::fabs(double(subset_ref[r][k])));
    }
    worst = std::max(worst, max_diff / max_ref);
  }
  const auto last = g["last_logits"].get<std::vector<float>>();
  ASSERT_EQ(static_cast<int64_t>(last.size()), vocab);
  worst =
      std::max(worst, testing::row_rel_error(out.logits.data() + (ids.size() - 1) * vocab, last));
  std::printf("smollm2: worst relative logit error %.3g\n", worst);
  EXPECT_LE(worst, kRelTol);

  const auto prompt = g["greedy_prompt"].get<std::vector<int32_t>>();
  const auto expect = g["greedy_tokens"].get<std::vector<int32_t>>();
  testing::DirectBatch gen(64, 16, 9);
  const int s2 = gen.add_sequence();
  model.forward(gen.step({{s2, prompt, false}}), &out);
  std::vector<int32_t> got;
  for (size_t i = 0; i < expect.size(); ++i) {
    got.push_back(testing::argmax(out.logits.data(), vocab));
    if (i + 1 < expect.size()) model.forward(gen.step({{s2, {got.back()}, false}}), &out);
  }
  EXPECT_EQ(got, expect);
}

}  // namespace
}  // namespace arbor
