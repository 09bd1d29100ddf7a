#include "engine/runner/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <optional>
#include <span>
#include <unordered_set>

#include "engine/backend/step_graphs.h"
#include "engine/core/error.h"
#include "engine/core/host_math.h"
#include "engine/runner/batch_builder.h"
#include "engine/runner/kv_sizing.h"
#include "engine/verify/device_verify.h"
#include "engine/verify/tree_layout.h"

namespace arbor {

void EngineConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0)
      throw_error(ErrorCode::kInvalidArgument,
                  std::string(name) + " must be positive, got " + std::to_string(v));
  };
  if (num_blocks < 0)
    throw_error(
        ErrorCode::kInvalidArgument,
        "num_blocks must be >= 0 (0: sized from memory), got " + std::to_string(num_blocks));
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1))
    throw_error(ErrorCode::kInvalidArgument, "gpu_memory_utilization must be in (0, 1], got " +
                                                 std::to_string(gpu_memory_utilization));
  positive("block_size", block_size);
  positive("max_step_tokens", max_step_tokens);
  positive("max_running", max_running);
  positive("tree_budget.max_nodes", tree_budget.max_nodes);
  if (tree_budget.max_depth < 0)
    throw_error(ErrorCode::kInvalidArgument,
                "tree_budget.max_depth must be >= 0, got " + std::to_string(tree_budget.max_depth));
  if (pad_trees < -1 || pad_trees > 1)
    throw_error(ErrorCode::kInvalidArgument,
                "pad_trees must be -1 (auto), 0 or 1, got " + std::to_string(pad_trees));
  if (measure_cost) cost_probe.validate();
}

void EngineConfig::set_cost_model(const std::string& value) {
  measure_cost = value == "measure";
  if (!value.empty() && !measure_cost) cost = load_cost_model(value);
}

namespace {

KvCacheConfig kv_config(const EngineConfig& c) {
  c.validate();
  KvCacheConfig k;
  k.num_blocks = c.num_blocks;
  k.block_size = c.block_size;
  k.enable_prefix_caching = c.prefix_caching;
  return k;
}

SchedulerConfig sched_config(const EngineConfig& c) {
  SchedulerConfig s;
  s.max_step_tokens = c.max_step_tokens;
  s.max_running = c.max_running;
  s.tree.adaptive = c.adaptive_trees;
  s.tree.max_tree = c.tree_budget;
  s.tree.max_tree.max_nodes = std::min(c.tree_budget.max_nodes, c.max_step_tokens);
  s.cost = c.cost;
  return s;
}

SamplingParams choice_params(const SamplingParams& p, int32_t choice) {
  SamplingParams q = p;
  if (q.seed && choice > 0)
    q.seed = *q.seed + 0x9E3779B97F4A7C15ull * static_cast<uint64_t>(choice);
  return q;
}

TokenLogprob logprob_of(std::span<const float> logits, int32_t token, int32_t k) {
  const float lse = host_math::logsumexp(logits);
  TokenLogprob t;
  t.token = token;
  t.logprob = logits[token] - lse;
  if (k > 0)
    for (int32_t id : host_math::top_k(logits, k)) t.top.emplace_back(id, logits[id] - lse);
  return t;
}

// True when a request's next tokens are the raw logits' argmax: greedy sampling whose logits
// processing is the identity (no logit bias, no penalties) and no logprobs. Its step then needs
// only the argmax ids (ForwardRequest::argmax_only), and verify_greedy_argmax() equals verify()
// for its trees.
bool argmax_suffices(const GenerationRequest& r, const SamplingParams& p) {
  return p.greedy() && p.logit_bias.empty() && p.repetition_penalty == 1.0f &&
         p.presence_penalty == 0.0f && p.frequency_penalty == 0.0f && r.logprobs < 0;
}

// The greedy token of an argmax_only logits row; -1 (NaN, +inf or only -inf) fails as argmax()
// of the logits would.
int32_t checked_argmax(int32_t id, int64_t vocab) {
  if (id < 0 || id >= vocab)
    throw_error(ErrorCode::kInvalidArgument, "the target's logits have no argmax (argmax id " +
                                                 std::to_string(id) +
                                                 ": a NaN or +inf, or every logit -inf)");
  return id;
}

}  // namespace

struct Engine::Request {
  ReqId id = 0;
  GenerationRequest req;
  int32_t live = 0;            // choices not finished or cancelled
  bool forked = false;         // choices 1..n-1 exist
  std::vector<uint64_t> sids;  // [n] scheduler id per choice (0: not created / gone)
};

struct Engine::Choice {
  uint64_t sid = 0;
  std::shared_ptr<Request> request;
  int32_t index = 0;
  Sampler sampler;
  Rng rng;
  bool speculate = false;
  bool begun = false;  // open in the proposer
  DraftTree draft;
  GenerationResult result;

  Choice(uint64_t s, std::shared_ptr<Request> r, int32_t i, bool spec)
      : sid(s),
        request(std::move(r)),
        index(i),
        sampler(choice_params(request->req.sampling, i)),
        rng(sampler.make_rng()),
        speculate(spec) {}
  const GenerationRequest& req() const { return request->req; }
};

namespace {

ForwardRequest forward_request_for(const Proposer* proposer) {
  ForwardRequest want;
  if (proposer != nullptr) {
    want.final_hidden = proposer->needs_hidden();
    want.capture_layers = proposer->capture_layers();
  }
  return want;
}

// `config` with num_blocks 0 resolved from the backend's memory (runner/kv_sizing.h), the
// backend's KV cache allocated; the capacity line in *capacity.
EngineConfig sized_config(LlamaModel& model, EngineConfig config, const Proposer* proposer,
                          std::string* capacity) {
  config.validate();
  std::optional<KvSizing> sized;
  if (config.num_blocks == 0) {
    sized =
        size_kv_cache(model, config.gpu_memory_utilization, config.block_size,
                      config.max_step_tokens, config.max_running, forward_request_for(proposer));
    config.num_blocks = static_cast<int32_t>(sized->num_blocks);
  }
  // Before the block manager exists: a cache that does not fit is an error naming the sizes.
  const KvCacheShape shape = model.kv_shape(config.num_blocks, config.block_size);
  model.allocate_kv(shape);
  *capacity = describe_kv_capacity(shape, model.backend().kv_cache_bytes(shape),
                                   model.config().max_position, sized ? &*sized : nullptr);
  if (model.tensor_parallel() > 1)
    *capacity += "; the sizes are each rank's (" + std::to_string(shape.num_kv_heads) + " of " +
                 std::to_string(model.config().num_kv_heads) + " KV heads on each of " +
                 std::to_string(model.tensor_parallel()) + " ranks)";
  return config;
}

}  // namespace

