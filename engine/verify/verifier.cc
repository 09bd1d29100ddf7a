#include "engine/verify/verifier.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/error.h"
#include "engine/sampling/logits_processors.h"
#include "engine/verify/tree_layout.h"

namespace arbor {
namespace {

// What every mode needs: the tree's shape and p / argmax at a node with its path's context.
class TreeWalk {
 public:
  TreeWalk(const DraftTree& tree, std::span<const float> logits, int64_t vocab,
           const Sampler& sampler, std::span<const int32_t> prompt, std::span<const int32_t> output)
      : tree_(tree),
        logits_(logits),
        vocab_(vocab),
        sampler_(sampler),
        prompt_(prompt),
        output_(output),
        layout_(layout_tree(tree.parent, 0)) {}

  const TreeLayout& layout() const { return layout_; }

  // p at `node`, in double, normalised.
  std::vector<double> target_probs(int32_t node) const {
    const std::vector<int32_t> history = history_at(node);
    const std::vector<float> p = sampler_.probs(row(node), prompt_, history);
    std::vector<double> out(p.begin(), p.end());
    normalize(out);
    return out;
  }

  // argmax of the processed logits at `node` (lowest id on ties): plain greedy decoding's token.
  int32_t greedy_token(int32_t node) const {
    const std::vector<int32_t> history = history_at(node);
    std::vector<float> work(row(node).begin(), row(node).end());
    sampler_.process_logits(work, prompt_, history);
    return argmax(work);
  }

  static void normalize(std::vector<double>& p) {
    double sum = 0.0;
    for (double v : p) sum += v;
    ARBOR_CHECK(sum > 0.0, "distribution with no mass");
    for (double& v : p) v /= sum;
  }

  // Fills the parts of `result` that follow from the final node.
  void finish(int32_t last, int32_t bonus, VerifyResult* result) const {
    result->accepted_nodes = tree_path_to(tree_.parent, last);
    result->accepted_tokens.clear();
    for (size_t d = 1; d < result->accepted_nodes.size(); ++d)
      result->accepted_tokens.push_back(tree_.token[result->accepted_nodes[d]]);
    result->bonus_token = bonus;
  }

 private:
  std::span<const float> row(int32_t node) const {
    return logits_.subspan(static_cast<size_t>(node) * vocab_, static_cast<size_t>(vocab_));
  }
  // The generated tokens as plain decoding would have them when sampling after `node`.
  std::vector<int32_t> history_at(int32_t node) const {
    std::vector<int32_t> history(output_.begin(), output_.end());
    const std::vector<int32_t> path = tree_path_to(tree_.parent, node);
    for (size_t d = 1; d < path.size(); ++d) history.push_back(tree_.token[path[d]]);
    return history;
  }

