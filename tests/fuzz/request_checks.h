// What the two request targets (openai_request, grpc_request) share: the served model's context
// (SmolLM2's tokenizer and chat template, `arbor serve`'s default limits) and the check both
// front ends end in, EngineService::submit()'s check_request(). A request it accepts must keep
// the promises RequestLimits documents: prompt ids inside the vocabulary, prompt + max_tokens
// within the context, n and fan-out, stop strings, logprobs and logit_bias within bounds.
#pragma once

#include <string>
#include <vector>

#include "server/engine_service.h"
#include "server/request_limits.h"
#include "tests/fuzz/fuzz_util.h"

namespace arbor::fuzz {

inline RequestLimits served_limits(const Tokenizer& tok) {
  RequestLimits limits;
  limits.max_context = 8192;  // SmolLM2's context length
  limits.vocab_size = tok.vocab_size();
  return limits;
}

// Runs check_request; RequestError is the documented refusal. Accepted requests are checked
// against the limits here, independently of request_limits.cc.
inline void check_submitted(const std::vector<ServiceRequest>& requests,
                            const RequestLimits& limits, bool speculate_requested) {
  try {
    check_request(requests, limits, speculate_requested);
  } catch (const RequestError&) {
    return;
  }
  if (requests.empty() || static_cast<int64_t>(requests.size()) > limits.max_prompts)
    fail("check_request accepted " + std::to_string(requests.size()) + " prompts");
  for (const ServiceRequest& r : requests) {
    const GenerationRequest& g = r.gen;
    const int64_t len = static_cast<int64_t>(g.prompt.size());
    if (len == 0 || g.max_tokens < 1 || len + g.max_tokens > limits.max_context)
      fail("check_request accepted a prompt of " + std::to_string(len) +
           " tokens with max_tokens " + std::to_string(g.max_tokens) + " in a context of " +
           std::to_string(limits.max_context));
    for (int32_t t : g.prompt)
      if (t < 0 || t >= limits.vocab_size)
        fail("check_request accepted token id " + std::to_string(t));
    if (g.n < 1 || g.n > limits.max_choices ||
        static_cast<int64_t>(requests.size()) * g.n > limits.max_sequences)
      fail("check_request accepted n = " + std::to_string(g.n));
    if (g.logprobs < -1 || g.logprobs > limits.max_logprobs)
      fail("check_request accepted logprobs = " + std::to_string(g.logprobs));
    if (static_cast<int64_t>(r.stop.size()) > limits.max_stop)
      fail("check_request accepted " + std::to_string(r.stop.size()) + " stop strings");
    for (const std::string& s : r.stop)
      if (s.empty() || static_cast<int64_t>(s.size()) > limits.max_stop_bytes)
        fail("check_request accepted a stop string of " + std::to_string(s.size()) + " bytes");
    const SamplingParams& p = g.sampling;
    if (!(p.temperature >= 0 && p.temperature <= 2) || !(p.top_p > 0 && p.top_p <= 1) ||
        !(p.min_p >= 0 && p.min_p <= 1) || !(p.repetition_penalty > 0))
      fail("check_request accepted sampling parameters out of range");
    if (static_cast<int64_t>(p.logit_bias.size()) > limits.max_logit_bias)
      fail("check_request accepted " + std::to_string(p.logit_bias.size()) + " logit_bias entries");
    for (const auto& [id, bias] : p.logit_bias)
      if (id < 0 || id >= limits.vocab_size || !(bias >= -100 && bias <= 100))
        fail("check_request accepted logit_bias " + std::to_string(id) + ": " +
             std::to_string(bias));
  }
}

}  // namespace arbor::fuzz