Engine::Engine(LlamaModel& model, const EngineConfig& config, Proposer* proposer)
    : model_(model),
      config_(sized_config(model, config, proposer, &kv_capacity_)),
      proposer_(proposer),
      kv_(kv_config(config_)),
      sched_(kv_, sched_config(config_)) {
  want_ = forward_request_for(proposer_);
  if (bucket_steps()) sched_.set_step_token_buckets(static_cast<int32_t>(kStepTokenBuckets));
  if (proposer_ != nullptr && config_.device_tree_tokens && model_.tensor_parallel() == 1)
    proposer_->set_tree_reader(&model_.backend());
  if (config_.measure_cost && config_.adaptive_trees) {
    // Before any request: the probe writes into the (still empty) KV cache.
    CostModelConfig cost = config_.cost;
    cost.curves =
        measure_verify_cost(model_, proposer_, config_.cost_probe, config_.max_step_tokens,
                            config_.max_running, config_.tree_budget.max_nodes);
    if (!cost.curves.empty()) sched_.set_cost(std::move(cost));
  }
}

Engine::~Engine() = default;

void Engine::check(const GenerationRequest& r) const {
  const int64_t vocab = model_.config().vocab_size;
  if (r.prompt.empty())
    throw_error(ErrorCode::kInvalidArgument, "the prompt is empty (no prompt tokens)");
  for (int32_t t : r.prompt)
    if (t < 0 || t >= vocab)
      throw_error(ErrorCode::kInvalidArgument, "token id " + std::to_string(t) +
                                                   " is outside the vocabulary of " +
                                                   std::to_string(vocab));
  if (r.max_tokens <= 0)
    throw_error(ErrorCode::kInvalidArgument,
                "max_tokens must be positive, got " + std::to_string(r.max_tokens));
  if (r.n < 1 || r.n > 128)
    throw_error(ErrorCode::kInvalidArgument, "n must be in [1, 128], got " + std::to_string(r.n));
  if (r.logprobs < -1 || r.logprobs > 20)
    throw_error(ErrorCode::kInvalidArgument,
                "logprobs must be in [0, 20], got " + std::to_string(r.logprobs));
  for (int32_t t : r.stop_token_ids)
    if (t < 0 || t >= vocab)
      throw_error(ErrorCode::kInvalidArgument,
                  "stop token id " + std::to_string(t) + " is outside the vocabulary");
  r.sampling.validate();
  // Refused here, at add, rather than by the sampler mid-step (where it would fail the step).
  for (const auto& [t, bias] : r.sampling.logit_bias)
    if (t >= vocab)
      throw_error(ErrorCode::kInvalidArgument, "logit_bias token id " + std::to_string(t) +
                                                   " is outside the vocabulary of " +
                                                   std::to_string(vocab));
}

void Engine::add(ReqId id, const GenerationRequest& r) {
  if (requests_.count(id))
    throw_error(ErrorCode::kInvalidArgument, "request " + std::to_string(id) + " already exists");
  check(r);
  const bool spec = proposer_ != nullptr && r.speculate;
  const int64_t capacity = static_cast<int64_t>(config_.num_blocks) * config_.block_size;
  const int64_t need = static_cast<int64_t>(r.prompt.size()) + r.max_tokens +
                       (spec ? config_.tree_budget.max_nodes : 0);
  if (need > capacity)
    throw_error(ErrorCode::kResourceExhausted,
                "the request needs " + std::to_string(need) + " KV slots (prompt " +
                    std::to_string(r.prompt.size()) + " + max_tokens " +
                    std::to_string(r.max_tokens) + ") but the cache holds " +
                    std::to_string(capacity));
  auto req = std::make_shared<Request>();
  req->id = id;
  req->req = r;
  req->live = 1;
  req->sids.assign(static_cast<size_t>(r.n), 0);
  const uint64_t sid = next_sid_++;
  req->sids[0] = sid;
  choices_.emplace(sid, std::make_unique<Choice>(sid, req, 0, spec));
  sched_.add(sid, r.prompt, spec);
  requests_.emplace(id, std::move(req));
}

void Engine::drop(uint64_t sid) {
  auto it = choices_.find(sid);
  if (it == choices_.end()) return;
  Choice& c = *it->second;
  sched_.remove(sid);
  if (c.begun) proposer_->end(static_cast<RequestId>(sid));
  Request& r = *c.request;
  r.sids[static_cast<size_t>(c.index)] = 0;
  r.live--;
  if (r.live == 0) requests_.erase(r.id);
  choices_.erase(it);
}

bool Engine::cancel(ReqId id) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return false;
  std::shared_ptr<Request> r = it->second;
  for (uint64_t sid : r->sids)
    if (sid) drop(sid);
  requests_.erase(id);
  return true;
}

bool Engine::cancel_choice(ReqId id, int32_t choice) {
  auto it = requests_.find(id);
  if (it == requests_.end() || choice < 0 || choice >= it->second->req.n) return false;
  std::shared_ptr<Request> r = it->second;
  const uint64_t sid = r->sids[static_cast<size_t>(choice)];
  if (!sid) return false;
  if (choice == 0 && !r->forked && r->req.n > 1) return cancel(id);  // siblings not born yet
  drop(sid);
  return true;
}

