// The OpenAI wire format: request bodies of /v1/completions and /v1/chat/completions parsed
// and validated into ServiceRequests (errors name the parameter, as OpenAI's do), and the
// response / stream-chunk / error bodies built from a RequestStream's output.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
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
// RequestError -> 400 with its param and code; arbor::Error -> ApiError (kInvalidArgument 400,
// kResourceExhausted 429, kUnsupported 503 while draining, kNotFound 404, else 500).
ApiError to_api_error(const std::exception& e);

struct ApiContext {
  const Tokenizer* tokenizer = nullptr;
  const ChatTemplate* chat_template = nullptr;  // null: chat answers 400
  std::string model_id;
  int32_t max_context = 0;           // for chat's default max_tokens (limits: check_request())
  int32_t default_max_tokens = 256;  // chat (completions default to OpenAI's 16)
  bool add_bos = true;               // completions prompts (chat templates carry their own)
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
  bool speculate_requested = false;       // "speculate": true given explicitly
  std::vector<std::string> prompt_texts;  // completions with echo: the prompt texts
  std::vector<ServiceRequest> requests;   // one per prompt
};

// Request bodies nest at most this deep (arrays and objects); deeper ones are refused before
// the JSON parser or any recursive walk sees them.
inline constexpr int kMaxJsonDepth = 64;

// A request body as JSON: 400 (code "json_too_deep") when it nests deeper than `max_depth`,
// 400 when it is not JSON.
nlohmann::json parse_json_body(std::string_view body, int max_depth = kMaxJsonDepth);

// The wire format -> ServiceRequests: field types, integers as integers, fields this server
// does not implement refused by name. Throws ApiError (400 naming the parameter, 404 for an
// unknown model). The content limits are check_request()'s (EngineService::submit).
ParsedRequest parse_openai_request(const nlohmann::json& body, bool chat, const ApiContext& ctx);
// parse_json_body + parse_openai_request.
ParsedRequest parse_openai_body(std::string_view body, bool chat, const ApiContext& ctx);

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
