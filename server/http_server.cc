#include "server/http_server.h"

#include <dirent.h>
#include <linux/sockios.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <ctime>
#include <random>
#include <thread>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "engine/core/error.h"
#include "server/auth.h"

namespace arbor {

using nlohmann::json;

struct HttpServer::Impl {
  EngineService& service;
  Metrics& metrics;
  ServedModelInfo info;
  ApiContext api;
  HttpOptions opt;
  httplib::Server svr;
  std::thread thread;
  absl::Mutex rng_mu;
  std::mt19937_64 rng ABSL_GUARDED_BY(rng_mu){std::random_device{}()};

  Impl(EngineService& s, Metrics& m, ServedModelInfo i, ApiContext a, HttpOptions o)
      : service(s), metrics(m), info(std::move(i)), api(std::move(a)), opt(std::move(o)) {}

  std::string new_id(const char* prefix) {
    absl::MutexLock lock(&rng_mu);
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
    return buf;
  }
};

namespace {

// The listening socket's backlog. cpp-httplib 0.11 (a shared library on Debian) listens with 5,
// which drops the SYNs of a burst of new connections: their clients wait for the kernel's 1 s
// retransmit. start() listens again with this backlog (Linux takes a second listen() on a
// listening socket as a new backlog); the kernel caps it at net.core.somaxconn.
constexpr int kListenBacklog = 1024;

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump_json(error_body(e)), "application/json");
}

// Routes that need the API key when the server has one: the generation API and /tokenize.
// /health and /metrics stay public (load balancers and Prometheus scrape them).
bool needs_api_key(const std::string& path) {
  return path.rfind("/v1/", 0) == 0 || path == "/tokenize";
}

// The socket of the connection a handler serves. cpp-httplib 0.11 does not hand it to
// handlers, so it is found by the connection's addresses, unique among open sockets; -1 when
// not found (the handler then waits without noticing a gone client).
int connection_fd(const httplib::Request& req) {
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return -1;
  int found = -1;
  while (dirent* e = readdir(dir)) {
    char* end = nullptr;
    const long fd = std::strtol(e->d_name, &end, 10);
    if (end == e->d_name || *end != '\0') continue;
    struct stat st;
    if (fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    sockaddr_storage local{}, peer{};
    socklen_t local_len = sizeof local, peer_len = sizeof peer;
    if (getsockname(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&local), &local_len) != 0 ||
        getpeername(static_cast<int>(fd), reinterpret_cast<sockaddr*>(&peer), &peer_len) != 0)
      continue;
    char local_port[16], peer_host[NI_MAXHOST], peer_port[16];
    if (getnameinfo(reinterpret_cast<sockaddr*>(&local), local_len, nullptr, 0, local_port,
                    sizeof local_port, NI_NUMERICSERV) != 0 ||
        getnameinfo(reinterpret_cast<sockaddr*>(&peer), peer_len, peer_host, sizeof peer_host,
                    peer_port, sizeof peer_port, NI_NUMERICHOST | NI_NUMERICSERV) != 0)
      continue;
    if (std::atoi(local_port) == req.local_port && std::atoi(peer_port) == req.remote_port &&
        req.remote_addr == peer_host) {
      found = static_cast<int>(fd);
      break;
    }
  }
  closedir(dir);
  return found;
}

