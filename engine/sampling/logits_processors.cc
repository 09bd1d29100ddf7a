#include "engine/sampling/logits_processors.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <string>

#include "engine/core/error.h"

namespace arbor {

namespace {
constexpr float kFiltered = -std::numeric_limits<float>::infinity();

void check_token(int32_t token, const char* where) {
  if (token < 0)
    throw_error(ErrorCode::kInvalidArgument,
                std::string(where) + " holds negative token id " + std::to_string(token));
}

// Probabilities in double, for thresholds (no normalisation checks: callers validated).
std::vector<double> probabilities(std::span<const float> logits) {
  const float max_logit = *std::max_element(logits.begin(), logits.end());
  std::vector<double> p(logits.size());
  double total = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) {
    p[i] = logits[i] == kFiltered ? 0.0 : std::exp(double(logits[i]) - double(max_logit));
    total += p[i];
  }
  for (double& x : p) x /= total;
  return p;
}

void check_finite(std::span<const float> logits) {
  if (logits.empty()) throw_error(ErrorCode::kInvalidArgument, "empty logits");
  bool any = false;
  for (size_t i = 0; i < logits.size(); ++i) {
    if (std::isnan(logits[i]) || logits[i] == std::numeric_limits<float>::infinity())
      throw_error(ErrorCode::kInvalidArgument,
                  "logit of token " + std::to_string(i) + " is " + std::to_string(logits[i]));
    any = any || logits[i] != kFiltered;
  }
  if (!any) throw_error(ErrorCode::kInvalidArgument, "every logit is -inf");
}
}  // namespace

void apply_logit_bias(std::span<float> logits, std::span<const std::pair<int32_t, float>> bias) {
  const int64_t vocab = static_cast<int64_t>(logits.size());
  for (const auto& [token, value] : bias)
    if (token < 0 || token >= vocab)
      throw_error(ErrorCode::kInvalidArgument, "logit_bias token id " + std::to_string(token) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(vocab) + ")");
  for (const auto& [token, value] : bias) logits[static_cast<size_t>(token)] += value;
}

void apply_repetition_penalty(std::span<float> logits, float penalty,
                              std::span<const int32_t> prompt_tokens,
                              std::span<const int32_t> output_tokens) {
  if (penalty == 1.0f) return;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::vector<uint8_t> seen(logits.size(), 0);
  for (auto [tokens, where] : {std::pair{prompt_tokens, "prompt"}, {output_tokens, "output"}}) {
    for (int32_t t : tokens) {
      check_token(t, where);
      if (t < vocab) seen[t] = 1;
    }
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    if (!seen[i]) continue;
    logits[i] = logits[i] < 0.0f ? logits[i] * penalty : logits[i] / penalty;
  }
}

void apply_presence_frequency_penalty(std::span<float> logits, float presence, float frequency,
                                      std::span<const int32_t> output_tokens) {
  if (presence == 0.0f && frequency == 0.0f) return;
  const int64_t vocab = static_cast<int64_t>(logits.size());
  std::vector<int32_t> count(logits.size(), 0);
  for (int32_t t : output_tokens) {
    check_token(t, "output");
    if (t < vocab) ++count[t];
  }
  for (size_t i = 0; i < logits.size(); ++i) {
    if (count[i] == 0) continue;
    logits[i] -= presence + frequency * static_cast<float>(count[i]);
  }
}

void apply_temperature(std::span<float> logits, float temperature) {
  ARBOR_CHECK(temperature > 0.0f, "temperature " + std::to_string(temperature));
  if (temperature == 1.0f) return;
  for (float& x : logits) x /= temperature;
}

void apply_top_k(std::span<float> logits, int32_t top_k) {
  if (top_k <= 0 || static_cast<size_t>(top_k) >= logits.size()) return;
  std::vector<float> sorted(logits.begin(), logits.end());
  std::nth_element(sorted.begin(), sorted.begin() + (top_k - 1), sorted.end(), std::greater<>());
  const float kth = sorted[static_cast<size_t>(top_k - 1)];
  for (float& x : logits)
    if (x < kth) x = kFiltered;
}

void apply_top_p(std::span<float> logits, float top_p) {
  if (top_p >= 1.0f) return;
  check_finite(logits);
  const std::vector<double> p = probabilities(logits);
  std::vector<int32_t> order(logits.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  double above = 0.0;  // mass of the tokens before this one in descending order
  for (size_t r = 0; r < order.size(); ++r) {
    const int32_t i = order[r];
    if (r > 0 && above >= double(top_p)) logits[i] = kFiltered;
    above += p[i];
  }
}

void apply_min_p(std::span<float> logits, float min_p) {
  if (min_p <= 0.0f) return;
  check_finite(logits);
  const std::vector<double> p = probabilities(logits);
  const double threshold = double(min_p) * *std::max_element(p.begin(), p.end());
  for (size_t i = 0; i < logits.size(); ++i)
    if (p[i] < threshold) logits[i] = kFiltered;
}

std::vector<float> softmax(std::span<const float> logits) {
  check_finite(logits);
  const std::vector<double> p = probabilities(logits);
  return std::vector<float>(p.begin(), p.end());
}

int32_t argmax(std::span<const float> logits) {
  check_finite(logits);
  return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

}  // namespace arbor
