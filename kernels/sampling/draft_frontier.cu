#include "kernels/sampling/draft_frontier.h"

namespace arbor::kernels {
namespace {

__global__ void draft_frontier_load_kernel(DraftFrontierLoadParams p) {
  const int row = blockIdx.x * blockDim.x + threadIdx.x;
  if (row >= p.rows) return;
  const int32_t id = p.f.ids[row];
  p.token_ids[row] = p.vocab_offset != nullptr ? static_cast<int32_t>(id + p.vocab_offset[id]) : id;
  p.positions[row] = p.positions0[row] + p.depth - 1;
  p.slots[row] = p.all_slots[static_cast<int64_t>(p.depth - 1) * p.rows + row];
  p.committed_len[row] = p.key_path_base[row] + p.depth - 1;
  int32_t* out = p.key_path + p.key_path_indptr[row];
  const int32_t* path = p.f.path + static_cast<int64_t>(row) * p.max_depth;
  const int32_t add = p.path_shift != nullptr ? p.path_shift[row] : 0;
  for (int e = 0; e < p.depth; ++e) out[e] = path[e] + add;
}

// One block of k * k threads per tree: thread c's rank is the number of candidates ahead of it
// (a higher score, or the same score and a lower index), the order of the host's partial_sort.
__global__ void draft_frontier_select_kernel(DraftFrontierSelectParams p) {
  __shared__ float score[32 * 32];
  const int g = blockIdx.x, k = p.k, c = threadIdx.x, n = k * k;
  const int base_row = g * k;
  if (c < n) {
    const int row = base_row + c / k;
    score[c] = p.in.scores[row] + p.top_values[static_cast<int64_t>(row) * k + c % k];
  }
  __syncthreads();
  if (c >= n) return;
  const float mine = score[c];
  int rank = 0;
  for (int o = 0; o < n; ++o) {
    const float s = score[o];
    rank += (s > mine || (s == mine && o < c)) ? 1 : 0;
  }
  if (rank >= k) return;
  const int row = base_row + c / k, out = base_row + rank;
  p.out.ids[out] = p.top_ids[static_cast<int64_t>(row) * k + c % k];
  p.out.scores[out] = mine;
  p.out.parent[out] = row;
  if (p.chosen != nullptr) p.chosen[out] = c;
  const int32_t* from = p.in.path + static_cast<int64_t>(row) * p.max_depth;
  int32_t* to = p.out.path + static_cast<int64_t>(out) * p.max_depth;
  for (int e = 0; e < p.depth; ++e) to[e] = from[e];
  to[p.depth] = p.depth * k + rank;
}

__global__ void draft_frontier_roots_kernel(DraftFrontierRootsParams p) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= p.groups * p.k) return;
  if (i < p.root_groups * p.k) {
    const int64_t from = static_cast<int64_t>(p.rows[i / p.k]) * p.k + i % p.k;
    p.f.ids[i] = p.root_ids[from];
    p.f.scores[i] = p.root_values[from];
  }
  p.first_ids[i] = p.f.ids[i];
  p.first_scores[i] = p.f.scores[i];
}

__global__ void draft_frontier_shift_kernel(DraftFrontierShiftParams p) {
  const int g = blockIdx.x;
  const int rows = p.rows[g];
  const int shift = max(0, min(rows - p.len[p.len_index[g]], rows - 1));
  const int row = p.root_rows[g] - shift;
  for (int r = threadIdx.x; r < p.k; r += blockDim.x) {
    const int i = g * p.k + r;
    const int64_t from = static_cast<int64_t>(row) * p.k + r;
    p.f.ids[i] = p.first_ids[i] = p.root_ids[from];
    p.f.scores[i] = p.first_scores[i] = p.root_values[from];
    p.positions0[i] -= shift;
    p.key_path_base[i] -= shift;
    p.path_shift[i] = shift;
  }
  const float* src = p.root_source + static_cast<int64_t>(row) * p.cols;
  float* dst = p.roots + static_cast<int64_t>(g) * p.cols;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) dst[c] = src[c];
}

}  // namespace

cudaError_t launch_draft_frontier_shift(const DraftFrontierShiftParams& p, cudaStream_t stream) {
  if (p.groups <= 0 || p.k <= 0) return cudaSuccess;
  draft_frontier_shift_kernel<<<p.groups, 128, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_draft_frontier_roots(const DraftFrontierRootsParams& p, cudaStream_t stream) {
  if (p.groups <= 0 || p.k <= 0) return cudaSuccess;
  draft_frontier_roots_kernel<<<(p.groups * p.k + 127) / 128, 128, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_draft_frontier_load(const DraftFrontierLoadParams& p, cudaStream_t stream) {
  if (p.rows <= 0) return cudaSuccess;
  draft_frontier_load_kernel<<<(p.rows + 127) / 128, 128, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_draft_frontier_select(const DraftFrontierSelectParams& p, cudaStream_t stream) {
  if (p.groups <= 0 || p.k <= 0) return cudaSuccess;
  if (p.k > 32 || p.depth >= p.max_depth) return cudaErrorInvalidValue;
  const int threads = (p.k * p.k + 31) / 32 * 32;
  draft_frontier_select_kernel<<<p.groups, threads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace arbor::kernels
