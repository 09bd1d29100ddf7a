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

#include <algorithm>
#include <cstdint>
#include <vector>

#include "engine/scheduler/cost_model.h"
#include "engine/verify/tree_budget.h"

namespace arbor {

// Running acceptance by tree size and depth (EMA of accepted / offered per depth), with a prior
// for what was not seen. A wider tree offers more candidates at each depth, so it accepts more
// often: rates measured with 2-node trees (one child per level) say little about a 64-node tree
// (a proposer's top-k children at each level), and a policy judging big trees by small ones
// never grows past what it first tried. So rates are kept per size class (floor(log2(nodes)) of
// the verified tree: 2-3, 4-7, ..., 64-127 nodes), and a class not measured at a depth borrows
// from its nearest measured neighbours: interpolated between two, else each doubling of the
// tree leaves `miss_per_doubling` of the misses (0.9: SmolLM2's EAGLE-2 head accepts 45% of
// single children at depth 1 and 68% with 10, five doublings apart). Nothing measured at a
// depth: no better than the level above, nor the prior.
class AcceptanceEstimate {
 public:
  explicit AcceptanceEstimate(double prior = 0.6, double ema = 0.1, double miss_per_doubling = 0.9)
      : prior_(prior), ema_(ema), miss_per_doubling_(miss_per_doubling) {}
  // One verify step of a tree of `tree_nodes` nodes: offered[d] / accepted[d] say whether a node
  // at depth d + 1 was tested / accepted (the AcceptanceStats delta of that step).
  void update(const std::vector<int64_t>& offered, const std::vector<int64_t>& accepted,
              int32_t tree_nodes);
  // Acceptance at `depth` (>= 1) of a tree of `nodes` (>= 2) nodes.
  double rate(int32_t depth, int32_t nodes) const;
  // Expected tokens a tree of `nodes` reaching `depth` emits: 1 + sum_d prod_{j<=d} rate(j).
  double expected_emitted(int32_t nodes, int32_t depth) const;
  // Moves each rate `other` has (measured or inherited) `weight` of the way to other's; counts
  // one sample. The server-wide estimate folds in each request's this way when it ends.
  void blend(const AcceptanceEstimate& other, double weight);
  int64_t samples() const { return samples_; }

 private:
  static size_t size_class(int32_t nodes);  // floor(log2(nodes)) - 1, nodes >= 2
  bool seen(size_t cls, size_t d) const {
    return cls < seen_.size() && d < seen_[cls].size() && seen_[cls][d] > 0;
  }
  double prior_;
  double ema_;
  double miss_per_doubling_;
  std::vector<std::vector<double>> rate_;  // [size class][depth - 1]
  std::vector<std::vector<int64_t>> seen_;
  int64_t samples_ = 0;
};

// A mean that weighs the latest samples most: the plain mean of the first 16, then each new
// sample weighs 1/16 (the latest 16 about two thirds).
struct LatestMean {
  double value = 0;
  int64_t samples = 0;
  static double weight(int64_t n) { return std::max(1.0 / static_cast<double>(n), 1.0 / 16); }
  void add(double x) {
    samples++;
    const double w = weight(samples);
    value = (1 - w) * value + w * x;
  }
};

// LatestMeans per batch, in power-of-two buckets (CostModel::bucket_of).
class BatchMeans {
 public:
  void add(int32_t batch, double x);
  // The bucket of `batch`; nullptr while it has fewer than min_samples samples.
  const LatestMean* at(int32_t batch, int64_t min_samples) const;

 private:
  std::vector<LatestMean> by_bucket_;
};

// Of the requests admitted speculating at a load (the batch they joined, in power-of-two
// buckets): the share of their first decode steps in which the step policy gave them a tree (a
// mean that weighs the latest requests most). Admission and the step policy judge with the same
// cost model, but at different shapes (a burst of arrivals at the batch it will form; each step
// at the batch it has, its prefill chunks included) and from different estimates (the
// server-wide acceptance; each request's own), so they can disagree; where they do, every
// request admitted speculating pays the draft's prefill of its prompt and its first steps'
// features, and is then detached without a tree. The record lets admission follow what the
// step policy did at that load.
class TreeUptake {
 public:
  // One request admitted at `batch`: `trees` of its first `steps` decode steps had a tree.
  void record(int32_t batch, int32_t trees, int32_t steps);
  // The mean share at `batch`'s bucket; `fallback` while fewer than min_samples were recorded.
  double share(int32_t batch, int32_t min_samples, double fallback) const;

 private:
  BatchMeans share_;
};

// What decode-only steps delivered, per batch (power-of-two buckets), for steps in which the
// tree policy gave trees and for steps without a tree: each step's speed against a plain step
// at its own batch, emitted tokens per request x plain_ms / the whole step's ms (drafting and
// the proposer's feedback included; plain_ms from the cost curve without its online
// correction, so that batches of one bucket and steps of different moments compare), as means
// that weigh the latest 16 most. The policy predicts a tree's worth from acceptance estimates
// and a cost model, both of which can be wrong (estimates that ran high are the ones that win
// budgets; a cost curve's shape at a batch it never measured with trees); this is the outcome
// it is checked against. Both sides must stay current: a plain side measured once, early (the
// first steps after a burst's prefill run slower), and never again while trees run, would judge
// every later tree against a stale figure, so the record counts the tree steps since each
// bucket's last plain step (plain_stale).
class StepYield {
 public:
  void record(int32_t batch, bool trees, int32_t emitted, double ms, double plain_ms);
  // Trees at `batch` delivered less than steps without (each measured at least min_samples
  // times there, else at the nearest smaller batch that was).
  bool trees_lose(int32_t batch, int32_t min_samples) const;
  // Speed at `batch` for steps with (trees) or without trees (1: as fast as the curve's plain
  // step); -1: none.
  double speed(int32_t batch, bool trees) const;
  // Whether `batch`'s plain side is due a new sample: `interval` tree steps recorded there
  // since its last plain step (a count of steps, not a judgement of timings, which would make a
  // run's trees depend on its host's load).
  bool plain_stale(int32_t batch, int32_t interval) const;

 private:
  BatchMeans speed_[2];                     // [trees]
  std::vector<int32_t> trees_since_plain_;  // per bucket
};

struct TreePolicyConfig {
  bool adaptive = true;           // false: every request gets max_tree
  TreeBudget max_tree;            // largest budget per request
  int32_t max_step_tokens = 512;  // all tokens of the step, prefill included
  double min_gain = 0.02;         // a doubling must raise throughput by this fraction
  // > 0: a decode step with a tree runs padded to graph_bucket(tokens, step_token_buckets)
  // tokens (step graphs under adaptive trees, Engine::bucket_budgets), so a tree is weighed at
  // the bucket's cost: one more node past a bucket's edge costs the next bucket.
  int32_t step_token_buckets = 0;
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
// determined, and each further level is taken to cost `level_share` of the first (which also
// pays the proposer's feedback forward and root top-k): 0.5 is what EAGLE's device-grown trees
// measure on an H200 (about 0.2 ms, then 0.1 ms per level, for SmolLM2). A proportional split
// (every level costing the first's) made a draft measured at depth 1 look five times as dear
// at depth 5, and the policy never tried the deeper trees that pay.
class DraftCostEstimate {
 public:
  explicit DraftCostEstimate(double ema = 0.1, double level_share = 0.5)
      : ema_(ema), level_share_(level_share) {}
  void observe(int32_t depth, double ms);
  DraftCost cost() const { return cost_; }
  int64_t samples() const { return samples_; }

 private:
  double ema_;
  double level_share_;
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
