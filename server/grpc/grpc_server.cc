#include "server/grpc/grpc_server.h"

#include <atomic>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <mutex>
#include <optional>
#include <vector>

#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#include "arbor.grpc.pb.h"
#include "engine/core/error.h"

namespace arbor {

namespace {

namespace pb = ::arbor::v1;

// Handler threads: one per in-flight call (synchronous API), so 64 concurrent streams plus
// unary calls and gRPC's pollers fit with room to spare. Beyond it gRPC answers
// RESOURCE_EXHAUSTED itself.
constexpr int kMaxThreads = 256;
// How often a waiting handler looks for a cancelled call.
constexpr auto kPollInterval = std::chrono::milliseconds(50);
// shutdown(): how long calls in flight may go on before gRPC cancels them.
constexpr auto kShutdownGrace = std::chrono::seconds(5);
constexpr int32_t kDefaultMaxTokens = 16;  // as OpenAI completions
constexpr int32_t kMaxLogprobs = 20;
constexpr int32_t kMaxChoices = 128;

grpc::Status invalid(const std::string& message) {
  return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, message);
}

// arbor::Error (and anything else thrown while handling a call) -> gRPC status.
grpc::Status to_status(const std::exception& ex) {
  const auto* e = dynamic_cast<const Error*>(&ex);
  if (!e) return grpc::Status(grpc::StatusCode::INTERNAL, ex.what());
  switch (e->code()) {
    case ErrorCode::kInvalidArgument:
      return grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, e->what());
    case ErrorCode::kResourceExhausted:
      return grpc::Status(grpc::StatusCode::RESOURCE_EXHAUSTED, e->what());
    case ErrorCode::kUnsupported:  // the service draining
      return grpc::Status(grpc::StatusCode::UNAVAILABLE, e->what());
    case ErrorCode::kNotFound:
      return grpc::Status(grpc::StatusCode::NOT_FOUND, e->what());
    default:
      return grpc::Status(grpc::StatusCode::INTERNAL, e->what());
  }
}

// Constant-time comparison: the time a wrong key takes says nothing about the right one.
bool same_secret(std::string_view a, std::string_view b) {
  if (a.size() != b.size()) return false;
  unsigned char diff = 0;
  for (size_t i = 0; i < a.size(); ++i) diff |= static_cast<unsigned char>(a[i] ^ b[i]);
  return diff == 0;
}

std::string fmt_float(float v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", static_cast<double>(v));
  return buf;
}

// `name` must lie in [lo, hi] (NaN never does).
std::optional<grpc::Status> check_range(const char* name, float v, float lo, float hi) {
  if (v >= lo && v <= hi) return std::nullopt;
  return invalid(std::string(name) + " must be in [" + fmt_float(lo) + ", " + fmt_float(hi) +
                 "], got " + fmt_float(v));
}

void fill_logprob(const Tokenizer& tok, const TokenLogprob& in, pb::TokenLogprob* out) {
  out->set_token(in.token);
  out->set_piece(tok.token_bytes(in.token));
  out->set_logprob(in.logprob);
  for (const auto& [id, lp] : in.top) {
    pb::TopLogprob* t = out->add_top();
    t->set_token(id);
    t->set_piece(tok.token_bytes(id));
    t->set_logprob(lp);
  }
}

void fill_usage(const Usage& in, pb::Usage* out) {
  out->set_prompt_tokens(in.prompt_tokens);
  out->set_completion_tokens(in.completion_tokens);
  out->set_cached_prompt_tokens(in.cached_prompt_tokens);
  out->set_accepted_draft_tokens(in.accepted_draft_tokens);
  out->set_decode_steps(in.decode_steps);
  out->set_mean_accepted_length(in.mean_accepted_length());
}

// Appends a delta's new text, tokens and logprobs to a choice (and its finish reason).
void append_delta(const Tokenizer& tok, const ChoiceDelta& d, pb::Choice* c) {
  c->set_index(d.index);
  c->mutable_text()->append(d.text);
  for (int32_t t : d.tokens) c->add_token_ids(t);
  for (const TokenLogprob& lp : d.logprobs) fill_logprob(tok, lp, c->add_logprobs());
  if (!d.finish_reason.empty()) c->set_finish_reason(d.finish_reason);
}

}  // namespace

// ---------------------------------------------------------------------------------------------
// The arbor.v1.Arbor service

class ArborService final : public pb::Arbor::Service {
 public:
  ArborService(EngineService& service, ServedModelInfo info, std::string api_key)
      : service_(service), info_(std::move(info)), api_key_(std::move(api_key)) {}

  void set_draining() { draining_ = true; }

