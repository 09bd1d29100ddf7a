#include "server/request_limits.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

#include "server/engine_service.h"

namespace arbor {

namespace {

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

[[noreturn]] void refuse(const std::string& param, const std::string& message,
                         const std::string& code = "") {
  throw RequestError(param, message, code);
}

// `name` in [lo, hi] (NaN never is).
void check_range(const char* name, double v, double lo, double hi) {
  if (!(v >= lo && v <= hi))
    refuse(name, std::string("'") + name + "' must be in [" + num(lo) + ", " + num(hi) + "], got " +
                     num(v));
}

void check_sampling(const SamplingParams& s, const RequestLimits& limits) {
  check_range("temperature", s.temperature, 0.0, 2.0);
  if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
    refuse("top_p", "'top_p' must be in (0, 1], got " + num(s.top_p));
  if (s.top_k < -1)
    refuse("top_k", "'top_k' must be -1 or 0 (off) or positive, got " + std::to_string(s.top_k));
  check_range("min_p", s.min_p, 0.0, 1.0);
  check_range("presence_penalty", s.presence_penalty, -2.0, 2.0);
  check_range("frequency_penalty", s.frequency_penalty, -2.0, 2.0);
  if (!(s.repetition_penalty > 0.0f) || !std::isfinite(s.repetition_penalty))
    refuse("repetition_penalty",
           "'repetition_penalty' must be positive and finite, got " + num(s.repetition_penalty));
  if (static_cast<int64_t>(s.logit_bias.size()) > limits.max_logit_bias)
    refuse("logit_bias", "'logit_bias' holds at most " + std::to_string(limits.max_logit_bias) +
                             " entries, got " + std::to_string(s.logit_bias.size()));
  for (size_t i = 0; i < s.logit_bias.size(); ++i) {
    const auto [id, bias] = s.logit_bias[i];
    if (id < 0 || id >= limits.vocab_size)
      refuse("logit_bias", "'logit_bias' token id " + std::to_string(id) +
                               " is outside the vocabulary of " +
                               std::to_string(limits.vocab_size));
    if (i > 0 && s.logit_bias[i - 1].first >= id)
      refuse("logit_bias", "'logit_bias' names token id " + std::to_string(id) + " twice");
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias))
      refuse("logit_bias", "'logit_bias' bias for token " + std::to_string(id) + " is " +
                               num(bias) + ", must be in [-100, 100]");
  }
}

}  // namespace

void check_request(const std::vector<ServiceRequest>& requests, const RequestLimits& limits,
                   bool speculate_requested) {
  if (requests.empty()) refuse("prompt", "no prompt given");
  const int64_t prompts = static_cast<int64_t>(requests.size());
  if (prompts > limits.max_prompts)
    refuse("prompt", "at most " + std::to_string(limits.max_prompts) +
                         " prompts per request, got " + std::to_string(prompts));
  const int64_t max_ctx = limits.max_context;
  const int64_t max_prompt =
      std::min(limits.max_prompt_tokens > 0 ? limits.max_prompt_tokens : max_ctx - 1, max_ctx - 1);
  for (size_t i = 0; i < requests.size(); ++i) {
    const ServiceRequest& r = requests[i];
    const GenerationRequest& g = r.gen;
    const std::string which = prompts > 1 ? " (prompt " + std::to_string(i) + ")" : "";

    if (g.n < 1 || g.n > limits.max_choices)
      refuse("n", "'n' must be in [1, " + std::to_string(limits.max_choices) + "], got " +
                      std::to_string(g.n));
    if (prompts * g.n > limits.max_sequences)
      refuse("n", "'n' x prompts must be at most " + std::to_string(limits.max_sequences) +
                      ", got " + std::to_string(g.n) + " x " + std::to_string(prompts));

    if (static_cast<int64_t>(r.stop.size()) > limits.max_stop)
      refuse("stop", "'stop' holds at most " + std::to_string(limits.max_stop) + " strings, got " +
                         std::to_string(r.stop.size()));
    for (size_t k = 0; k < r.stop.size(); ++k) {
      if (r.stop[k].empty()) refuse("stop", "'stop' strings must not be empty");
      if (static_cast<int64_t>(r.stop[k].size()) > limits.max_stop_bytes)
        refuse("stop", "'stop' strings are at most " + std::to_string(limits.max_stop_bytes) +
                           " bytes, stop[" + std::to_string(k) + "] has " +
                           std::to_string(r.stop[k].size()));
    }

    if (g.logprobs < -1 || g.logprobs > limits.max_logprobs)
      refuse("logprobs", "'logprobs' must be in [0, " + std::to_string(limits.max_logprobs) +
                             "], got " + std::to_string(g.logprobs));

    check_sampling(g.sampling, limits);
    if (speculate_requested && g.speculate && !limits.speculation_available)
      refuse("speculate", "speculation is not configured on this server (start it with --spec)");

    if (g.prompt.empty()) refuse("prompt", "the prompt is empty" + which);
    for (int32_t t : g.prompt)
      if (t < 0 || t >= limits.vocab_size)
        refuse("prompt", "token id " + std::to_string(t) + which +
                             " is outside the vocabulary of " + std::to_string(limits.vocab_size));
    const int64_t len = static_cast<int64_t>(g.prompt.size());
    if (len > max_prompt)
      refuse("prompt",
             "This model's maximum context length is " + std::to_string(max_ctx) +
                 " tokens and prompts are at most " + std::to_string(max_prompt) + "; your prompt" +
                 which + " has " + std::to_string(len) + " tokens",
             "context_length_exceeded");
    if (g.max_tokens < 1)
      refuse("max_tokens", "'max_tokens' must be at least 1, got " + std::to_string(g.max_tokens));
    if (len + g.max_tokens > max_ctx)
      refuse("max_tokens",
             "This model's maximum context length is " + std::to_string(max_ctx) +
                 " tokens; you requested " + std::to_string(len + g.max_tokens) + " (" +
                 std::to_string(len) + " in the prompt" + which + ", " +
                 std::to_string(g.max_tokens) +
                 " for the completion); reduce the prompt or max_tokens",
             "context_length_exceeded");
  }
}

}  // namespace arbor
