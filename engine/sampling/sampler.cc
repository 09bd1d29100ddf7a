#include "engine/sampling/sampler.h"

#include <cmath>
#include <string>

#include "engine/core/error.h"
#include "engine/sampling/logits_processors.h"

namespace arbor {

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  params_.validate();
}

Rng Sampler::make_rng() const {
  return Rng(params_.seed ? *params_.seed : Rng::random_seed());
}

void Sampler::process_logits(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                             std::span<const int32_t> output_tokens) const {
  apply_logit_bias(logits, params_.logit_bias);
  apply_repetition_penalty(logits, params_.repetition_penalty, prompt_tokens, output_tokens);
  apply_presence_frequency_penalty(logits, params_.presence_penalty, params_.frequency_penalty,
                                   output_tokens);
  if (params_.greedy()) return;
  apply_temperature(logits, params_.temperature);
  apply_top_k(logits, params_.top_k);
  apply_top_p(logits, params_.top_p);
  apply_min_p(logits, params_.min_p);
}

std::vector<float> Sampler::probs(std::span<const float> logits,
                                  std::span<const int32_t> prompt_tokens,
                                  std::span<const int32_t> output_tokens) const {
  std::vector<float> work(logits.begin(), logits.end());
  process_logits(work, prompt_tokens, output_tokens);
  if (params_.greedy()) {
    const int32_t best = argmax(work);
    std::vector<float> one_hot(work.size(), 0.0f);
    one_hot[static_cast<size_t>(best)] = 1.0f;
    return one_hot;
  }
  return softmax(work);
}

int32_t Sampler::sample_token(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                              std::span<const int32_t> output_tokens, Rng& rng) const {
  if (params_.greedy()) {
    std::vector<float> work(logits.begin(), logits.end());
    process_logits(work, prompt_tokens, output_tokens);
    return argmax(work);
  }
  return sample(probs(logits, prompt_tokens, output_tokens), rng);
}

int32_t Sampler::sample(std::span<const float> probs, Rng& rng) {
  double total = 0.0;
  int32_t last_positive = -1;
  for (size_t i = 0; i < probs.size(); ++i) {
    if (!(probs[i] >= 0.0f) || std::isinf(probs[i]))
      throw_error(ErrorCode::kInvalidArgument,
                  "probability of token " + std::to_string(i) + " is " + std::to_string(probs[i]));
    total += probs[i];
    if (probs[i] > 0.0f) last_positive = static_cast<int32_t>(i);
  }
  if (last_positive < 0)
    throw_error(ErrorCode::kInvalidArgument,
                "cannot sample from " + std::to_string(probs.size()) + " zero probabilities");
  const double target = rng.uniform() * total;
  double cumulative = 0.0;
  for (int32_t i = 0; i < last_positive; ++i) {
    cumulative += probs[i];
    if (target < cumulative) return i;  // zero-probability tokens never satisfy this
  }
  return last_positive;  // also absorbs rounding when target lands at the very top
}

}  // namespace arbor