// The client closed its end (or the connection broke).
bool connection_closed(int fd) {
  pollfd p{fd, POLLRDHUP, 0};
  return ::poll(&p, 1, 0) > 0 && (p.revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0;
}

// Waits until the peer's TCP has acknowledged every byte written to `fd` (SIOCOUTQ: bytes sent
// or queued but not acknowledged), until the peer sends something (its next request on the
// connection, which carries the acknowledgement a receiver in request / response mode delays,
// or its close), until `stopping`, or for at most `limit`. A written response is only in this
// process's socket buffers: a process that exits then (in a container, whose network namespace
// goes with it) loses what the client had not yet received. Polls with growing intervals, from
// 50 us (a loopback or LAN acknowledgement) to 5 ms.
void wait_acknowledged(int fd, const std::atomic<bool>& stopping, std::chrono::milliseconds limit) {
  const auto until = std::chrono::steady_clock::now() + limit;
  long interval_ns = 50000;
  while (!stopping.load()) {
    int unacked = 0;
    if (ioctl(fd, SIOCOUTQ, &unacked) != 0 || unacked <= 0) return;
    if (std::chrono::steady_clock::now() >= until) return;
    pollfd p{fd, POLLIN | POLLRDHUP, 0};
    const timespec wait{0, interval_ns};
    if (::ppoll(&p, 1, &wait, nullptr) != 0) return;  // the peer sent something, or an error
    interval_ns = std::min(interval_ns * 2, 5000000L);
  }
}

// A generation the HTTP server accepted, counted (HttpServer::responses_in_flight_) until its
// response is written and acknowledged by the client's TCP (wait_acknowledged): the drain waits
// for the count to reach zero. Held by the httplib::Response (its content provider's releaser),
// so it ends after the last byte is written, on the connection's thread, its socket still open.
class InFlight {
 public:
  InFlight(std::atomic<int64_t>* count, const std::atomic<bool>* stopping, int fd)
      : count_(count), stopping_(stopping), fd_(fd) {
    (*count_)++;
  }
  InFlight(const InFlight&) = delete;
  InFlight& operator=(const InFlight&) = delete;
  ~InFlight() {
    if (fd_ >= 0) wait_acknowledged(fd_, *stopping_, kAcknowledgeLimit);
    (*count_)--;
  }

 private:
  // httplib's write timeout: as long as a blocked write of the response could have waited.
  static constexpr std::chrono::milliseconds kAcknowledgeLimit{30000};
  std::atomic<int64_t>* count_;
  const std::atomic<bool>* stopping_;
  int fd_;
};

const char* reason_label(int status) {
  switch (status) {
    case 400:
      return "reason=\"invalid_request\"";
    case 401:
      return "reason=\"unauthorized\"";
    case 404:
      return "reason=\"not_found\"";
    case 413:
      return "reason=\"too_large\"";
    case 429:
      return "reason=\"queue_full\"";
    case 503:
      return "reason=\"draining\"";
    default:
      return "reason=\"error\"";
  }
}

}  // namespace

HttpServer::HttpServer(EngineService& service, Metrics& metrics, ServedModelInfo info,
                       ApiContext api, HttpOptions options)
    : impl_(std::make_unique<Impl>(service, metrics, std::move(info), std::move(api),
                                   std::move(options))) {}

HttpServer::~HttpServer() {
  stop();
}

