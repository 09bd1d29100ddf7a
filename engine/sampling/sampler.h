// Turns one request's fp32 logits into its next token: logit bias, penalties, temperature, top-k,
// top-p, min-p (that order, as HF generate and vLLM apply them), then a seeded draw. probs()
// exposes the exact distribution plain decoding samples from, for the lossless speculative
// verifier.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling/rng.h"
#include "engine/sampling/sampling_params.h"

namespace arbor {

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);  // validates params

  const SamplingParams& params() const { return params_; }
  // The request's generator: seeded from params.seed, else from std::random_device.
  Rng make_rng() const;

  // In place on logits [vocab]: logit bias, repetition penalty (prompt + output tokens),
  // presence/frequency penalties (output tokens), then unless greedy: temperature, top-k, top-p,
  // min-p. Filtered tokens become -inf. Throws kInvalidArgument for a logit_bias id >= vocab.
  void process_logits(std::span<float> logits, std::span<const int32_t> prompt_tokens,
                      std::span<const int32_t> output_tokens) const;
  // The distribution to sample from: [vocab], 0 for filtered tokens, summing to 1. Greedy: one-hot
  // at the argmax of the biased and penalised logits (lowest id on ties).
  std::vector<float> probs(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                           std::span<const int32_t> output_tokens) const;
  // probs() then a draw (greedy: the argmax, consuming no randomness).
  int32_t sample_token(std::span<const float> logits, std::span<const int32_t> prompt_tokens,
                       std::span<const int32_t> output_tokens, Rng& rng) const;

  // One inverse-CDF draw from `probs` ([vocab], non-negative, positive sum; need not be
  // normalised): consumes exactly one rng.uniform(); never returns a zero-probability token.
  static int32_t sample(std::span<const float> probs, Rng& rng);

 private:
  SamplingParams params_;
};

}  // namespace arbor