int64_t Engine::feature_width() const {
  const int64_t layers = static_cast<int64_t>(want_.capture_layers.size());
  return model_.config().hidden_size * (want_.final_hidden || layers == 0 ? 1 : layers);
}

TargetFeedback Engine::PendingFeedback::view() const {
  TargetFeedback fb;
  fb.request = static_cast<RequestId>(sid);
  fb.start = start;
  fb.tokens = tokens;
  fb.hidden = hidden;
  for (const auto& x : captured) fb.captured.emplace_back(x);
  fb.next_token = next;
  return fb;
}

void Engine::feed(Choice& c, int32_t start, const std::vector<int32_t>& tokens,
                  const std::vector<int32_t>& rows, int32_t first_row, int32_t next,
                  PendingFeedback* defer, const float* path_rows) {
  if (!c.speculate) return;
  PendingFeedback now;
  PendingFeedback& p = defer != nullptr ? *defer : now;
  p.sid = c.sid;
  p.start = start;
  p.tokens = tokens;
  p.next = next;
  const int64_t hs = model_.config().hidden_size;
  // Where flat row r's features sit in out_.hidden / captured.
  auto at = [&](int32_t r) -> int64_t {
    if (feature_index_.empty()) return r;
    const int32_t i = feature_index_.at(static_cast<size_t>(r));
    ARBOR_CHECK(i >= 0, "features of row " + std::to_string(r) + " did not come back");
    return i;
  };
  p.hidden.clear();
  if (want_.final_hidden) {
    p.hidden.reserve(rows.size() * hs);
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* src = path_rows != nullptr ? path_rows + static_cast<int64_t>(i) * hs
                                              : out_.hidden.data() + at(first_row + rows[i]) * hs;
      p.hidden.insert(p.hidden.end(), src, src + hs);
    }
  }
  // EAGLE-3's layers: a path row holds them side by side (ForwardRequest::path_hidden).
  const size_t layers = want_.capture_layers.size();
  p.captured.assign(layers, {});
  for (size_t l = 0; l < layers; ++l)
    for (size_t i = 0; i < rows.size(); ++i) {
      const float* src = path_rows != nullptr
                             ? path_rows + (static_cast<int64_t>(i * layers + l)) * hs
                             : out_.captured[l].data() + at(first_row + rows[i]) * hs;
      p.captured[l].insert(p.captured[l].end(), src, src + hs);
    }
  if (defer == nullptr) proposer_->observe(now.view());
}

namespace {

// Extra children of the root until `tree` has `size` nodes (EngineConfig::pad_trees). They are
// deterministic candidates, so any tokens keep verification lossless (a child repeating an
// earlier sibling's token is never accepted before it); the request's recent tokens first (text
// repeats), then ids from 0, never a token the root has as a child on the host. Tokens left on
// the drafter's device stay there (the extra children's are on the host: index -1), so padding
// never waits for the device. A tree whose root children were sampled from a draft
// distribution is left as it is.
void pad_tree(DraftTree* tree, int32_t size, std::span<const int32_t> context, int64_t vocab) {
  if (tree->size() >= size || (!tree->q_row.empty() && tree->q_row[0] >= 0)) return;
  const bool device = !tree->device.empty();
  std::unordered_set<int32_t> used;
  for (int32_t i = 1; i < tree->size(); ++i) {
    const auto k = static_cast<size_t>(i);
    if (tree->parent[k] == 0 && (!device || tree->device.index[k] < 0)) used.insert(tree->token[k]);
  }
  auto add = [&](int32_t t) {
    if (tree->size() >= size || t < 0 || t >= vocab || !used.insert(t).second) return;
    tree->parent.push_back(0);
    tree->token.push_back(t);
    if (!tree->q_row.empty()) tree->q_row.push_back(-1);
    if (device) tree->device.index.push_back(-1);
    if (!tree->device.parent_index.empty()) tree->device.parent_index.push_back(-1);
  };
  for (size_t i = context.size(); i > 0 && tree->size() < size && context.size() - i < 256; --i)
    add(context[i - 1]);
  for (int32_t t = 0; t < vocab && tree->size() < size; ++t) add(t);
}

// Deals `extra` nodes one at a time to the smallest of `size`'s entries listed in `open` that
// are below their `cap`; returns what could not be dealt.
int64_t deal_nodes(std::vector<int32_t>* size, const std::vector<int32_t>& cap,
                   const std::vector<size_t>& open, int64_t extra) {
  std::vector<int32_t>& s = *size;
  while (extra > 0) {
    size_t pick = s.size();
    for (size_t i : open)
      if (s[i] < cap[i] && (pick == s.size() || s[i] < s[pick])) pick = i;
    if (pick == s.size()) break;  // every open entry is at its cap
    ++s[pick];
    --extra;
  }
  return extra;
}

}  // namespace

// One step's state, handed from stage to stage.
struct Engine::StepRun {
  explicit StepRun(int64_t vocab) : sampling(vocab) {}
  std::chrono::steady_clock::time_point start;
  // draft
  double drafted_ms = 0;
  int32_t drafted_depth = 0;
  bool draft_warmup = false;  // the draft ran a new shape eagerly or recorded its graph
  // reserve
  StepPlan plan;
  // forward
  StepInputs inputs;
  std::vector<int32_t> first_logit;  // [items] the first logits row of each item
  bool any_prefill = false, any_decode = false;
  bool argmax_only = false;     // only argmax ids came back (ForwardRequest::argmax_only)
  bool backend_sample = false;  // sampled / verified on the backend (ForwardRequest::sample)
  bool path_hidden = false;     // hidden states of the accepted paths only (path_rows)
  // The proposer's time folding the paths in inside the forward (observe_paths_on_device).
  double device_paths_ms = 0;
  TreeSampleBuilder sampling;
  std::vector<int32_t> sample_item;  // [items] index in `sampling`, -1 when not sampled there
  bool warmup = false;               // the forward warmed up a step graph (see forward())
  // verify
  std::vector<VerifyResult> verified;  // [items] decode items' results
  // commit
  std::vector<EngineEvent> events;
  std::vector<uint64_t> finished;
  std::vector<PendingFeedback> pending;  // verify steps' feedback, observed after the commits
  int32_t emitted = 0;                   // tokens the decode items emitted
};

