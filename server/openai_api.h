// The OpenAI wire format: request bodies of /v1/completions and /v1/chat/completions parsed
// and validated into ServiceRequests (errors name the parameter, as OpenAI's do), and the
// response / stream-chunk / error bodies built from a RequestStream's output.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer.h"
#include "server/engine_service.h"

namespace arbor {

class ChatTemplate;

// An error with its HTTP status and OpenAI error fields.
class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string type = "invalid_request_error",
           std::string param = "", std::string code = "")
      : std::runtime_error(message),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
  int status;
  std::string type, param, code;
};

// {"error": {"message", "type", "param", "code"}}
nlohmann::json error_body(const ApiError& e);
// arbor::Error -> ApiError (kInvalidArgument 400, kResourceExhausted 429, kUnsupported 503
// while draining, kNotFound 404, else 500).
ApiError to_api_error(const std::exception& e);

struct ApiContext {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: chat answers 400
  std::string model_id;
  int32_t max_context = 0;
  int32_t max_prompt_tokens = 0;     // 0: max_context - 1
  int32_t default_max_tokens = 256;  // chat (completions default to OpenAI's 16)
  bool speculation_available = false;
  bool add_bos = true;  // completions prompts (chat templates carry their own)
};

struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  std::string model;
  int32_t n = 1;
  // Completions: logprobs = k (-1 none). Chat: logprobs true -> top_logprobs (0..20).
  int32_t logprobs = -1;
  bool echo = false;
  std::vector<std::string> prompt_texts;  // completions with echo: the prompt texts
  std::vector<ServiceRequest> requests;   // one per prompt
};

// Throws ApiError (400 naming the parameter, 404 for an unknown model).
ParsedRequest parse_openai_request(const nlohmann::json& body, bool chat, const ApiContext& ctx);

// Response builders. `id` like "cmpl-..."/"chatcmpl-...", created = unix seconds.
struct ChoiceState {
  std::string text;
  std::vector<TokenLogprob> logprobs;
  std::string finish_reason;
};
nlohmann::json usage_json(const Usage& u);
nlohmann::json completion_response(const ParsedRequest& p, const std::string& id, int64_t created,
                                   const std::string& model, const std::vector<ChoiceState>& ch,
                                   const Usage& usage, const Tokenizer& tok);
// One streamed chunk for `delta` (chat: role in the first chunk of each choice).
nlohmann::json stream_chunk(const ParsedRequest& p, const std::string& id, int64_t created,
                            const std::string& model, const ChoiceDelta& delta, bool first,
                            const Tokenizer& tok);
// The final usage-only chunk (stream_options.include_usage).
nlohmann::json usage_chunk(const ParsedRequest& p, const std::string& id, int64_t created,
                           const std::string& model, const Usage& usage);
// Serializes (invalid UTF-8 in token strings replaced, never thrown).
std::string dump_json(const nlohmann::json& j);

}  // namespace arbor
