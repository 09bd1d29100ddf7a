// The continuous-batching scheduler: pure logic over the paged KV cache manager, no device.
// Each step it (1) admits waiting requests in arrival order while the free blocks hold their
// context and the running requests' next `lookahead` tokens, (2) gives every decoding request a
// decode item (a speculation tree sized by the tree-budget policy, or the root alone), (3) fills
// the rest of the step's token budget with chunked prefill of the others (prefill and
// speculative verification share one step), and (4) reserves KV slots, preempting the newest
// arrival (its KV is dropped and recomputed later) when blocks run out; a preempted request
// that was admitted under the look-ahead in force widens it. A request never fails for memory
// pressure once admitted: it waits. Cancellation frees every block at once. See README.md.
#pragma once

#include <algorithm>
#include <cstdint>
#include <deque>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "engine/kv_cache/kv_cache_manager.h"
#include "engine/scheduler/cost_model.h"
#include "engine/scheduler/tree_policy.h"
#include "engine/verify/verifier.h"

namespace arbor {

using ReqId = uint64_t;

struct SchedulerConfig {
  int32_t max_step_tokens = 512;  // tokens one step scores (prefill chunks + trees)
  int32_t max_running = 64;       // sequences decoding or prefilling at once
  TreePolicyConfig tree;          // adaptive budgets; tree.max_step_tokens follows the above
  int32_t detach_after = 8;       // adaptive: steps at one node before speculation stops
  // adaptive: every probe_every-th speculating request is admitted speculating whatever the
  // policy predicts at admission, from the acceptance prior rather than the server-wide
  // estimate, and drafts a tree in each of its first detach_after decode steps, so a
  // pessimistic server-wide estimate is measured again instead of locking speculation off
  // (afterwards the policy and detach_after decide). 0: never.
  int32_t probe_every = 32;
  // adaptive: a request joining a load at which the requests admitted speculating had a tree
  // in fewer than this share of their first 2 * detach_after decode steps (TreeUptake, 8 such
  // requests recorded) is admitted without speculation, whatever admission's own verdict
  // (probes still speculate, and keep the record current). 0: never.
  double min_tree_uptake = 0.25;
  // adaptive: where decode-only steps with the policy's trees delivered fewer tokens per request
  // and ms than steps without at that batch (StepYield, 4 of each measured, or at the nearest
  // smaller batch measured), the policy's trees are overruled (every request decodes plainly)
  // but in every yield_recheck-th such step, which measures them again, and arrivals at such a
  // load start plain (probes aside). Where they stand, the plain side is measured again by one
  // step without trees after 4 * yield_recheck tree steps at that batch. 0: never overruled,
  // never re-checked.
  int32_t yield_recheck = 16;
  // Admission look-ahead, tokens: a waiting request is admitted only while the free blocks hold
  // its whole context plus `lookahead` tokens and the next `lookahead` tokens of every running
  // request (the rest of a prefilling request's context too). The look-ahead starts here, grows
  // by twice this much when a request admitted under the look-ahead in force is preempted (it
  // proved too short) and shrinks by a quarter of this for each running request that ends in a
  // step without preemption, never below this value nor above the pool. 0: admit while the
  // contexts alone fit (no look-ahead, no adaptation).
  int32_t admission_lookahead = 32;
  CostModelConfig cost;
  void validate() const;  // throws kInvalidArgument naming the field
};

struct ScheduledItem {
  ReqId id = 0;
  bool decode = false;      // a tree (T = num_tokens nodes; 1 = plain decode), else a prefill chunk
  int32_t start = 0;        // position of the item's first token (the request's computed length)
  int32_t num_tokens = 0;   // tokens scored
  bool last_chunk = false;  // prefill: the chunk reaches the end of the context (sample after it)
  TreeBudget budget;        // decode: what the proposer was allowed
};

struct StepPlan {
  std::vector<ScheduledItem> items;
  std::vector<ReqId> admitted;   // started running this step (proposers begin them)
  std::vector<ReqId> preempted;  // lost their KV this step and wait again (proposers end them)
  // Speculating requests the policy kept at one node for `detach_after` steps in a row: they
  // stop speculating for good (the runner ends them in the proposer), so a loaded server stops
  // paying for drafting and feature bookkeeping it does not use.
  std::vector<ReqId> detached;
  SlotCopies copies;  // copy-on-write copies of the reservations: run before the step
  // A decode-only step of this many requests (0: it carries prefill), and whether the tree
  // policy gave any of them a tree (a probe's tree regardless aside): record_step_yield.
  int32_t yield_batch = 0;
  bool policy_trees = false;
  int32_t total_tokens() const;
};

// The first phase of a step's plan (Scheduler::plan_step): the trees to draft, in order. The
// caller may raise a tree's max_nodes (never beyond SchedulerConfig::tree.max_tree.max_nodes)
// before drafting, e.g. so that the step's token count lands on a size that recorded step
// graphs replay; reserve_step() holds each tree to its budget here.
class PlannedStep {
 public:
  std::vector<std::pair<ReqId, TreeBudget>> trees;
  // Decode items without a tree (one token each).
  int32_t decodes_without_tree() const {
    return static_cast<int32_t>(decodes_.size() - trees.size());
  }
  bool has_prefill() const { return !chunks_.empty(); }