  grpc::Status Generate(grpc::ServerContext* ctx, const pb::GenerateRequest* req,
                        pb::GenerateResponse* resp) override {
    std::shared_ptr<RequestStream> stream;
    if (grpc::Status s = begin(ctx, *req, &stream); !s.ok()) return s;
    resp->set_id(new_id());
    resp->set_model(info_.id);
    for (int32_t i = 0; i < stream->num_choices(); ++i) resp->add_choices()->set_index(i);
    const Tokenizer& tok = service_.tokenizer();
    while (true) {
      if (ctx->IsCancelled()) return cancelled(*stream);
      StreamUpdate u;
      if (!stream->next(&u, kPollInterval)) continue;
      for (const ChoiceDelta& d : u.deltas) append_delta(tok, d, resp->mutable_choices(d.index));
      if (!u.done) continue;
      if (!u.error.empty()) return grpc::Status(grpc::StatusCode::INTERNAL, u.error);
      fill_usage(u.usage, resp->mutable_usage());
      return grpc::Status::OK;
    }
  }

  grpc::Status GenerateStream(grpc::ServerContext* ctx, const pb::GenerateRequest* req,
                              grpc::ServerWriter<pb::GenerateStreamResponse>* writer) override {
    std::shared_ptr<RequestStream> stream;
    if (grpc::Status s = begin(ctx, *req, &stream); !s.ok()) return s;
    const std::string id = new_id();
    const Tokenizer& tok = service_.tokenizer();
    while (true) {
      if (ctx->IsCancelled()) return cancelled(*stream);
      StreamUpdate u;
      if (!stream->next(&u, kPollInterval)) continue;
      pb::GenerateStreamResponse msg;
      msg.set_id(id);
      // One entry per choice that advanced: an update may carry several deltas of a choice
      // (steps that ran while the client was reading).
      std::vector<int> entry(static_cast<size_t>(stream->num_choices()), -1);
      for (const ChoiceDelta& d : u.deltas) {
        if (d.text.empty() && d.tokens.empty() && d.logprobs.empty() && d.finish_reason.empty())
          continue;
        int& e = entry[static_cast<size_t>(d.index)];
        if (e < 0) {
          e = msg.choices_size();
          msg.add_choices();
        }
        append_delta(tok, d, msg.mutable_choices(e));
      }
      if (u.done && !u.error.empty()) {  // the engine failed: what it made, then the error
        if (msg.choices_size() > 0) writer->Write(msg);
        return grpc::Status(grpc::StatusCode::INTERNAL, u.error);
      }
      if (u.done) fill_usage(u.usage, msg.mutable_usage());
      if (msg.choices_size() == 0 && !u.done) continue;
      // A failed write means the client is gone: stop generating for it.
      if (!writer->Write(msg)) return cancelled(*stream);
      if (u.done) return grpc::Status::OK;
    }
  }

  grpc::Status Tokenize(grpc::ServerContext* ctx, const pb::TokenizeRequest* req,
                        pb::TokenizeResponse* resp) override {
    if (grpc::Status s = authorize(*ctx); !s.ok()) return s;
    if (grpc::Status s = check_model(req->model()); !s.ok()) return s;
    try {
      const Tokenizer& tok = service_.tokenizer();
      const std::vector<int32_t> ids =
          tok.encode(req->text(), !req->has_add_bos() || req->add_bos(),
                     !req->has_parse_special() || req->parse_special());
      for (int32_t id : ids) {
        resp->add_token_ids(id);
        resp->add_pieces(tok.token_bytes(id));
      }
      return grpc::Status::OK;
    } catch (const std::exception& e) {
      return to_status(e);
    }
  }

  grpc::Status GetModelInfo(grpc::ServerContext* ctx, const pb::ModelInfoRequest*,
                            pb::ModelInfo* resp) override {
    if (grpc::Status s = authorize(*ctx); !s.ok()) return s;
    const Tokenizer& tok = service_.tokenizer();
    resp->set_id(info_.id);
    resp->set_max_context(info_.max_context);
    resp->set_vocab_size(info_.vocab_size);
    resp->set_speculation(info_.speculation);
    resp->set_backend(info_.backend);
    resp->set_bos_id(tok.bos_id());
    resp->set_eos_id(tok.eos_id());
    resp->set_add_bos(tok.spec().add_bos && tok.bos_id() >= 0);
    return grpc::Status::OK;
  }

 private:
  grpc::Status authorize(const grpc::ServerContext& ctx) const {
    if (api_key_.empty()) return grpc::Status::OK;
    const auto [begin, end] = ctx.client_metadata().equal_range("authorization");
    for (auto it = begin; it != end; ++it) {
      const std::string_view value(it->second.data(), it->second.size());
      if (same_secret(value, "Bearer " + api_key_)) return grpc::Status::OK;
    }
    return grpc::Status(
        grpc::StatusCode::UNAUTHENTICATED,
        "missing or wrong API key: send the metadata 'authorization: Bearer <key>'");
  }

