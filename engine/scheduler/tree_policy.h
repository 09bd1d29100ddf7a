// The tree-budget policy: how many draft nodes each speculating request may score this step.
// It maximises predicted throughput, (tokens the step is expected to emit) / (predicted step
// time + drafting time), using the cost model (step time vs total tokens at this batch size),
// the drafting cost (per step, growing with the deepest tree: a draft model batches every
// request's tree into one forward per level) and each request's running acceptance by tree
// depth. Budgets grow by doubling, one request at a time, while the objective improves, from
// two starts: every request at a plain decode (one node), and every request at the best common
// budget (a shared drafting cost one tree alone cannot pay may pay for eight). So speculation
// shrinks, then turns off, as the batch grows and verification stops being free, and with all
// budgets at one node the step is exactly plain decoding: enabling speculation never predicts a
// slower step than disabling it.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/scheduler/cost_model.h"
#include "engine/verify/tree_budget.h"

namespace arbor {

// Running acceptance by tree depth (EMA of accepted / offered per depth), with a prior for
// depths not yet seen.
class AcceptanceEstimate {
 public:
  explicit AcceptanceEstimate(double prior = 0.6, double ema = 0.1) : prior_(prior), ema_(ema) {}
  // One verify step: offered[d] / accepted[d] say whether a node at depth d + 1 was tested /
  // accepted (the AcceptanceStats delta of that step).
  void update(const std::vector<int64_t>& offered, const std::vector<int64_t>& accepted);
  double rate(int32_t depth) const;  // depth >= 1
  // Expected tokens a tree reaching `depth` emits: 1 + sum_d prod_{j<=d} rate(j).
  double expected_emitted(int32_t depth) const;
  int64_t samples() const { return samples_; }

 private:
  double prior_;
  double ema_;
  std::vector<double> rate_;  // [depth - 1]
  std::vector<int64_t> seen_;
  int64_t samples_ = 0;
};

struct TreePolicyConfig {
  bool adaptive = true;           // false: every request gets max_tree
  TreeBudget max_tree;            // largest budget per request
  int32_t max_step_tokens = 512;  // all tokens of the step, prefill included
  double min_gain = 0.02;         // a doubling must raise throughput by this fraction
};

struct TreeCandidate {
  const AcceptanceEstimate* acceptance = nullptr;
};

// Drafting time of one step as a function of the deepest tree budget drafted in it:
// fixed_ms + per_level_ms * (depth - 1), nothing when no request drafts (depth 0). fixed_ms
// covers what any drafting step pays once (the proposer's feedback forward, the root top-k),
// per_level_ms one more draft forward over every request's frontier. It is per step, not per
// request: eight requests drafting in one batched forward cost about what one does.
struct DraftCost {
  double fixed_ms = 0;
  double per_level_ms = 0;
  double ms(int32_t depth) const {
    return depth <= 0 ? 0.0 : fixed_ms + per_level_ms * static_cast<double>(depth - 1);
  }
};

// DraftCost measured online: an exponentially weighted least-squares line through (depth - 1,
// measured ms) of the steps that drafted. While every sample has the same depth the line is not
// determined, and the cost is taken as proportional to depth (each level, the first included,
// costs the same), the shape of a draft model's lockstep expansion.
class DraftCostEstimate {
 public:
  explicit DraftCostEstimate(double ema = 0.1) : ema_(ema) {}
  void observe(int32_t depth, double ms);
  DraftCost cost() const { return cost_; }
  int64_t samples() const { return samples_; }

 private:
  double ema_;
  double x_ = 0, y_ = 0, xx_ = 0, xy_ = 0;  // weighted moments of (depth - 1, ms)
  DraftCost cost_;
  int64_t samples_ = 0;
};

// The depth a budget of `nodes` is expected to reach: trees double in width and grow one level
// per doubling (2 -> 1, 4 -> 2, 8 -> 3, ...), capped by max_depth.
int32_t budget_depth(int32_t nodes, int32_t max_depth);

// Budgets for `candidates` (same order), given the tokens the step already carries (prefill
// chunks and non-speculating decodes), the tokens those emit (one per decode and per last
// prefill chunk) and the number of requests in the step. The objective is the whole step's
// throughput, so one request's tree is weighed against slowing every other request's token.
std::vector<TreeBudget> choose_tree_budgets(const std::vector<TreeCandidate>& candidates,
                                            int32_t fixed_tokens, int32_t fixed_emitted,
                                            int32_t batch, const CostModel& cost,
                                            const DraftCost& draft, const TreePolicyConfig& config);

// The throughput choose_tree_budgets predicts for `nodes` (one per candidate): expected emitted
// tokens per ms of verification plus drafting.
double predicted_throughput(const std::vector<TreeCandidate>& candidates,
                            const std::vector<int32_t>& nodes, int32_t fixed_tokens,
                            int32_t fixed_emitted, int32_t batch, const CostModel& cost,
                            const DraftCost& draft, const TreePolicyConfig& config);

}  // namespace arbor
