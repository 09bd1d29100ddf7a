// EAGLE-2's dynamic draft tree grown on the device (the engine's Backend::draft_frontier_*): the
// frontier of G trees of width k, loaded into a draft step and chosen anew from each depth's
// top-k, by the host rule of engine/backend/draft_frontier.cc bit for bit.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

// The frontier: rows g * k + r, r < k (best first).
struct DraftFrontier {
  int32_t* ids = nullptr;     // [G * k] draft ids
  float* scores = nullptr;    // [G * k] cumulative log-probabilities
  int32_t* parent = nullptr;  // [G * k] row of the next load's source
  int32_t* path = nullptr;    // [G * k, max_depth] key offsets, ancestors first
};

// A step's rows from the frontier at depth `depth` (1-based): token_ids[row] = ids[row] +
// vocab_offset[ids[row]] (no table: ids[row]); positions[row] = positions0[row] + depth - 1;
// slots[row] = all_slots[(depth - 1) * rows + row]; committed_len[row] = key_path_base[row] +
// depth - 1; key_path[key_path_indptr[row] + e] = path[row][e] + path_shift[row], e < depth.
struct DraftFrontierLoadParams {
  DraftFrontier f;
  const int64_t* vocab_offset = nullptr;  // [draft_vocab] or nullptr
  const int32_t* positions0 = nullptr;    // [G * k]
  const int64_t* all_slots = nullptr;     // [max_depth, G * k]
  int32_t* token_ids = nullptr;           // the step's [G * k] arrays
  int32_t* positions = nullptr;
  int64_t* slots = nullptr;
  int32_t* committed_len = nullptr;
  const int32_t* key_path_base = nullptr;
  const int32_t* key_path_indptr = nullptr;
  int32_t* key_path = nullptr;
  const int32_t* path_shift = nullptr;  // [G * k] added to every key path offset, or nullptr
  int32_t rows = 0;                     // G * k
  int32_t depth = 0;
  int32_t max_depth = 0;
};
cudaError_t launch_draft_frontier_load(const DraftFrontierLoadParams& p, cudaStream_t stream);

// The next frontier `out` from `in` and depth d's top-k (top_ids, top_values [G * k, k]): per
// tree the k best candidates c = r * k + j by score in.scores[g k + r] + top_values[(g k + r) k
// + j], ties to the lower c; out row g k + rank: the candidate's draft id and score, parent g k +
// r, path = in's row path then depth * k + rank, and chosen[g k + rank] = c (where chosen is
// set: the log draft_tree_select reads). One block per tree; k <= 32.
struct DraftFrontierSelectParams {
  DraftFrontier in, out;
  const int32_t* top_ids = nullptr;
  const float* top_values = nullptr;
  int32_t* chosen = nullptr;  // [G * k] or nullptr
  int32_t groups = 0;
  int32_t k = 0;
  int32_t depth = 0;
  int32_t max_depth = 0;
};
cudaError_t launch_draft_frontier_select(const DraftFrontierSelectParams& p, cudaStream_t stream);

// The first frontier of G trees: for trees g < root_groups from kept root rows, ids[g k + r] =
// root_ids[rows[g] k + r], scores likewise from root_values; every tree's (those as uploaded)
// also into first_ids / first_scores (the log's copy).
struct DraftFrontierRootsParams {
  DraftFrontier f;
  int32_t* first_ids = nullptr;        // [G * k]
  float* first_scores = nullptr;       // [G * k]
  const int32_t* root_ids = nullptr;   // [R, k]
  const float* root_values = nullptr;  // [R, k]
  const int32_t* rows = nullptr;       // [root_groups]
  int32_t groups = 0;
  int32_t root_groups = 0;
  int32_t k = 0;
};
cudaError_t launch_draft_frontier_roots(const DraftFrontierRootsParams& p, cudaStream_t stream);

// Backend::draft_frontier_shift: tree g moves back by s = clamp(rows[g] - len[len_index[g]], 0,
// rows[g] - 1): positions0 and key_path_base of its k rows minus s, their path_shift s; its first
// frontier (f and `first`, ids then scores [G * k] each) from kept root row root_rows[g] - s; roots
// row g = that row of root_source [*, cols]. One block per tree.
struct DraftFrontierShiftParams {
  DraftFrontier f;
  int32_t* first_ids = nullptr;
  float* first_scores = nullptr;
  const int32_t* root_ids = nullptr;   // [R, k]
  const float* root_values = nullptr;  // [R, k]
  const int32_t* root_rows = nullptr;  // [groups]
  int32_t* positions0 = nullptr;       // [G * k]
  int32_t* key_path_base = nullptr;    // [G * k]
  int32_t* path_shift = nullptr;       // [G * k]: s
  const int32_t* len = nullptr;        // [*]
  const int32_t* len_index = nullptr;  // [groups]
  const int32_t* rows = nullptr;       // [groups]
  const float* root_source = nullptr;  // [*, cols]
  float* roots = nullptr;              // [groups, cols]
  int64_t cols = 0;
  int32_t groups = 0;
  int32_t k = 0;
};
cudaError_t launch_draft_frontier_shift(const DraftFrontierShiftParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
