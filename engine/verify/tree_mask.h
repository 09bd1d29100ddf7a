// Packed ancestor masks for speculation trees (DESIGN.md "Tree representation"): node 0 is the
// root, parent[i] < i for i > 0, and row i has bit j set iff j == i or j is an ancestor of i.
// Rows are ceil(T/32) uint32 words. Shared by the batch builder, the kernels' tests and the
// verifier.
#pragma once

#include <cstdint>
#include <vector>

namespace arbor {

// Throws kInvalidArgument naming the node when the parent list is not a topologically ordered
// tree rooted at node 0 (parent[0] must be -1).
void validate_tree_parents(const std::vector<int32_t>& parent);

// depth[i]: number of edges from the root (depth[0] = 0).
std::vector<int32_t> tree_depths(const std::vector<int32_t>& parent);

// [T, ceil(T/32)] packed rows.
std::vector<uint32_t> pack_ancestor_mask(const std::vector<int32_t>& parent);

inline int32_t mask_words(int32_t tree_size) {
  return (tree_size + 31) / 32;
}

}  // namespace arbor
