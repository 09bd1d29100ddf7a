// Decides which path of a draft tree the target model accepts, and the one extra token it emits
// (DESIGN.md "Verification"): greedy matching, lossless multi-branch rejection sampling
// (SpecInfer / EAGLE), or Medusa's typical acceptance (opt-in, NOT lossless). Pure logic on the
// target's host logits; the walk and the math are documented in engine/spec/README.md.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/sampling/rng.h"
#include "engine/sampling/sampler.h"
#include "engine/verify/draft_tree.h"

namespace arbor {

enum class VerifyMode {
  kGreedy,     // follow the child whose token is argmax p; deterministic, no randomness used
  kRejection,  // lossless multi-branch speculative sampling; a greedy sampler walks as kGreedy
  kTypical,    // Medusa typical acceptance: NOT lossless; a greedy sampler walks as kGreedy
};

const char* verify_mode_name(VerifyMode mode);

struct VerifyOptions {
  VerifyMode mode = VerifyMode::kRejection;
  // Typical acceptance: accept x at a node iff p(x) > min(epsilon, delta * exp(-H(p))), with
  // H(p) = -sum p log(p + 1e-5) (Medusa's posterior_threshold / posterior_alpha defaults).
  float typical_epsilon = 0.09f;
  float typical_delta = 0.3f;
  // verify() checks that prompt ++ output ends with the root token. Off only for callers whose
  // context is a multiset for the penalties rather than the sequence (sample_trees_on_host).
  bool check_root = true;
};

// One step's decision for one request. The tokens it emits are accepted_tokens then bonus_token
// (1 + accepted_tokens.size() of them); the bonus token is the next tree's root.
struct VerifyResult {
  std::vector<int32_t> accepted_nodes;   // [n + 1] a root-to-node path: 0, then accepted nodes
  std::vector<int32_t> accepted_tokens;  // [n] tokens of accepted_nodes[1..]
  int32_t bonus_token = -1;              // drawn from p (or its residual) at the last accepted node
  // [n + 1] entry d: children of accepted_nodes[d] that were tested (0 when it is a leaf).
  // Rejection sampling stops at the first accepted child; greedy and typical test them all.
  std::vector<int32_t> children_tried;

  int32_t num_accepted() const { return static_cast<int32_t>(accepted_tokens.size()); }
  std::vector<int32_t> emitted_tokens() const;
};

// The randomness the verifier consumes, as two decisions. Production wraps a request's Rng
// (RngRandomness: one uniform() per decision); tests substitute an enumerator to compute the
// verifier's exact output distribution.
class VerifyRandomness {
 public:
  virtual ~VerifyRandomness() = default;
  // True with `probability` (in [0, 1]).
  virtual bool bernoulli(double probability) = 0;
  // Index i with probability weights[i] / sum(weights); weights >= 0 with a positive sum. Never
  // returns a zero-weight index.
  virtual int32_t categorical(std::span<const double> weights) = 0;
};

// The inverse-CDF draw both randomness sources use: the index i < last positive weight where
// the running sum first exceeds u * sum(weights), else the last positive weight's index.
// u in [0, 1); weights >= 0 with a positive sum.
int32_t categorical_from_uniform(std::span<const double> weights, double u);

class RngRandomness final : public VerifyRandomness {
 public:
  explicit RngRandomness(Rng& rng) : rng_(rng) {}
  bool bernoulli(double probability) override { return rng_.uniform() < probability; }
  int32_t categorical(std::span<const double> weights) override;

 private:
  Rng& rng_;
};

// Verifies one request's tree.
//   logits: [T, vocab] host fp32, row i = the target's raw logits at node i (predicting the token
//           after node i).
//   prompt, output: the request's committed tokens, split as the sampler's penalties need them
//           (output = generated tokens). prompt + output must end with the root token
//           tree.token[0]: the root is committed (sampled) but its K/V is not yet written.
// The target distribution at node i is p_i = sampler.probs(logits row i, prompt,
// output ++ tokens of the path root -> i, root excluded): exactly what plain decoding would
// sample from after emitting that path, penalties included.
// Throws kInvalidArgument for a malformed tree (validate_draft_tree), a logits size other than
// T * vocab, or a context that does not end with the root token.
VerifyResult verify(const DraftTree& tree, std::span<const float> logits, int64_t vocab,
                    const Sampler& sampler, std::span<const int32_t> prompt,
                    std::span<const int32_t> output, VerifyRandomness& randomness,
                    const VerifyOptions& options = {});
VerifyResult verify(const DraftTree& tree, std::span<const float> logits, int64_t vocab,
                    const Sampler& sampler, std::span<const int32_t> prompt,
                    std::span<const int32_t> output, Rng& rng, const VerifyOptions& options = {});

// Greedy verification from the target's argmax ids alone (the backend computed them on the
// device, Backend::argmax_rows, so no logits were downloaded).
//   argmax: [T] entry i = argmax of the target's raw logits at node i, lowest id on ties; -1
//           where that row has a NaN or +inf or only -inf (throws kInvalidArgument if reached,
//           as argmax() on the logits does).
// Equals verify() on those logits for a greedy sampler whose logits processing is the identity
// (no logit_bias, repetition_penalty 1, presence and frequency penalties 0), in every VerifyMode.
// Throws kInvalidArgument as verify() does for a malformed tree or a wrong root, and for
// argmax.size() other than T.
VerifyResult verify_greedy_argmax(const DraftTree& tree, std::span<const int32_t> argmax,
                                  int64_t vocab, std::span<const int32_t> prompt,
                                  std::span<const int32_t> output);

// Acceptance statistics over many steps (per request or per run).
struct AcceptanceStats {
  int64_t steps = 0;
  int64_t emitted = 0;            // accepted + bonus tokens
  std::vector<int64_t> offered;   // [max depth] entry d: steps that tested a node at depth d + 1
  std::vector<int64_t> accepted;  // [max depth] entry d: steps that accepted a node at depth d + 1
  // Per tree node i (entry 0 the root): steps whose accepted path holds node i. With a static
  // tree (Medusa, cut to a budget by keeping its first nodes) node i is the same tree position in
  // every step, so on_path[i] / in_tree()[i] is how often that position is accepted when offered
  // (spec-bench --node-stats, scripts/medusa_tree_from_stats.py).
  std::vector<int64_t> on_path;
  // tree_sizes[n]: steps whose verified tree had n nodes (add() given the tree's size).
  std::vector<int64_t> tree_sizes;

  // tree_size: the verified tree's node count (tree_sizes), or -1 when not known.
  void add(const VerifyResult& result, int32_t tree_size = -1);
  // Per tree node i: steps whose tree had node i (a tree of n nodes has nodes 0..n-1), from
  // tree_sizes; as long as the largest tree.
  std::vector<int64_t> in_tree() const;
  void merge(const AcceptanceStats& other);  // both sets of steps
  double mean_emitted_per_step() const { return steps ? double(emitted) / steps : 0.0; }
  // accepted / offered at `depth` (>= 1); 0 when never offered.
  double acceptance_rate(int32_t depth) const;
};

}  // namespace arbor