 private:
  friend class Scheduler;
  StepPlan plan_;                       // admitted and detached so far
  std::vector<ScheduledItem> decodes_;  // every decode item, budgets set
  std::vector<ScheduledItem> chunks_;   // prefill chunks within the token budget
  bool planned_ = false;                // running requests existed
};

class Scheduler {
 public:
  Scheduler(KvCacheManager& kv, const SchedulerConfig& config);

  // Queues a request. `context` is what its KV must hold before decoding (the prompt). Throws
  // kInvalidArgument for a duplicate id or an empty context.
  void add(ReqId id, std::vector<int32_t> context, bool speculate);
  // Plans one step in two phases, so the trees are drafted between them by whoever owns the
  // proposer (the engine), for all requests at once:
  //   PlannedStep p = sched.plan_step();          // admission, items, tree budgets
  //   sizes = <draft p.trees: each tree's node count, in [1, budget.max_nodes]>;
  //   StepPlan plan = sched.reserve_step(std::move(p), sizes);  // reservations, preemption
  // The plan's items hold exactly num_tokens reserved slots; it is empty when nothing is
  // runnable. Nothing may change the scheduler between the two calls.
  PlannedStep plan_step();
  StepPlan reserve_step(PlannedStep planned, std::span<const int32_t> tree_sizes);

  // --- after the step ran ---------------------------------------------------------------------
  // A prefill chunk's tokens are in the cache.
  void commit_prefill(const ScheduledItem& item);
  // A verify step accepted `nodes` (ascending, node 0 first) holding `tokens`; returns the
  // compaction plan, already applied to the bookkeeping (its copies must run on the backend).
  CommitPlan commit_tree(ReqId id, std::span<const int32_t> nodes, std::span<const int32_t> tokens);
  // Generated tokens join the request's context (the last one is the next tree's root).
  void append(ReqId id, std::span<const int32_t> tokens);
  void record_acceptance(ReqId id, const VerifyResult& result, int32_t tree_nodes);
  // Drafting cost of one step that drafted trees: the deepest budget drafted and the proposer's
  // time (propose + observe), for the whole batch.
  void record_draft_step(int32_t depth, double ms);
  void observe_step(int32_t batch, int32_t tokens, double ms) { cost_.observe(batch, tokens, ms); }
  // What a step of `plan` delivered: the tokens its decode items emitted in `ms`, the whole
  // step's wall time (drafting and feedback included; steps that recorded graphs left out).
  void record_step_yield(const StepPlan& plan, int32_t emitted, double ms, bool warmup = false);
  const StepYield& step_yield() const { return yield_; }
  // Replaces the cost model (e.g. with curves measured at start-up); forgets its observations.
  void set_cost(CostModelConfig cost);
  // Decode steps with trees run padded to graph_bucket(tokens, buckets) (TreePolicyConfig).
  void set_step_token_buckets(int32_t buckets) { config_.tree.step_token_buckets = buckets; }
  // What the tree policy has learned across requests: the cost model with its online
  // corrections, the acceptance a new request starts from, the drafting cost. A scheduler made
  // for a run that stands for a server which has already served a while (spec-bench's timed
  // rounds after its warm-up) starts from another one's.
  struct PolicyState {
    CostModel cost;
    AcceptanceEstimate global_acceptance;
    DraftCostEstimate draft_cost;
    TreeUptake uptake;
    StepYield yield;
  };
  PolicyState policy_state() const {
    return {cost_, global_acceptance_, draft_cost_, uptake_, yield_};
  }
  void restore_policy_state(const PolicyState& state);
  // A new running request `child` sharing every KV block of `parent` (n > 1 samples of one
  // prompt): parent must have finished its prefill; child's context is parent's committed
  // tokens. The child decodes next once its first token is appended.
  void fork(ReqId parent, ReqId child, bool speculate);
  // Removes a request (waiting or running), freeing its blocks. False when unknown.
  bool remove(ReqId id);

