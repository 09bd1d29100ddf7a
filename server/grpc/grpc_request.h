// arbor.v1.GenerateRequest / ChatRequest -> ServiceRequest: the gRPC wire format's own rules
// (the model name, which prompt is set, proto defaults for unset fields). A chat's messages go
// through the HTTP chat path (server/openai_api.h): the same message checks, template rendering
// and default max_tokens. The content limits are check_request()'s (server/request_limits.h),
// applied by EngineService::submit() exactly as for the HTTP front end.
#pragma once

#include <string>

#include <grpcpp/support/status.h>

#include "arbor.pb.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/engine_service.h"
#include "server/openai_api.h"

namespace arbor {

struct RequestContext {
  const Tokenizer* tokenizer = nullptr;
  std::string model_id;  // GenerateRequest.model must be empty or this (else NOT_FOUND)
};

// Unset max_tokens: OpenAI completions' default.
inline constexpr int32_t kGrpcDefaultMaxTokens = 16;

// OK and `*out` filled, or the status to answer (INVALID_ARGUMENT naming the field, NOT_FOUND
// for another model). `*speculate_requested`: the request set `speculate: true`.
grpc::Status convert_generate_request(const arbor::v1::GenerateRequest& req,
                                      const RequestContext& ctx, ServiceRequest* out,
                                      bool* speculate_requested);

// The same for a chat: `ctx` is the HTTP front end's (tokenizer, chat template, model id,
// context and default_max_tokens). FAILED_PRECONDITION when the model has no chat template.
grpc::Status convert_chat_request(const arbor::v1::ChatRequest& req, const ApiContext& ctx,
                                  ServiceRequest* out, bool* speculate_requested);

}  // namespace arbor
