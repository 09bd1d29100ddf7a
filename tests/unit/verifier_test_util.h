// Helpers for the verifier tests: a toy "language model" whose logits are a fixed pseudo-random
// function of the whole context (so plain decoding's exact distribution is computable), tree
// logits filled from it, and an enumerating VerifyRandomness that walks every decision sequence
// of a randomised computation with its exact probability.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <map>
#include <numeric>
#include <span>
#include <utility>
#include <vector>

#include "engine/sampling/sampler.h"
#include "engine/spec/tree_choices.h"
#include "engine/verify/draft_tree.h"
#include "engine/verify/tree_layout.h"
#include "engine/verify/verifier.h"

namespace arbor::testing {

inline uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// logits(context)[v] = scale * (uniform in [-1, 1)), from a hash of (seed, every context token).
struct ToyModel {
  int32_t vocab = 5;
  float scale = 1.5f;
  uint64_t seed = 1;

  std::vector<float> logits(std::span<const int32_t> context) const {
    uint64_t h = splitmix64(seed);
    for (int32_t t : context) h = splitmix64(h ^ (static_cast<uint64_t>(t) + 0x1234567ull));
    std::vector<float> out(static_cast<size_t>(vocab));
    for (int32_t v = 0; v < vocab; ++v) {
      h = splitmix64(h);
      out[v] = scale * static_cast<float>(static_cast<double>(h >> 11) * 0x1.0p-52 - 1.0);
    }
    return out;
  }
};

// Tokens of the path root -> node, root excluded.
inline std::vector<int32_t> path_tokens(const DraftTree& tree, int32_t node) {
  std::vector<int32_t> out;
  const std::vector<int32_t> path = tree_path_to(tree.parent, node);
  for (size_t d = 1; d < path.size(); ++d) out.push_back(tree.token[path[d]]);
  return out;
}

// [T, vocab] target logits: row i = model.logits(committed ++ path tokens of node i).
inline std::vector<float> tree_logits(const ToyModel& model, const DraftTree& tree,
                                      const std::vector<int32_t>& committed) {
  std::vector<float> out;
  for (int32_t i = 0; i < tree.size(); ++i) {
    std::vector<int32_t> context = committed;
    const std::vector<int32_t> tail = path_tokens(tree, i);
    context.insert(context.end(), tail.begin(), tail.end());
    const std::vector<float> row = model.logits(context);
    out.insert(out.end(), row.begin(), row.end());
  }
  return out;
}

// Enumerates every sequence of decisions a deterministic-given-decisions computation makes:
//   Enumerator e; do { result = run(e); dist[result] += e.weight(); } while (e.next());
// Each run follows the recorded choices and takes the first option at new decision points;
// weight() is the probability of the run's decision sequence. Zero-probability options are
// skipped, so weights over all runs sum to 1.
class Enumerator final : public VerifyRandomness {
 public:
  bool bernoulli(double probability) override {
    std::vector<std::pair<int32_t, double>> options;
    if (probability > 0.0) options.push_back({1, std::min(probability, 1.0)});
    if (probability < 1.0) options.push_back({0, 1.0 - std::max(probability, 0.0)});
    return choose(options) == 1;
  }
  int32_t categorical(std::span<const double> weights) override {
    double sum = 0.0;
    for (double w : weights) sum += w;
    std::vector<std::pair<int32_t, double>> options;
    for (size_t i = 0; i < weights.size(); ++i)
      if (weights[i] > 0.0) options.push_back({static_cast<int32_t>(i), weights[i] / sum});
    return choose(options);
  }
  double weight() const { return weight_; }
  int64_t runs() const { return runs_; }
  // Advances to the next unexplored decision sequence; false when all were run.
  bool next() {
    ++runs_;
    stack_.resize(depth_);
    while (!stack_.empty() && stack_.back().chosen + 1 == stack_.back().options.size())
      stack_.pop_back();
    if (stack_.empty()) return false;
    ++stack_.back().chosen;
    depth_ = 0;
    weight_ = 1.0;
    return true;
  }

