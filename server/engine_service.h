// The serving core shared by the HTTP and gRPC front ends: one loop thread owns the Engine and
// steps it while requests exist; front-end threads submit requests and read their output from
// a RequestStream (detokenized text per choice, stop strings applied, logprobs, usage with the
// speculation figures). Cancelling a stream (client gone, stop string, drain) frees its KV
// blocks at the next step boundary. Metrics are updated here.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <absl/base/thread_annotations.h>
#include <absl/synchronization/mutex.h>

#include "engine/runner/engine.h"
#include "engine/tokenizer/tokenizer.h"
#include "server/metrics.h"
#include "server/request_limits.h"

namespace arbor {

struct ServiceRequest {
  GenerationRequest gen;          // prompt ids, sampling, max_tokens, n, logprobs, speculate
  std::vector<std::string> stop;  // stop strings (text level; not included in the output)
  bool skip_special = true;       // special tokens omitted from the text
};

struct Usage {
  int64_t prompt_tokens = 0;
  int64_t completion_tokens = 0;
  int64_t cached_prompt_tokens = 0;
  // Speculation: verify steps that carried a tree, draft tokens accepted, and tokens emitted per
  // decode step (1 without speculation).
  int64_t decode_steps = 0;
  int64_t decode_tokens = 0;  // tokens those steps emitted
  int64_t accepted_draft_tokens = 0;
  double mean_accepted_length() const {
    return decode_steps ? double(decode_tokens) / double(decode_steps) : 0.0;
  }
};

struct ChoiceDelta {
  int32_t index = 0;                   // choice index (prompt i, sample j -> i * n + j)
  std::string text;                    // new text
  std::vector<int32_t> tokens;         // new token ids (those whose text is in `text`, roughly)
  std::vector<TokenLogprob> logprobs;  // per new token when asked
  std::string finish_reason;           // set once: "stop", "length", "cancelled"
};

struct StreamUpdate {
  std::vector<ChoiceDelta> deltas;
  bool done = false;  // every choice finished; usage is final
  Usage usage;
  std::string error;  // set with done when the engine failed the request
};

class EngineService;

// One submitted request (all its prompts and choices). Thread-safe.
class RequestStream {
 public:
  // Waits up to `timeout` for output; false when nothing new arrived. After done, returns
  // false forever.
  bool next(StreamUpdate* out, std::chrono::milliseconds timeout);
  // Client gone or no longer interested: frees the request's KV blocks at the next step.
  void cancel();
  int32_t num_choices() const { return num_choices_; }
  int64_t prompt_tokens() const { return prompt_tokens_; }

 private:
  friend class EngineService;
  bool has_output() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return !pending_.empty() || done_; }
  absl::Mutex mu_;
  std::vector<ChoiceDelta> pending_ ABSL_GUARDED_BY(mu_);
  bool done_ ABSL_GUARDED_BY(mu_) = false;
  bool delivered_done_ ABSL_GUARDED_BY(mu_) = false;
  std::string error_ ABSL_GUARDED_BY(mu_);
  Usage usage_ ABSL_GUARDED_BY(mu_);
  std::atomic<bool> cancelled_{false};
  int32_t num_choices_ = 0;
  int64_t prompt_tokens_ = 0;
  EngineService* service_ = nullptr;
  uint64_t key_ = 0;
};

struct ServiceOptions {
  int32_t max_queue = 256;  // requests waiting for a running slot; beyond: 429
  // Request content limits (server/request_limits.h). limits.max_context 0: the model's (and
  // never more than the KV cache holds); limits.vocab_size is the tokenizer's.
  RequestLimits limits;
};

class EngineService {
 public:
  EngineService(Engine& engine, const Tokenizer& tokenizer, std::vector<int32_t> stop_token_ids,
                ServiceOptions options, Metrics* metrics);
  ~EngineService();

  // Starts the loop thread.
  void start();
  // Queues one request per prompt (choices numbered prompt-major) after check_request() (the
  // one place for content limits). Throws RequestError (a refused field, named),
  // arbor::Error kResourceExhausted (queue full), kUnsupported when draining.
  // `speculate_requested`: the client asked for speculation explicitly.
  std::shared_ptr<RequestStream> submit(std::vector<ServiceRequest> requests,
                                        bool speculate_requested = false);
  // Stops taking requests, waits until every running one finished (or `timeout`, then cancels
  // the rest), stops the loop.
  void drain(std::chrono::milliseconds timeout);
  bool draining() const { return draining_; }

  int32_t max_context() const { return limits_.max_context; }
  const RequestLimits& limits() const { return limits_; }
  const Tokenizer& tokenizer() const { return tokenizer_; }
  const Engine& engine() const { return engine_; }
  size_t live_requests() const { return live_.load(); }

 private:
  friend class RequestStream;
  struct Choice;
  struct Live;
  void loop();
  void request_cancel(uint64_t key);
  void admit(uint64_t key, const std::shared_ptr<Live>& live);
  void cancel_live(Live& live, const std::string& reason);
  void finish_choice(Live& live, int32_t index, const std::string& reason, bool natural);
  void flush(Live& live);
  void update_gauges();
  bool has_work() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stop_ || !submitted_.empty() || !cancels_.empty();
  }

  Engine& engine_;
  const Tokenizer& tokenizer_;
  std::vector<int32_t> stop_token_ids_;
  ServiceOptions options_;
  Metrics* metrics_;
  RequestLimits limits_;

  // Front-end threads hand requests and cancels to the loop thread here.
  absl::Mutex mu_;
  std::deque<std::pair<uint64_t, std::shared_ptr<Live>>> submitted_ ABSL_GUARDED_BY(mu_);
  std::vector<uint64_t> cancels_ ABSL_GUARDED_BY(mu_);
  bool stop_ ABSL_GUARDED_BY(mu_) = false;
  uint64_t next_key_ ABSL_GUARDED_BY(mu_) = 1;
  std::atomic<bool> draining_{false};
  std::atomic<size_t> live_{0};
  std::atomic<int64_t> queued_{0};  // sequences waiting in the scheduler (loop thread writes)
  std::thread thread_;

  // Loop thread only.
  std::unordered_map<ReqId, std::pair<std::shared_ptr<Live>, int32_t>> by_engine_id_;  // + prompt
  std::unordered_map<uint64_t, std::shared_ptr<Live>> by_key_;
  ReqId next_engine_id_ = 1;
};

}  // namespace arbor