std::vector<EngineEvent> Engine::step() {
  using Clock = std::chrono::steady_clock;
  StepRun run(model_.config().vocab_size);
  run.start = Clock::now();
  EngineStats::Stages& st = stats_.stage_seconds;
  Clock::time_point mark = run.start;
  const auto lap = [&mark](double* into) {  // the time since the last lap, into a stage
    const Clock::time_point now = Clock::now();
    *into += std::chrono::duration<double>(now - mark).count();
    mark = now;
  };
  PlannedStep planned = sched_.plan_step();  // admission, items, budgets
  bucket_budgets(&planned);                  // room to reach a step-graph size
  lap(&st.plan);
  const std::vector<int32_t> sizes = draft(planned, &run);  // trees, all requests at once
  lap(&st.trees);
  st.trees -= run.drafted_ms * 1e-3;                          // the proposer's part: draft_seconds
  run.plan = sched_.reserve_step(std::move(planned), sizes);  // KV slots, preemption
  apply_plan(run.plan);
  lap(&st.reserve);
  if (run.plan.items.empty()) return {};
  forward(&run);        // one forward pass; sampling and verification on the backend where it can
  mark = Clock::now();  // (inputs and the forward timed inside)
  verify(&run);         // every tree's accepted path (from the backend's results or on the host)
  lap(&st.verify);
  commit(&run);  // KV compaction, tokens emitted, stops
  lap(&st.commit);
  const double feedback_before = stats_.feedback_seconds;
  observe(&run);  // the proposer folds in the accepted paths; the cost models learn the step
  for (uint64_t sid : run.finished) drop(sid);
  lap(&st.learn);
  st.learn -= stats_.feedback_seconds - feedback_before;  // the proposer's part: feedback
  return std::move(run.events);
}

bool Engine::pad_for_graphs() const {
  return config_.pad_trees == 1 || (config_.pad_trees == -1 && model_.step_graphs());
}

bool Engine::bucket_steps() const {
  return proposer_ != nullptr && config_.adaptive_trees && pad_for_graphs();
}

void Engine::bucket_budgets(PlannedStep* planned) const {
  if (!bucket_steps() || planned->trees.empty() || planned->has_prefill()) return;
  const int32_t max_nodes = sched_.config().tree.max_tree.max_nodes;
  std::vector<int32_t> size, cap(planned->trees.size(), max_nodes);
  std::vector<size_t> open;
  int64_t total = planned->decodes_without_tree();
  for (const auto& [sid, budget] : planned->trees) {
    open.push_back(size.size());
    size.push_back(budget.max_nodes);
    total += budget.max_nodes;
  }
  const int64_t target =
      std::min<int64_t>(graph_bucket(total, kStepTokenBuckets), config_.max_step_tokens);
  deal_nodes(&size, cap, open, target - total);
  for (size_t i = 0; i < size.size(); ++i) planned->trees[i].second.max_nodes = size[i];
}

std::vector<int32_t> Engine::draft(const PlannedStep& planned, StepRun* run) {
  const std::vector<std::pair<ReqId, TreeBudget>>& wanted = planned.trees;
  if (wanted.empty()) return {};
  const int64_t vocab = model_.config().vocab_size;
  std::vector<std::pair<RequestId, TreeBudget>> requests;
  for (const auto& [sid, budget] : wanted)
    requests.push_back({static_cast<RequestId>(sid), budget});
  // The drafting time is the step's, recorded against its deepest budget.
  const StepGraphStats graphs_before = proposer_->draft_graph_stats();
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<DraftTree> trees = proposer_->propose_batch(requests);
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  run->draft_warmup = proposer_->draft_graph_stats().warmed_up_since(graphs_before);
  stats_.draft_seconds += ms * 1e-3;
  run->drafted_ms += ms;
  for (const auto& w : wanted)
    run->drafted_depth = std::max(run->drafted_depth, w.second.max_depth);
  ARBOR_CHECK(trees.size() == wanted.size(), "proposer returned " + std::to_string(trees.size()) +
                                                 " trees for " + std::to_string(wanted.size()) +
                                                 " requests");
  std::vector<int32_t> n;
  for (size_t i = 0; i < wanted.size(); ++i) {
    const auto& [sid, budget] = wanted[i];
    Choice& c = *choices_.at(sid);
    c.draft = std::move(trees[i]);
    ARBOR_CHECK(!c.draft.token.empty() && c.draft.token[0] == sched_.context(sid).back(),
                "proposer tree root differs from the request's newest token");
    n.push_back(std::min<int32_t>(c.draft.size(), budget.max_nodes));
  }
  // A step graph's key holds the step's token count, not each request's tree size: trees that
  // came back smaller than their budgets are padded (pad_tree) so that the count lands on a
  // bucket. With adaptive trees the whole decode step's count (bucket_budgets gave the budgets
  // the room); else, for proposers whose trees vary (n-gram), the trees' total: the next power
  // of two for one tree, 2 buckets per power of two for several.
  const bool bucket = bucket_steps() && !planned.has_prefill();
  if (bucket || (proposer_->varying_tree_sizes() && pad_for_graphs())) {
    // Trees that may grow: not cut to their budgets later, and (outside step bucketing, where
    // a step with any tree pads all of them) not a bare root.
    std::vector<size_t> open;
    std::vector<int32_t> cap;
    int64_t total = 0;
    bool any_tree = false;
    for (size_t i = 0; i < wanted.size(); ++i) {
      total += n[i];
      cap.push_back(wanted[i].second.max_nodes);
      any_tree = any_tree || n[i] >= 2;
      if ((bucket || n[i] >= 2) && choices_.at(wanted[i].first)->draft.size() <= n[i])
        open.push_back(i);
    }
    // With no tree at all the step is plain decoding's shape already.
    const int64_t others = planned.decodes_without_tree();
    const int64_t target = !bucket    ? graph_bucket(total, wanted.size() > 1 ? 2 : 1)
                           : any_tree ? graph_bucket(total + others, kStepTokenBuckets) - others
                                      : total;
    std::vector<int32_t> size = n;
    deal_nodes(&size, cap, open, target - total);
    for (size_t i : open) {
      Choice& c = *choices_.at(wanted[i].first);
      pad_tree(&c.draft, size[i], sched_.context(wanted[i].first), vocab);
      n[i] = c.draft.size();
    }
  }
  return n;
}

