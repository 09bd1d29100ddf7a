// Per-request sampling settings, with the OpenAI / vLLM field names and meanings, and their
// validation at the API boundary. The processors that apply them are logits_processors.h; the
// order they run in is Sampler's.
#pragma once

#include <cstdint>
#include <optional>
#include <utility>
#include <vector>

namespace arbor {

// Temperatures below this are greedy (vLLM's rule: dividing by a tiny temperature overflows).
inline constexpr float kGreedyTemperature = 1e-5f;

// logit_bias limits: OpenAI's bias range, and a bound on the entries of one request (each step
// applies every entry to every logits row of the request).
inline constexpr float kMaxLogitBias = 100.0f;
inline constexpr int32_t kMaxLogitBiasEntries = 1024;

struct SamplingParams {
  float temperature = 1.0f;  // >= 0; 0 (below kGreedyTemperature) = greedy argmax
  int32_t top_k = 0;         // keep the k largest logits (ties with the k-th kept); 0, -1 = off
  float top_p = 1.0f;        // (0, 1]: keep the smallest top set holding >= top_p mass
  float min_p = 0.0f;        // [0, 1]: drop tokens with prob < min_p * max prob
  float repetition_penalty = 1.0f;  // > 0 (HF/CTRL): seen tokens' logits / r if > 0, * r if < 0
  float presence_penalty = 0.0f;    // [-2, 2] (OpenAI): minus once for a token in the output
  float frequency_penalty = 0.0f;   // [-2, 2] (OpenAI): minus per occurrence in the output
  std::optional<uint64_t> seed;     // per-request RNG seed; none = drawn from std::random_device
  // (token id, bias) sorted by id, unique ids; bias in [-100, 100] (OpenAI), added to the raw
  // logit before every other processor (vLLM v1 and HF generate's order).
  std::vector<std::pair<int32_t, float>> logit_bias;

  bool greedy() const { return temperature < kGreedyTemperature; }
  // Throws kInvalidArgument naming the field and its value ("top_p must be in (0, 1], got 1.5";
  // "logit_bias bias for token 5 is 150, must be in [-100, 100]"). logit_bias ids are not
  // checked against the vocabulary here (the server knows it); the sampler and the device path
  // throw kInvalidArgument for an id >= vocab.
  void validate() const;
};

}  // namespace arbor
