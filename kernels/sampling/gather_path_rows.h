// The rows of an fp32 matrix at the accepted paths of a tree-sampling launch (tree_sampling.h),
// gathered on the device so that only they cross to the host (the target's final hidden states
// a drafter reads, instead of every tree row's). For item i, whose path has len[i] nodes
// path[node_indptr[i] + d] (item-relative node indices, root first):
//   out[out_offset[i] + d] = x[node_row[node_indptr[i] + path[node_indptr[i] + min(d, len[i] -
//   1)]]]
// for d < out_offset[i + 1] - out_offset[i] (rows past the path repeat its last one), and with
// `next` the token after each row: token[node_indptr[i] + path[node_indptr[i] + d + 1]] while
// d + 1 < len[i], then bonus[i] (0 where it is negative).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

struct GatherPathRowsParams {
  const float* x = nullptr;  // [*, cols]
  int64_t cols = 0;
  const int32_t* node_indptr = nullptr;  // [items + 1]
  const int32_t* path = nullptr;         // [nodes] (tree sampling's out_path)
  const int32_t* len = nullptr;          // [items] (out_len)
  const int32_t* node_row = nullptr;     // [nodes] row of x holding each node's row
  const int32_t* out_offset = nullptr;   // [items + 1]
  float* out = nullptr;                  // [out_offset[items], cols]
  const int32_t* token = nullptr;        // [nodes] (with next)
  const int32_t* bonus = nullptr;        // [items] (with next)
  int32_t* next = nullptr;               // [out_offset[items]] or null
  int32_t num_items = 0;
  int32_t max_rows_per_item = 0;  // max over i of out_offset[i + 1] - out_offset[i]
};

cudaError_t launch_gather_path_rows(const GatherPathRowsParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
