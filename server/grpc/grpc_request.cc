#include "server/grpc/grpc_request.h"

#include <algorithm>

namespace arbor {

namespace pb = ::arbor::v1;

grpc::Status convert_generate_request(const pb::GenerateRequest& req, const RequestContext& ctx,
                                      ServiceRequest* out, bool* speculate_requested) {
  auto invalid = [](const std::string& message) {
    return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
  };
  if (!req.model().empty() && req.model() != ctx.model_id)
    return grpc::Status(grpc::StatusCode::NOT_FOUND, "model '" + req.model().substr(0, 256) +
                                                         "' does not exist; this server serves '" +
                                                         ctx.model_id + "'");
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

  SamplingParams& s = g.sampling;
  s.temperature = req.has_temperature() ? req.temperature() : 1.0f;
  s.top_p = req.has_top_p() ? req.top_p() : 1.0f;
  s.top_k = req.top_k();
  s.min_p = req.min_p();
  s.presence_penalty = req.presence_penalty();
  s.frequency_penalty = req.frequency_penalty();
  s.repetition_penalty = req.has_repetition_penalty() ? req.repetition_penalty() : 1.0f;
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

}  // namespace arbor
