// A speculation tree for one request (DESIGN.md "Tree representation"): node 0 is the root
// (the last accepted token, whose K/V is not yet written), parents precede children, and the
// children of a node are tried by the verifier in index order (rank order of the proposal).
// Proposers produce it; the batch builder lays it out; the verifier walks it.
#pragma once

#include <cstdint>
#include <vector>

namespace arbor {

struct DraftTree {
  std::vector<int32_t> parent;  // [T] parent[0] = -1, parent[i] < i
  std::vector<int32_t> token;   // [T] token[0] = root
  // Draft distributions for proposals that were *sampled*: q_row[i] >= 0 names the row of `q`
  // ([num_q_rows, vocab]) that node i's children were drawn from; -1 means node i's children
  // are deterministic proposals (top-k ranks, n-gram continuations): q = one-hot per child.
  // Empty q_row: every node deterministic. Sampled children must be independent draws from
  // their row (with replacement, so siblings may repeat a token); the verifier's real-q rule
  // relies on it (engine/spec/README.md).
  std::vector<int32_t> q_row;  // [T] or empty
  std::vector<float> q;        // [num_q_rows, vocab]

  int32_t size() const { return static_cast<int32_t>(token.size()); }
  static DraftTree root_only(int32_t root_token) { return DraftTree{{-1}, {root_token}, {}, {}}; }
};

}  // namespace arbor
