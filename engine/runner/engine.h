// The engine: one step at a time over a changing set of requests. Requests are added and
// cancelled between steps (the server's loop thread owns the engine); each step() asks the
// scheduler for a plan (admission, chunked prefill beside speculative decode, tree budgets,
// preemption), drafts trees through the proposer, runs one forward pass, verifies the trees
// (lossless rejection sampling or greedy), compacts the accepted KV and returns the tokens each
// request produced. n > 1 samples of a prompt prefill once and fork the prompt's KV blocks.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache/kv_cache_manager.h"
#include "engine/model/llama_model.h"
#include "engine/runner/cost_probe.h"
#include "engine/sampling/sampler.h"
#include "engine/scheduler/scheduler.h"
#include "engine/spec/proposer.h"
#include "engine/verify/verifier.h"

namespace arbor {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, BOS included when wanted
  SamplingParams sampling;
  int32_t max_tokens = 128;             // generated tokens at most (per choice)
  bool ignore_eos = false;              // keep going past EOS (benchmarks)
  std::vector<int32_t> stop_token_ids;  // ends the request besides the model's EOS
  bool speculate = true;                // use the engine's proposer (if it has one)
  int32_t n = 1;                        // independent samples (choices) of the prompt
  int32_t logprobs = -1;                // -1: none; k >= 0: chosen token's + top k alternatives
};

struct GenerationResult {
  std::vector<int32_t> tokens;       // generated ids (a stop token included)
  std::string finish_reason;         // "stop" (EOS / stop id), "length" or "cancelled"
  int32_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int32_t preemptions = 0;
  AcceptanceStats acceptance;  // decode / verify steps: tokens emitted per step, by depth
};

struct TokenLogprob {
  int32_t token = -1;
  float logprob = 0;                           // log p(token) under the model (raw logits)
  std::vector<std::pair<int32_t, float>> top;  // the k most likely, best first
};

// What one step did for one choice of one request.
struct EngineEvent {
  ReqId id = 0;
  int32_t choice = 0;
  std::vector<int32_t> tokens;         // newly generated
  std::vector<TokenLogprob> logprobs;  // [tokens.size()] when the request asked for them
  int32_t accepted_draft_tokens = 0;   // of `tokens`, drafted by the proposer and accepted
  bool finished = false;
  GenerationResult result;  // when finished: the choice's whole result
};

// Buckets per power of two for a decode step's token count under adaptive trees
// (EngineConfig::pad_trees): at most a quarter of the step is padding.
constexpr int64_t kStepTokenBuckets = 4;

struct EngineConfig {
  // KV cache blocks; 0: as many as gpu_memory_utilization of the backend's memory holds after
  // the weights and a profiled step (runner/kv_sizing.h), which `arbor serve` and `generate` do
  // by default.
  int32_t num_blocks = 256;
  double gpu_memory_utilization = 0.9;  // with num_blocks 0; host memory on the CPU backend
  int32_t block_size = 16;              // tokens per block
  int32_t max_step_tokens = 512;        // token budget of one step (prefill chunking)
  int32_t max_running = 64;             // sequences running at once
  bool prefix_caching = true;
  TreeBudget tree_budget;       // largest tree a proposer may return
  bool adaptive_trees = false;  // size trees per step from the cost model (else tree_budget)
  CostModelConfig cost;         // for adaptive trees
  // Adaptive trees: measure the served model's verify-step curve when the engine starts
  // (runner/cost_probe.h) and plan with it instead of cost.curves; the online correction stays.
  bool measure_cost = false;
  CostProbeOptions cost_probe;
  // A --cost-model value: "" leaves the prior, "measure" sets measure_cost, anything else is a
  // curve file (load_cost_model).
  void set_cost_model(const std::string& value);
  VerifyOptions verify;  // rejection sampling (lossless) unless typical is asked for
  // Sample and verify on the backend (Backend::sample_trees) when every item of a step can
  // (no logprobs; rejection mode or greedy): only ids cross to the host, never [M, vocab]
  // logits. Off: logits are downloaded and verified on the host (same tokens for a seed).
  bool backend_sampling = true;
  // Pad drafted trees (within their budgets) with extra candidate children of the root, so
  // that verify steps repeat the few token counts that recorded step graphs replay (a graph key
  // holds the step's token count). Trees that vary from step to step (n-gram:
  // Proposer::varying_tree_sizes): one tree to its size rounded up to a power of two, several
  // to a total in 2 buckets per power of two. With adaptive_trees, for every proposer: the
  // planned budgets are raised and the trees padded so that a decode step that verifies a tree
  // scores graph_bucket(tokens, kStepTokenBuckets) tokens (the policy's budgets change from step
  // to step). Lossless: the extra children are deterministic candidates like any other. -1:
  // when the model records step graphs (CUDA); 0: never; 1: always.
  int32_t pad_trees = -1;
  // Let the proposer leave its trees' tokens on its backend when the model's backend can read
  // them there (Proposer::set_tree_reader; one rank only): the step's ids and the tree sampling
  // take them on the device and the accepted ones come back with the verify step's results, so
  // a drafting step waits for the device once. Off: tokens come to the host after drafting.
  bool device_tree_tokens = true;
  void validate() const;
};