 private:
  struct Point {
    std::vector<std::pair<int32_t, double>> options;  // (outcome, probability)
    size_t chosen = 0;
  };
  int32_t choose(const std::vector<std::pair<int32_t, double>>& options) {
    if (options.empty()) ADD_FAILURE() << "decision with no possible outcome";
    if (depth_ == stack_.size()) stack_.push_back({options, 0});
    Point& point = stack_[depth_++];
    if (point.options.size() != options.size())
      ADD_FAILURE() << "the computation is not deterministic given its decisions";
    weight_ *= point.options[point.chosen].second;
    return point.options[point.chosen].first;
  }
  std::vector<Point> stack_;
  size_t depth_ = 0;
  double weight_ = 1.0;
  int64_t runs_ = 0;
};

// Largest |a - b| over the union of keys (missing = 0).
inline double max_abs_difference(const std::map<std::vector<int32_t>, double>& a,
                                 const std::map<std::vector<int32_t>, double>& b) {
  double worst = 0.0;
  for (const auto& [k, v] : a) {
    const auto it = b.find(k);
    worst = std::max(worst, std::abs(v - (it == b.end() ? 0.0 : it->second)));
  }
  for (const auto& [k, v] : b)
    if (!a.count(k)) worst = std::max(worst, std::abs(v));
  return worst;
}

// ---- Speculative decoding of the toy model: proposers, one step, exact distributions. ----

using ProposeFn =
    std::function<DraftTree(const std::vector<int32_t>& committed, VerifyRandomness& randomness)>;
using VerifyFn = std::function<VerifyResult(
    const DraftTree& tree, std::span<const float> logits, int64_t vocab, const Sampler& sampler,
    std::span<const int32_t> prompt, std::span<const int32_t> output, VerifyRandomness& r)>;

inline VerifyFn production_verifier() {
  return
      [](const DraftTree& tree, std::span<const float> logits, int64_t vocab,
         const Sampler& sampler, std::span<const int32_t> prompt, std::span<const int32_t> output,
         VerifyRandomness& r) { return verify(tree, logits, vocab, sampler, prompt, output, r); };
}

struct SpecSetup {
  ToyModel target;
  SamplingParams params;
  std::vector<int32_t> prompt;  // non-empty
  std::vector<int32_t> output;  // generated before the first step (may be empty)
  ProposeFn propose;
};

inline std::vector<int32_t> concat(std::vector<int32_t> a, const std::vector<int32_t>& b) {
  a.insert(a.end(), b.begin(), b.end());
  return a;
}

// Token ids sorted by the model's logit at `context`, best first (lowest id on ties).
inline std::vector<int32_t> ranked(const ToyModel& model, const std::vector<int32_t>& context) {
  const std::vector<float> logits = model.logits(context);
  std::vector<int32_t> ids(logits.size());
  std::iota(ids.begin(), ids.end(), 0);
  std::stable_sort(ids.begin(), ids.end(),
                   [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  return ids;
}

// Medusa-style deterministic proposals: the static tree's depth-d ranks index the ranking of an
// independent draft model (seed + d) at the committed context.
inline ProposeFn static_proposer(StaticTree tree, ToyModel draft) {
  return [tree, draft](const std::vector<int32_t>& committed, VerifyRandomness&) {
    std::vector<std::vector<int32_t>> topk;
    for (int32_t d = 1; d <= tree.max_depth(); ++d) {
      ToyModel head = draft;
      head.seed += static_cast<uint64_t>(d);
      topk.push_back(ranked(head, committed));
    }
    return instantiate(tree, committed.back(), topk);
  };
}

// Deterministic proposals with duplicate siblings: root -> {a, a, b}; node 1 -> {c}; node 2 ->
// {c, c'}; node 4 -> {e}, where a, b are the draft's top two and c, c', e its top choices after
// the path.
inline ProposeFn duplicate_proposer(ToyModel draft) {
  return [draft](const std::vector<int32_t>& committed, VerifyRandomness&) {
    const std::vector<int32_t> r0 = ranked(draft, committed);
    const std::vector<int32_t> r1 = ranked(draft, concat(committed, {r0[0]}));
    const std::vector<int32_t> r2 = ranked(draft, concat(committed, {r0[0], r1[0]}));
    return DraftTree{{-1, 0, 0, 0, 1, 2, 2, 4},
                     {committed.back(), r0[0], r0[0], r0[1], r1[0], r1[0], r1[1], r2[0]},
                     {},
                     {}};
  };
}

// q = softmax of the draft's logits at `context`, cut to its top `keep` tokens (so q has zeros).
inline std::vector<float> draft_q(const ToyModel& draft, const std::vector<int32_t>& context,
                                  int32_t keep) {
  const std::vector<float> logits = draft.logits(context);
  const std::vector<int32_t> order = ranked(draft, context);
  std::vector<float> q(logits.size(), 0.0f);
  double sum = 0.0;
  for (int32_t k = 0; k < keep; ++k) sum += std::exp(double(logits[order[k]]));
  for (int32_t k = 0; k < keep; ++k)
    q[order[k]] = static_cast<float>(std::exp(double(logits[order[k]])) / sum);
  return q;
}

// Sampled proposals: the root's `root_children` are independent draws from q(root); the first
// child gets `grand_children` independent draws from q(after it); when `mixed`, the second child
// gets the draft's top-2 as deterministic children.
inline ProposeFn sampled_proposer(ToyModel draft, int32_t keep, int32_t root_children,
                                  int32_t grand_children, bool mixed) {
  return [=](const std::vector<int32_t>& committed, VerifyRandomness& r) {
    DraftTree tree = DraftTree::root_only(committed.back());
    auto draw = [&](const std::vector<float>& q) {
      return r.categorical(std::vector<double>(q.begin(), q.end()));
    };
    const std::vector<float> q0 = draft_q(draft, committed, keep);
    tree.q = q0;
    tree.q_row = {0};
    for (int32_t c = 0; c < root_children; ++c) {
      tree.parent.push_back(0);
      tree.token.push_back(draw(q0));
      tree.q_row.push_back(-1);
    }
    if (root_children >= 1 && grand_children > 0) {
      const std::vector<float> q1 = draft_q(draft, concat(committed, {tree.token[1]}), keep);
      tree.q.insert(tree.q.end(), q1.begin(), q1.end());
      tree.q_row[1] = 1;
      for (int32_t c = 0; c < grand_children; ++c) {
        tree.parent.push_back(1);
        tree.token.push_back(draw(q1));
        tree.q_row.push_back(-1);
      }
    }
    if (mixed && root_children >= 2) {
      const std::vector<int32_t> top = ranked(draft, concat(committed, {tree.token[2]}));
      for (int32_t c = 0; c < 2; ++c) {
        tree.parent.push_back(2);
        tree.token.push_back(top[c]);
        tree.q_row.push_back(-1);
      }
    }
    return tree;
  };
}

// One speculative step after `output`: the tokens it emits.
inline std::vector<int32_t> spec_step(const SpecSetup& s, const Sampler& sampler,
                                      const std::vector<int32_t>& output, VerifyRandomness& r,
                                      const VerifyFn& verifier) {
  const std::vector<int32_t> committed = concat(s.prompt, output);
  const DraftTree tree = s.propose(committed, r);
  const std::vector<float> logits = tree_logits(s.target, tree, committed);
  return verifier(tree, logits, s.target.vocab, sampler, s.prompt, output, r).emitted_tokens();
}

// Plain decoding's next-token distribution after `output`, normalised in double.
inline std::vector<double> target_next(const SpecSetup& s, const Sampler& sampler,
                                       const std::vector<int32_t>& output) {
  const std::vector<float> p =
      sampler.probs(s.target.logits(concat(s.prompt, output)), s.prompt, output);
  std::vector<double> out(p.begin(), p.end());
  const double sum = std::accumulate(out.begin(), out.end(), 0.0);
  for (double& v : out) v /= sum;
  return out;
}

using Joint = std::map<std::vector<int32_t>, double>;

// Adds weight * P_plain(continuation) for every way plain decoding extends `emitted` to k tokens.
inline void extend_plainly(const SpecSetup& s, const Sampler& sampler,
                           const std::vector<int32_t>& emitted, double weight, size_t k,
                           Joint* joint) {
  if (emitted.size() >= k) {
    (*joint)[std::vector<int32_t>(emitted.begin(), emitted.begin() + k)] += weight;
    return;
  }
  const std::vector<double> p = target_next(s, sampler, concat(s.output, emitted));
  for (size_t t = 0; t < p.size(); ++t)
    if (p[t] > 0.0)
      extend_plainly(s, sampler, concat(emitted, {static_cast<int32_t>(t)}), weight * p[t], k,
                     joint);
}

// Exact joint of the first k tokens under plain decoding.
inline Joint target_joint(const SpecSetup& s, size_t k) {
  const Sampler sampler(s.params);
  Joint joint;
  extend_plainly(s, sampler, {}, 1.0, k, &joint);
  return joint;
}

// Exact joint of the first k tokens when one speculative step is taken (every proposal and
// verification decision enumerated) and plain decoding continues if it emitted fewer than k.
inline Joint exact_step_joint(const SpecSetup& s, size_t k, const VerifyFn& verifier,
                              int64_t* runs = nullptr) {
  const Sampler sampler(s.params);
  Joint joint;
  Enumerator e;
  double total = 0.0;
  do {
    const std::vector<int32_t> emitted = spec_step(s, sampler, s.output, e, verifier);
    total += e.weight();
    extend_plainly(s, sampler, emitted, e.weight(), k, &joint);
  } while (e.next());
  EXPECT_NEAR(total, 1.0, 1e-9) << "decision probabilities do not sum to 1";
  if (runs) *runs = e.runs();
  return joint;
}

enum class Bug {
  kNoResidualUpdate,  // on rejection keep p as it was
  kOneHotResidual,    // sampled child: accept with min(1, p/q) but update p as for one-hot
  kPathlessPenalty,   // p at a node penalises the output only, not the path's tokens
  kBiaslessTarget,    // p ignores the request's logit bias (the raw model's distribution)
};

// A deliberately wrong verifier (the rejection walk with one mistake), to show that the exact
// and statistical tests catch such mistakes.
VerifyFn buggy_verifier(Bug bug) {
  return [bug](const DraftTree& tree, std::span<const float> logits, int64_t vocab,
               const Sampler& request_sampler, std::span<const int32_t> prompt,
               std::span<const int32_t> output, VerifyRandomness& r) {
    SamplingParams params = request_sampler.params();
    if (bug == Bug::kBiaslessTarget) params.logit_bias.clear();
    const Sampler sampler(params);
    const TreeLayout layout = layout_tree(tree.parent, 0);
    std::vector<int32_t> history(output.begin(), output.end());
    VerifyResult result;
    result.accepted_nodes = {0};
    int32_t node = 0;
    while (true) {
      const std::vector<float> pf =
          sampler.probs(logits.subspan(node * vocab, vocab), prompt, history);
      std::vector<double> p(pf.begin(), pf.end());
      const int32_t row = tree.q_row.empty() ? -1 : tree.q_row[node];
      int32_t accepted = -1;
      for (int32_t c = layout.child_offset[node]; c < layout.child_offset[node + 1]; ++c) {
        const int32_t x = tree.token[layout.child[c]];
        const double qx = row < 0 ? 1.0 : tree.q[row * vocab + x];
        if (r.bernoulli(std::min(1.0, p[x] / qx))) {
          accepted = layout.child[c];
          break;
        }
        if (bug == Bug::kNoResidualUpdate) continue;
        const bool one_hot = row < 0 || bug == Bug::kOneHotResidual;
        double sum = 0.0;
        for (int64_t v = 0; v < vocab; ++v) {
          const double qv = one_hot ? (v == x ? 1.0 : 0.0) : tree.q[row * vocab + v];
          p[v] = std::max(p[v] - qv, 0.0);
          sum += p[v];
        }
        for (double& v : p) v /= sum;
      }
      if (accepted < 0) {
        result.bonus_token = r.categorical(p);
        return result;
      }
      result.accepted_nodes.push_back(accepted);
      result.accepted_tokens.push_back(tree.token[accepted]);
      if (bug != Bug::kPathlessPenalty) history.push_back(tree.token[accepted]);
      node = accepted;
    }
  };
}

}  // namespace arbor::testing
