#include "server/http_server.h"

#include <chrono>
#include <ctime>
#include <random>
#include <thread>

#include <httplib.h>
#include <spdlog/spdlog.h>

#include "engine/core/error.h"

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
  std::mt19937_64 rng{std::random_device{}()};
  std::mutex rng_mu;

  Impl(EngineService& s, Metrics& m, ServedModelInfo i, ApiContext a, HttpOptions o)
      : service(s), metrics(m), info(std::move(i)), api(std::move(a)), opt(std::move(o)) {}

  std::string new_id(const char* prefix) {
    std::lock_guard<std::mutex> lock(rng_mu);
    char buf[40];
    std::snprintf(buf, sizeof(buf), "%s%016llx", prefix, static_cast<unsigned long long>(rng()));
    return buf;
  }
};

namespace {

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(dump_json(error_body(e)), "application/json");
}

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

void HttpServer::stop() {
  if (!impl_) return;
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
    if (m.opt.api_key.empty() || req.path.rfind("/v1/", 0) != 0)
      return httplib::Server::HandlerResponse::Unhandled;
    const std::string auth = req.get_header_value("Authorization");
    if (auth == "Bearer " + m.opt.api_key) return httplib::Server::HandlerResponse::Unhandled;
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
    json body;
    try {
      body = json::parse(req.body);
    } catch (const std::exception& e) {
      throw ApiError(400, std::string("the body is not valid JSON: ") + e.what());
    }
    if (!body.is_object() || !body.contains("prompt") || !body["prompt"].is_string())
      throw ApiError(400, "'prompt' must be a string", "invalid_request_error", "prompt");
    const bool add_special = body.value("add_special_tokens", true);
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
      json body;
      try {
        body = json::parse(req.body);
      } catch (const std::exception& e) {
        m.metrics.inc("arbor_requests_rejected_total", 1, reason_label(400));
        send_error(res, ApiError(400, std::string("the body is not valid JSON: ") + e.what()));
        return;
      }
      std::shared_ptr<ParsedRequest> p;
      std::shared_ptr<RequestStream> stream;
      try {
        p = std::make_shared<ParsedRequest>(parse_openai_request(body, chat, m.api));
        if (draining_) throw Error(ErrorCode::kUnsupported, "the server is shutting down");
        stream = m.service.submit(p->requests);
      } catch (const std::exception& e) {
        const ApiError a = to_api_error(e);
        m.metrics.inc("arbor_requests_rejected_total", 1, reason_label(a.status));
        send_error(res, a);
        return;
      }
      const std::string id = m.new_id(chat ? "chatcmpl-" : "cmpl-");
      const int64_t created = static_cast<int64_t>(std::time(nullptr));
      const std::string model = m.info.id;
      const auto keepalive = std::chrono::milliseconds(m.opt.keepalive_ms);
      const Tokenizer* tok = &m.service.tokenizer();
      auto release = [stream](bool) { stream->cancel(); };  // no-op once done
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
      auto state = std::make_shared<std::vector<ChoiceState>>(stream->num_choices());
      const auto started = std::chrono::steady_clock::now();
      res.set_chunked_content_provider(
          "application/json",
          [=](size_t, httplib::DataSink& sink) {
            StreamUpdate u;
            if (!stream->next(&u, keepalive)) {
              // JSON allows leading whitespace: after the first second, a space is the
              // keep-alive that notices a gone client.
              if (std::chrono::steady_clock::now() - started < std::chrono::seconds(1)) return true;
              return sink.write(" ", 1);
            }
            for (ChoiceDelta& d : u.deltas) {
              ChoiceState& c = (*state)[static_cast<size_t>(d.index)];
              c.text += d.text;
              c.logprobs.insert(c.logprobs.end(), d.logprobs.begin(), d.logprobs.end());
              if (!d.finish_reason.empty()) c.finish_reason = d.finish_reason;
            }
            if (!u.done) return true;
            std::string out;
            if (!u.error.empty())
              out = dump_json(error_body(ApiError(500, u.error, "internal_error")));
            else
              out = dump_json(completion_response(*p, id, created, model, *state, u.usage, *tok));
            if (!sink.write(out.data(), out.size())) return false;
            sink.done();
            return true;
          },
          release);
    };
  };
  svr.Post("/v1/completions", generate(false));
  svr.Post("/v1/chat/completions", generate(true));

  if (m.opt.port == 0) {
    port_ = svr.bind_to_any_port(m.opt.host);
  } else {
    port_ = svr.bind_to_port(m.opt.host, m.opt.port) ? m.opt.port : -1;
  }
  if (port_ <= 0)
    throw_error(ErrorCode::kInvalidArgument, "cannot listen on " + m.opt.host + ":" +
                                                 std::to_string(m.opt.port) +
                                                 " (address in use or not local?)");
  m.thread = std::thread([this] { impl_->svr.listen_after_bind(); });
}

}  // namespace arbor
