#include "engine/scheduler/tree_policy.h"

#include <algorithm>
#include <cmath>

#include "engine/backend/step_graphs.h"
#include "engine/core/error.h"

namespace arbor {

size_t AcceptanceEstimate::size_class(int32_t nodes) {
  size_t c = 0;
  while ((int64_t{4} << c) <= nodes) ++c;
  return c;
}

void AcceptanceEstimate::update(const std::vector<int64_t>& offered,
                                const std::vector<int64_t>& accepted, int32_t tree_nodes) {
  if (tree_nodes < 2) return;
  const size_t c = size_class(tree_nodes);
  if (rate_.size() <= c) {
    rate_.resize(c + 1);
    seen_.resize(c + 1);
  }
  std::vector<double>& rate = rate_[c];
  std::vector<int64_t>& seen = seen_[c];
  if (rate.size() < offered.size()) {
    rate.resize(offered.size(), prior_);
    seen.resize(offered.size(), 0);
  }
  bool any = false;
  for (size_t d = 0; d < offered.size(); ++d) {
    if (offered[d] <= 0) continue;
    const double a = (d < accepted.size() && accepted[d] > 0) ? 1.0 : 0.0;
    rate[d] = seen[d] == 0 ? 0.5 * (prior_ + a) : (1 - ema_) * rate[d] + ema_ * a;
    seen[d]++;
    any = true;
  }
  if (any) samples_++;
}

void AcceptanceEstimate::blend(const AcceptanceEstimate& other, double weight) {
  const double w = std::clamp(weight, 0.0, 1.0);
  for (size_t c = 0; c < other.rate_.size(); ++c)
    for (size_t d = 0; d < other.rate_[c].size(); ++d) {
      if (!other.seen(c, d)) continue;
      if (rate_.size() <= c) {
        rate_.resize(c + 1);
        seen_.resize(c + 1);
      }
      if (rate_[c].size() <= d) {
        rate_[c].resize(d + 1, prior_);
        seen_[c].resize(d + 1, 0);
      }
      rate_[c][d] = seen(c, d) ? (1 - w) * rate_[c][d] + w * other.rate_[c][d] : other.rate_[c][d];
      seen_[c][d]++;
    }
  samples_++;
}

double AcceptanceEstimate::rate(int32_t depth, int32_t nodes) const {
  const size_t d = static_cast<size_t>(depth - 1);
  const size_t c = size_class(std::max(nodes, 2));
  if (seen(c, d)) return rate_[c][d];
  // The nearest size classes measured at this depth, narrower and wider.
  size_t lo = SIZE_MAX, hi = SIZE_MAX;
  for (size_t k = c; k-- > 0;)
    if (seen(k, d)) {
      lo = k;
      break;
    }
  for (size_t k = c + 1; k < seen_.size(); ++k)
    if (seen(k, d)) {
      hi = k;
      break;
    }
  if (lo != SIZE_MAX && hi != SIZE_MAX) {
    const double t = static_cast<double>(c - lo) / static_cast<double>(hi - lo);
    return (1 - t) * rate_[lo][d] + t * rate_[hi][d];
  }
  // One side measured: each doubling of the tree leaves miss_per_doubling of the misses.
  if (lo != SIZE_MAX)
    return 1 - (1 - rate_[lo][d]) * std::pow(miss_per_doubling_, static_cast<double>(c - lo));
  if (hi != SIZE_MAX)
    return std::max(
        0.0, 1 - (1 - rate_[hi][d]) / std::pow(miss_per_doubling_, static_cast<double>(hi - c)));
  // A depth no tree reached yet: no better than the level above it (acceptance falls with depth).
  return depth <= 1 ? prior_ : std::min(prior_, rate(depth - 1, nodes));
}

double AcceptanceEstimate::expected_emitted(int32_t nodes, int32_t depth) const {
  double e = 1, p = 1;
  for (int32_t d = 1; d <= depth; ++d) {
    p *= rate(d, nodes);
    e += p;
  }
  return e;
}

void BatchMeans::add(int32_t batch, double x) {
  const auto b = static_cast<size_t>(CostModel::bucket_of(std::max(batch, 1)));
  if (by_bucket_.size() <= b) by_bucket_.resize(b + 1);
  by_bucket_[b].add(x);
}

const LatestMean* BatchMeans::at(int32_t batch, int64_t min_samples) const {
  const auto b = static_cast<size_t>(CostModel::bucket_of(std::max(batch, 1)));
  if (b >= by_bucket_.size() || by_bucket_[b].samples < std::max<int64_t>(min_samples, 1))
    return nullptr;
  return &by_bucket_[b];
}

void TreeUptake::record(int32_t batch, int32_t trees, int32_t steps) {
  if (steps <= 0 || batch <= 0) return;
  share_.add(batch, static_cast<double>(std::clamp(trees, 0, steps)) / steps);
}

double TreeUptake::share(int32_t batch, int32_t min_samples, double fallback) const {
  const LatestMean* m = share_.at(batch, min_samples);
  return m != nullptr ? m->value : fallback;
}

void StepYield::record(int32_t batch, bool trees, int32_t emitted, double ms, double plain_ms) {
  if (batch <= 0 || emitted <= 0 || !(ms > 0) || !(plain_ms > 0)) return;
  speed_[trees ? 1 : 0].add(batch, emitted / static_cast<double>(batch) * plain_ms / ms);
  const auto b = static_cast<size_t>(CostModel::bucket_of(batch));
  if (trees_since_plain_.size() <= b) trees_since_plain_.resize(b + 1, 0);
  trees_since_plain_[b] = trees ? trees_since_plain_[b] + 1 : 0;
}

double StepYield::speed(int32_t batch, bool trees) const {
  const LatestMean* m = speed_[trees ? 1 : 0].at(batch, 1);
  return m != nullptr ? m->value : -1;
}

bool StepYield::plain_stale(int32_t batch, int32_t interval) const {
  const auto b = static_cast<size_t>(CostModel::bucket_of(std::max(batch, 1)));
  if (interval <= 0 || b >= trees_since_plain_.size()) return false;
  return trees_since_plain_[b] >= interval;
}

bool StepYield::trees_lose(int32_t batch, int32_t min_samples) const {
  // A batch not measured borrows the nearest smaller one's verdict: verification's cost grows
  // with the batch and acceptance does not, so trees that lose at a batch lose at a larger one.
  for (int32_t b = CostModel::bucket_of(std::max(batch, 1)); b >= 0; --b) {
    const LatestMean* with = speed_[1].at(int32_t{1} << b, min_samples);
    const LatestMean* without = speed_[0].at(int32_t{1} << b, min_samples);
    if (with != nullptr && without != nullptr) return with->value < without->value;
  }
  return false;
}

int32_t budget_depth(int32_t nodes, int32_t max_depth) {
  int32_t depth = 0;
  while ((int64_t{2} << depth) <= nodes) ++depth;
  return std::min(depth, max_depth);
}

void DraftCostEstimate::observe(int32_t depth, double ms) {
  if (depth <= 0 || !(ms >= 0)) return;
  const double x = static_cast<double>(depth - 1);
  const double k = samples_ == 0 ? 1.0 : ema_;
  auto mix = [k](double& m, double v) { m = (1 - k) * m + k * v; };
  mix(x_, x);
  mix(y_, ms);
  mix(xx_, x * x);
  mix(xy_, x * ms);
  samples_++;
  const double var = xx_ - x_ * x_;
  if (var < 0.25) {
    // One depth (or nearly): the line is not determined; each further level costs level_share
    // of the first.
    cost_.fixed_ms = y_ / (1 + level_share_ * x_);
    cost_.per_level_ms = level_share_ * cost_.fixed_ms;
    return;
  }
  double slope = (xy_ - x_ * y_) / var;
  double intercept = y_ - slope * x_;
  if (slope < 0) {
    slope = 0;
    intercept = y_;
  } else if (intercept < 0) {
    intercept = 0;
    slope = xy_ / xx_;
  }
  cost_.fixed_ms = intercept;
  cost_.per_level_ms = slope;
}

namespace {

// One assignment of budgets and what it predicts.
struct Assignment {
  std::vector<int32_t> nodes;
  int32_t tokens = 0;
  double emitted = 0;
  int32_t depth = 0;  // deepest budget (0: nobody drafts)
  double value = 0;   // predicted throughput
};

class BudgetSearch {
 public:
  BudgetSearch(const std::vector<TreeCandidate>& candidates, int32_t fixed_tokens,
               int32_t fixed_emitted, int32_t batch, const CostModel& cost, const DraftCost& draft,
               const TreePolicyConfig& config)
      : c_(candidates),
        fixed_tokens_(fixed_tokens),
        fixed_emitted_(fixed_emitted),
        batch_(batch),
        cost_(cost),
        draft_(draft),
        config_(config) {}