void Engine::apply_plan(const StepPlan& plan) {
  for (ReqId sid : plan.preempted) {
    Choice& c = *choices_.at(sid);
    c.result.preemptions++;
    stats_.preemptions++;
    if (c.begun) proposer_->end(static_cast<RequestId>(sid));
    c.begun = false;
  }
  for (ReqId sid : plan.admitted) {
    Choice& c = *choices_.at(sid);
    c.result.cached_prompt_tokens += sched_.computed(sid);
    c.speculate = c.speculate && sched_.speculating(sid);
    if (c.speculate) {
      proposer_->begin(static_cast<RequestId>(sid), sched_.context(sid));
      c.begun = true;
    }
  }
  for (ReqId sid : plan.detached) {
    Choice& c = *choices_.at(sid);
    if (c.begun) proposer_->end(static_cast<RequestId>(sid));
    c.begun = false;
    c.speculate = false;
  }
  if (!plan.copies.empty()) model_.copy_kv(plan.copies.src_slots, plan.copies.dst_slots);
}

void Engine::resolve_device_tokens(DraftTree* tree) {
  resolve_device_tokens(std::vector<DraftTree*>{tree});
}

void Engine::resolve_device_tokens(const std::vector<DraftTree*>& trees) {
  // Trees whose tokens sit in one buffer come over in one download (one wait).
  std::vector<DraftTree*> left;
  for (DraftTree* t : trees)
    if (!t->device.empty()) left.push_back(t);
  Backend& b = model_.backend();
  while (!left.empty()) {
    const DeviceTokens source = left.front()->device;
    std::vector<int64_t> index;  // the trees' index lists end to end
    std::vector<DraftTree*> now, later;
    for (DraftTree* t : left) {
      if (t->device.ids.data != source.ids.data) {
        later.push_back(t);
        continue;
      }
      now.push_back(t);
      index.insert(index.end(), t->device.index.begin(), t->device.index.end());
      index.insert(index.end(), t->device.parent_index.begin(), t->device.parent_index.end());
    }
    b.wait_for(*source.owner);
    std::vector<int32_t> ids;
    b.download_ids(source.ids, index, &ids);
    size_t at = 0;
    for (DraftTree* t : now) {
      for (size_t i = 0; i < t->device.index.size(); ++i, ++at)
        if (t->device.index[i] >= 0) t->token[i] = ids[at];
      for (size_t i = 0; i < t->device.parent_index.size(); ++i, ++at)
        if (t->device.parent_index[i] >= 0) t->parent[i] = ids[at];
      t->device = DeviceTokens{};
      validate_draft_tree(*t, model_.config().vocab_size);
    }
    left = std::move(later);
  }
}

