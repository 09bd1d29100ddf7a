// The OpenAI-compatible HTTP front end (cpp-httplib): /v1/completions, /v1/chat/completions
// (JSON or SSE streaming), /v1/models, /health, /metrics, /tokenize. Optional bearer API key,
// body size and nesting limits, OpenAI-style error bodies, a listen backlog of 1024, TCP_NODELAY
// (no Nagle stall between a response's writes on a kept-alive connection). A client
// that disconnects cancels its request: streams notice on the next write (SSE keep-alive
// comments are sent while waiting); a non-streamed request watches its connection while it
// waits for the whole result, so an engine failure answers 500 with an error body.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <memory>
#include <string>

#include "server/engine_service.h"
#include "server/metrics.h"
#include "server/openai_api.h"
#include "server/served_model.h"

namespace arbor {

struct HttpOptions {
  std::string host = "127.0.0.1";
  int port = 8000;
  std::string api_key;               // empty: no authentication
  int64_t max_body_bytes = 1 << 20;  // larger bodies get 413
  int threads = 128;                 // connections served at once
  int keepalive_ms = 200;            // while waiting for output
};

class HttpServer {
 public:
  HttpServer(EngineService& service, Metrics& metrics, ServedModelInfo info, ApiContext api,
             HttpOptions options);
  ~HttpServer();
  // Binds (throws arbor::Error naming host:port when it cannot) and serves on a thread.
  void start();
  void set_draining() { draining_ = true; }
  // Waits (until `deadline`) for every accepted generation's response to be sent and its bytes
  // acknowledged by the client's TCP: the engine may have finished a request while its stream
  // is still being written to (or read by) a slow client, and the listener (with /health
  // answering 503) stays open meanwhile. False when time ran out.
  bool wait_responses_delivered(std::chrono::steady_clock::time_point deadline) const;
  int64_t responses_in_flight() const { return responses_in_flight_.load(); }
  void stop();
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
  std::atomic<bool> draining_{false};
  std::atomic<bool> stopping_{false};            // stop(): acknowledgement waits give up
  std::atomic<int64_t> responses_in_flight_{0};  // generations accepted, not yet acknowledged
};

}  // namespace arbor
