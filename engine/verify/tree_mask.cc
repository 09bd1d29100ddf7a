#include "engine/verify/tree_mask.h"

#include <string>

#include "engine/core/error.h"

namespace arbor {

void validate_tree_parents(const std::vector<int32_t>& parent) {
  if (parent.empty()) throw_error(ErrorCode::kInvalidArgument, "tree has no nodes");
  if (parent[0] != -1)
    throw_error(
        ErrorCode::kInvalidArgument,
        "tree node 0 must be the root (parent -1), found parent " + std::to_string(parent[0]));
  for (size_t i = 1; i < parent.size(); ++i)
    if (parent[i] < 0 || parent[i] >= static_cast<int32_t>(i))
      throw_error(ErrorCode::kInvalidArgument,
                  "tree node " + std::to_string(i) + " has parent " + std::to_string(parent[i]) +
                      "; parents must precede their children (0 <= parent < " + std::to_string(i) +
                      ")");
}

std::vector<int32_t> tree_depths(const std::vector<int32_t>& parent) {
  validate_tree_parents(parent);
  std::vector<int32_t> depth(parent.size(), 0);
  for (size_t i = 1; i < parent.size(); ++i) depth[i] = depth[parent[i]] + 1;
  return depth;
}

std::vector<uint32_t> pack_ancestor_mask(const std::vector<int32_t>& parent) {
  validate_tree_parents(parent);
  const int32_t t = static_cast<int32_t>(parent.size());
  const int32_t words = mask_words(t);
  std::vector<uint32_t> mask(static_cast<size_t>(t) * words, 0u);
  for (int32_t i = 0; i < t; ++i) {
    uint32_t* row = mask.data() + static_cast<size_t>(i) * words;
    // A node sees itself and everything its parent sees.
    if (i > 0) {
      const uint32_t* prow = mask.data() + static_cast<size_t>(parent[i]) * words;
      for (int32_t w = 0; w < words; ++w) row[w] = prow[w];
    }
    row[i / 32] |= 1u << (i % 32);
  }
  return mask;
}

}  // namespace arbor