void Engine::forward(StepRun* run) {
  const auto inputs_start = std::chrono::steady_clock::now();
  const StepPlan& plan = run->plan;
  // Trees whose tokens a drafter left on its backend: read there by the step (one source
  // buffer per step; the trees of any other come to the host first).
  Backend* token_owner = nullptr;
  Tensor token_source;
  for (const ScheduledItem& it : plan.items) {
    Choice& c = *choices_.at(it.id);
    if (!it.decode || it.num_tokens <= 1 || c.draft.device.empty()) continue;
    if (token_owner == nullptr) {
      token_owner = c.draft.device.owner;
      token_source = c.draft.device.ids;
    }
    if (c.draft.device.ids.data != token_source.data) resolve_device_tokens(&c.draft);
  }
  std::vector<StepItem> items;
  for (const ScheduledItem& it : plan.items) {
    const Choice& c = *choices_.at(it.id);
    const std::vector<int32_t>& ctx = sched_.context(it.id);
    StepItem s;
    s.seq = sched_.seq(it.id);
    if (it.decode) {
      run->any_decode = true;
      if (it.num_tokens > 1) {
        ARBOR_CHECK(c.draft.size() == it.num_tokens);
        s.tokens = c.draft.token;
        s.parents = c.draft.parent;
        s.token_index = c.draft.device.index;
        s.parent_index = c.draft.device.parent_index;
        s.all_logits = true;
      } else {
        s.tokens = {ctx.back()};
      }
    } else {
      run->any_prefill = true;
      s.tokens.assign(ctx.begin() + it.start, ctx.begin() + it.start + it.num_tokens);
    }
    items.push_back(std::move(s));
  }
  run->first_logit = BatchBuilder::build(kv_, items, &run->inputs);
  if (token_owner != nullptr) {
    stats_.device_token_steps++;
    run->inputs.token_source = token_source;
    model_.backend().wait_for(*token_owner);  // the draft's ids are written before the step reads
  }

  ForwardRequest want;  // features only when a speculating request needs them
  for (const ScheduledItem& it : plan.items)
    if (choices_.at(it.id)->speculate) want = want_;
  // Whether every item can be sampled / verified on the backend (tree_sampling_supports; the
  // first step of n > 1 forks the other choices after the forward: they draw on the host).
  bool can_sample = config_.backend_sampling;
  for (const ScheduledItem& it : plan.items) {
    const Choice& c = *choices_.at(it.id);
    if (it.decode && !tree_sampling_supports(c.sampler.params(), config_.verify.mode))
      can_sample = false;
    if (!it.decode && it.last_chunk && c.index == 0 && c.request->req.n > 1 && !c.request->forked)
      can_sample = false;
  }
  // A drafter reading final hidden states or EAGLE-3's layer features gets only the accepted
  // paths' rows (gathered on the backend, back with the ids) in steps of decode / verify items
  // alone; prefill chunks feed it every row.
  const bool path_hidden =
      want.final_hidden != !want.capture_layers.empty() && !run->any_prefill && can_sample;
  // Else download argmax ids, not [M, vocab] logits, when no item needs more (mixed steps keep
  // the logits). n > 1 choices share their request's sampling parameters, so the first decides.
  want.argmax_only = !path_hidden;
  for (const ScheduledItem& it : plan.items) {
    const Choice& c = *choices_.at(it.id);
    if (!argmax_suffices(c.req(), c.sampler.params())) want.argmax_only = false;
  }
  run->argmax_only = want.argmax_only;
  // Else sample / verify on the backend when every item can: items that emit a token are added
  // to `sampling` (sample_item[k] = their index), and only ids come back.
  run->sample_item.assign(plan.items.size(), -1);
  const bool backend_sample = !run->argmax_only && can_sample;
  for (size_t k = 0; k < plan.items.size() && backend_sample; ++k) {
    const Choice& c = *choices_.at(plan.items[k].id);
    if (c.req().logprobs >= 0) want.top_logprobs = std::max(want.top_logprobs, c.req().logprobs);
  }
  if (backend_sample) {
    for (size_t k = 0; k < plan.items.size(); ++k) {
      const ScheduledItem& it = plan.items[k];
      Choice& c = *choices_.at(it.id);
      const std::vector<int32_t>& ctx = sched_.context(it.id);
      if (!it.decode) {
        if (!it.last_chunk) continue;
        run->sample_item[k] =
            run->sampling.add(DraftTree::root_only(ctx.back()), run->first_logit[k],
                              c.sampler.params(), c.req().prompt, c.result.tokens, &c.rng);
        continue;
      }
      const std::span<const int32_t> cs(ctx);
      const size_t prompt_len = c.req().prompt.size();
      run->sample_item[k] = run->sampling.add(
          it.num_tokens > 1 ? c.draft : DraftTree::root_only(ctx.back()), run->first_logit[k],
          c.sampler.params(), cs.subspan(0, prompt_len), cs.subspan(prompt_len), &c.rng);
    }
    want.sample = &run->sampling.batch();
    want.path_hidden = path_hidden;
  }
  run->backend_sample = backend_sample;
  run->path_hidden = backend_sample && path_hidden;
  if ((want.final_hidden || !want.capture_layers.empty()) && !run->path_hidden) {
    // Every row's features would come back: only the speculating items' are read (a prefill
    // chunk of a request that does not speculate may be most of the step).
    for (size_t k = 0; k < plan.items.size(); ++k)
      if (choices_.at(plan.items[k].id)->speculate)
        for (int32_t r = run->inputs.qo_indptr[k]; r < run->inputs.qo_indptr[k + 1]; ++r)
          want.feature_rows.push_back(r);
  }
  if (run->path_hidden) stats_.path_feedback_steps++;
  if (run->path_hidden && proposer_->observes_paths_on_device()) {
    // The verified paths reach the proposer on the device, queued behind the step before its
    // wait; their host feedback (commit, observe) then settles what ran. Only in steps that
    // verify a tree for at least half of the requests (a policy probing a few requests of a
    // large batch keeps the host's way: its draft forwards would each be a shape of their own
    // to record; a request cut to one token by its max_tokens does not).
    std::vector<Proposer::DevicePath> paths;
    for (size_t k = 0; k < plan.items.size(); ++k) {
      const ScheduledItem& it = plan.items[k];
      if (it.num_tokens > 1 && run->sample_item[k] >= 0 && choices_.at(it.id)->speculate)
        paths.push_back({static_cast<RequestId>(it.id), run->sample_item[k]});
    }
    if (2 * paths.size() < plan.items.size()) paths.clear();
    if (!paths.empty())
      want.on_path_rows = [this, run, paths = std::move(paths)](const PathRowsOnDevice& rows) {
        const auto p0 = std::chrono::steady_clock::now();
        proposer_->observe_paths_on_device(paths, rows);
        run->device_paths_ms +=
            std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - p0)
                .count();
        stats_.device_path_steps++;
      };
  }
  if (!backend_sample) want.top_logprobs = -1;
  if (!run->argmax_only && !backend_sample) stats_.logits_downloads++;
  const StepGraphStats graphs_before = model_.step_graph_stats();
  const auto t0 = std::chrono::steady_clock::now();
  stats_.stage_seconds.inputs += std::chrono::duration<double>(t0 - inputs_start).count();
  model_.forward(run->inputs, &out_, want);
  feature_index_.clear();  // flat row -> row of out_.hidden / captured when only some came back
  if (!out_.feature_rows.empty()) {
    feature_index_.assign(static_cast<size_t>(run->inputs.num_tokens()), -1);
    for (size_t i = 0; i < out_.feature_rows.size(); ++i)
      feature_index_[static_cast<size_t>(out_.feature_rows[i])] = static_cast<int32_t>(i);
  }
  // A step whose shape ran eagerly on its way to a recording, or was recorded, is a warm-up:
  // several times slower than the replays that follow, so it would mislead the cost model.
  run->warmup = model_.step_graph_stats().warmed_up_since(graphs_before);
  // (the proposer's part inside it is feedback)
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() -
                      run->device_paths_ms * 1e-3;
  stats_.feedback_seconds += run->device_paths_ms * 1e-3;
  stats_.steps++;
  (run->any_prefill && run->any_decode ? stats_.mixed_seconds
   : run->any_prefill                  ? stats_.prefill_seconds
                                       : stats_.decode_seconds) += secs;
}