struct EngineStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;    // prompt tokens run through the model
  int64_t decode_tokens = 0;     // tokens generated
  int64_t tree_tokens = 0;       // tokens scored in decode / verify steps (tree nodes)
  int64_t logits_downloads = 0;  // steps whose [M, vocab] logits were copied to the host
  // Steps whose drafter got the target's hidden states at the accepted paths only
  // (ForwardRequest::path_hidden), not every row's.
  int64_t path_feedback_steps = 0;
  // Steps whose verified paths the proposer folded in on the device, before the step's wait
  // (Proposer::observe_paths_on_device).
  int64_t device_path_steps = 0;
  // Steps whose trees' tokens the step read on the drafter's backend (DraftTree::device).
  int64_t device_token_steps = 0;
  int64_t preemptions = 0;
  double prefill_seconds = 0;  // wall time of steps that carried prefill only
  double decode_seconds = 0;   // wall time of steps that carried decode only
  double mixed_seconds = 0;    // steps with both
  double draft_seconds = 0;    // proposer: drafting trees (propose_batch)
  // Of the steps whose draft returned before the device ran it (Proposer::last_draft_device_ms):
  // that device time, which the forward's wait includes.
  double draft_device_seconds = 0;
  double feedback_seconds = 0;  // proposer: folding accepted tokens into its state (observe)
  // The host's stages of a step around the forward and the proposer (Engine::step): planning
  // (admission, budgets), the drafted trees' handling outside the proposer (checks, padding),
  // reserving KV and applying the plan, building the step's inputs (tree layouts and masks),
  // verification (accepted paths from the results), committing (KV compaction, emitted tokens,
  // stops) and learning (cost models, finished requests dropped).
  struct Stages {
    double plan = 0, trees = 0, reserve = 0, inputs = 0, verify = 0, commit = 0, learn = 0;
    double sum() const { return plan + trees + reserve + inputs + verify + commit + learn; }
  };
  Stages stage_seconds;
  AcceptanceStats acceptance;  // all verify steps with a tree of more than one node
};

class Engine {
 public:
  // `proposer` (optional, not owned) drafts trees for requests with speculate set.
  Engine(LlamaModel& model, const EngineConfig& config, Proposer* proposer = nullptr);
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // Validates (kInvalidArgument naming the field; kResourceExhausted when the request can never
  // fit in the KV cache) and queues the request. `id` must be new.
  void add(ReqId id, const GenerationRequest& request);
  // The request checks of add() that do not depend on the engine's state (prompt ids, max_tokens,
  // n, logprobs, stop ids, sampling): reads only immutable configuration, so front-end threads
  // may call it while the loop thread steps.
  void check(const GenerationRequest& request) const;
  // Stops a request (every choice, or one choice), freeing its KV blocks at once. Returns false
  // when it is unknown (already finished). Cancelled choices produce no further events.
  bool cancel(ReqId id);
  bool cancel_choice(ReqId id, int32_t choice);
  // One step; the events of every choice that produced tokens or finished.
  std::vector<EngineEvent> step();
  bool idle() const { return requests_.empty(); }
  size_t num_requests() const { return requests_.size(); }

  const Scheduler& scheduler() const { return sched_; }
  // The tree policy's learned state (Scheduler::PolicyState), to start another engine from.
  Scheduler::PolicyState policy_state() const { return sched_.policy_state(); }
  void restore_policy_state(const Scheduler::PolicyState& state) {
    sched_.restore_policy_state(state);
  }
  const KvCacheManager& kv() const { return kv_; }
  const EngineStats& stats() const { return stats_; }
  const LlamaModel& model() const { return model_; }
  // The KV cache's capacity and, when it was sized from memory, how (one line for the log).
  const std::string& kv_capacity() const { return kv_capacity_; }
  bool has_proposer() const { return proposer_ != nullptr; }

