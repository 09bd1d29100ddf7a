// The tree-budget policy: how many draft nodes each speculating request may score this step.
// It maximises predicted throughput, (tokens the step is expected to emit) / (predicted step
// time + drafting time), using the cost model (step time vs total tokens at this batch size)
// and each request's running acceptance by tree depth. Every request starts at a plain decode
// (one node); budgets grow by doubling, one request at a time, while the objective improves.
// So speculation shrinks, then turns off, as the batch grows and verification stops being free,
// and with all budgets at one node the step is exactly plain decoding: enabling speculation
// never predicts a slower step than disabling it.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/scheduler/cost_model.h"
#include "engine/spec/proposer.h"

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
  double draft_ms = 0;  // drafting time when it speculates (0 for n-gram lookup)
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
                                            const TreePolicyConfig& config);

}  // namespace arbor