  // --- queries --------------------------------------------------------------------------------
  bool has(ReqId id) const { return reqs_.count(id) != 0; }
  bool running(ReqId id) const;
  bool decoding(ReqId id) const;
  // Still speculating (false once detached, or when admitted under a load where the policy
  // predicts no gain from speculation).
  bool speculating(ReqId id) const { return get(id).speculate; }
  int32_t computed(ReqId id) const;
  SeqId seq(ReqId id) const;
  const std::vector<int32_t>& context(ReqId id) const;
  int32_t preemptions(ReqId id) const;
  // The admission look-ahead in force (tokens; SchedulerConfig::admission_lookahead).
  int32_t lookahead() const { return lookahead_; }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size(); }
  // Running requests that may draft trees (admitted speculating and not detached).
  size_t num_speculating() const;
  bool idle() const { return waiting_.empty() && running_.empty(); }
  const KvCacheManager& kv() const { return kv_; }
  const CostModel& cost() const { return cost_; }
  const AcceptanceEstimate& acceptance(ReqId id) const;
  // The drafting cost learned from the steps that drafted (record_draft_step).
  const DraftCostEstimate& draft_cost() const { return draft_cost_; }
  const SchedulerConfig& config() const { return config_; }

 private:
  // Priority: arrival order; a fork's choices sit right after their parent. Admission takes the
  // oldest waiting request first, preemption the newest running one.
  using Rank = std::pair<uint64_t, uint64_t>;  // (arrival, birth)
  struct Req {
    Rank rank;
    int32_t admitted_lookahead = 0;  // the look-ahead in force when it was last admitted
    std::vector<int32_t> context;
    bool speculate = false;
    SeqId seq = -1;
    int32_t computed = 0;    // tokens whose K/V are in the cache
    bool prefilled = false;  // computed reached the end of the context once since admission
    int32_t preemptions = 0;
    AcceptanceEstimate acceptance;
    int32_t trees = 0;  // verified since `acceptance` was last folded into the server-wide one
    int32_t steps_without_tree = 0;
    int32_t probe_steps = 0;  // decode steps left that draft a tree regardless (probe_every)
    // Admitted speculating at this load (> 0) and its first decode steps not yet recorded in
    // uptake_: how many ran, how many of them the policy gave a tree.
    int32_t uptake_batch = 0;
    int32_t uptake_steps = 0;
    int32_t uptake_trees = 0;
  };
  Req& get(ReqId id);
  const Req& get(ReqId id) const;
  // Folds r's acceptance into the server-wide estimate (a request whose trees were verified,
  // when it ends, is detached or is preempted): each request weighs alike (the mean of the
  // first 16, then the latest 16 weigh about two thirds), not each tree. Updated tree by tree,
  // the estimate was the latest trees' average, and at batch 1 those are the last request's:
  // one whose acceptance fell until it was detached left an estimate no admission would start
  // speculating on, and none did again until a probe (1.00x where the policy runs 1.42x).
  void fold_acceptance(Req& r);
  // Records r's first decode steps in uptake_ (`left` more steps counted as without a tree).
  void record_uptake(Req& r, int32_t left);
  int32_t uptake_window() const { return 2 * config_.detach_after; }
  bool is_decoding(const Req& r) const {
    return r.prefilled && r.computed + 1 == static_cast<int32_t>(r.context.size());
  }
  bool before(ReqId a, ReqId b) const { return get(a).rank < get(b).rank; }
  // Inserts `id` into `list` (waiting_ or running_), which is kept in rank order.
  template <typename List>
  void insert_by_rank(List& list, ReqId id) const {
    list.insert(std::upper_bound(list.begin(), list.end(), id,
                                 [this](ReqId a, ReqId b) { return before(a, b); }),
                id);
  }
  // Blocks a running request takes over its next lookahead_ tokens (beyond those it holds).
  int32_t growth_blocks(const Req& r) const;
  void admit(StepPlan* plan);
  void preempt(ReqId id, StepPlan* plan);
  // Reserves n slots; copies go to the plan. False when the pool is short.
  bool reserve(Req& r, int32_t n, StepPlan* plan);

  KvCacheManager& kv_;
  SchedulerConfig config_;
  CostModel cost_;
  // Across requests: the acceptance prior a new request starts from (fold_acceptance).
  AcceptanceEstimate global_acceptance_;
  // What drafting costs a step (per step, not per request: drafts are batched).
  DraftCostEstimate draft_cost_;
  TreeUptake uptake_;  // min_tree_uptake
  StepYield yield_;    // yield_recheck
  int64_t overruled_steps_ = 0;
  int64_t spec_admissions_ = 0;       // speculating requests admitted (probe_every)
  int32_t lookahead_ = 0;             // admission look-ahead in force, tokens
  bool step_preempted_ = false;       // the last reserve_step preempted a request
  bool lookahead_too_short_ = false;  // ... one admitted under the look-ahead in force
  uint64_t next_arrival_ = 0;
  uint64_t next_birth_ = 0;
  std::unordered_map<ReqId, Req> reqs_;
  std::deque<ReqId> waiting_;   // by rank (oldest first: admitted first)
  std::vector<ReqId> running_;  // by rank (newest last: preempted first)
};

}  // namespace arbor
