// The one place where a request's content is checked against the server's limits: context
// length, prompt length, choices and fan-out, stop strings, logprobs, sampling ranges and
// logit_bias. Both front ends (HTTP, gRPC) convert their wire format into ServiceRequests
// (types and integer ranges of their own encoding only) and EngineService::submit() calls
// check_request(), so the same request gets the same verdict and message on either.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/sampling/sampling_params.h"

namespace arbor {

struct ServiceRequest;

struct RequestLimits {
  int32_t max_context = 0;                        // prompt + max_tokens of one choice, at most
  int32_t max_prompt_tokens = 0;                  // 0: max_context - 1
  int32_t vocab_size = 0;                         // prompt / logit_bias token ids below it
  int32_t max_choices = 128;                      // n
  int32_t max_prompts = 64;                       // prompts of one completions request
  int32_t max_sequences = 256;                    // prompts x n
  int32_t max_stop = 16;                          // stop strings per request
  int32_t max_stop_bytes = 256;                   // bytes per stop string
  int32_t max_logprobs = 20;                      // top alternatives per token
  int32_t max_logit_bias = kMaxLogitBiasEntries;  // logit_bias entries
  bool speculation_available = false;             // `speculate: true` is refused without a proposer
};

// A request refused for its content: kInvalidArgument with the OpenAI parameter it names
// ("max_tokens", "stop", ...) and, where OpenAI has one, an error code
// ("context_length_exceeded"). HTTP answers 400 with `param`/`code`, gRPC INVALID_ARGUMENT
// with the same message.
class RequestError : public Error {
 public:
  RequestError(std::string param, const std::string& message, std::string code = "")
      : Error(ErrorCode::kInvalidArgument, message),
        param(std::move(param)),
        code(std::move(code)) {}
  std::string param, code;
};

// Throws RequestError for the first check `requests` (one per prompt, as submitted) fails.
// `speculate_requested`: the client asked for speculation explicitly.
void check_request(const std::vector<ServiceRequest>& requests, const RequestLimits& limits,
                   bool speculate_requested = false);

}  // namespace arbor
