#include "kernels/sampling/gather_path_rows.h"

namespace arbor::kernels {
namespace {

// One block per (item, path position): the threads copy the row.
__global__ void gather_path_rows_kernel(GatherPathRowsParams p) {
  const int32_t i = static_cast<int32_t>(blockIdx.x);
  const int32_t d = static_cast<int32_t>(blockIdx.y);
  const int32_t rows = p.out_offset[i + 1] - p.out_offset[i];
  const int32_t len = p.len[i];
  if (d >= rows || len < 1) return;
  const int32_t first = p.node_indptr[i];
  const int32_t at = d < len ? d : len - 1;
  const int64_t src = p.node_row[first + p.path[first + at]];
  if (p.next != nullptr && threadIdx.x == 0) {
    const int32_t after = d + 1 < len ? p.token[first + p.path[first + d + 1]] : p.bonus[i];
    p.next[p.out_offset[i] + d] = after < 0 ? 0 : after;
  }
  const float* from = p.x + src * p.cols;
  float* to = p.out + static_cast<int64_t>(p.out_offset[i] + d) * p.cols;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) to[c] = from[c];
}

}  // namespace

cudaError_t launch_gather_path_rows(const GatherPathRowsParams& p, cudaStream_t stream) {
  if (p.num_items <= 0 || p.max_rows_per_item <= 0 || p.cols <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.num_items), static_cast<unsigned>(p.max_rows_per_item));
  gather_path_rows_kernel<<<grid, 128, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace arbor::kernels