void Engine::verify(StepRun* run) {
  const int64_t vocab = model_.config().vocab_size;
  const StepPlan& plan = run->plan;
  run->verified.assign(plan.items.size(), VerifyResult{});
  if (!run->backend_sample) {
    // Verified on the host: the tokens left on the drafter's backend come here first, every
    // tree's in one download (the backend's tree sampling returns the accepted ones instead).
    std::vector<DraftTree*> trees;
    for (const ScheduledItem& it : plan.items)
      if (it.decode && it.num_tokens > 1) trees.push_back(&choices_.at(it.id)->draft);
    resolve_device_tokens(trees);
  }
  for (size_t k = 0; k < plan.items.size(); ++k) {
    const ScheduledItem& it = plan.items[k];
    if (!it.decode) continue;
    Choice& c = *choices_.at(it.id);
    const std::vector<int32_t>& ctx = sched_.context(it.id);
    if (it.num_tokens <= 1) c.draft = DraftTree::root_only(ctx.back());
    const DraftTree& tree = c.draft;
    const int32_t t = tree.size();
    const size_t prompt_len = c.req().prompt.size();
    const std::span<const int32_t> cs(ctx);
    const int32_t first = run->first_logit[k];
    // Recomputed requests carry generated tokens in the context: split at the prompt.
    run->verified[k] =
        run->backend_sample ? run->sampling.result(run->sample_item[k], out_.sampled)
        : run->argmax_only
            ? verify_greedy_argmax(tree,
                                   std::span<const int32_t>(out_.argmax)
                                       .subspan(static_cast<size_t>(first), static_cast<size_t>(t)),
                                   vocab, cs.subspan(0, prompt_len), cs.subspan(prompt_len))
            : arbor::verify(
                  tree,
                  std::span<const float>(out_.logits)
                      .subspan(static_cast<size_t>(first) * vocab, static_cast<size_t>(t * vocab)),
                  vocab, c.sampler, cs.subspan(0, prompt_len), cs.subspan(prompt_len), c.rng,
                  config_.verify);
  }
}

void Engine::emit(StepRun* run, Choice& c, const std::vector<int32_t>& tokens,
                  const std::vector<int32_t>& rows, int32_t accepted, int32_t item) {
  const int64_t vocab = model_.config().vocab_size;
  const int32_t eos = model_.config().eos_token_id;
  EngineEvent ev;
  ev.id = c.request->id;
  ev.choice = c.index;
  const GenerationRequest& r = c.req();
  const char* reason = nullptr;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int32_t tok = tokens[i];
    c.result.tokens.push_back(tok);
    ev.tokens.push_back(tok);
    if (r.logprobs >= 0) {
      if (item >= 0) {  // sampled on the backend: its logprobs came back with the ids
        TokenLogprob t;
        t.token = tok;
        t.logprob = out_.emitted_logprobs[static_cast<size_t>(out_.emitted_indptr[item]) + i];
        for (int32_t j = 0; j < std::min(r.logprobs, out_.top_k); ++j) {
          const size_t e = static_cast<size_t>(rows[i]) * out_.top_k + j;
          t.top.emplace_back(out_.top_ids[e], out_.top_values[e]);
        }
        ev.logprobs.push_back(std::move(t));
      } else {
        ev.logprobs.push_back(logprob_of(
            std::span<const float>(out_.logits.data() + static_cast<int64_t>(rows[i]) * vocab,
                                   static_cast<size_t>(vocab)),
            tok, r.logprobs));
      }
    }
    stats_.decode_tokens++;
    const bool stop =
        (!r.ignore_eos && tok == eos) ||
        std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), tok) != r.stop_token_ids.end();
    if (stop)
      reason = "stop";
    else if (static_cast<int32_t>(c.result.tokens.size()) >= r.max_tokens)
      reason = "length";
    if (reason) break;
  }
  ev.accepted_draft_tokens = std::min<int32_t>(accepted, static_cast<int32_t>(ev.tokens.size()));
  if (reason) {
    c.result.finish_reason = reason;
    ev.finished = true;
    ev.result = c.result;
    run->finished.push_back(c.sid);
  } else {
    sched_.append(c.sid, ev.tokens);
  }
  run->events.push_back(std::move(ev));
}

