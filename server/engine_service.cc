#include "server/engine_service.h"

#include <algorithm>

#include <spdlog/spdlog.h>

#include "engine/core/error.h"
#include "server/stop_strings.h"

namespace arbor {

using Clock = std::chrono::steady_clock;

// ---------------------------------------------------------------------------------------------
// RequestStream

bool RequestStream::next(StreamUpdate* out, std::chrono::milliseconds timeout) {
  mu_.LockWhenWithTimeout(absl::Condition(this, &RequestStream::has_output),
                          absl::FromChrono(timeout));
  bool got = false;
  if (!delivered_done_ && has_output()) {
    out->deltas = std::move(pending_);
    pending_.clear();
    out->done = done_;
    out->usage = usage_;
    out->error = error_;
    if (done_) delivered_done_ = true;
    got = true;
  }
  mu_.Unlock();
  return got;
}

void RequestStream::cancel() {
  if (cancelled_.exchange(true)) return;
  if (service_) service_->request_cancel(key_);
}

// ---------------------------------------------------------------------------------------------
// Loop-thread state

struct EngineService::Choice {
  std::unique_ptr<IncrementalDecoder> decoder;
  std::string held;  // text held back: it may be the start of a stop string
  bool finished = false;
  bool any_token = false;
  int64_t tokens = 0;
  Clock::time_point first_token, last_token;
};

struct EngineService::Live {
  std::shared_ptr<RequestStream> stream;
  std::vector<ServiceRequest> requests;  // one per prompt
  std::vector<ReqId> engine_ids;         // per prompt (0: not added / gone)
  std::vector<StopStrings> stops;        // per prompt: its stop strings, matched in linear time
  int32_t n = 1;
  std::vector<Choice> choices;  // [prompts * n]
  int32_t unfinished = 0;
  Usage usage;
  Clock::time_point arrival;
  std::vector<ChoiceDelta> out;  // deltas built this iteration
  std::string error;             // why the engine failed the request (empty: it did not)
  bool finished = false;         // the stream has been told it is done
};

EngineService::EngineService(Engine& engine, const Tokenizer& tokenizer,
                             std::vector<int32_t> stop_token_ids, ServiceOptions options,
                             Metrics* metrics)
    : engine_(engine),
      tokenizer_(tokenizer),
      stop_token_ids_(std::move(stop_token_ids)),
      options_(options),
      metrics_(metrics),
      limits_(options.limits) {
  const int64_t model_max = engine_.model().config().max_position;
  const auto& kv = engine_.kv();
  const int64_t capacity = static_cast<int64_t>(kv.num_blocks()) * kv.block_size();
  int64_t m = std::min(model_max, capacity);
  if (limits_.max_context > 0) m = std::min<int64_t>(m, limits_.max_context);
  limits_.max_context = static_cast<int32_t>(m);
  limits_.vocab_size = static_cast<int32_t>(
      std::min<int64_t>(tokenizer_.vocab_size(), engine_.model().config().vocab_size));
  if (options_.max_queue < 0)
    throw_error(ErrorCode::kInvalidArgument,
                "max_queue must be >= 0, got " + std::to_string(options_.max_queue));
}

EngineService::~EngineService() {
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

void EngineService::start() {
  thread_ = std::thread([this] { loop(); });
}

std::shared_ptr<RequestStream> EngineService::submit(std::vector<ServiceRequest> requests,
                                                     bool speculate_requested) {
  if (draining_)
    throw_error(ErrorCode::kUnsupported, "the server is shutting down and takes no new requests");
  check_request(requests, limits_, speculate_requested);
  int64_t prompt_tokens = 0;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& g = requests[i].gen;
    try {
      engine_.check(g);  // the engine's own request checks; immutable state, any thread
    } catch (const Error& e) {
      throw_error(e.code(), requests.size() > 1
                                ? e.what() + std::string(" (prompt ") + std::to_string(i) + ")"
                                : std::string(e.what()));
    }
    prompt_tokens += static_cast<int64_t>(g.prompt.size());
  }
  auto live = std::make_shared<Live>();
  live->stream = std::make_shared<RequestStream>();
  live->n = requests[0].gen.n;
  live->arrival = Clock::now();
  live->stream->num_choices_ = static_cast<int32_t>(requests.size()) * live->n;
  live->stream->prompt_tokens_ = prompt_tokens;
  live->stream->service_ = this;
  live->choices.resize(static_cast<size_t>(live->stream->num_choices_));
  live->unfinished = live->stream->num_choices_;
  live->usage.prompt_tokens = prompt_tokens;
  for (size_t i = 0; i < requests.size(); ++i) {
    // A prompt of special tokens only (e.g. BOS) leaves the output at the start of the text.
    const bool at_text_start = tokenizer_.decode(requests[i].gen.prompt, true).empty();
    for (int32_t j = 0; j < live->n; ++j)
      live->choices[i * live->n + j].decoder =
          std::make_unique<IncrementalDecoder>(tokenizer_, requests[i].skip_special, at_text_start);
  }
  for (const ServiceRequest& r : requests) live->stops.emplace_back(r.stop);
  live->requests = std::move(requests);
  {
    absl::MutexLock lock(&mu_);
    const int64_t waiting = queued_.load() + static_cast<int64_t>(submitted_.size());
    if (waiting >= options_.max_queue) {
      // Counted by the front end that maps the error to its status (HTTP: 429, queue_full).
      throw_error(ErrorCode::kResourceExhausted, "the server's queue is full (" +
                                                     std::to_string(waiting) +
                                                     " requests waiting); retry later");
    }
    const uint64_t key = next_key_++;
    live->stream->key_ = key;
    submitted_.emplace_back(key, live);
    live_++;
  }
  return live->stream;
}

void EngineService::request_cancel(uint64_t key) {
  absl::MutexLock lock(&mu_);
  cancels_.push_back(key);
}

void EngineService::drain(std::chrono::milliseconds timeout) {
  draining_ = true;
  const auto deadline = Clock::now() + timeout;
  while (live_.load() > 0 && Clock::now() < deadline)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  {
    absl::MutexLock lock(&mu_);
    stop_ = true;  // the loop cancels what is left
  }
  if (thread_.joinable()) thread_.join();
}

// ---------------------------------------------------------------------------------------------
// Loop thread

void EngineService::admit(uint64_t key, const std::shared_ptr<Live>& live) {
  by_key_[key] = live;
  for (size_t i = 0; i < live->requests.size(); ++i) {
    ServiceRequest& r = live->requests[i];
    for (int32_t t : stop_token_ids_)
      if (!r.gen.ignore_eos && std::find(r.gen.stop_token_ids.begin(), r.gen.stop_token_ids.end(),
                                         t) == r.gen.stop_token_ids.end())
        r.gen.stop_token_ids.push_back(t);
    const ReqId id = next_engine_id_++;
    try {
      engine_.add(id, r.gen);
    } catch (const Error& e) {
      live->engine_ids.push_back(0);
      live->error = e.what();
      cancel_live(*live, "error");
      return;
    }
    live->engine_ids.push_back(id);
    by_engine_id_[id] = {live, static_cast<int32_t>(i)};
  }
}

void EngineService::finish_choice(Live& live, int32_t index, const std::string& reason,
                                  bool natural) {
  Choice& c = live.choices[static_cast<size_t>(index)];
  if (c.finished) return;
  c.finished = true;
  ChoiceDelta d;
  d.index = index;
  // A natural end flushes held-back text and incomplete bytes; a stop string, a cancel or an
  // error drops them.
  if (natural) d.text = c.held + c.decoder->finish();
  c.held.clear();
  d.finish_reason = reason;
  live.out.push_back(std::move(d));
  live.unfinished--;
  if (metrics_ && reason != "cancelled" && reason != "error") {
    if (c.any_token) {
      metrics_->observe("arbor_time_to_first_token_seconds",
                        std::chrono::duration<double>(c.first_token - live.arrival).count());
      if (c.tokens > 1)
        metrics_->observe("arbor_time_per_output_token_seconds",
                          std::chrono::duration<double>(c.last_token - c.first_token).count() /
                              double(c.tokens - 1));
    }
    metrics_->observe("arbor_e2e_request_latency_seconds",
                      std::chrono::duration<double>(Clock::now() - live.arrival).count());
  }
}

void EngineService::cancel_live(Live& live, const std::string& reason) {
  for (size_t i = 0; i < live.engine_ids.size(); ++i)
    if (live.engine_ids[i]) {
      engine_.cancel(live.engine_ids[i]);
      by_engine_id_.erase(live.engine_ids[i]);
      live.engine_ids[i] = 0;
    }
  for (size_t i = 0; i < live.choices.size(); ++i)
    finish_choice(live, static_cast<int32_t>(i), reason, false);
  flush(live);
}

// Hands this iteration's deltas to the stream; finishes the request when no choice is left.
void EngineService::flush(Live& live) {
  const bool done = live.unfinished == 0;
  if (live.out.empty() && !done) return;
  if (done) {
    for (size_t i = 0; i < live.engine_ids.size(); ++i)
      if (live.engine_ids[i]) {
        engine_.cancel(live.engine_ids[i]);  // no-op when the engine finished it already
        by_engine_id_.erase(live.engine_ids[i]);
        live.engine_ids[i] = 0;
      }
  }
  const bool finished_now = done && !live.finished;
  if (finished_now) live.finished = true;
  // Callers hold their own reference; erasing the map's must not free `live` under us.
  std::shared_ptr<Live> keep;
  if (finished_now) {
    keep = by_key_.count(live.stream->key_) ? by_key_.at(live.stream->key_) : nullptr;
    by_key_.erase(live.stream->key_);
    live_--;
    // Counted before the stream can see its end, so a client that has read the whole response
    // already finds the request in /metrics.
    if (metrics_) {
      const std::string& err = live.error;
      metrics_->inc("arbor_requests_total", 1,
                    err.empty()
                        ? (live.stream->cancelled_ ? "status=\"cancelled\"" : "status=\"ok\"")
                        : "status=\"error\"");
      metrics_->inc("arbor_prompt_tokens_total", static_cast<double>(live.usage.prompt_tokens));
    }
  }
  {
    absl::MutexLock lock(&live.stream->mu_);  // its waiters re-check their condition on unlock
    for (ChoiceDelta& d : live.out) live.stream->pending_.push_back(std::move(d));
    live.stream->usage_ = live.usage;
    if (finished_now) {
      live.stream->error_ = live.error;
      live.stream->done_ = true;
    }
  }
  live.out.clear();
}

void EngineService::update_gauges() {
  queued_ = static_cast<int64_t>(engine_.scheduler().num_waiting());
  if (!metrics_) return;
  const KvCacheStats st = engine_.kv().stats();
  metrics_->set("arbor_kv_blocks_used", st.used_blocks);
  metrics_->set("arbor_kv_blocks_free", st.free_blocks);
  metrics_->set("arbor_kv_blocks_total", st.num_blocks);
  metrics_->set("arbor_kv_cache_usage_ratio", st.usage());
  metrics_->set("arbor_kv_sequences", st.num_sequences);
  const Scheduler& sched = engine_.scheduler();
  metrics_->set("arbor_queue_depth", static_cast<double>(sched.num_waiting()));
  metrics_->set("arbor_running_sequences", static_cast<double>(sched.num_running()));
  metrics_->set("arbor_admission_lookahead_tokens", sched.lookahead());
  const EngineStats& es = engine_.stats();
  metrics_->set("arbor_engine_steps_total", static_cast<double>(es.steps));
  metrics_->set("arbor_preemptions_total", static_cast<double>(es.preemptions));
  metrics_->set("arbor_spec_verify_steps_total", static_cast<double>(es.acceptance.steps));
  metrics_->set("arbor_spec_emitted_tokens_total", static_cast<double>(es.acceptance.emitted));
  metrics_->set("arbor_spec_speculating_sequences", static_cast<double>(sched.num_speculating()));
  metrics_->set("arbor_spec_draft_seconds_total", es.draft_seconds);
  metrics_->set("arbor_spec_feedback_seconds_total", es.feedback_seconds);
  metrics_->set("arbor_engine_step_seconds_total", es.prefill_seconds, "phase=\"prefill\"");
  metrics_->set("arbor_engine_step_seconds_total", es.decode_seconds, "phase=\"decode\"");
  metrics_->set("arbor_engine_step_seconds_total", es.mixed_seconds, "phase=\"mixed\"");
  const StepGraphStats gs = engine_.model().step_graph_stats();
  metrics_->set("arbor_step_graphs_total", static_cast<double>(gs.replays), "outcome=\"replay\"");
  metrics_->set("arbor_step_graphs_total", static_cast<double>(gs.captures), "outcome=\"capture\"");
  metrics_->set("arbor_step_graphs_total", static_cast<double>(gs.eager), "outcome=\"eager\"");
  metrics_->set("arbor_step_graphs_total", static_cast<double>(gs.capture_failures),
                "outcome=\"failed\"");
  for (size_t d = 0; d < es.acceptance.offered.size(); ++d) {
    const std::string label = "depth=\"" + std::to_string(d + 1) + "\"";
    metrics_->set("arbor_spec_draft_offered_total", static_cast<double>(es.acceptance.offered[d]),
                  label);
    metrics_->set("arbor_spec_draft_accepted_total", static_cast<double>(es.acceptance.accepted[d]),
                  label);
  }
}

void EngineService::loop() {
  update_gauges();
  while (true) {
    std::deque<std::pair<uint64_t, std::shared_ptr<Live>>> submitted;
    std::vector<uint64_t> cancels;
    bool stop = false;
    {
      // Idle: sleep until a front end hands over work. Busy: take what is there and step.
      if (engine_.idle())
        mu_.LockWhen(absl::Condition(this, &EngineService::has_work));
      else
        mu_.Lock();
      submitted.swap(submitted_);
      cancels.swap(cancels_);
      stop = stop_;
      mu_.Unlock();
    }
    for (auto& [key, live] : submitted) admit(key, live);
    for (uint64_t key : cancels) {
      auto it = by_key_.find(key);
      if (it == by_key_.end()) continue;
      const std::shared_ptr<Live> live = it->second;  // flush() erases the map's reference
      cancel_live(*live, "cancelled");
    }
    if (stop) {
      std::vector<std::shared_ptr<Live>> all;
      for (auto& [k, l] : by_key_) all.push_back(l);
      for (auto& l : all) cancel_live(*l, "cancelled");
      update_gauges();
      return;
    }
    if (engine_.idle()) {
      update_gauges();
      continue;
    }
    std::vector<EngineEvent> events;
    try {
      events = engine_.step();
    } catch (const std::exception& e) {
      spdlog::error("engine step failed: {}", e.what());
      std::vector<std::shared_ptr<Live>> all;
      for (auto& [k, l] : by_key_) all.push_back(l);
      for (auto& l : all) {
        l->error = std::string("engine step failed: ") + e.what();
        cancel_live(*l, "error");
      }
      update_gauges();
      continue;
    }
    const auto now = Clock::now();
    std::vector<std::shared_ptr<Live>> touched;
    for (EngineEvent& ev : events) {
      auto it = by_engine_id_.find(ev.id);
      if (it == by_engine_id_.end()) continue;
      std::shared_ptr<Live> live = it->second.first;
      const int32_t index = it->second.second * live->n + ev.choice;
      Choice& c = live->choices[static_cast<size_t>(index)];
      if (c.finished) continue;
      if (std::find(touched.begin(), touched.end(), live) == touched.end()) touched.push_back(live);
      if (!ev.tokens.empty()) {
        if (!c.any_token) c.first_token = now;
        c.any_token = true;
        c.last_token = now;
        c.tokens += static_cast<int64_t>(ev.tokens.size());
        live->usage.completion_tokens += static_cast<int64_t>(ev.tokens.size());
        live->usage.accepted_draft_tokens += ev.accepted_draft_tokens;
        if (metrics_)
          metrics_->inc("arbor_generation_tokens_total", static_cast<double>(ev.tokens.size()));
      }
      ChoiceDelta d;
      d.index = index;
      d.tokens = ev.tokens;
      d.logprobs = std::move(ev.logprobs);
      std::string text;
      for (int32_t t : ev.tokens) text += c.decoder->push(t);
      std::string reason;
      const StopStrings& stops = live->stops[static_cast<size_t>(it->second.second)];
      if (!stops.empty()) {
        c.held += text;
        const StopStrings::Scan scan = stops.scan(c.held);
        if (scan.cut != std::string::npos) {
          d.text = c.held.substr(0, scan.cut);
          c.held.clear();
          reason = "stop";
        } else {
          d.text = c.held.substr(0, c.held.size() - scan.keep);
          c.held.erase(0, c.held.size() - scan.keep);
        }
      } else {
        d.text = std::move(text);
      }
      if (ev.finished) {
        live->usage.decode_steps += ev.result.acceptance.steps;
        live->usage.decode_tokens += ev.result.acceptance.emitted;
        if (ev.choice == 0) live->usage.cached_prompt_tokens += ev.result.cached_prompt_tokens;
        if (reason.empty()) reason = ev.result.finish_reason;
      }
      live->out.push_back(std::move(d));
      if (!reason.empty()) {
        const bool stop_string = !ev.finished;
        if (stop_string) engine_.cancel_choice(ev.id, ev.choice);
        finish_choice(*live, index, reason, !stop_string);
      }
    }
    for (auto& live : touched) flush(*live);
    update_gauges();
  }
}

}  // namespace arbor