  grpc::Status check_model(const std::string& model) const {
    if (model.empty() || model == info_.id) return grpc::Status::OK;
    return grpc::Status(
        grpc::StatusCode::NOT_FOUND,
        "model '" + model + "' does not exist; this server serves '" + info_.id + "'");
  }

  // Authorizes, validates, converts and submits a generate call.
  grpc::Status begin(grpc::ServerContext* ctx, const pb::GenerateRequest& req,
                     std::shared_ptr<RequestStream>* stream) {
    if (grpc::Status s = authorize(*ctx); !s.ok()) return s;
    if (draining_)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the server is shutting down and takes no new requests");
    if (grpc::Status s = check_model(req.model()); !s.ok()) return s;
    try {
      ServiceRequest sr;
      if (grpc::Status s = to_service_request(req, &sr); !s.ok()) return s;
      std::vector<ServiceRequest> requests;
      requests.push_back(std::move(sr));
      *stream = service_.submit(std::move(requests));
      return grpc::Status::OK;
    } catch (const std::exception& e) {
      return to_status(e);
    }
  }

  // The HTTP side's rules (server/openai_api.cc), with messages naming the proto field.
  grpc::Status to_service_request(const pb::GenerateRequest& req, ServiceRequest* out) const {
    const Tokenizer& tok = service_.tokenizer();
    GenerationRequest& g = out->gen;
    switch (req.prompt_case()) {
      case pb::GenerateRequest::kText:
        if (req.text().empty()) return invalid("prompt: 'text' is empty");
        g.prompt = tok.encode(req.text(), !req.has_add_bos() || req.add_bos(),
                              /*parse_special=*/true);
        break;
      case pb::GenerateRequest::kTokenIds:
        if (req.token_ids().ids().empty()) return invalid("prompt: 'token_ids' is empty");
        for (int32_t id : req.token_ids().ids()) {
          if (id < 0 || id >= tok.vocab_size())
            return invalid("token id " + std::to_string(id) + " in 'token_ids' is outside the " +
                           "vocabulary of " + std::to_string(tok.vocab_size()));
          g.prompt.push_back(id);
        }
        break;
      default:
        return invalid("prompt: set 'text' or 'token_ids'");
    }

    g.max_tokens = req.has_max_tokens() ? req.max_tokens() : kDefaultMaxTokens;
    if (g.max_tokens < 1)
      return invalid("max_tokens must be at least 1, got " + std::to_string(g.max_tokens));
    const int64_t max_ctx = service_.max_context();
    const int64_t len = static_cast<int64_t>(g.prompt.size());
    if (len >= max_ctx)
      return invalid("the prompt has " + std::to_string(len) +
                     " tokens; this model's maximum context length is " + std::to_string(max_ctx) +
                     " (prompts at most " + std::to_string(max_ctx - 1) + ")");
    if (len + g.max_tokens > max_ctx)
      return invalid("max_tokens " + std::to_string(g.max_tokens) + " with a prompt of " +
                     std::to_string(len) + " tokens exceeds this model's maximum context length " +
                     "of " + std::to_string(max_ctx) + " tokens");

    SamplingParams& s = g.sampling;
    s.temperature = req.has_temperature() ? req.temperature() : 1.0f;
    s.top_p = req.has_top_p() ? req.top_p() : 1.0f;
    s.top_k = req.top_k();
    s.min_p = req.min_p();
    s.presence_penalty = req.presence_penalty();
    s.frequency_penalty = req.frequency_penalty();
    s.repetition_penalty = req.has_repetition_penalty() ? req.repetition_penalty() : 1.0f;
    if (req.has_seed()) s.seed = req.seed();
    if (auto e = check_range("temperature", s.temperature, 0.0f, 2.0f)) return *e;
    if (!(s.top_p > 0.0f && s.top_p <= 1.0f))
      return invalid("top_p must be in (0, 1], got " + fmt_float(s.top_p));
    if (s.top_k < -1)
      return invalid("top_k must be -1, 0 (off) or positive, got " + std::to_string(s.top_k));
    if (auto e = check_range("min_p", s.min_p, 0.0f, 1.0f)) return *e;
    if (auto e = check_range("presence_penalty", s.presence_penalty, -2.0f, 2.0f)) return *e;
    if (auto e = check_range("frequency_penalty", s.frequency_penalty, -2.0f, 2.0f)) return *e;
    if (!(s.repetition_penalty > 0.0f) || std::isinf(s.repetition_penalty))
      return invalid("repetition_penalty must be positive, got " + fmt_float(s.repetition_penalty));
    s.validate();  // the engine's own rules (kInvalidArgument)

    g.n = req.has_n() ? req.n() : 1;
    if (g.n < 1 || g.n > kMaxChoices)
      return invalid("n must be in [1, " + std::to_string(kMaxChoices) + "], got " +
                     std::to_string(g.n));
    g.logprobs = req.has_logprobs() ? req.logprobs() : -1;
    if (req.has_logprobs() && (g.logprobs < 0 || g.logprobs > kMaxLogprobs))
      return invalid("logprobs must be in [0, " + std::to_string(kMaxLogprobs) + "], got " +
                     std::to_string(g.logprobs));
    g.ignore_eos = req.ignore_eos();
    g.speculate = !req.has_speculate() || req.speculate();
    if (req.has_speculate() && req.speculate() && !speculation_available())
      return invalid(
          "speculate: speculation is not configured on this server (start it with "
          "--spec)");
    for (int i = 0; i < req.stop_size(); ++i) {
      if (req.stop(i).empty()) return invalid("stop[" + std::to_string(i) + "] is empty");
      out->stop.push_back(req.stop(i));
    }
    out->skip_special = true;
    return grpc::Status::OK;
  }