bool HttpServer::wait_responses_delivered(std::chrono::steady_clock::time_point deadline) const {
  while (responses_in_flight_.load() > 0) {
    if (std::chrono::steady_clock::now() >= deadline) return false;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return true;
}

void HttpServer::stop() {
  if (!impl_) return;
  stopping_ = true;
  impl_->svr.stop();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void HttpServer::start() {
  Impl& m = *impl_;
  httplib::Server& svr = m.svr;
  const int threads = m.opt.threads;
  svr.new_task_queue = [threads] { return new httplib::ThreadPool(static_cast<size_t>(threads)); };
  svr.set_payload_max_length(static_cast<size_t>(m.opt.max_body_bytes));
  svr.set_read_timeout(30, 0);
  svr.set_write_timeout(30, 0);

  svr.set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    Impl& m = *impl_;
    if (m.opt.api_key.empty() || !needs_api_key(req.path))
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (same_secret(auth, "Bearer " + m.opt.api_key))
      return httplib::Server::HandlerResponse::Unhandled;
    m.metrics.inc("arbor_requests_rejected_total", 1, reason_label(401));
    send_error(res, ApiError(401,
                             auth.empty() ? "missing API key: send 'Authorization: Bearer <key>'"
                                          : "incorrect API key provided",
                             "invalid_request_error", "", "invalid_api_key"));
    return httplib::Server::HandlerResponse::Handled;
  });
  svr.set_error_handler(
      httplib::Server::HandlerWithResponse([](const httplib::Request& req, httplib::Response& res) {
        if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
        std::string msg;
        if (res.status == 404)
          msg = "no route for " + req.method + " " + req.path;
        else if (res.status == 413)
          msg = "the request body is larger than the server accepts";
        else if (res.status == 405)
          msg = "method not allowed";
        else
          msg = "HTTP error " + std::to_string(res.status);
        send_error(res, ApiError(res.status, msg, "invalid_request_error"));
        return httplib::Server::HandlerResponse::Handled;
      }));
  svr.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          send_error(res, to_api_error(e));
        } catch (...) {
          send_error(res, ApiError(500, "unknown error", "internal_error"));
        }
      });

  svr.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    if (draining_ || impl_->service.draining()) {
      res.status = 503;
      res.set_content(R"({"status":"draining"})", "application/json");
      return;
    }
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  svr.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(impl_->metrics.render(), "text/plain; version=0.0.4");
  });
  svr.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    const Impl& m = *impl_;
    json model = {{"id", m.info.id},
                  {"object", "model"},
                  {"created", 0},
                  {"owned_by", "arbor"},
                  {"root", m.info.id},
                  {"max_model_len", m.info.max_context},
                  {"speculation", m.info.speculation},
                  {"backend", m.info.backend}};
    res.set_content(dump_json(json{{"object", "list"}, {"data", json::array({model})}}),
                    "application/json");
  });
  svr.Post("/tokenize", [this](const httplib::Request& req, httplib::Response& res) {
    const json body = parse_json_body(req.body);
    if (!body.is_object()) throw ApiError(400, "the request body must be a JSON object");
    for (const auto& [key, value] : body.items())
      if (key != "prompt" && key != "add_special_tokens" && key != "model")
        throw ApiError(400, "Unrecognized request argument supplied: '" + key.substr(0, 64) + "'",
                       "invalid_request_error", key.substr(0, 64));
    if (!body.contains("prompt") || !body["prompt"].is_string())
      throw ApiError(400, "'prompt' must be a string", "invalid_request_error", "prompt");
    if (body.contains("model") && body["model"] != impl_->info.id)
      throw ApiError(404, "the model does not exist; this server serves '" + impl_->info.id + "'",
                     "invalid_request_error", "model", "model_not_found");
    bool add_special = true;
    if (body.contains("add_special_tokens")) {
      if (!body["add_special_tokens"].is_boolean())
        throw ApiError(400,
                       std::string("'add_special_tokens' must be a boolean, got ") +
                           body["add_special_tokens"].type_name(),
                       "invalid_request_error", "add_special_tokens");
      add_special = body["add_special_tokens"].get<bool>();
    }
    const auto ids =
        impl_->service.tokenizer().encode(body["prompt"].get<std::string>(), add_special, true);
    res.set_content(
        dump_json(json{
            {"tokens", ids}, {"count", ids.size()}, {"max_model_len", impl_->info.max_context}}),
        "application/json");
  });

  auto generate = [this](bool chat) {
    return [this, chat](const httplib::Request& req, httplib::Response& res) {
      Impl& m = *impl_;
      std::shared_ptr<ParsedRequest> p;
      std::shared_ptr<RequestStream> stream;
      try {
        p = std::make_shared<ParsedRequest>(parse_openai_body(req.body, chat, m.api));
        if (draining_) throw Error(ErrorCode::kUnsupported, "the server is shutting down");
        stream = m.service.submit(p->requests, p->speculate_requested);
      } catch (const std::exception& e) {
        ApiError a = to_api_error(e);
        if (chat && a.param == "prompt") a.param = "messages";
        m.metrics.inc("arbor_requests_rejected_total", 1, reason_label(a.status));
        send_error(res, a);
        return;
      }
      // Counted until its response is sent and acknowledged (the drain waits for it:
      // wait_responses_delivered).
      const int fd = connection_fd(req);
      auto in_flight = std::make_shared<InFlight>(&responses_in_flight_, &stopping_, fd);
      const std::string id = m.new_id(chat ? "chatcmpl-" : "cmpl-");
      const int64_t created = static_cast<int64_t>(std::time(nullptr));
      const std::string model = m.info.id;
      const auto keepalive = std::chrono::milliseconds(m.opt.keepalive_ms);
      const Tokenizer* tok = &m.service.tokenizer();
      // The provider (holding in_flight) is released when the response ends either way.
      auto release = [stream, in_flight](bool) { stream->cancel(); };  // no-op once done
      if (p->stream) {
        res.set_header("Cache-Control", "no-cache");
        auto first = std::make_shared<std::vector<bool>>(stream->num_choices(), true);
        res.set_chunked_content_provider(
            "text/event-stream",
            [=](size_t, httplib::DataSink& sink) {
              StreamUpdate u;
              if (!stream->next(&u, keepalive)) {
                // Nothing new: a comment line keeps the connection honest (a gone client
                // fails this write and the request is cancelled).
                if (!sink.write(": keep-alive\n\n", 14)) return false;
                return true;
              }
              std::string out;
              for (const ChoiceDelta& d : u.deltas) {
                const size_t i = static_cast<size_t>(d.index);
                if (d.text.empty() && d.finish_reason.empty() && d.logprobs.empty() && !(*first)[i])
                  continue;
                out += "data: " +
                       dump_json(stream_chunk(*p, id, created, model, d, (*first)[i], *tok)) +
                       "\n\n";
                (*first)[i] = false;
              }
              if (u.done) {
                if (!u.error.empty())
                  out +=
                      "data: " + dump_json(error_body(ApiError(500, u.error, "internal_error"))) +
                      "\n\n";
                if (p->include_usage)
                  out +=
                      "data: " + dump_json(usage_chunk(*p, id, created, model, u.usage)) + "\n\n";
                out += "data: [DONE]\n\n";
              }
              if (!out.empty() && !sink.write(out.data(), out.size())) return false;
              if (u.done) sink.done();
              return true;
            },
            release);
        return;
      }
      // Not streamed: wait for the whole result here, so that a request the engine fails
      // answers 500 with an error body (a status cannot change once sent). A client that
      // closes its connection meanwhile cancels the request.
      std::vector<ChoiceState> state(static_cast<size_t>(stream->num_choices()));
      StreamUpdate u;
      while (true) {
        if (!stream->next(&u, keepalive)) {
          if (fd >= 0 && connection_closed(fd)) {
            stream->cancel();
            res.status = 499;  // nginx's "client closed request"; nobody reads it
            return;
          }
          continue;
        }
        for (ChoiceDelta& d : u.deltas) {
          ChoiceState& c = state[static_cast<size_t>(d.index)];
          c.text += d.text;
          c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
          if (!d.finish_reason.empty()) c.finish_reason = d.finish_reason;
        }
        if (u.done) break;
      }
      if (!u.error.empty()) {
        send_error(res, ApiError(500, u.error, "internal_error"));
        return;
      }
      // Through a provider whose releaser holds in_flight: the count ends after the body is
      // written, not when this handler returns.
      auto body = std::make_shared<const std::string>(
          dump_json(completion_response(*p, id, created, model, state, u.usage, *tok)));
      res.set_content_provider(
          body->size(), "application/json",
          [body](size_t offset, size_t length, httplib::DataSink& sink) {
            return sink.write(body->data() + offset, length);
          },
          [in_flight](bool) {});
    };
  };
  svr.Post("/v1/completions", generate(false));
  svr.Post("/v1/chat/completions", generate(true));

  // Our socket options instead of httplib's default, which sets SO_REUSEPORT (a second server
  // could then bind the same port and take half its connections); the last socket the callback
  // sees is the one that was bound.
  int listen_fd = -1;
  // TCP_NODELAY (the accepted connections inherit it): httplib writes a response's headers and
  // each body chunk separately, and with Nagle's algorithm a write waits for the previous one's
  // acknowledgement, which a keep-alive client delays by up to 40 ms (measured: every request on
  // a reused connection took 42-44 ms more, the first chunk of a stream too).
  svr.set_socket_options([&listen_fd](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    setsockopt(sock, IPPROTO_TCP, TCP_NODELAY, &yes, sizeof yes);
    listen_fd = sock;
  });
  if (m.opt.port == 0) {
    port_ = svr.bind_to_any_port(m.opt.host);
  } else {
    port_ = svr.bind_to_port(m.opt.host, m.opt.port) ? m.opt.port : -1;
  }
  if (port_ <= 0)
    throw_error(ErrorCode::kInvalidArgument, "cannot listen on " + m.opt.host + ":" +
                                                 std::to_string(m.opt.port) +
                                                 " (address in use or not local?)");
  if (listen_fd < 0 || ::listen(listen_fd, kListenBacklog) != 0)
    spdlog::warn(
        "HTTP: could not raise the listen backlog to {}: bursts of new connections "
        "may wait for SYN retransmits",
        kListenBacklog);
  m.thread = std::thread([this] { impl_->svr.listen_after_bind(); });
}

}  // namespace arbor
