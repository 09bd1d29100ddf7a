// The gRPC front end (proto/arbor.proto, package arbor.v1): Generate, GenerateStream, Chat,
// ChatStream, Tokenize and GetModelInfo over the EngineService that the HTTP front end shares,
// plus the standard grpc.health.v1 service and server reflection. It owns the grpc::Server and its
// handler threads (synchronous API, one thread per in-flight call); requests are validated here
// with the HTTP side's rules and their arbor::Error codes mapped to gRPC status codes. A cancelled
// call cancels its request.
#pragma once

#include <memory>
#include <string>

#include "server/engine_service.h"
#include "server/openai_api.h"
#include "server/served_model.h"

namespace arbor {

struct GrpcOptions {
  std::string host = "127.0.0.1";  // bind address (IPv6 literals without brackets are fine)
  int port = 50051;                // 0: any free port (see GrpcServer::port())
  std::string api_key;             // non-empty: calls need metadata `authorization: Bearer <key>`
};

class GrpcServer {
 public:
  // `service` (and `api`'s tokenizer and chat template) must outlive the server. `api` is the
  // HTTP front end's: Chat renders and limits conversations as /v1/chat/completions does.
  GrpcServer(EngineService& service, ServedModelInfo info, ApiContext api, GrpcOptions options);
  ~GrpcServer();  // shuts down if still running
  GrpcServer(const GrpcServer&) = delete;
  GrpcServer& operator=(const GrpcServer&) = delete;

  // Binds and starts serving; health SERVING. Throws kInvalidArgument naming host:port when it
  // cannot bind.
  void start();
  // Health NOT_SERVING; new Generate / Chat calls (and their streams) answer UNAVAILABLE. Calls in
  // flight go on.
  void set_draining();
  // Stops accepting calls and lets those in flight end for up to ~5 s, then cancels them.
  void shutdown();
  // The bound port (after start()).
  int port() const;

 private:
  class Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace arbor