  bool speculation_available() const {
    return !info_.speculation.empty() && info_.speculation != "off";
  }

  // The client cancelled or its deadline passed (or the server shut down): stop generating.
  static grpc::Status cancelled(RequestStream& stream) {
    stream.cancel();
    return grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
  }

  std::string new_id() {
    char buf[32];
    std::snprintf(buf, sizeof buf, "gen-%llx-%llu", static_cast<unsigned long long>(start_time_),
                  static_cast<unsigned long long>(++next_id_));
    return buf;
  }

  EngineService& service_;
  const ServedModelInfo info_;
  const std::string api_key_;
  std::atomic<bool> draining_{false};
  std::atomic<uint64_t> next_id_{0};
  const uint64_t start_time_ = static_cast<uint64_t>(
      std::chrono::system_clock::now().time_since_epoch() / std::chrono::seconds(1));
};

// ---------------------------------------------------------------------------------------------
// GrpcServer

class GrpcServer::Impl {
 public:
  Impl(EngineService& service, ServedModelInfo info, GrpcOptions options)
      : options(std::move(options)), arbor(service, std::move(info), this->options.api_key) {}

  GrpcOptions options;
  ArborService arbor;                    // outlives `server` (declared before it)
  std::unique_ptr<grpc::Server> server;  // null until start() and after shutdown()
  std::mutex mu;                         // start / shutdown
  int port = 0;
};

GrpcServer::GrpcServer(EngineService& service, ServedModelInfo info, GrpcOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(info), std::move(options))) {}

GrpcServer::~GrpcServer() {
  shutdown();
}

void GrpcServer::start() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.server) return;
  const std::string& host = m.options.host;
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  const std::string address =
      (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(m.options.port);

  grpc::EnableDefaultHealthCheckService(true);
  grpc::ServerBuilder builder;
  // Without this a second server could bind the same port (SO_REUSEPORT) and share its calls.
  builder.AddChannelArgument(GRPC_ARG_ALLOW_REUSEPORT, 0);
  grpc::ResourceQuota quota("arbor_grpc");
  quota.SetMaxThreads(kMaxThreads);
  builder.SetResourceQuota(quota);
  int selected_port = 0;
  builder.AddListeningPort(address, grpc::InsecureServerCredentials(), &selected_port);
  builder.RegisterService(&m.arbor);
  m.server = builder.BuildAndStart();
  if (!m.server || selected_port == 0) {
    m.server.reset();
    throw_error(ErrorCode::kInvalidArgument,
                "gRPC: cannot listen on " + address + " (address in use or not local?)");
  }
  m.port = selected_port;
  grpc::HealthCheckServiceInterface* health = m.server->GetHealthCheckService();
  health->SetServingStatus("", true);
  health->SetServingStatus(pb::Arbor::service_full_name(), true);
}

void GrpcServer::set_draining() {
  Impl& m = *impl_;
  m.arbor.set_draining();
  std::lock_guard<std::mutex> lock(m.mu);
  if (m.server) m.server->GetHealthCheckService()->SetServingStatus(false);
}

void GrpcServer::shutdown() {
  Impl& m = *impl_;
  std::lock_guard<std::mutex> lock(m.mu);
  if (!m.server) return;
  m.arbor.set_draining();
  m.server->GetHealthCheckService()->SetServingStatus(false);
  // Returns once every call ended: in-flight ones get kShutdownGrace, then are cancelled (their
  // handlers see IsCancelled() and cancel their requests).
  m.server->Shutdown(std::chrono::system_clock::now() + kShutdownGrace);
  m.server->Wait();
  m.server.reset();
}

int GrpcServer::port() const {
  return impl_->port;
}

}  // namespace arbor