  int32_t depth_of(int32_t nodes) const {
    return nodes <= 1 ? 0 : budget_depth(nodes, config_.max_tree.max_depth);
  }
  double emitted(size_t i, int32_t nodes) const {
    if (nodes <= 1) return 1.0;
    // Memoised per candidate and budget: budgets are powers of two or max_nodes, so slot
    // floor(log2(nodes)) - 1, one more when not a power of two, is below 32.
    const int32_t log2 = CostModel::bucket_of(nodes);
    const auto slot = static_cast<size_t>(log2 - 1 + ((nodes & (nodes - 1)) != 0 ? 1 : 0));
    if (emitted_.empty()) emitted_.assign(c_.size() * kSlots, -1.0);
    double& e = emitted_[i * kSlots + slot];
    if (e < 0) e = c_[i].acceptance->expected_emitted(nodes, depth_of(nodes));
    return e;
  }
  double value(double emitted, int32_t tokens, int32_t depth) const {
    return emitted / (step_ms(tokens) + draft_.ms(depth));
  }
  // The cost model's step at `tokens` (padded), looked up once per search: the search weighs
  // every doubling of every candidate at each step it grows, and at 64 requests the lookups
  // (an interpolation and a scan of the online buckets each) were most of the planning time.
  double step_ms(int32_t tokens) const {
    const auto t = static_cast<size_t>(std::max(tokens, 0));
    // Grown to the counts the search reaches, not sized by max_step_tokens (which may be
    // thousands): predicted_throughput and a batch-1 plan look up a handful.
    if (t >= step_ms_.size()) step_ms_.resize(std::max(t + 1, 2 * step_ms_.size()), -1.0);
    double& ms = step_ms_[t];
    if (ms < 0) ms = cost_.step_ms(batch_, padded(tokens));
    return ms;
  }
  // The tokens a step of `tokens` runs as: the bucket when any tree is in it (a step of plain
  // decodes keeps its count).
  int32_t padded(int32_t tokens) const {
    const int32_t plain = fixed_tokens_ + static_cast<int32_t>(c_.size());
    if (config_.step_token_buckets <= 0 || tokens <= plain) return tokens;
    return static_cast<int32_t>(std::min<int64_t>(graph_bucket(tokens, config_.step_token_buckets),
                                                  config_.max_step_tokens));
  }
  // The next budget after `nodes`: doubled, capped at max_nodes (nodes itself when at the cap).
  int32_t next(int32_t nodes) const {
    return std::max(nodes, std::min(nodes * 2, config_.max_tree.max_nodes));
  }

