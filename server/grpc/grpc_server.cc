#include "server/grpc/grpc_server.h"

#include <atomic>
#include <chrono>
#include <cstdio>
#include <vector>

#include <absl/synchronization/mutex.h>
#include <grpcpp/grpcpp.h>
#include <grpcpp/health_check_service_interface.h>
#include <spdlog/spdlog.h>

#ifdef ARBOR_GRPC_REFLECTION
#include <grpcpp/ext/proto_server_reflection_plugin.h>

#include "grpc/health/v1/health.pb.h"
#endif

#include "arbor.grpc.pb.h"
#include "engine/core/error.h"
#include "server/auth.h"
#include "server/grpc/grpc_request.h"

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
  ArborService(EngineService& service, ServedModelInfo info, ApiContext api, std::string api_key)
      : service_(service),
        info_(std::move(info)),
        api_(std::move(api)),
        api_key_(std::move(api_key)) {}

  void set_draining() { draining_ = true; }

  grpc::Status Generate(grpc::ServerContext* ctx, const pb::GenerateRequest* req,
                        pb::GenerateResponse* resp) override {
    std::shared_ptr<RequestStream> stream;
    if (grpc::Status s = begin(ctx, *req, &stream); !s.ok()) return s;
    return collect(ctx, *stream, "gen", resp);
  }

  grpc::Status GenerateStream(grpc::ServerContext* ctx, const pb::GenerateRequest* req,
                              grpc::ServerWriter<pb::GenerateStreamResponse>* writer) override {
    std::shared_ptr<RequestStream> stream;
    if (grpc::Status s = begin(ctx, *req, &stream); !s.ok()) return s;
    return write_deltas(ctx, *stream, "gen", writer);
  }

  grpc::Status Chat(grpc::ServerContext* ctx, const pb::ChatRequest* req,
                    pb::ChatResponse* resp) override {
    std::shared_ptr<RequestStream> stream;
    if (grpc::Status s = begin(ctx, *req, &stream); !s.ok()) return s;
    return collect(ctx, *stream, "chat", resp);
  }

  grpc::Status ChatStream(grpc::ServerContext* ctx, const pb::ChatRequest* req,
                          grpc::ServerWriter<pb::ChatStreamResponse>* writer) override {
    std::shared_ptr<RequestStream> stream;
    if (grpc::Status s = begin(ctx, *req, &stream); !s.ok()) return s;
    return write_deltas(ctx, *stream, "chat", writer);
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

  // Authorizes, validates, converts and submits a Generate or Chat call.
  template <class Request>
  grpc::Status begin(grpc::ServerContext* ctx, const Request& req,
                     std::shared_ptr<RequestStream>* stream) {
    if (grpc::Status s = authorize(*ctx); !s.ok()) return s;
    if (draining_)
      return grpc::Status(grpc::StatusCode::UNAVAILABLE,
                          "the server is shutting down and takes no new requests");
    try {
      ServiceRequest sr;
      bool speculate_requested = false;
      if (grpc::Status s = convert(req, &sr, &speculate_requested); !s.ok()) return s;
      std::vector<ServiceRequest> requests;
      requests.push_back(std::move(sr));
      *stream = service_.submit(std::move(requests), speculate_requested);
      return grpc::Status::OK;
    } catch (const std::exception& e) {
      return to_status(e);
    }
  }

  grpc::Status convert(const pb::GenerateRequest& req, ServiceRequest* out,
                       bool* speculate_requested) const {
    return convert_generate_request(req, RequestContext{&service_.tokenizer(), info_.id}, out,
                                    speculate_requested);
  }

  grpc::Status convert(const pb::ChatRequest& req, ServiceRequest* out,
                       bool* speculate_requested) const {
    return convert_chat_request(req, api_, out, speculate_requested);
  }

  // A unary call's answer (GenerateResponse, ChatResponse): every choice whole, then usage.
  template <class Response>
  grpc::Status collect(grpc::ServerContext* ctx, RequestStream& stream, const char* id_prefix,
                       Response* resp) {
    resp->set_id(new_id(id_prefix));
    resp->set_model(info_.id);
    for (int32_t i = 0; i < stream.num_choices(); ++i) resp->add_choices()->set_index(i);
    const Tokenizer& tok = service_.tokenizer();
    while (true) {
      if (ctx->IsCancelled()) return cancelled(stream);
      StreamUpdate u;
      if (!stream.next(&u, kPollInterval)) continue;
      for (const ChoiceDelta& d : u.deltas) append_delta(tok, d, resp->mutable_choices(d.index));
      if (!u.done) continue;
      if (!u.error.empty()) return grpc::Status(grpc::StatusCode::INTERNAL, u.error);
      fill_usage(u.usage, resp->mutable_usage());
      return grpc::Status::OK;
    }
  }

  // A streaming call's messages (GenerateStreamResponse, ChatStreamResponse): deltas as they
  // come, usage in the last one.
  template <class Message>
  grpc::Status write_deltas(grpc::ServerContext* ctx, RequestStream& stream, const char* id_prefix,
                            grpc::ServerWriter<Message>* writer) {
    const std::string id = new_id(id_prefix);
    const Tokenizer& tok = service_.tokenizer();
    while (true) {
      if (ctx->IsCancelled()) return cancelled(stream);
      StreamUpdate u;
      if (!stream.next(&u, kPollInterval)) continue;
      Message msg;
      msg.set_id(id);
      // One entry per choice that advanced: an update may carry several deltas of a choice
      // (steps that ran while the client was reading).
      std::vector<int> entry(static_cast<size_t>(stream.num_choices()), -1);
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
      if (!writer->Write(msg)) return cancelled(stream);
      if (u.done) return grpc::Status::OK;
    }
  }

  // The client cancelled or its deadline passed (or the server shut down): stop generating.
  static grpc::Status cancelled(RequestStream& stream) {
    stream.cancel();
    return grpc::Status(grpc::StatusCode::CANCELLED, "the call was cancelled");
  }

  std::string new_id(const char* prefix) {
    char buf[48];
    std::snprintf(buf, sizeof buf, "%s-%llx-%llu", prefix,
                  static_cast<unsigned long long>(start_time_),
                  static_cast<unsigned long long>(++next_id_));
    return buf;
  }

  EngineService& service_;
  const ServedModelInfo info_;
  const ApiContext api_;  // chat: the HTTP front end's template, context and defaults
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
  Impl(EngineService& service, ServedModelInfo info, ApiContext api, GrpcOptions options)
      : options(std::move(options)),
        arbor(service, std::move(info), std::move(api), this->options.api_key) {}

  GrpcOptions options;
  ArborService arbor;  // outlives `server` (declared before it)
  absl::Mutex mu;      // start / shutdown
  std::unique_ptr<grpc::Server> server ABSL_GUARDED_BY(mu);  // null until start(), after shutdown()
  int port = 0;
};

