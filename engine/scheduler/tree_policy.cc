#include "engine/scheduler/tree_policy.h"

#include <algorithm>

namespace arbor {

void AcceptanceEstimate::update(const std::vector<int64_t>& offered,
                                const std::vector<int64_t>& accepted) {
  if (rate_.size() < offered.size()) {
    rate_.resize(offered.size(), prior_);
    seen_.resize(offered.size(), 0);
  }
  bool any = false;
  for (size_t d = 0; d < offered.size(); ++d) {
    if (offered[d] <= 0) continue;
    const double a = (d < accepted.size() && accepted[d] > 0) ? 1.0 : 0.0;
    rate_[d] = seen_[d] == 0 ? 0.5 * (prior_ + a) : (1 - ema_) * rate_[d] + ema_ * a;
    seen_[d]++;
    any = true;
  }
  if (any) samples_++;
}

double AcceptanceEstimate::rate(int32_t depth) const {
  const size_t d = static_cast<size_t>(depth - 1);
  if (d < rate_.size() && seen_[d] > 0) return rate_[d];
  // Unseen depth: no better than the deepest depth seen so far (acceptance falls with depth).
  for (size_t k = std::min(d, rate_.size()); k-- > 0;)
    if (seen_[k] > 0) return std::min(prior_, rate_[k]);
  return prior_;
}

double AcceptanceEstimate::expected_emitted(int32_t depth) const {
  double e = 1, p = 1;
  for (int32_t d = 1; d <= depth; ++d) {
    p *= rate(d);
    e += p;
  }
  return e;
}

int32_t budget_depth(int32_t nodes, int32_t max_depth) {
  int32_t depth = 0;
  while ((int64_t{2} << depth) <= nodes) ++depth;
  return std::min(depth, max_depth);
}

std::vector<TreeBudget> choose_tree_budgets(const std::vector<TreeCandidate>& candidates,
                                            int32_t fixed_tokens, int32_t fixed_emitted,
                                            int32_t batch, const CostModel& cost,
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
  std::vector<int32_t> nodes(n, 1);
  auto emitted = [&](size_t i, int32_t nn) {
    if (nn <= 1) return 1.0;
    return candidates[i].acceptance->expected_emitted(budget_depth(nn, config.max_tree.max_depth));
  };
  int32_t tokens = fixed_tokens + static_cast<int32_t>(n);
  double sum_emitted = static_cast<double>(n + fixed_emitted), draft_ms = 0;
  auto throughput = [&](double e, int32_t t, double d) { return e / (cost.step_ms(batch, t) + d); };
  double best = throughput(sum_emitted, tokens, draft_ms);
  while (true) {
    size_t pick = n;
    double pick_value = best * (1 + config.min_gain);
    int32_t pick_nodes = 0;
    for (size_t i = 0; i < n; ++i) {
      // Every larger power-of-two budget, not just the next: a fixed drafting cost can make a
      // 2-node tree a loss where an 8-node tree is a gain.
      for (int32_t next = std::min(nodes[i] * 2, config.max_tree.max_nodes); next > nodes[i];
           next = std::min(next * 2, config.max_tree.max_nodes)) {
        const int32_t t = tokens + next - nodes[i];
        if (t > config.max_step_tokens) break;
        const double e = sum_emitted - emitted(i, nodes[i]) + emitted(i, next);
        const double d = draft_ms + (nodes[i] == 1 ? candidates[i].draft_ms : 0.0);
        const double v = throughput(e, t, d);
        if (v > pick_value) {
          pick = i;
          pick_value = v;
          pick_nodes = next;
        }
        if (next == config.max_tree.max_nodes) break;
      }
    }
    if (pick == n) break;
    sum_emitted += emitted(pick, pick_nodes) - emitted(pick, nodes[pick]);
    if (nodes[pick] == 1) draft_ms += candidates[pick].draft_ms;
    tokens += pick_nodes - nodes[pick];
    nodes[pick] = pick_nodes;
    best = throughput(sum_emitted, tokens, draft_ms);
  }
  for (size_t i = 0; i < n; ++i)
    out[i] = TreeBudget{nodes[i], budget_depth(nodes[i], config.max_tree.max_depth)};
  return out;
}

}  // namespace arbor