void Engine::commit(StepRun* run) {
  const int64_t vocab = model_.config().vocab_size;
  const StepPlan& plan = run->plan;
  // Every verified path's KV compaction, run as one copy after the loop: each request's copies
  // stay within its own tree slots, so they are independent, and one call is one upload and one
  // launch instead of one (and a wait for the last upload's staging) per request.
  SlotCopies compactions;
  for (size_t k = 0; k < plan.items.size(); ++k) {
    const ScheduledItem& it = plan.items[k];
    Choice& c = *choices_.at(it.id);
    const int32_t first_row = run->inputs.qo_indptr[k];
    const int32_t first_logit = run->first_logit[k];
    if (!it.decode) {
      sched_.commit_prefill(it);
      stats_.prefill_tokens += it.num_tokens;
      std::vector<int32_t> rows(static_cast<size_t>(it.num_tokens));
      for (int32_t i = 0; i < it.num_tokens; ++i) rows[static_cast<size_t>(i)] = i;
      const std::vector<int32_t>& ctx = sched_.context(it.id);
      std::vector<int32_t> chunk(ctx.begin() + it.start, ctx.begin() + it.start + it.num_tokens);
      // A chunk's rows reach the proposer with the step's other feedback (observe): one
      // batched draft forward for every prompt instead of one per chunk. n > 1 forks below
      // need the proposer's state first.
      auto defer = [&]() -> PendingFeedback* {
        if (!c.speculate) return nullptr;
        run->pending.emplace_back();
        run->pending.back().prompt = true;
        return &run->pending.back();
      };
      if (!it.last_chunk) {
        feed(c, it.start, chunk, rows, first_row,
             ctx[static_cast<size_t>(it.start + it.num_tokens)], defer());
        continue;
      }
      // The first generated token: sampled from the chunk's last row.
      Request& req = *c.request;
      auto next_token = [&](Choice& x) {
        if (run->argmax_only) return checked_argmax(out_.argmax[first_logit], vocab);
        if (run->backend_sample)
          return run->sampling.result(run->sample_item[k], out_.sampled).bonus_token;
        return x.sampler.sample_token(
            std::span<const float>(out_.logits.data() + static_cast<int64_t>(first_logit) * vocab,
                                   static_cast<size_t>(vocab)),
            x.req().prompt, x.result.tokens, x.rng);
      };
      if (c.index == 0 && req.req.n > 1 && !req.forked) {
        // n > 1: the prompt's KV is computed once; the other choices fork it here and each
        // draws its own first token from the same logits.
        req.forked = true;
        feed(c, it.start, chunk, rows, first_row, -1);
        std::vector<Choice*> all = {&c};
        for (int32_t i = 1; i < req.req.n; ++i) {
          const uint64_t sid = next_sid_++;
          bool spec = c.speculate &&
                      proposer_->fork(static_cast<RequestId>(c.sid), static_cast<RequestId>(sid));
          sched_.fork(c.sid, sid, spec);
          auto child = std::make_unique<Choice>(sid, c.request, i, spec);
          child->begun = spec;
          child->result.cached_prompt_tokens = sched_.computed(sid);
          req.sids[static_cast<size_t>(i)] = sid;
          req.live++;
          all.push_back(child.get());
          choices_.emplace(sid, std::move(child));
        }
        for (Choice* x : all) {
          const int32_t next = next_token(*x);
          if (x->speculate) feed(*x, sched_.computed(x->sid), {}, {}, first_row, next);
          emit(run, *x, {next}, {first_logit}, 0, -1);
        }
        continue;
      }
      const int32_t next = next_token(c);
      feed(c, it.start, chunk, rows, first_row, next, defer());
      emit(run, c, {next}, {first_logit}, 0, run->sample_item[k]);
      continue;
    }
    // A decode / verify item: the accepted path's KV is compacted into place.
    const VerifyResult& v = run->verified[k];
    const DraftTree& tree = c.draft;
    const int32_t t = tree.size();
    stats_.tree_tokens += t;
    c.result.acceptance.add(v, t);
    if (t > 1) stats_.acceptance.add(v, t);
    sched_.record_acceptance(it.id, v, t);
    // The root, then the accepted tokens (those of a tree left on a device are only known from
    // the results).
    std::vector<int32_t> node_tokens = {tree.token[0]};
    node_tokens.insert(node_tokens.end(), v.accepted_tokens.begin(), v.accepted_tokens.end());
    const int32_t start = sched_.computed(it.id);
    const CommitPlan compaction = sched_.commit_tree(it.id, v.accepted_nodes, node_tokens);
    compactions.append(compaction.copies);
    std::vector<int32_t> emitted = v.accepted_tokens;
    emitted.push_back(v.bonus_token);
    run->emitted += static_cast<int32_t>(emitted.size());
    std::vector<int32_t> rows;
    for (int32_t node : v.accepted_nodes) rows.push_back(first_logit + node);
    if (c.speculate) {
      run->pending.emplace_back();
      const float* path_rows = nullptr;
      if (run->path_hidden) {
        const int32_t item = run->sample_item[k];
        ARBOR_CHECK(
            item >= 0 && out_.sampled.path_indptr[item + 1] - out_.sampled.path_indptr[item] ==
                             static_cast<int32_t>(v.accepted_nodes.size()),
            "path rows do not match the accepted path");
        path_rows = out_.sampled.path_rows.data() +
                    static_cast<int64_t>(out_.sampled.path_indptr[item]) * feature_width();
      }
      feed(c, start, node_tokens, v.accepted_nodes, first_row, v.bonus_token, &run->pending.back(),
           path_rows);
    }
    emit(run, c, emitted, rows, v.num_accepted(), run->sample_item[k]);
  }
  if (!compactions.empty()) model_.copy_kv(compactions.src_slots, compactions.dst_slots);
}

void Engine::observe(StepRun* run) {
  double observe_ms = 0;
  // Prompt chunks first, then the verified paths (each request has one item per step, so the
  // order between them is free): the draft cost model learns only the second call's time.
  const auto observe_some = [&](bool prompt) {
    std::vector<TargetFeedback> fbs;
    for (const PendingFeedback& p : run->pending)
      if (p.prompt == prompt) fbs.push_back(p.view());
    if (fbs.empty()) return 0.0;
    const auto f0 = std::chrono::steady_clock::now();
    proposer_->observe_batch(fbs);
    const double ms =
        std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - f0).count();
    stats_.feedback_seconds += ms * 1e-3;
    observe_ms += ms;
    return ms;
  };
  observe_some(true);
  const double path_ms = observe_some(false) + run->device_paths_ms;
  observe_ms += run->device_paths_ms;
  // What trees cost beyond verification: drafting them and folding the accepted paths into
  // the proposer's state (steps without a tree do not tell it).
  // A draft that did not wait for the device (trees picked there) cost the step its device
  // time, which ran while the host went on (read now: the verify step's wait came after it).
  double drafted_ms = run->drafted_ms;
  if (run->drafted_depth > 0) {
    const double device_ms = proposer_->last_draft_device_ms();
    if (device_ms >= 0) {
      drafted_ms = std::max(drafted_ms, device_ms);
      stats_.draft_device_seconds += device_ms * 1e-3;
    }
  }
  // A warm-up step (a new step shape, or a draft of a new depth or batch run eagerly or
  // recorded) pays one-time work (GEMM tuning, graph recording: 19.5 ms against 0.1 for
  // SmolLM2's Medusa heads) that would set the draft cost estimate's level: one such step of
  // a deeper tree once made every level look four times as dear.
  if (run->drafted_depth > 0 && !run->warmup && !run->draft_warmup)
    sched_.record_draft_step(run->drafted_depth, drafted_ms + path_ms);
  // The cost model learns the whole step but the proposer's part (which the draft cost model
  // learns): the forward plus planning, tree building, verification and compaction, all of
  // which grow with the tree tokens. Steps that warmed up a step graph are left out.
  const double step_ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - run->start)
          .count();
  if (!run->warmup)
    sched_.observe_step(static_cast<int32_t>(run->plan.items.size()), run->inputs.num_tokens(),
                        std::max(step_ms - drafted_ms - observe_ms, 1e-3));
  // What the step delivered, drafting included (the policy's trees are checked against it).
  sched_.record_step_yield(run->plan, run->emitted, step_ms, run->warmup || run->draft_warmup);
}

}  // namespace arbor