GrpcServer::GrpcServer(EngineService& service, ServedModelInfo info, ApiContext api,
                       GrpcOptions options)
    : impl_(std::make_unique<Impl>(service, std::move(info), std::move(api), std::move(options))) {}

GrpcServer::~GrpcServer() {
  shutdown();
}

void GrpcServer::start() {
  Impl& m = *impl_;
  absl::MutexLock lock(&m.mu);
  if (m.server) return;
  const std::string& host = m.options.host;
  const bool ipv6 = host.find(':') != std::string::npos && host.front() != '[';
  const std::string address =
      (ipv6 ? "[" + host + "]" : host) + ":" + std::to_string(m.options.port);

  grpc::EnableDefaultHealthCheckService(true);
#ifdef ARBOR_GRPC_REFLECTION
  // Server reflection: grpcurl and GUI clients list and describe the services without .proto
  // files. Registered explicitly (not only by the library's static initializer) so that the
  // linker keeps libgrpc++_reflection.
  grpc::reflection::InitProtoReflectionServerBuilderPlugin();
  // gRPC's built-in health service has no protobuf descriptor of its own, so reflection could
  // list grpc.health.v1.Health but not describe it (grpc/grpc#36665), and GUI clients that
  // describe every service fail. The one generated from proto/grpc/health/v1/health.proto
  // fills that in; naming it here links it in.
  (void)grpc::health::v1::HealthCheckRequest::descriptor();
#endif
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
  absl::MutexLock lock(&m.mu);
  if (m.server) m.server->GetHealthCheckService()->SetServingStatus(false);
}

void GrpcServer::shutdown() {
  Impl& m = *impl_;
  absl::MutexLock lock(&m.mu);
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