 private:
  struct Choice;
  struct Request;
  void drop(uint64_t sid);  // removes a choice from the scheduler and proposer
  // One request's feedback with its own storage: a verify step's is kept until the step's loop
  // has verified every request, so that all of them reach the proposer in one
  // Proposer::observe_batch call.
  struct PendingFeedback {
    TargetFeedback view() const;  // spans into this object
    uint64_t sid = 0;
    int32_t start = 0;
    std::vector<int32_t> tokens;
    std::vector<float> hidden;
    std::vector<std::vector<float>> captured;
    int32_t next = -1;
    bool prompt = false;  // a prefill chunk's rows (not a verified path: not a drafting cost)
  };
  // Hands the proposer a request's newly committed positions (with defer: into *defer instead).
  // Their hidden rows are out_.hidden's first_row + rows[i], or with path_rows (an item's
  // accepted path, ForwardRequest::path_hidden) path_rows + i * hidden_size.
  void feed(Choice& c, int32_t start, const std::vector<int32_t>& tokens,
            const std::vector<int32_t>& rows, int32_t first_row, int32_t next,
            PendingFeedback* defer = nullptr, const float* path_rows = nullptr);

  // step()'s stages, in order (README.md): plan (Scheduler::plan_step) -> draft -> reserve
  // (Scheduler::reserve_step, apply_plan) -> forward -> verify -> commit -> observe.
  struct StepRun;
  // Step graphs are keyed by the step's token count (EngineConfig::pad_trees): whether trees
  // are padded for them, and whether a decode step's whole count is (adaptive trees).
  bool pad_for_graphs() const;
  bool bucket_steps() const;
  // Adaptive trees with step graphs: raises the planned tree budgets (smallest first, up to the
  // largest tree) until the decode step's tokens reach graph_bucket(tokens, kStepTokenBuckets),
  // so that the policy's changing budgets replay a few recorded sizes.
  void bucket_budgets(PlannedStep* planned) const;
  // Drafts the planned trees (all requests in one Proposer::propose_batch call), pads them for
  // step graphs; returns each tree's node count.
  std::vector<int32_t> draft(const PlannedStep& planned, StepRun* run);
  // Preemptions, admissions and detachments reach the proposer; copy-on-write copies run.
  void apply_plan(const StepPlan& plan);
  // Builds the flat step and runs the model: argmax ids only, or sampling and verification on
  // the backend, or the logits, whichever every item allows.
  void forward(StepRun* run);
  // Every decode item's VerifyResult.
  void verify(StepRun* run);
  // Brings trees' tokens left on the drafter's backend to the host: one download (one wait)
  // per buffer they sit in.
  void resolve_device_tokens(DraftTree* tree);
  void resolve_device_tokens(const std::vector<DraftTree*>& trees);
  // Prefill chunks commit (a last chunk samples the first token; n > 1 forks here), verified
  // paths commit and compact, tokens are emitted up to a stop.
  void commit(StepRun* run);
  // Emits tokens for a choice, stopping at a stop token or max_tokens; `rows` are the logits
  // rows that predicted them, `item` its index among the backend-sampled items (-1: none).
  void emit(StepRun* run, Choice& c, const std::vector<int32_t>& tokens,
            const std::vector<int32_t>& rows, int32_t accepted, int32_t item);
  // The proposer observes the step's accepted paths in one call; the cost models learn.
  void observe(StepRun* run);
  // Floats in one row of ForwardOutput::sampled.path_rows: the hidden size, times the capture
  // layers for EAGLE-3.
  int64_t feature_width() const;

  LlamaModel& model_;
  std::string kv_capacity_;  // before config_: set while config_ is sized
  EngineConfig config_;
  Proposer* proposer_;
  KvCacheManager kv_;
  Scheduler sched_;
  EngineStats stats_;
  ForwardRequest want_;
  ForwardOutput out_;
  // out_.feature_rows inverted: flat row -> its row in out_.hidden / captured (empty: the same).
  std::vector<int32_t> feature_index_;
  std::unordered_map<ReqId, std::shared_ptr<Request>> requests_;
  std::unordered_map<uint64_t, std::unique_ptr<Choice>> choices_;  // by scheduler id
  uint64_t next_sid_ = 1;
};

}  // namespace arbor
