// Logits processors for one request on host fp32 logits ([vocab]), each matching a reference:
// Hugging Face transformers' SequenceBias (one-token sequences: OpenAI's logit_bias) /
// RepetitionPenalty / Temperature / TopK / TopP / MinP processors and OpenAI's presence /
// frequency penalties. Filtered tokens get -inf, as HF's warpers do.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
#include <vector>

namespace arbor {

// OpenAI logit_bias (HF SequenceBiasLogitsProcessor on one-token sequences, vLLM's
// LogitBiasLogitsProcessor): logit[id] += bias in fp32 for each (id, bias); a -inf logit stays
// -inf. Throws kInvalidArgument for an id outside [0, vocab) (before changing anything; HF and
// vLLM refuse such ids too).
void apply_logit_bias(std::span<float> logits, std::span<const std::pair<int32_t, float>> bias);

// HF RepetitionPenaltyLogitsProcessor: every distinct token in prompt or output has its logit
// divided by `penalty` if positive, multiplied if negative. Ids >= vocab are ignored (as HF does
// for an embedding larger than the LM head); negative ids throw kInvalidArgument.
void apply_repetition_penalty(std::span<float> logits, float penalty,
                              std::span<const int32_t> prompt_tokens,
                              std::span<const int32_t> output_tokens);

// OpenAI: logit[t] -= presence * (count[t] > 0) + frequency * count[t], counts over the
// generated tokens only.
void apply_presence_frequency_penalty(std::span<float> logits, float presence, float frequency,
                                      std::span<const int32_t> output_tokens);

// logits /= temperature (temperature > 0).
void apply_temperature(std::span<float> logits, float temperature);

// HF TopKLogitsWarper: keeps logits >= the k-th largest (so ties with it survive); k >= vocab or
// k <= 0 keeps everything.
void apply_top_k(std::span<float> logits, int32_t top_k);

// HF TopPLogitsWarper: keeps the tokens whose strictly-more-likely tokens hold < top_p of the
// probability (the smallest top set with mass >= top_p); always keeps the most likely token.
// Among equal logits the lower id counts as more likely.
void apply_top_p(std::span<float> logits, float top_p);

// HF MinPLogitsWarper: drops tokens with prob < min_p * max prob (keeps the most likely).
void apply_min_p(std::span<float> logits, float min_p);

// Softmax in double precision: [vocab] probabilities, exactly 0 where the logit is -inf. Throws
// kInvalidArgument for NaN or +inf logits, or when every logit is -inf.
std::vector<float> softmax(std::span<const float> logits);

// Index of the largest logit, the lowest index among ties (greedy decoding).
int32_t argmax(std::span<const float> logits);

}  // namespace arbor
