// Logits processors against Hugging Face transformers: tests/data/sampling/processors.json holds
// random fp32 logits pushed through HF's SequenceBias (OpenAI logit_bias) / RepetitionPenalty /
// Temperature / TopK / TopP / MinP processors (and OpenAI presence/frequency penalties in numpy),
// alone and chained in generate's order (scripts/make_sampling_fixtures.py). We compare the
// surviving token set exactly, the surviving logits and the renormalised probabilities within
// fp32 rounding. The logit bias is also checked against hand-computed values.
#include "engine/sampling/logits_processors.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/sampling/sampler.h"

namespace arbor {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

nlohmann::json load_fixture() {
  const std::string path = std::string(ARBOR_TEST_DATA_DIR) + "/sampling/processors.json";
  std::ifstream in(path);
  if (!in) {
    ADD_FAILURE() << "missing fixture " << path << " (run scripts/make_sampling_fixtures.py)";
    return {};
  }
  return nlohmann::json::parse(in);
}

SamplingParams params_of(const nlohmann::json& p) {
  SamplingParams s;
  s.temperature = p.value("temperature", 1.0f);
  s.top_k = p.value("top_k", 0);
  s.top_p = p.value("top_p", 1.0f);
  s.min_p = p.value("min_p", 0.0f);
  s.repetition_penalty = p.value("repetition_penalty", 1.0f);
  s.presence_penalty = p.value("presence_penalty", 0.0f);
  s.frequency_penalty = p.value("frequency_penalty", 0.0f);
  if (p.contains("logit_bias"))
    for (const auto& entry : p["logit_bias"])
      s.logit_bias.emplace_back(entry[0].get<int32_t>(), entry[1].get<float>());
  return s;
}

TEST(LogitsProcessors, MatchTransformers) {
  const nlohmann::json fixture = load_fixture();
  ASSERT_TRUE(fixture.contains("cases"));
  ASSERT_GE(fixture["cases"].size(), 20u);
  int bias_cases = 0, bias_and_penalty_cases = 0;
  for (const auto& c : fixture["cases"]) {
    if (c["params"].contains("logit_bias")) {
      ++bias_cases;
      bias_and_penalty_cases += c["params"].value("repetition_penalty", 1.0f) != 1.0f ||
                                c["params"].value("presence_penalty", 0.0f) != 0.0f ||
                                c["params"].value("frequency_penalty", 0.0f) != 0.0f;
    }
    SCOPED_TRACE(c["name"].get<std::string>());
    const Sampler sampler(params_of(c["params"]));
    const auto logits = c["logits"].get<std::vector<float>>();
    const auto prompt = c["prompt_tokens"].get<std::vector<int32_t>>();
    const auto output = c["output_tokens"].get<std::vector<int32_t>>();
    const auto kept = c["kept"].get<std::vector<int32_t>>();
    const auto kept_logits = c["kept_logits"].get<std::vector<float>>();
    const auto want_probs = c["probs"].get<std::vector<double>>();

    std::vector<float> processed = logits;
    sampler.process_logits(processed, prompt, output);
    std::vector<int32_t> survivors;
    for (size_t i = 0; i < processed.size(); ++i) {
      if (processed[i] != -kInf) survivors.push_back(static_cast<int32_t>(i));
    }
    ASSERT_EQ(survivors, kept);
    for (size_t k = 0; k < kept.size(); ++k) {
      const float got = processed[static_cast<size_t>(kept[k])];
      EXPECT_NEAR(got, kept_logits[k], 1e-6 * std::max(1.0f, std::fabs(kept_logits[k])))
          << "token " << kept[k];
    }
    const std::vector<float> probs = sampler.probs(logits, prompt, output);
    ASSERT_EQ(probs.size(), want_probs.size());
    double total = 0.0;
    for (size_t i = 0; i < probs.size(); ++i) {
      EXPECT_NEAR(probs[i], want_probs[i], 1e-6 + 1e-5 * want_probs[i]) << "token " << i;
      total += probs[i];
    }
    EXPECT_NEAR(total, 1.0, 1e-5);
  }
  EXPECT_GE(bias_cases, 10) << "the fixture predates logit_bias (re-run the script)";
  EXPECT_GE(bias_and_penalty_cases, 5);
}

TEST(LogitsProcessors, LogitBiasAddsToTheRawLogit) {
  std::vector<float> x = {1.0f, -2.0f, 0.5f, -kInf, 3.0f};
  const std::vector<std::pair<int32_t, float>> bias = {{0, 2.5f}, {2, -100.0f}, {3, 100.0f}};
  apply_logit_bias(x, bias);
  // 1 + 2.5; 0.5 - 100 in fp32; -inf stays -inf; untouched ids unchanged.
  EXPECT_EQ(x, (std::vector<float>{3.5f, -2.0f, -99.5f, -kInf, 3.0f}));
  apply_logit_bias(x, {});
  EXPECT_EQ(x, (std::vector<float>{3.5f, -2.0f, -99.5f, -kInf, 3.0f}));
}

TEST(LogitsProcessors, LogitBiasRefusesIdsOutsideTheVocabularyWithoutTouchingLogits) {
  for (int32_t bad : {5, 1 << 30, -1}) {
    std::vector<float> x = {1.0f, 2.0f, 3.0f, 4.0f, 5.0f};
    const std::vector<std::pair<int32_t, float>> bias = {{0, 1.0f}, {bad, 1.0f}};
    try {
      apply_logit_bias(x, bias);
      ADD_FAILURE() << "id " << bad << " accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::to_string(bad)), std::string::npos) << e.what();
    }
    EXPECT_EQ(x, (std::vector<float>{1.0f, 2.0f, 3.0f, 4.0f, 5.0f})) << "changed before the throw";
  }
}

TEST(LogitsProcessors, TopKKeepsTiesAndIgnoresOversizeK) {
  std::vector<float> x = {1.0f, 3.0f, 2.0f, 3.0f, 2.0f, 0.5f};
  apply_top_k(x, 3);  // the 3rd largest is 2.0, shared by ids 2 and 4
  EXPECT_EQ(x, (std::vector<float>{-kInf, 3.0f, 2.0f, 3.0f, 2.0f, -kInf}));
  std::vector<float> y = {1.0f, 2.0f};
  apply_top_k(y, 5);
  EXPECT_EQ(y, (std::vector<float>{1.0f, 2.0f}));
}

TEST(LogitsProcessors, TopPAndMinPAlwaysKeepTheMostLikelyToken) {
  std::vector<float> x = {0.0f, 10.0f, 0.0f};
  apply_top_p(x, 0.01f);
  EXPECT_EQ(x, (std::vector<float>{-kInf, 10.0f, -kInf}));
  std::vector<float> y = {0.0f, 0.0f, 0.0f};
  apply_min_p(y, 1.0f);  // all equal: all at the threshold, all kept
  EXPECT_EQ(y, (std::vector<float>{0.0f, 0.0f, 0.0f}));
}

TEST(LogitsProcessors, SoftmaxAndArgmaxRejectBadLogits) {
  EXPECT_THROW(softmax(std::vector<float>{}), Error);
  EXPECT_THROW(softmax(std::vector<float>{1.0f, std::nanf("")}), Error);
  EXPECT_THROW(softmax(std::vector<float>{1.0f, kInf}), Error);
  EXPECT_THROW(argmax(std::vector<float>{-kInf, -kInf}), Error);
  EXPECT_EQ(softmax(std::vector<float>{-kInf, 0.0f}), (std::vector<float>{0.0f, 1.0f}));
  EXPECT_EQ(argmax(std::vector<float>{1.0f, 5.0f, 2.0f, 5.0f}), 1);  // lowest id on ties
  std::vector<float> z = {1.0f, 2.0f};
  EXPECT_THROW(apply_repetition_penalty(z, 1.2f, std::vector<int32_t>{-1}, {}), Error);
}

}  // namespace
}  // namespace arbor
