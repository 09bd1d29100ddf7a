#include "engine/scheduler/scheduler.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <optional>

#include "engine/core/error.h"

namespace arbor {

namespace {

// Requests admitted speculating at a load that TreeUptake must have recorded before admission
// follows it (SchedulerConfig::min_tree_uptake).
constexpr int32_t kMinUptakeSamples = 8;
// Decode-only steps with trees and without that StepYield must have measured at a batch before
// the policy's trees there can be overruled (SchedulerConfig::yield_recheck).
constexpr int32_t kMinYieldSamples = 4;

// ARBOR_TREE_TRACE=1: one stderr line per decode step with the tree policy's inputs and choice,
// one per admission and per detach.
bool trace_trees() {
  static const bool on = [] {
    const char* e = std::getenv("ARBOR_TREE_TRACE");
    return e != nullptr && e[0] == '1';
  }();
  return on;
}

}  // namespace

void SchedulerConfig::validate() const {
  if (max_step_tokens < 1)
    throw_error(ErrorCode::kInvalidArgument,
                "max_step_tokens must be >= 1, got " + std::to_string(max_step_tokens));
  if (max_running < 1)
    throw_error(ErrorCode::kInvalidArgument,
                "max_running must be >= 1, got " + std::to_string(max_running));
  if (tree.max_tree.max_nodes < 1)
    throw_error(ErrorCode::kInvalidArgument, "speculation max tree nodes must be >= 1, got " +
                                                 std::to_string(tree.max_tree.max_nodes));
  if (probe_every < 0)
    throw_error(ErrorCode::kInvalidArgument,
                "probe_every must be >= 0, got " + std::to_string(probe_every));
  if (!(min_tree_uptake >= 0 && min_tree_uptake <= 1))
    throw_error(ErrorCode::kInvalidArgument,
                "min_tree_uptake must be in [0, 1], got " + std::to_string(min_tree_uptake));
  if (yield_recheck < 0)
    throw_error(ErrorCode::kInvalidArgument,
                "yield_recheck must be >= 0, got " + std::to_string(yield_recheck));
  if (admission_lookahead < 0)
    throw_error(ErrorCode::kInvalidArgument,
                "admission_lookahead must be >= 0, got " + std::to_string(admission_lookahead));
  if (tree.max_tree.max_depth < 0)
    throw_error(ErrorCode::kInvalidArgument, "speculation max tree depth must be >= 0, got " +
                                                 std::to_string(tree.max_tree.max_depth));
  if (tree.max_tree.max_nodes > max_step_tokens)
    throw_error(ErrorCode::kInvalidArgument,
                "speculation max tree nodes (" + std::to_string(tree.max_tree.max_nodes) +
                    ") exceed max_step_tokens (" + std::to_string(max_step_tokens) + ")");
  cost.validate();
}

int32_t StepPlan::total_tokens() const {
  int32_t t = 0;
  for (const auto& i : items) t += i.num_tokens;
  return t;
}

Scheduler::Scheduler(KvCacheManager& kv, const SchedulerConfig& config)
    : kv_(kv),
      config_((config.validate(), config)),
      cost_(config.cost),
      lookahead_(config.admission_lookahead) {
  config_.tree.max_step_tokens = config_.max_step_tokens;
}

Scheduler::Req& Scheduler::get(ReqId id) {
  auto it = reqs_.find(id);
  if (it == reqs_.end())
    throw_error(ErrorCode::kInvalidArgument, "scheduler: unknown request " + std::to_string(id));
  return it->second;
}
const Scheduler::Req& Scheduler::get(ReqId id) const {
  return const_cast<Scheduler*>(this)->get(id);
}

bool Scheduler::running(ReqId id) const {
  return get(id).seq >= 0;
}
bool Scheduler::decoding(ReqId id) const {
  return is_decoding(get(id));
}
int32_t Scheduler::computed(ReqId id) const {
  return get(id).computed;
}
SeqId Scheduler::seq(ReqId id) const {
  return get(id).seq;
}
const std::vector<int32_t>& Scheduler::context(ReqId id) const {
  return get(id).context;
}
int32_t Scheduler::preemptions(ReqId id) const {
  return get(id).preemptions;
}
const AcceptanceEstimate& Scheduler::acceptance(ReqId id) const {
  return get(id).acceptance;
}

void Scheduler::add(ReqId id, std::vector<int32_t> context, bool speculate) {
  if (reqs_.count(id))
    throw_error(ErrorCode::kInvalidArgument,
                "scheduler: request " + std::to_string(id) + " is already scheduled");
  if (context.empty())
    throw_error(ErrorCode::kInvalidArgument,
                "scheduler: request " + std::to_string(id) + " has an empty context");
  Req r;
  r.rank = {next_arrival_++, next_birth_++};
  r.context = std::move(context);
  r.speculate = speculate;
  reqs_.emplace(id, std::move(r));
  waiting_.push_back(id);  // the newest arrival
}

void Scheduler::fork(ReqId parent, ReqId child, bool speculate) {
  Req& p = get(parent);
  if (p.seq < 0 || !p.prefilled || p.computed != static_cast<int32_t>(p.context.size()))
    throw_error(ErrorCode::kInvalidArgument,
                "scheduler: fork of request " + std::to_string(parent) +
                    " needs it running with its prefill just committed");
  if (reqs_.count(child))
    throw_error(ErrorCode::kInvalidArgument,
                "scheduler: request " + std::to_string(child) + " is already scheduled");
  Req c;
  c.rank = {p.rank.first, next_birth_++};  // the parent's arrival: right after its siblings
  c.admitted_lookahead = p.admitted_lookahead;
  c.context = p.context;
  c.speculate = speculate;
  c.seq = kv_.fork(p.seq);
  c.computed = p.computed;
  c.prefilled = true;
  reqs_.emplace(child, std::move(c));
  insert_by_rank(running_, child);
}

bool Scheduler::remove(ReqId id) {
  auto it = reqs_.find(id);
  if (it == reqs_.end()) return false;
  record_uptake(it->second, 0);  // a request that ends early counts the steps it ran
  fold_acceptance(it->second);
  if (it->second.seq >= 0) {
    kv_.free_sequence(it->second.seq);
    // A running request ended while nothing was preempted: the look-ahead narrows by a quarter
    // of admission_lookahead (rounded up), down to admission_lookahead.
    const int32_t step = config_.admission_lookahead;
    if (!step_preempted_) lookahead_ = std::max(step, lookahead_ - (step + 3) / 4);
  }
  reqs_.erase(it);
  waiting_.erase(std::remove(waiting_.begin(), waiting_.end(), id), waiting_.end());
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  return true;
}

void Scheduler::preempt(ReqId id, StepPlan* plan) {
  Req& r = get(id);
  kv_.free_sequence(r.seq);  // drops a reservation in flight too
  r.seq = -1;
  r.computed = 0;
  r.prefilled = false;
  r.preemptions++;
  r.uptake_batch = 0;  // admitted again later, at the load of then
  fold_acceptance(r);
  step_preempted_ = true;
  if (r.admitted_lookahead >= lookahead_) lookahead_too_short_ = true;
  running_.erase(std::remove(running_.begin(), running_.end(), id), running_.end());
  // Back in line at its arrival: ahead of every request that arrived after it.
  insert_by_rank(waiting_, id);
  auto& items = plan->items;
  items.erase(std::remove_if(items.begin(), items.end(),
                             [&](const ScheduledItem& i) { return i.id == id; }),
              items.end());
  auto& adm = plan->admitted;
  if (std::find(adm.begin(), adm.end(), id) != adm.end())
    adm.erase(std::remove(adm.begin(), adm.end(), id), adm.end());
  else
    plan->preempted.push_back(id);
}

bool Scheduler::reserve(Req& r, int32_t n, StepPlan* plan) {
  ReservePlan rp;
  if (!kv_.reserve(r.seq, n, &rp)) return false;
  plan->copies.append(rp.copies);
  return true;
}

int32_t Scheduler::growth_blocks(const Req& r) const {
  const int64_t bs = kv_.block_size();
  const int64_t want = (static_cast<int64_t>(r.context.size()) + lookahead_ + bs - 1) / bs;
  const int64_t held = static_cast<int64_t>(kv_.block_table(r.seq).size());
  return static_cast<int32_t>(std::max<int64_t>(0, want - held));
}

void Scheduler::admit(StepPlan* plan) {
  const int64_t bs = kv_.block_size();
  // Blocks the running requests will take over the look-ahead: an admission must leave them.
  int64_t growth = 0;
  for (ReqId id : running_) growth += growth_blocks(get(id));
  // The policy's verdict on this call's burst of speculating arrivals, judged once (below) for
  // the first of them: how many of the group it gives trees. They are interchangeable, so that
  // many of them, in arrival order, start speculating; the others decode plainly.
  std::optional<int32_t> burst_trees;
  while (!waiting_.empty() && static_cast<int32_t>(running_.size()) < config_.max_running) {
    Req& r = get(waiting_.front());
    // Every block of the context counts, cached ones too: an unreferenced cached block is part
    // of the free pool, and taking it leaves less for the prefill that follows. A preempted
    // request comes back only when its whole context plus the look-ahead fits beside the
    // running requests' own look-ahead, so it is not preempted again at once. Alone, a request
    // is always admitted (the engine refused requests that can never fit).
    const int64_t need = (static_cast<int64_t>(r.context.size()) + lookahead_ + bs - 1) / bs;
    if (!running_.empty() && kv_.num_free_blocks() < growth + need) break;
    const bool probe = r.speculate && config_.tree.adaptive && config_.probe_every > 0 &&
                       spec_admissions_++ % config_.probe_every == config_.probe_every - 1;
    const bool judged =
        r.speculate && config_.tree.adaptive && global_acceptance_.samples() > 0 && !probe;
    // The requests behind it that this step may admit too (a burst joins as one load).
    const int32_t ahead = static_cast<int32_t>(std::min<size_t>(
        waiting_.size() - 1, static_cast<size_t>(config_.max_running) - running_.size() - 1));
    const int32_t load = static_cast<int32_t>(running_.size()) + 1 + ahead;
    const bool guarded = r.speculate && config_.tree.adaptive && !probe;
    if (guarded && (uptake_.share(load, kMinUptakeSamples, 1.0) < config_.min_tree_uptake ||
                    (config_.yield_recheck > 0 && yield_.trees_lose(load, kMinYieldSamples)))) {
      // The step policy kept the last requests admitted speculating at this load without trees,
      // or its trees delivered less than plain steps there (they would be overruled).
      r.speculate = false;
    } else if (judged && burst_trees) {  // the rest of a burst already judged
      r.acceptance = global_acceptance_;
      r.speculate = *burst_trees > 0;
      if (r.speculate) --*burst_trees;
    } else if (judged) {
      // Would a tree pay for this request at the load it joins? If not, it never starts
      // speculating (no drafting, no feature bookkeeping). It starts from what other requests
      // measured, and shares the step's drafting cost with the running requests that speculate.
      // (A probe starts regardless: without it a pessimistic estimate would never be revised.)
      // The load it joins includes the requests behind it that this step may admit too: a
      // burst of arrivals is judged at the batch it will decode in, not request by request
      // from an empty batch up. Those of them that would speculate are judged as it is and
      // share the drafting cost with it (eight arrivals at an empty engine speculate together
      // where one tree alone would not pay for the step's draft forward); it speculates when
      // the policy gives a tree to any of that group (they are interchangeable; see
      // burst_trees).
      r.acceptance = global_acceptance_;
      std::vector<TreeCandidate> cands = {{&r.acceptance}};
      int32_t plain = 0;
      for (int32_t i = 1; i <= ahead; ++i) {
        if (get(waiting_[static_cast<size_t>(i)]).speculate) {
          cands.push_back({&global_acceptance_});
        } else {
          plain++;
        }
      }
      const size_t group = cands.size();
      for (ReqId id : running_) {
        const Req& o = get(id);
        if (o.speculate) {
          cands.push_back({&o.acceptance});
        } else {
          plain++;
        }
      }
      const auto b =
          choose_tree_budgets(cands, plain, plain, load, cost_, draft_cost_.cost(), config_.tree);
      const auto trees = static_cast<int32_t>(
          std::count_if(b.begin(), b.begin() + static_cast<std::ptrdiff_t>(group),
                        [](const TreeBudget& t) { return t.max_nodes > 1; }));
      r.speculate = trees > 0;
      burst_trees = std::max(0, trees - 1);
    }
    if (probe) r.probe_steps = config_.detach_after;
    r.uptake_batch = r.speculate && config_.tree.adaptive ? load : 0;
    r.uptake_steps = r.uptake_trees = 0;
    if (trace_trees())
      std::fprintf(stderr,
                   "tree admit: request %llu running %zu load %d uptake %.2f speculate %d "
                   "probe %d\n",
                   (unsigned long long)waiting_.front(), running_.size(), load,
                   uptake_.share(load, kMinUptakeSamples, -1), r.speculate ? 1 : 0, probe ? 1 : 0);
    // A proposer needs the target's features of every position, so speculating requests do not
    // skip cached prefix tokens.
    const auto created = r.speculate ? kv_.create_sequence() : kv_.create_sequence(r.context);
    r.seq = created.seq;
    r.computed = created.cached_tokens;
    r.prefilled = false;
    r.admitted_lookahead = lookahead_;
    growth += growth_blocks(r);
    const ReqId id = waiting_.front();
    waiting_.pop_front();
    insert_by_rank(running_, id);
    plan->admitted.push_back(id);
  }
}

PlannedStep Scheduler::plan_step() {
  PlannedStep planned;
  StepPlan& plan = planned.plan_;
  admit(&plan);
  if (running_.empty()) return planned;

  // Decode items first (every decoding request gets one), then prefill chunks in admission
  // order within the token budget left after one token per decode.
  std::vector<ReqId> decodes, prefills;
  for (ReqId id : running_) (is_decoding(get(id)) ? decodes : prefills).push_back(id);
  int32_t budget = config_.max_step_tokens - static_cast<int32_t>(decodes.size());
  std::vector<ScheduledItem> chunks;
  for (ReqId id : prefills) {
    if (budget <= 0) break;
    const Req& r = get(id);
    const int32_t remaining = static_cast<int32_t>(r.context.size()) - r.computed;
    const int32_t n = std::min(remaining, budget);
    ScheduledItem it;
    it.id = id;
    it.start = r.computed;
    it.num_tokens = n;
    it.last_chunk = n == remaining;
    chunks.push_back(it);
    budget -= n;
  }

  // Tree budgets for the speculating decodes, given the prefill tokens the step carries.
  std::vector<TreeCandidate> cands;
  std::vector<size_t> cand_of(decodes.size(), SIZE_MAX);
  int32_t fixed = 0, fixed_emitted = 0;
  for (const auto& c : chunks) {
    fixed += c.num_tokens;
    fixed_emitted += c.last_chunk ? 1 : 0;
  }
  for (size_t k = 0; k < decodes.size(); ++k) {
    const Req& r = get(decodes[k]);
    if (r.speculate) {
      cand_of[k] = cands.size();
      cands.push_back({&r.acceptance});
    } else {
      fixed += 1;
      fixed_emitted += 1;
    }
  }
  const int32_t batch = static_cast<int32_t>(decodes.size() + chunks.size());
  // Plain decoding's own step time anchors every tree decision. A prior curve measured on
  // another model can be wrong in shape, not only in level, and while every request speculates
  // no plain step runs to correct it. So a decode-only step at a batch whose plain step was not
  // measured yet runs plain (min_obs such steps per batch bucket; they do not count towards
  // detach_after).
  const bool explore =
      config_.tree.adaptive && !cands.empty() && chunks.empty() && !cost_.measured(batch, batch);
  TreePolicyConfig policy = config_.tree;
  if (!chunks.empty()) policy.step_token_buckets = 0;  // a step with prefill is not padded
  std::vector<TreeBudget> budgets = explore
                                        ? std::vector<TreeBudget>(cands.size(), TreeBudget{1, 0})
                                        : choose_tree_budgets(cands, fixed, fixed_emitted, batch,
                                                              cost_, draft_cost_.cost(), policy);
  if (trace_trees()) {
    int32_t tokens = fixed;
    for (const TreeBudget& b : budgets) tokens += b.max_nodes;
    const DraftCost dc = draft_cost_.cost();
    std::fprintf(stderr,
                 "tree step: batch %d%s plain %.3f ms, planned %d tokens %.3f ms, draft "
                 "%.3f + %.3f/level ms; yield %.4f / %.4f; budgets",
                 batch, explore ? " (explore)" : "", cost_.step_ms(batch, batch), tokens,
                 cost_.step_ms(batch, tokens), dc.fixed_ms, dc.per_level_ms,
                 yield_.speed(batch, true), yield_.speed(batch, false));
    for (size_t c = 0; c < cands.size(); ++c)
      std::fprintf(stderr, " %d/%d [%.2f %.2f %.2f]", budgets[c].max_nodes, budgets[c].max_depth,
                   cands[c].acceptance->rate(1, budgets[c].max_nodes),
                   cands[c].acceptance->rate(2, budgets[c].max_nodes),
                   cands[c].acceptance->rate(3, budgets[c].max_nodes));
    std::fprintf(stderr, "\n");
  }
  // Where the policy's trees delivered less than plain steps at this batch, they are overruled
  // (but in every yield_recheck-th such step).
  const auto any_tree = [](const std::vector<TreeBudget>& bs) {
    return std::any_of(bs.begin(), bs.end(), [](const TreeBudget& b) { return b.max_nodes > 1; });
  };
  // And the plain side they are judged against is measured again after 4 * yield_recheck tree
  // steps at a batch (plain_stale), by one step without trees (a plain step costs a winning
  // tree's gain: at batch 1, 1/64 of the steps lose a third of their tokens, ~0.5%).
  bool overruled = false, recheck_plain = false;
  const bool checked = !explore && chunks.empty() && config_.tree.adaptive &&
                       config_.yield_recheck > 0 && any_tree(budgets);
  if (checked && yield_.trees_lose(batch, kMinYieldSamples) &&
      overruled_steps_++ % config_.yield_recheck != config_.yield_recheck - 1) {
    overruled = true;
  } else if (checked && yield_.plain_stale(batch, 4 * config_.yield_recheck)) {
    recheck_plain = true;
  }
  if (overruled || recheck_plain) std::fill(budgets.begin(), budgets.end(), TreeBudget{1, 0});
  plan.yield_batch = chunks.empty() ? batch : 0;
  plan.policy_trees = any_tree(budgets);
  if (trace_trees() && (overruled || recheck_plain))
    std::fprintf(stderr, "tree %s: batch %d speed with trees %.4f, without %.4f\n",
                 overruled ? "overruled" : "plain recheck", batch, yield_.speed(batch, true),
                 yield_.speed(batch, false));
  // What the policy gave the requests admitted speculating, in their first decode steps.
  for (size_t k = 0; k < decodes.size() && !explore; ++k) {
    Req& r = get(decodes[k]);
    if (cand_of[k] == SIZE_MAX || r.uptake_batch <= 0) continue;
    r.uptake_steps++;
    if (budgets[cand_of[k]].max_nodes > 1) r.uptake_trees++;
    if (r.uptake_steps >= uptake_window()) record_uptake(r, 0);
  }
  // A probe's first decode steps draft a small tree whatever the policy says (probe_every).
  for (size_t k = 0; k < decodes.size() && !explore; ++k) {
    Req& r = get(decodes[k]);
    if (cand_of[k] == SIZE_MAX || r.probe_steps <= 0) continue;
    r.probe_steps--;
    TreeBudget& b = budgets[cand_of[k]];
    if (b.max_nodes <= 1) {
      b.max_nodes = std::min(4, config_.tree.max_tree.max_nodes);
      b.max_depth = budget_depth(b.max_nodes, config_.tree.max_tree.max_depth);
    }
  }

  std::vector<ScheduledItem>& decode_items = planned.decodes_;
  for (size_t k = 0; k < decodes.size(); ++k) {
    const ReqId id = decodes[k];
    Req& r = get(id);
    ScheduledItem it;
    it.id = id;
    it.decode = true;
    it.start = r.computed;
    it.budget = cand_of[k] == SIZE_MAX ? TreeBudget{1, 0} : budgets[cand_of[k]];
    if (r.speculate && config_.tree.adaptive && !explore) {
      r.steps_without_tree = it.budget.max_nodes > 1 ? 0 : r.steps_without_tree + 1;
      if (r.steps_without_tree >= config_.detach_after) {
        r.speculate = false;
        record_uptake(r, uptake_window() - r.uptake_steps);  // no tree for the rest
        fold_acceptance(r);
        plan.detached.push_back(id);
        if (trace_trees())
          std::fprintf(stderr, "tree detach: request %llu\n", (unsigned long long)id);
      }
    }
    if (it.budget.max_nodes > 1) planned.trees.push_back({id, it.budget});
    decode_items.push_back(it);
  }
  planned.chunks_ = std::move(chunks);
  planned.planned_ = true;
  return planned;
}

StepPlan Scheduler::reserve_step(PlannedStep planned, std::span<const int32_t> drafted) {
  ARBOR_CHECK(drafted.size() == planned.trees.size(),
              "drafted " + std::to_string(drafted.size()) + " trees for " +
                  std::to_string(planned.trees.size()) + " requests");
  StepPlan plan = std::move(planned.plan_);
  step_preempted_ = false;
  lookahead_too_short_ = false;
  if (!planned.planned_) return plan;
  // Reserve: decodes, then chunks. Out of blocks: a tree falls back to its root, then the newest
  // running request is preempted (possibly the one being planned) until the item fits.
  auto is_running = [&](ReqId id) {
    return std::find(running_.begin(), running_.end(), id) != running_.end();
  };
  // A tree's nodes beyond its root take only blocks that no later decode's next token needs:
  // trees shrink to their roots before anyone is preempted for them.
  const auto& decodes = planned.decodes_;
  std::vector<int32_t> roots_after(decodes.size() + 1, 0);  // [decodes + 1] blocks, suffix sums
  for (size_t k = decodes.size(); k-- > 0;)
    roots_after[k] = roots_after[k + 1] + kv_.blocks_needed(get(decodes[k].id).seq, 1);
  size_t next_draft = 0;
  for (size_t k = 0; k < decodes.size(); ++k) {
    ScheduledItem it = decodes[k];
    const ReqId id = it.id;
    int32_t n = 1;
    if (it.budget.max_nodes > 1) {
      const auto& [tree_id, budget] = planned.trees[next_draft];
      ARBOR_CHECK(tree_id == id && budget.max_nodes >= it.budget.max_nodes &&
                      budget.max_nodes <= config_.tree.max_tree.max_nodes,
                  "planned tree of request " + std::to_string(id) + " changed to " +
                      std::to_string(budget.max_nodes) + " nodes (planned " +
                      std::to_string(it.budget.max_nodes) + ", max " +
                      std::to_string(config_.tree.max_tree.max_nodes) + ")");
      it.budget = budget;
      n = drafted[next_draft++];
      ARBOR_CHECK(n >= 1 && n <= it.budget.max_nodes,
                  "draft of request " + std::to_string(id) + " returned " + std::to_string(n) +
                      " nodes for a budget of " + std::to_string(it.budget.max_nodes));
    }
    if (!is_running(id)) continue;  // preempted for an earlier item
    Req& r = get(id);
    if (n > 1 && kv_.blocks_needed(r.seq, n) + roots_after[k + 1] > kv_.num_free_blocks()) n = 1;
    bool ok = reserve(r, n, &plan);
    if (!ok && n > 1) {
      n = 1;
      ok = reserve(r, 1, &plan);
    }
    while (!ok) {
      const ReqId victim = running_.back();
      preempt(victim, &plan);
      if (victim == id) break;
      ok = reserve(r, 1, &plan);
    }
    if (!ok) continue;
    it.num_tokens = n;
    plan.items.push_back(it);
  }
  for (ScheduledItem it : planned.chunks_) {
    if (!is_running(it.id)) continue;
    Req& r = get(it.id);
    bool ok = reserve(r, it.num_tokens, &plan);
    if (!ok) {
      // Shrink the chunk to what the free blocks hold; an empty chunk waits for a later step.
      int32_t lo = 0, hi = it.num_tokens;
      while (lo + 1 < hi) {
        const int32_t mid = (lo + hi) / 2;
        (kv_.blocks_needed(r.seq, mid) <= kv_.num_free_blocks() ? lo : hi) = mid;
      }
      if (lo > 0 && reserve(r, lo, &plan)) {
        it.num_tokens = lo;
        it.last_chunk = false;
        ok = true;
      }
    }
    if (ok) plan.items.push_back(it);
  }
  if (plan.items.empty() && !running_.empty()) {
    // Nothing fits: the newest request gives its blocks back (unless it is alone, which the
    // engine's admission check rules out) and the next step tries again.
    if (running_.size() > 1) preempt(running_.back(), &plan);
  }
  // A request admitted under the look-ahead in force was preempted: it was too short, widen it.
  // (Requests admitted under a shorter one say nothing new: one wave of over-admission widens
  // it once, not once per victim.)
  if (lookahead_too_short_) {
    const int64_t pool = static_cast<int64_t>(kv_.num_blocks()) * kv_.block_size();
    lookahead_ = static_cast<int32_t>(
        std::min<int64_t>(pool, int64_t{lookahead_} + 2 * int64_t{config_.admission_lookahead}));
  }
  return plan;
}

void Scheduler::commit_prefill(const ScheduledItem& item) {
  Req& r = get(item.id);
  ARBOR_CHECK(!item.decode && item.start == r.computed);
  std::span<const int32_t> tokens(r.context.data() + item.start,
                                  static_cast<size_t>(item.num_tokens));
  const CommitPlan c = kv_.commit_all(r.seq, tokens);
  ARBOR_CHECK(c.copies.empty());
  r.computed += item.num_tokens;
  if (r.computed == static_cast<int32_t>(r.context.size())) r.prefilled = true;
}

CommitPlan Scheduler::commit_tree(ReqId id, std::span<const int32_t> nodes,
                                  std::span<const int32_t> tokens) {
  Req& r = get(id);
  const CommitPlan c = kv_.plan_commit(r.seq, nodes, tokens);
  kv_.apply(c);
  r.computed += static_cast<int32_t>(nodes.size());
  return c;
}

void Scheduler::append(ReqId id, std::span<const int32_t> tokens) {
  Req& r = get(id);
  r.context.insert(r.context.end(), tokens.begin(), tokens.end());
}

void Scheduler::record_acceptance(ReqId id, const VerifyResult& result, int32_t tree_nodes) {
  if (tree_nodes <= 1) return;
  AcceptanceStats one;
  one.add(result);
  Req& r = get(id);
  r.acceptance.update(one.offered, one.accepted, tree_nodes);
  r.trees++;
}

size_t Scheduler::num_speculating() const {
  return static_cast<size_t>(
      std::count_if(running_.begin(), running_.end(), [&](ReqId id) { return get(id).speculate; }));
}

void Scheduler::set_cost(CostModelConfig cost) {
  cost_ = CostModel(cost);  // validates
  config_.cost = std::move(cost);
}

void Scheduler::restore_policy_state(const PolicyState& state) {
  cost_ = state.cost;
  global_acceptance_ = state.global_acceptance;
  draft_cost_ = state.draft_cost;
  uptake_ = state.uptake;
  yield_ = state.yield;
}

void Scheduler::fold_acceptance(Req& r) {
  if (r.trees <= 0) return;
  global_acceptance_.blend(r.acceptance, LatestMean::weight(global_acceptance_.samples() + 1));
  r.trees = 0;
}

void Scheduler::record_uptake(Req& r, int32_t left) {
  if (r.uptake_batch > 0)
    uptake_.record(r.uptake_batch, r.uptake_trees, r.uptake_steps + std::max(left, 0));
  r.uptake_batch = 0;
}

void Scheduler::record_step_yield(const StepPlan& plan, int32_t emitted, double ms, bool warmup) {
  if (trace_trees())
    std::fprintf(stderr, "tree yield: batch %d trees %d emitted %d ms %.3f%s\n", plan.yield_batch,
                 plan.policy_trees ? 1 : 0, emitted, ms, warmup ? " (warm-up)" : "");
  if (plan.yield_batch > 0 && !warmup)
    yield_.record(plan.yield_batch, plan.policy_trees, emitted, ms,
                  cost_.prior_ms(plan.yield_batch, plan.yield_batch));
}

void Scheduler::record_draft_step(int32_t depth, double ms) {
  draft_cost_.observe(depth, ms);
}

}  // namespace arbor
