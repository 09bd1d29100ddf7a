// A speculation tree for one request (DESIGN.md "Tree representation"): node 0 is the root
// (the last accepted token, whose K/V is not yet written), parents precede children, and the
// children of a node are tried by the verifier in index order (rank order of the proposal).
// Proposers produce it; the batch builder lays it out; the verifier walks it.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend/tensor.h"

namespace arbor {

class Backend;

// Tree tokens a drafter left in its backend's memory (no wait for the device): node i's token is
// ids[index[i]] where index[i] >= 0; token[i] then holds a placeholder inside the vocabulary
// (the root's id). The reader calls wait_for(*owner) before its ops read ids; ids stay valid
// until the drafter's next proposal. Empty index: every token is on the host.
// A tree whose shape was also chosen there (EAGLE's trees picked on the device,
// Backend::draft_frontier_trees) has parent_index too: node i's parent is ids[parent_index[i]]
// where parent_index[i] >= 0, and `parent` then holds a placeholder tree whose every node is at
// least as deep as the real one's (the verify step's attention plan and the accepted path's
// rows are sized from it).
struct DeviceTokens {
  Backend* owner = nullptr;
  Tensor ids;                         // int32, owner's memory
  std::vector<int64_t> index;         // [T] or empty
  std::vector<int64_t> parent_index;  // [T] or empty
  bool empty() const { return index.empty(); }
};

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
  DeviceTokens device{};       // tokens not yet on the host (see DeviceTokens)

  int32_t size() const { return static_cast<int32_t>(token.size()); }
  static DraftTree root_only(int32_t root_token) {
    DraftTree t;
    t.parent = {-1};
    t.token = {root_token};
    return t;
  }
};

}  // namespace arbor