  // What `nodes` (one budget per candidate) predicts.
  Assignment assess(std::vector<int32_t> nodes) const {
    Assignment a;
    a.tokens = fixed_tokens_;
    a.emitted = fixed_emitted_;
    for (size_t i = 0; i < nodes.size(); ++i) {
      a.tokens += nodes[i];
      a.emitted += emitted(i, nodes[i]);
      a.depth = std::max(a.depth, depth_of(nodes[i]));
    }
    a.value = value(a.emitted, a.tokens, a.depth);
    a.nodes = std::move(nodes);
    return a;
  }
  Assignment uniform(int32_t nodes) const { return assess(std::vector<int32_t>(c_.size(), nodes)); }

  // Grows one budget at a time (to any larger power of two: a fixed drafting cost can make a
  // 2-node tree a loss where an 8-node tree is a gain) while throughput rises by min_gain.
  void grow(Assignment* a) const {
    const size_t n = c_.size();
    while (true) {
      size_t pick = n;
      double pick_value = a->value * (1 + config_.min_gain);
      int32_t pick_nodes = 0;
      for (size_t i = 0; i < n; ++i) {
        const int32_t cur = a->nodes[i];
        for (int32_t nn = next(cur); nn > cur; nn = next(nn)) {
          const int32_t t = a->tokens + nn - cur;
          if (t > config_.max_step_tokens) break;
          const double e = a->emitted - emitted(i, cur) + emitted(i, nn);
          const double v = value(e, t, std::max(a->depth, depth_of(nn)));
          if (v > pick_value) {
            pick = i;
            pick_value = v;
            pick_nodes = nn;
          }
          if (nn == next(nn)) break;  // at max_nodes
        }
      }
      if (pick == n) return;
      a->emitted += emitted(pick, pick_nodes) - emitted(pick, a->nodes[pick]);
      a->tokens += pick_nodes - a->nodes[pick];
      a->depth = std::max(a->depth, depth_of(pick_nodes));
      a->nodes[pick] = pick_nodes;
      a->value = pick_value;
    }
  }

