// EAGLE-2's dynamic draft tree (SafeAILab/EAGLE, eagle/model/cnets.py topK_genrate), as pure
// logic over a draft callback: the root's top_k children form the first frontier; each step runs
// the draft once over the frontier, scores every child candidate by cumulative log-probability
// (parent score + log p), and keeps the top_k best as the next frontier. After `depth` steps the
// best total_tokens - 1 candidates become the tree. Ties prefer the earlier candidate, so a
// node's ancestors (scores never lower, indices lower) are always kept; nodes are ordered by
// candidate index, so parents precede children and siblings are in rank order.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "engine/draft/top_k_rows.h"
#include "engine/verify/draft_tree.h"

namespace arbor {

struct DynamicTreeParams {
  int32_t total_tokens = 60;  // tree nodes including the root
  int32_t depth = 5;          // draft steps after the first; the tree is at most depth + 1 deep
  int32_t top_k = 10;         // children tried per node and frontier width
  bool operator==(const DynamicTreeParams&) const = default;
};

// A node of the frontier handed to the draft: `parent_row` is its parent's row in the previous
// expand() call (-1 for the root's children), `token` its target-vocabulary id.
struct FrontierNode {
  int32_t parent_row = -1;
  int32_t token = -1;
};

// Runs the draft over one frontier (step 1 = the root's children) and returns each node's
// log-probabilities over the draft vocabulary: [frontier.size(), draft_vocab] host fp32.
using FrontierExpand =
    std::function<std::vector<float>(int32_t step, const std::vector<FrontierNode>& frontier)>;

// root_log_probs: [draft_vocab], the draft's distribution after the root. to_target maps a draft
// id to a target id (identity unless the draft has its own vocabulary). Calls expand() `depth`
// times. params must be positive (ARBOR_CHECK); top_k is clamped to draft_vocab.
DraftTree grow_dynamic_tree(int32_t root_token, std::span<const float> root_log_probs,
                            const DynamicTreeParams& params,
                            const std::function<int32_t(int32_t)>& to_target,
                            const FrontierExpand& expand);

// The same tree from each row's best k entries only (what the tree reads of a row, TopKRows:
// ids best first, ties lower id first; k = min(params.top_k, draft_vocab)). The draft computes
// them where its logits are (Backend::top_k_log_softmax), so full-vocabulary rows never reach
// the host.
using FrontierExpandTopK =
    std::function<TopKRows(int32_t step, const std::vector<FrontierNode>& frontier)>;
// grow_dynamic_tree_top_k as a state machine, so several requests' trees can grow in lockstep
// with one draft forward per step for all of them (EagleProposer::propose_batch):
//   DynamicTreeGrower g(root, root_top, params, to_target);
//   while (!g.done()) g.absorb(<top-k rows of the draft over g.frontier()>);
//   DraftTree t = g.tree();
class DynamicTreeGrower {
 public:
  struct Candidate {
    float score;     // cumulative log-probability from the root
    int32_t token;   // target id
    int32_t parent;  // candidate index, -1 for the root
  };
  DynamicTreeGrower(int32_t root_token, const TopKRows& root, const DynamicTreeParams& params,
                    const std::function<int32_t(int32_t)>& to_target);
  bool done() const { return done_; }
  int32_t step() const { return step_; }  // expansions absorbed so far
  // The nodes the next draft step runs over (step() + 1; parent rows index the previous
  // frontier, -1 for the root's children).
  std::vector<FrontierNode> frontier() const;
  // The draft's top-k rows for frontier() (one per node, in order).
  void absorb(const TopKRows& rows);
  DraftTree tree() const;

 private:
  int32_t root_token_;
  DynamicTreeParams params_;
  std::function<int32_t(int32_t)> to_target_;
  int32_t top_k_;
  int32_t step_ = 0;
  bool done_ = false;
  std::vector<Candidate> cands_;     // in the official flat order
  std::vector<int32_t> frontier_;    // candidate indices, in row order
  std::vector<int32_t> parent_row_;  // frontier row -> parent's previous row
};

DraftTree grow_dynamic_tree_top_k(int32_t root_token, const TopKRows& root,
                                  const DynamicTreeParams& params,
                                  const std::function<int32_t(int32_t)>& to_target,
                                  const FrontierExpandTopK& expand);

}  // namespace arbor
