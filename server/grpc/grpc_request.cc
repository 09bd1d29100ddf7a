#include "server/grpc/grpc_request.h"

#include <algorithm>

#include <nlohmann/json.hpp>

namespace arbor {

namespace pb = ::arbor::v1;

namespace {

grpc::Status invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

grpc::Status check_model(const std::string& model, const std::string& served) {
  if (model.empty() || model == served) return grpc::Status::OK;
  return grpc::Status(
      grpc::StatusCode::NOT_FOUND,
      "model '" + model.substr(0, 256) + "' does not exist; this server serves '" + served + "'");
}

// The fields GenerateRequest and ChatRequest share (same names, numbers and meanings) but
// max_tokens, whose default differs: sampling, choices, logprobs, stop strings, speculation.
// Unset fields take the proto's documented defaults.
template <class Request>
grpc::Status convert_options(const Request& req, ServiceRequest* out, bool* speculate_requested) {
  GenerationRequest& g = out->gen;
  SamplingParams& s = g.sampling;
  s.temperature = req.has_temperature() ? req.temperature() : 1.0f;
  s.top_p = req.has_top_p() ? req.top_p() : 1.0f;
  s.top_k = req.top_k();
  s.min_p = req.min_p();
  s.presence_penalty = req.presence_penalty();
  s.frequency_penalty = req.frequency_penalty();
  s.repetition_penalty = req.has_repetition_penalty() ? req.repetition_penalty() : 1.0f;
  s.seed.reset();
  if (req.has_seed()) s.seed = req.seed();
  s.logit_bias.assign(req.logit_bias().begin(), req.logit_bias().end());
  std::sort(s.logit_bias.begin(), s.logit_bias.end());  // a proto map has no order

  g.n = req.has_n() ? req.n() : 1;
  g.logprobs = req.has_logprobs() ? req.logprobs() : -1;
  // -1 is "none" internally; on the wire an explicit -1 is a bad value, as over HTTP.
  if (req.has_logprobs() && req.logprobs() < 0)
    return invalid("'logprobs' must be in [0, 20], got " + std::to_string(req.logprobs()));
  g.ignore_eos = req.ignore_eos();
  g.speculate = !req.has_speculate() || req.speculate();
  *speculate_requested = req.has_speculate() && req.speculate();
  out->stop.assign(req.stop().begin(), req.stop().end());
  out->skip_special = true;
  return grpc::Status::OK;
}

}  // namespace

grpc::Status convert_generate_request(const pb::GenerateRequest& req, const RequestContext& ctx,
                                      ServiceRequest* out, bool* speculate_requested) {
  if (grpc::Status s = check_model(req.model(), ctx.model_id); !s.ok()) return s;
  const Tokenizer& tok = *ctx.tokenizer;
  GenerationRequest& g = out->gen;
  switch (req.prompt_case()) {
    case pb::GenerateRequest::kText:
      if (req.text().empty()) return invalid("prompt: 'text' is empty");
      g.prompt = tok.encode(req.text(), !req.has_add_bos() || req.add_bos(),
                            /*parse_special=*/true);
      break;
    case pb::GenerateRequest::kTokenIds:
      // Vocabulary checks are check_request()'s.
      g.prompt.assign(req.token_ids().ids().begin(), req.token_ids().ids().end());
      break;
    default:
      return invalid("prompt: set 'text' or 'token_ids'");
  }
  g.max_tokens = req.has_max_tokens() ? req.max_tokens() : kGrpcDefaultMaxTokens;
  return convert_options(req, out, speculate_requested);
}

grpc::Status convert_chat_request(const pb::ChatRequest& req, const ApiContext& ctx,
                                  ServiceRequest* out, bool* speculate_requested) {
  if (grpc::Status s = check_model(req.model(), ctx.model_id); !s.ok()) return s;
  if (!ctx.chat_template)
    return grpc::Status(grpc::StatusCode::FAILED_PRECONDITION,
                        "this model has no chat template (serve it with --chat-template FILE); "
                        "use Generate");
  if (req.messages().empty()) return invalid("'messages' must hold at least one message");
  // The prompt comes from the HTTP chat path, not a copy of it: the messages (and max_tokens,
  // whose default depends on the rendered prompt's length) as the JSON body
  // /v1/chat/completions would get, through parse_openai_request(). That checks each message
  // (roles, fields), renders the template and tokenizes the text as HTTP chat does, with its
  // error messages ("'messages[1].role' must be system, developer, user or assistant, ...").
  // Every other field is converted from the proto as for Generate.
  nlohmann::json messages = nlohmann::json::array();
  for (const pb::ChatMessage& m : req.messages()) {
    nlohmann::json message = {{"role", m.role()}, {"content", m.content()}};
    if (m.has_name()) message["name"] = m.name();
    messages.push_back(std::move(message));
  }
  nlohmann::json body = {{"messages", std::move(messages)}};
  if (req.has_max_tokens()) body["max_tokens"] = req.max_tokens();
  try {
    ParsedRequest parsed = parse_openai_request(body, /*chat=*/true, ctx);
    out->gen.prompt = std::move(parsed.requests.at(0).gen.prompt);
    out->gen.max_tokens = parsed.requests.at(0).gen.max_tokens;
  } catch (const ApiError& e) {
    // The body holds messages and max_tokens only, so a refusal is about one of them (400);
    // anything else would be a bug here.
    return grpc::Status(
        e.status == 400 ? grpc::StatusCode::INVALID_ARGUMENT : grpc::StatusCode::INTERNAL,
        e.what());
  }
  return convert_options(req, out, speculate_requested);
}

}  // namespace arbor
