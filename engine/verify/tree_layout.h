// Checks a proposer's DraftTree and derives what the rest of a step needs from it: depths,
// RoPE positions (committed_len + depth), packed ancestor masks, children lists in try order,
// and root-to-leaf paths. Pure logic on host vectors (DESIGN.md "Tree representation").
#pragma once

#include <cstdint>
#include <vector>

#include "engine/verify/draft_tree.h"
#include "engine/verify/tree_budget.h"

namespace arbor {

// Throws kInvalidArgument naming the node / row / value when `tree` breaks the DraftTree
// contract: parent/token sizes differ, parents not topologically ordered from a root at node 0,
// a token outside [0, vocab), q_row neither empty nor [T], a q_row entry outside [-1, rows), q not
// [rows, vocab], a used q row with a negative or non-finite entry or a sum off 1 by more than
// 1e-3, or a sampled child whose token has q = 0 (it could not have been drawn).
void validate_draft_tree(const DraftTree& tree, int64_t vocab);
// As above, plus the request's budget: at most budget.max_nodes nodes (root included) and depth
// at most budget.max_depth.
void validate_draft_tree(const DraftTree& tree, int64_t vocab, const TreeBudget& budget);

struct TreeLayout {
  int32_t committed_len = 0;          // tokens whose K/V is already in the cache
  std::vector<int32_t> depth;         // [T] edges from the root
  std::vector<int32_t> position;      // [T] committed_len + depth: RoPE position of each node
  std::vector<uint32_t> mask;         // [T, mask_words(T)] packed ancestor rows (tree_mask.h)
  std::vector<int32_t> child_offset;  // [T + 1] children of i: child[child_offset[i] ..
  std::vector<int32_t> child;         // [T - 1]   child_offset[i + 1]), ascending (try order)
  std::vector<std::vector<int32_t>> leaf_paths;  // per leaf, ascending leaf index: root..leaf

  int32_t size() const { return static_cast<int32_t>(depth.size()); }
  int32_t max_depth() const;
  int32_t num_children(int32_t node) const { return child_offset[node + 1] - child_offset[node]; }
};

// Layout of a tree whose parent list is valid (validate_tree_parents; token and q are not
// looked at). committed_len >= 0.
TreeLayout layout_tree(const std::vector<int32_t>& parent, int32_t committed_len);

// Root-to-node node indices (root first) for any node.
std::vector<int32_t> tree_path_to(const std::vector<int32_t>& parent, int32_t node);

}  // namespace arbor