  const DraftTree& tree_;
  std::span<const float> logits_;  // [T, vocab]
  int64_t vocab_;
  const Sampler& sampler_;
  std::span<const int32_t> prompt_;
  std::span<const int32_t> output_;
  TreeLayout layout_;
};

// Matched nodes: every node on the path equals plain greedy decoding's token. Each node's
// children are all compared, so duplicate siblings cannot hide a deeper match; the deepest
// matched node wins (lowest index among equals).
// `greedy_token(i)` is plain greedy decoding's token after node i; it is asked only for matched
// nodes (so a bad row elsewhere in the tree never matters, with logits or with argmax ids).
template <typename GreedyToken>
VerifyResult verify_greedy(const DraftTree& tree, const TreeLayout& layout,
                           const GreedyToken& greedy_token) {
  const int32_t t = tree.size();
  std::vector<int32_t> next(t, -1);  // greedy token after node i, for matched nodes
  std::vector<bool> matched(t, false);
  matched[0] = true;
  int32_t best = 0;
  for (int32_t i = 0; i < t; ++i) {
    if (!matched[i]) continue;
    next[i] = greedy_token(i);
    for (int32_t c = layout.child_offset[i]; c < layout.child_offset[i + 1]; ++c) {
      const int32_t child = layout.child[c];
      if (tree.token[child] != next[i]) continue;
      matched[child] = true;
      const int32_t d = layout.depth[child], best_d = layout.depth[best];
      if (d > best_d || (d == best_d && child < best)) best = child;
    }
  }
  VerifyResult result;
  result.accepted_nodes = tree_path_to(tree.parent, best);
  for (size_t d = 1; d < result.accepted_nodes.size(); ++d)
    result.accepted_tokens.push_back(tree.token[result.accepted_nodes[d]]);
  result.bonus_token = next[best];
  for (int32_t node : result.accepted_nodes)
    result.children_tried.push_back(layout.num_children(node));
  return result;
}

// The checks verify() and verify_greedy_argmax() share: the root is the newest committed token.
void check_root(const DraftTree& tree, std::span<const int32_t> prompt,
                std::span<const int32_t> output) {
  const int32_t last = !output.empty() ? output.back() : !prompt.empty() ? prompt.back() : -1;
  if (last != tree.token[0])
    throw_error(ErrorCode::kInvalidArgument,
                "verify: the committed tokens end with " + std::to_string(last) +
                    " but the tree's root token is " + std::to_string(tree.token[0]));
}

// Multi-branch speculative sampling. At a node with target p, child x proposed from q is
// accepted with probability min(1, p(x) / q(x)); a rejection replaces p by the residual
// normalize(max(p - q, 0)) and moves to the next child. Deterministic children are q = one-hot(x):
// accept with probability p(x), else p(x) <- 0 and renormalise. With no child accepted the bonus
// token is drawn from the residual. Sampled children must be independent draws from q (the same q
// for every sibling): then each rejection leaves the residual as the exact target of the rest.
VerifyResult verify_rejection(const DraftTree& tree, const TreeWalk& walk, int64_t vocab,
                              VerifyRandomness& randomness) {
  const TreeLayout& layout = walk.layout();
  VerifyResult result;
  int32_t node = 0;
  while (true) {
    std::vector<double> p = walk.target_probs(node);
    const int32_t row = tree.q_row.empty() ? -1 : tree.q_row[node];
    std::vector<double> q;
    if (row >= 0) {
      const float* q_row = tree.q.data() + static_cast<size_t>(row) * vocab;
      q.assign(q_row, q_row + vocab);
      TreeWalk::normalize(q);
    }
    int32_t accepted = -1;
    int32_t tried = 0;
    for (int32_t c = layout.child_offset[node]; c < layout.child_offset[node + 1]; ++c) {
      const int32_t child = layout.child[c];
      const int32_t x = tree.token[child];
      ++tried;
      if (row < 0) {
        if (randomness.bernoulli(std::min(1.0, p[x]))) {
          accepted = child;
          break;
        }
        p[x] = 0.0;  // p(x) < 1 here: bernoulli(1) always accepts
        TreeWalk::normalize(p);
      } else {
        if (randomness.bernoulli(std::min(1.0, p[x] / q[x]))) {  // q[x] > 0: validated
          accepted = child;
          break;
        }
        std::vector<double> residual(p.size());
        double mass = 0.0;
        for (size_t v = 0; v < p.size(); ++v) {
          residual[v] = std::max(p[v] - q[v], 0.0);
          mass += residual[v];
        }
        // A rejection means p(x) < q(x), so p > q somewhere and the residual has mass; only
        // rounding in a q that sums to slightly more than 1 can empty it. Then p stands.
        if (mass > 0.0) {
          p = std::move(residual);
          TreeWalk::normalize(p);
        }
      }
    }
    result.children_tried.push_back(tried);
    if (accepted < 0) {
      walk.finish(node, randomness.categorical(p), &result);
      return result;
    }
    node = accepted;
  }
}

// Medusa's evaluate_posterior (typical branch) on a tree: a node passes when its token's
// probability under its parent's p exceeds min(epsilon, delta * exp(-H(p_parent))); a node is
// accepted with its whole path passing. The deepest accepted node wins, ties broken by the path's
// log-likelihood (sum of log p of its tokens), then by the lowest index. Bonus: argmax at that node
// (Medusa's fast mode).
VerifyResult verify_typical(const DraftTree& tree, const TreeWalk& walk,
                            const VerifyOptions& options) {
  const TreeLayout& layout = walk.layout();
  const int32_t t = tree.size();
  std::vector<bool> passed(t, false);
  std::vector<double> log_likelihood(t, 0.0);
  passed[0] = true;
  int32_t best = 0;
  for (int32_t i = 0; i < t; ++i) {
    if (!passed[i] || layout.num_children(i) == 0) continue;
    const std::vector<double> p = walk.target_probs(i);
    double entropy = 0.0;
    for (double v : p) entropy -= v * std::log(v + 1e-5);
    const double threshold =
        std::min<double>(options.typical_epsilon, options.typical_delta * std::exp(-entropy));
    for (int32_t c = layout.child_offset[i]; c < layout.child_offset[i + 1]; ++c) {
      const int32_t child = layout.child[c];
      const double px = p[tree.token[child]];
      if (!(px > threshold)) continue;
      passed[child] = true;
      log_likelihood[child] = log_likelihood[i] + std::log(px);
      const int32_t d = layout.depth[child], best_d = layout.depth[best];
      const double ll = log_likelihood[child], best_ll = log_likelihood[best];
      if (d > best_d || (d == best_d && (ll > best_ll || (ll == best_ll && child < best))))
        best = child;
    }
  }
  VerifyResult result;
  walk.finish(best, walk.greedy_token(best), &result);
  for (int32_t node : result.accepted_nodes)
    result.children_tried.push_back(layout.num_children(node));
  return result;
}

}  // namespace

const char* verify_mode_name(VerifyMode mode) {
  switch (mode) {
    case VerifyMode::kGreedy:
      return "greedy";
    case VerifyMode::kRejection:
      return "rejection";
    case VerifyMode::kTypical:
      return "typical";
  }
  return "unknown";
}

std::vector<int32_t> VerifyResult::emitted_tokens() const {
  std::vector<int32_t> out = accepted_tokens;
  out.push_back(bonus_token);
  return out;
}

int32_t RngRandomness::categorical(std::span<const double> weights) {
  return categorical_from_uniform(weights, rng_.uniform());
}

int32_t categorical_from_uniform(std::span<const double> weights, double u) {
  double total = 0.0;
  int32_t last_positive = -1;
  for (size_t i = 0; i < weights.size(); ++i) {
    ARBOR_CHECK(weights[i] >= 0.0, "weight " + std::to_string(i) + " is negative");
    total += weights[i];
    if (weights[i] > 0.0) last_positive = static_cast<int32_t>(i);
  }
  ARBOR_CHECK(last_positive >= 0, "categorical draw over zero weights");
  const double target = u * total;
  double cumulative = 0.0;
  for (int32_t i = 0; i < last_positive; ++i) {
    cumulative += weights[i];
    if (target < cumulative) return i;  // zero weights never satisfy this
  }
  return last_positive;
}

VerifyResult verify(const DraftTree& tree, std::span<const float> logits, int64_t vocab,
                    const Sampler& sampler, std::span<const int32_t> prompt,
                    std::span<const int32_t> output, VerifyRandomness& randomness,
                    const VerifyOptions& options) {
  validate_draft_tree(tree, vocab);
  if (logits.size() != static_cast<size_t>(tree.size()) * static_cast<size_t>(vocab))
    throw_error(ErrorCode::kInvalidArgument,
                "verify: logits hold " + std::to_string(logits.size()) + " values, expected " +
                    std::to_string(tree.size()) + " nodes x vocab " + std::to_string(vocab));
  if (options.check_root) check_root(tree, prompt, output);
  if (options.mode == VerifyMode::kTypical &&
      !(options.typical_epsilon >= 0.0f && options.typical_delta >= 0.0f))
    throw_error(ErrorCode::kInvalidArgument, "typical acceptance needs epsilon, delta >= 0, got " +
                                                 std::to_string(options.typical_epsilon) + ", " +
                                                 std::to_string(options.typical_delta));
  const TreeWalk walk(tree, logits, vocab, sampler, prompt, output);
  if (options.mode == VerifyMode::kGreedy || sampler.params().greedy())
    return verify_greedy(tree, walk.layout(),
                         [&](int32_t node) { return walk.greedy_token(node); });
  if (options.mode == VerifyMode::kTypical) return verify_typical(tree, walk, options);
  return verify_rejection(tree, walk, vocab, randomness);
}

VerifyResult verify(const DraftTree& tree, std::span<const float> logits, int64_t vocab,
                    const Sampler& sampler, std::span<const int32_t> prompt,
                    std::span<const int32_t> output, Rng& rng, const VerifyOptions& options) {
  RngRandomness randomness(rng);
  return verify(tree, logits, vocab, sampler, prompt, output, randomness, options);
}

VerifyResult verify_greedy_argmax(const DraftTree& tree, std::span<const int32_t> argmax,
                                  int64_t vocab, std::span<const int32_t> prompt,
                                  std::span<const int32_t> output) {
  validate_draft_tree(tree, vocab);
  if (argmax.size() != static_cast<size_t>(tree.size()))
    throw_error(ErrorCode::kInvalidArgument,
                "verify_greedy_argmax: " + std::to_string(argmax.size()) + " argmax ids for " +
                    std::to_string(tree.size()) + " tree nodes");
  check_root(tree, prompt, output);
  const TreeLayout layout = layout_tree(tree.parent, 0);
  return verify_greedy(tree, layout, [&](int32_t node) {
    const int32_t id = argmax[static_cast<size_t>(node)];
    if (id < 0 || id >= vocab)
      throw_error(ErrorCode::kInvalidArgument,
                  "verify: the target's logits at tree node " + std::to_string(node) +
                      " have no argmax (argmax id " + std::to_string(id) +
                      ": a NaN or +inf, or every logit -inf)");
    return id;
  });
}

void AcceptanceStats::add(const VerifyResult& result, int32_t tree_size) {
  ++steps;
  if (tree_size > 0) {
    if (tree_sizes.size() <= static_cast<size_t>(tree_size))
      tree_sizes.resize(static_cast<size_t>(tree_size) + 1, 0);
    ++tree_sizes[static_cast<size_t>(tree_size)];
  }
  emitted += result.num_accepted() + 1;
  for (int32_t node : result.accepted_nodes) {
    if (node < 0) continue;
    if (on_path.size() <= static_cast<size_t>(node)) on_path.resize(static_cast<size_t>(node) + 1);
    ++on_path[static_cast<size_t>(node)];
  }
  for (size_t d = 0; d < result.children_tried.size(); ++d) {
    if (result.children_tried[d] == 0) continue;
    if (offered.size() <= d) {
      offered.resize(d + 1, 0);
      accepted.resize(d + 1, 0);
    }
    ++offered[d];
    if (static_cast<int32_t>(d) < result.num_accepted()) ++accepted[d];
  }
}

void AcceptanceStats::merge(const AcceptanceStats& other) {
  steps += other.steps;
  emitted += other.emitted;
  const auto add_into = [](std::vector<int64_t>* into, const std::vector<int64_t>& from) {
    if (into->size() < from.size()) into->resize(from.size(), 0);
    for (size_t i = 0; i < from.size(); ++i) (*into)[i] += from[i];
  };
  add_into(&offered, other.offered);
  add_into(&accepted, other.accepted);
  add_into(&on_path, other.on_path);
  add_into(&tree_sizes, other.tree_sizes);
}

std::vector<int64_t> AcceptanceStats::in_tree() const {
  // Node i is in every tree of more than i nodes: a suffix sum of the size histogram.
  std::vector<int64_t> out(tree_sizes.empty() ? 0 : tree_sizes.size() - 1, 0);
  int64_t larger = 0;
  for (size_t i = out.size(); i-- > 0;) {
    larger += tree_sizes[i + 1];
    out[i] = larger;
  }
  return out;
}

double AcceptanceStats::acceptance_rate(int32_t depth) const {
  if (depth < 1 || depth > static_cast<int32_t>(offered.size()) || offered[depth - 1] == 0)
    return 0.0;
  return double(accepted[depth - 1]) / offered[depth - 1];
}

}  // namespace arbor
