#include "engine/verify/tree_layout.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/core/error.h"
#include "engine/verify/tree_mask.h"

namespace arbor {
namespace {

[[noreturn]] void invalid(const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "draft tree: " + what);
}

}  // namespace

void validate_draft_tree(const DraftTree& tree, int64_t vocab) {
  if (vocab <= 0) invalid("vocab size is " + std::to_string(vocab));
  const size_t t = tree.token.size();
  if (tree.parent.size() != t)
    invalid("has " + std::to_string(tree.parent.size()) + " parents but " + std::to_string(t) +
            " tokens");
  validate_tree_parents(tree.parent);
  for (size_t i = 0; i < t; ++i)
    if (tree.token[i] < 0 || tree.token[i] >= vocab)
      invalid("node " + std::to_string(i) + " has token " + std::to_string(tree.token[i]) +
              " outside the vocabulary [0, " + std::to_string(vocab) + ")");
  if (tree.q_row.empty()) {
    if (!tree.q.empty())
      invalid("q holds " + std::to_string(tree.q.size()) + " values but q_row is empty");
    return;
  }
  if (tree.q_row.size() != t)
    invalid("q_row has " + std::to_string(tree.q_row.size()) + " entries for " + std::to_string(t) +
            " nodes");
  if (tree.q.size() % static_cast<size_t>(vocab) != 0)
    invalid("q holds " + std::to_string(tree.q.size()) + " values, not a multiple of vocab " +
            std::to_string(vocab));
  const int64_t rows = static_cast<int64_t>(tree.q.size()) / vocab;
  std::vector<bool> row_checked(static_cast<size_t>(rows), false);
  for (size_t i = 0; i < t; ++i) {
    const int32_t row = tree.q_row[i];
    if (row < -1 || row >= rows)
      invalid("node " + std::to_string(i) + " has q_row " + std::to_string(row) + ", q has " +
              std::to_string(rows) + " rows (-1 = deterministic children)");
    if (row < 0 || row_checked[row]) continue;
    row_checked[row] = true;
    const float* q = tree.q.data() + row * vocab;
    double sum = 0.0;
    for (int64_t v = 0; v < vocab; ++v) {
      if (!(q[v] >= 0.0f) || std::isinf(q[v]))
        invalid("q row " + std::to_string(row) + " has q[" + std::to_string(v) +
                "] = " + std::to_string(q[v]));
      sum += q[v];
    }
    if (std::abs(sum - 1.0) > 1e-3)
      invalid("q row " + std::to_string(row) + " sums to " + std::to_string(sum) + ", not 1");
  }
  for (size_t i = 1; i < t; ++i) {
    const int32_t row = tree.q_row[tree.parent[i]];
    if (row >= 0 && tree.q[row * vocab + tree.token[i]] <= 0.0f)
      invalid("node " + std::to_string(i) + " (token " + std::to_string(tree.token[i]) +
              ") was sampled from q row " + std::to_string(row) + " where its probability is 0");
  }
}

void validate_draft_tree(const DraftTree& tree, int64_t vocab, const TreeBudget& budget) {
  if (tree.size() > budget.max_nodes)
    invalid("has " + std::to_string(tree.size()) + " nodes, max_nodes is " +
            std::to_string(budget.max_nodes));
  validate_draft_tree(tree, vocab);
  const std::vector<int32_t> depth = tree_depths(tree.parent);
  for (size_t i = 0; i < depth.size(); ++i)
    if (depth[i] > budget.max_depth)
      invalid("node " + std::to_string(i) + " has depth " + std::to_string(depth[i]) +
              ", max_depth is " + std::to_string(budget.max_depth));
}

int32_t TreeLayout::max_depth() const {
  return depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end());
}

TreeLayout layout_tree(const std::vector<int32_t>& parent, int32_t committed_len) {
  if (committed_len < 0)
    throw_error(ErrorCode::kInvalidArgument,
                "committed_len is " + std::to_string(committed_len) + ", must be >= 0");
  TreeLayout out;
  out.committed_len = committed_len;
  out.depth = tree_depths(parent);  // validates the parent list
  out.mask = pack_ancestor_mask(parent);
  const int32_t t = static_cast<int32_t>(parent.size());
  out.position.resize(t);
  for (int32_t i = 0; i < t; ++i) out.position[i] = committed_len + out.depth[i];

  // Counting sort by parent keeps each node's children in ascending index order.
  out.child_offset.assign(t + 1, 0);
  for (int32_t i = 1; i < t; ++i) ++out.child_offset[parent[i] + 1];
  for (int32_t i = 0; i < t; ++i) out.child_offset[i + 1] += out.child_offset[i];
  out.child.resize(t > 0 ? t - 1 : 0);
  std::vector<int32_t> fill(out.child_offset.begin(), out.child_offset.end() - 1);
  for (int32_t i = 1; i < t; ++i) out.child[fill[parent[i]]++] = i;

  for (int32_t i = 0; i < t; ++i)
    if (out.num_children(i) == 0) out.leaf_paths.push_back(tree_path_to(parent, i));
  return out;
}

std::vector<int32_t> tree_path_to(const std::vector<int32_t>& parent, int32_t node) {
  ARBOR_CHECK(node >= 0 && node < static_cast<int32_t>(parent.size()),
              "node " + std::to_string(node) + " of " + std::to_string(parent.size()));
  std::vector<int32_t> path;
  for (int32_t n = node; n >= 0; n = parent[n]) {
    path.push_back(n);
    ARBOR_CHECK(path.size() <= parent.size(), "parent list has a cycle");
  }
  std::reverse(path.begin(), path.end());
  return path;
}

}  // namespace arbor
