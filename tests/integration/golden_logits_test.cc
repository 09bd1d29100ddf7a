// The forward pass against Hugging Face transformers (scripts/make_golden_fixtures.py): fp32
// logits for every prompt position within 1e-4 relative (max |ours - ref| / max |ref| per
// row), and 32 greedy tokens identical, decoded one token per step through the paged cache.
#include <gtest/gtest.h>

#include "engine/backend/backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "tests/common/direct_batch.h"
#include "tests/common/golden.h"
#include "tests/common/model_runs.h"

namespace arbor {
namespace {

using testing::DirectBatch;

constexpr double kRelTol = 1e-4;

struct Case {
  std::string golden;      // tests/data/golden/<golden>.json
  std::string model_path;  // checkpoint
};

std::string data(const std::string& p) {
  return std::string(ARBOR_TEST_DATA_DIR) + "/" + p;
}

std::vector<Case> cases() {
  return {
      {"llama_gqa", data("models/llama_gqa")},
      {"llama_tied_bf16", data("models/llama_tied_bf16")},
      {"llama3_rope_f16", data("models/llama3_rope_f16")},
      {"mistral_sharded", data("models/mistral_sharded")},
      {"qwen2", data("models/qwen2")},
      {"stories260K", std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.bin"},
  };
}

class GoldenLogits : public ::testing::TestWithParam<Case> {};

TEST_P(GoldenLogits, MatchesTransformers) {
  const Case& c = GetParam();
  const nlohmann::json g = testing::read_json(data("golden/" + c.golden + ".json"));
  const ModelWeights weights = load_model_weights(c.model_path);
  auto backend = make_cpu_backend();
  LlamaModel model(*backend, weights);
  const int64_t block_size = 16;
  backend->allocate_kv(model.kv_shape(256, block_size));

  const std::vector<int32_t> ids = g["input_ids"].get<std::vector<int32_t>>();
  DirectBatch batch(256, block_size, /*seed=*/7);
  const int seq = batch.add_sequence();
  ForwardOutput out;
  model.forward(batch.step({{seq, ids, true}}), &out);
  const int64_t vocab = model.config().vocab_size;
  const auto ref = g["logits"].get<std::vector<std::vector<float>>>();
  ASSERT_EQ(ref.size(), ids.size());
  ASSERT_EQ(out.logits.size(), ids.size() * vocab);
  double worst = 0;
  for (size_t r = 0; r < ids.size(); ++r) {
    ASSERT_EQ(static_cast<int64_t>(ref[r].size()), vocab);
    const double err = testing::row_rel_error(out.logits.data() + r * vocab, ref[r]);
    worst = std::max(worst, err);
    EXPECT_LE(err, kRelTol) << c.golden << " row " << r;
  }
  RecordProperty("worst_rel_error", std::to_string(worst));
  std::printf("%s: worst relative logit error %.3g over %zu rows\n", c.golden.c_str(), worst,
              ids.size());

  const auto prompt = g["greedy_prompt"].get<std::vector<int32_t>>();
  const auto expect = g["greedy_tokens"].get<std::vector<int32_t>>();
  const int n = static_cast<int>(std::min<size_t>(expect.size(), 64));
  const std::vector<int32_t> got = testing::greedy_decode(model, prompt, n, block_size);
  EXPECT_EQ(got, std::vector<int32_t>(expect.begin(), expect.begin() + n));
}

INSTANTIATE_TEST_SUITE_P(Models, GoldenLogits, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.golden; });

}  // namespace
}  // namespace arbor