 private:
  const std::vector<TreeCandidate>& c_;
  int32_t fixed_tokens_, fixed_emitted_, batch_;
  const CostModel& cost_;
  const DraftCost& draft_;
  const TreePolicyConfig& config_;
  mutable std::vector<double> step_ms_;  // [tokens] -> ms, -1: not looked up yet
  static constexpr size_t kSlots = 32;
  mutable std::vector<double> emitted_;  // [candidate * kSlots + budget slot], -1: not yet
};

}  // namespace

std::vector<TreeBudget> choose_tree_budgets(const std::vector<TreeCandidate>& candidates,
                                            int32_t fixed_tokens, int32_t fixed_emitted,
                                            int32_t batch, const CostModel& cost,
                                            const DraftCost& draft,
                                            const TreePolicyConfig& config) {
  const size_t n = candidates.size();
  std::vector<TreeBudget> out(n, TreeBudget{1, 0});
  if (n == 0) return out;
  if (!config.adaptive) {
    int32_t room = config.max_step_tokens - fixed_tokens;
    for (auto& b : out) {
      b = config.max_tree;
      b.max_nodes = std::max(1, std::min(b.max_nodes, room));
      room -= b.max_nodes;
    }
    return out;
  }
  const BudgetSearch search(candidates, fixed_tokens, fixed_emitted, batch, cost, draft, config);
  Assignment best = search.uniform(1);
  const double plain = best.value;
  // The best budget common to every request, if it beats plain decoding by min_gain.
  Assignment common = best;
  for (int32_t u = search.next(1); u > 1; u = search.next(u)) {
    if (fixed_tokens + static_cast<int64_t>(n) * u > config.max_step_tokens) break;
    Assignment a = search.uniform(u);
    if (a.value > common.value) common = std::move(a);
    if (u == search.next(u)) break;
  }
  search.grow(&best);
  if (common.value > plain * (1 + config.min_gain)) {
    search.grow(&common);
    if (common.value > best.value) best = std::move(common);
  }
  for (size_t i = 0; i < n; ++i) out[i] = TreeBudget{best.nodes[i], search.depth_of(best.nodes[i])};
  return out;
}

double predicted_throughput(const std::vector<TreeCandidate>& candidates,
                            const std::vector<int32_t>& nodes, int32_t fixed_tokens,
                            int32_t fixed_emitted, int32_t batch, const CostModel& cost,
                            const DraftCost& draft, const TreePolicyConfig& config) {
  ARBOR_CHECK(nodes.size() == candidates.size(), "one budget per candidate");
  return BudgetSearch(candidates, fixed_tokens, fixed_emitted, batch, cost, draft, config)
      .assess(nodes)
      .value;
}

}  // namespace arbor
