// EAGLE-2's final draft trees picked on the device from the frontier log of a tree grown there
// (kernels/sampling/draft_frontier.h), and a verify step's tree layout rebuilt from parents that
// are only in device memory: the trees reach the target's verify step with no host round trip
// (engine/backend/draft_frontier.cc holds the host rule both follow bit for bit).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

// Most candidates one tree may have for draft_tree_select (k + depth * k * k).
inline constexpr int32_t kMaxDraftTreeCandidates = 2048;

// Per tree g (one block each): the candidates DynamicTreeGrower builds, in its order: the root's
// top-k (first_ids / first_scores [G * k]), then for each expansion s = 1 .. depth[g] the k * k
// children of the frontier rows (row r's j-th top-k entry of log depth s: score = the row's
// candidate's score + the value); the frontier rows of expansion s > 1 are the candidates that
// expansion s - 1's select chose (chosen[(s - 2) * G * k + g * k + r], an index into that
// expansion's k * k). The nodes[g] - 1 best candidates (higher score first, ties to the lower
// index) become nodes 1 .. nodes[g] - 1 in candidate order; node 0 is the root. Writes
// out[g * 2 * stride + i] = the target id (id + vocab_offset[id] where vocab_offset is set) and
// out[g * 2 * stride + stride + i] = the parent node (-1 for the root, 0 for a candidate whose
// parent was not kept, which cannot happen with log-probabilities <= 0).
struct DraftTreeSelectParams {
  const int32_t* first_ids = nullptr;
  const float* first_scores = nullptr;
  const int32_t* log_ids = nullptr;       // [depths, G * k, k]
  const float* log_values = nullptr;      // same
  const int32_t* chosen = nullptr;        // [depths - 1, G * k]
  const int64_t* vocab_offset = nullptr;  // [draft vocab] or nullptr
  const int32_t* depth = nullptr;         // [G] expansions per tree (<= the logged depths)
  const int32_t* nodes = nullptr;         // [G] tree sizes: 1 + min(total - 1, candidates)
  int32_t* out = nullptr;                 // [G, 2, stride]
  int32_t groups = 0;
  int32_t k = 0;
  int32_t stride = 0;
};
cudaError_t launch_draft_tree_select(const DraftTreeSelectParams& p, cudaStream_t stream);

// A step's tree rows rebuilt from their parents (one block per request): for request r whose
// rows [qo_indptr[r], qo_indptr[r + 1]) have any parent_index >= 0, node i's parent is
// parent_source[parent_index[row]] where that index is >= 0, else the highest set bit below i
// of its uploaded mask row (the parent the host laid out); then mask row i = its ancestors and
// itself, and positions[row] = positions[first row] + depth. Trees of at most max_nodes nodes.
struct TreeLayoutParams {
  const int32_t* parent_source = nullptr;
  const int64_t* parent_index = nullptr;  // [N]
  const int32_t* qo_indptr = nullptr;     // [R + 1]
  const int32_t* mask_indptr = nullptr;   // [R + 1] word offsets
  uint32_t* tree_mask = nullptr;
  int32_t* positions = nullptr;  // [N]
  int32_t num_requests = 0;
};
inline constexpr int32_t kMaxTreeLayoutNodes = 1024;
cudaError_t launch_tree_layout(const TreeLayoutParams& p, cudaStream_t stream);

// A batch-invariant attention plan's virtual requests (kernels/attention/paged_tree_attention.h)
// of those trees, from their rebuilt mask rows (after launch_tree_layout): the host planned
// each node v = token_request[row] with room for the path of its placeholder (at least its real
// depth + 1 entries); here path[path_indptr[v] ..] = the node's ancestors and itself in index
// order and committed_len[v] = path_base[v] + path length - 1. The kernel reads both at run
// time, so the host's longer placeholder paths only add splits that merge with weight 0.
struct TreeVirtualPathsParams {
  const int64_t* parent_index = nullptr;  // [N] (which requests to rewrite)
  const int32_t* qo_indptr = nullptr;     // [R + 1]
  const int32_t* mask_indptr = nullptr;   // [R + 1]
  const uint32_t* tree_mask = nullptr;
  const int32_t* token_request = nullptr;  // [N] virtual request of each row
  const int32_t* path_indptr = nullptr;    // [V + 1]
  const int32_t* path_base = nullptr;      // [V]
  int32_t* path = nullptr;
  int32_t* committed_len = nullptr;  // [V]
  int32_t num_requests = 0;
};
cudaError_t launch_tree_virtual_paths(const TreeVirtualPathsParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
