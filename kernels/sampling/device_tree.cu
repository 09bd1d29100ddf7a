#include "kernels/sampling/device_tree.h"

namespace arbor::kernels {
namespace {

constexpr int kSelectThreads = 256;

__global__ void __launch_bounds__(kSelectThreads)
    draft_tree_select_kernel(DraftTreeSelectParams p) {
  __shared__ float score[kMaxDraftTreeCandidates];
  __shared__ int32_t parent[kMaxDraftTreeCandidates];
  __shared__ int32_t id[kMaxDraftTreeCandidates];
  __shared__ int32_t node[kMaxDraftTreeCandidates];
  __shared__ uint8_t kept[kMaxDraftTreeCandidates];
  __shared__ int32_t warp_total[kSelectThreads / 32];
  const int g = blockIdx.x, k = p.k, kk = k * k, t = threadIdx.x;
  const int depth = p.depth[g], nodes = p.nodes[g];
  const int n = k + depth * kk;
  const int64_t rows = static_cast<int64_t>(p.groups) * k;
  for (int c = t; c < k; c += blockDim.x) {
    score[c] = p.first_scores[g * k + c];
    id[c] = p.first_ids[g * k + c];
    parent[c] = -1;
  }
  __syncthreads();
  for (int s = 1; s <= depth; ++s) {  // expansion s's children read their rows' scores
    const int base = k + (s - 1) * kk;
    for (int c = t; c < kk; c += blockDim.x) {
      const int r = c / k, j = c % k;
      const int from = s == 1 ? r : k + (s - 2) * kk + p.chosen[(s - 2) * rows + g * k + r];
      const int64_t e = ((s - 1) * rows + g * k + r) * k + j;
      score[base + c] = score[from] + p.log_values[e];
      id[base + c] = p.log_ids[e];
      parent[base + c] = from;
    }
    __syncthreads();
  }
  // Kept: among the nodes - 1 best (the host's partial_sort order).
  for (int c = t; c < n; c += blockDim.x) {
    const float mine = score[c];
    int rank = 0;
    for (int o = 0; o < n; ++o) {
      const float x = score[o];
      rank += (x > mine || (x == mine && o < c)) ? 1 : 0;
    }
    kept[c] = rank < nodes - 1 ? 1 : 0;
  }
  __syncthreads();
  // Node numbers: 1 + the kept candidates before c (each thread scans a contiguous chunk).
  const int chunk = (n + blockDim.x - 1) / blockDim.x;
  const int lo = min(n, t * chunk), hi = min(n, lo + chunk);
  int count = 0;
  for (int c = lo; c < hi; ++c) count += kept[c];
  int incl = count;
  const int lane = t % 32, warp = t / 32;
  for (int off = 1; off < 32; off *= 2) {
    const int y = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl += y;
  }
  if (lane == 31) warp_total[warp] = incl;
  __syncthreads();
  int before = incl - count;
  for (int w = 0; w < warp; ++w) before += warp_total[w];
  for (int c = lo; c < hi; ++c) {
    node[c] = 1 + before;
    before += kept[c];
  }
  __syncthreads();
  int32_t* tokens = p.out + static_cast<int64_t>(g) * 2 * p.stride;
  int32_t* parents = tokens + p.stride;
  if (t == 0) {
    tokens[0] = 0;
    parents[0] = -1;
  }
  for (int c = t; c < n; c += blockDim.x) {
    if (!kept[c]) continue;
    const int i = node[c], from = parent[c];
    const int32_t d = id[c];
    tokens[i] = p.vocab_offset != nullptr ? static_cast<int32_t>(d + p.vocab_offset[d]) : d;
    parents[i] = from < 0 ? 0 : kept[from] ? node[from] : 0;
  }
}

constexpr int kLayoutThreads = 128;

// Whether any of a request's rows [q0, q0 + t) has its parent on the device (the whole block
// calls it: a barrier).
__device__ bool has_device_parents(const int64_t* parent_index, int q0, int t) {
  bool any = false;
  for (int i = threadIdx.x; i < t; i += blockDim.x) any = any || parent_index[q0 + i] >= 0;
  return __syncthreads_or(any ? 1 : 0) != 0;
}

__global__ void __launch_bounds__(kLayoutThreads) tree_layout_kernel(TreeLayoutParams p) {
  __shared__ int32_t parent[kMaxTreeLayoutNodes];
  const int r = blockIdx.x;
  const int q0 = p.qo_indptr[r], t = p.qo_indptr[r + 1] - q0;
  if (t <= 1 || t > kMaxTreeLayoutNodes) return;
  if (!has_device_parents(p.parent_index, q0, t)) return;
  const int words = (t + 31) / 32;
  uint32_t* mask = p.tree_mask + p.mask_indptr[r];
  const int32_t root_position = p.positions[q0];
  for (int i = threadIdx.x; i < t; i += blockDim.x) {
    const int64_t idx = p.parent_index[q0 + i];
    int32_t par = -1;
    if (i == 0) {
      par = -1;
    } else if (idx >= 0) {
      par = p.parent_source[idx];
    } else {  // the host's parent: the highest ancestor bit below i of its mask row
      par = 0;
      const uint32_t* row = mask + static_cast<int64_t>(i) * words;
      for (int w = i / 32; w >= 0; --w) {
        uint32_t m = row[w];
        if (w == i / 32) m &= (1u << (i % 32)) - 1u;
        if (m != 0) {
          par = w * 32 + 31 - __clz(m);
          break;
        }
      }
    }
    if (i > 0 && (par < 0 || par >= i)) par = 0;  // a tree always (parents precede children)
    parent[i] = par;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < t; i += blockDim.x) {
    uint32_t* row = mask + static_cast<int64_t>(i) * words;
    for (int w = 0; w < words; ++w) row[w] = 0u;
    int depth = 0;
    for (int a = i;; a = parent[a], ++depth) {
      row[a / 32] |= 1u << (a % 32);
      if (a == 0) break;
    }
    p.positions[q0 + i] = root_position + depth;
  }
}

__global__ void __launch_bounds__(kLayoutThreads)
    tree_virtual_paths_kernel(TreeVirtualPathsParams p) {
  const int r = blockIdx.x;
  const int q0 = p.qo_indptr[r], t = p.qo_indptr[r + 1] - q0;
  if (t <= 1 || t > kMaxTreeLayoutNodes) return;
  if (!has_device_parents(p.parent_index, q0, t)) return;
  const int words = (t + 31) / 32;
  const uint32_t* mask = p.tree_mask + p.mask_indptr[r];
  for (int i = threadIdx.x; i < t; i += blockDim.x) {
    const int v = p.token_request[q0 + i];
    const int room = p.path_indptr[v + 1] - p.path_indptr[v];
    int32_t* path = p.path + p.path_indptr[v];
    const uint32_t* row = mask + static_cast<int64_t>(i) * words;
    int len = 0;
    for (int w = 0; w < words; ++w)
      for (uint32_t m = row[w]; m != 0; m &= m - 1) {
        if (len < room) path[len] = w * 32 + __ffs(m) - 1;
        ++len;
      }
    len = min(len, room);
    p.committed_len[v] = p.path_base[v] + len - 1;
  }
}

}  // namespace

cudaError_t launch_tree_virtual_paths(const TreeVirtualPathsParams& p, cudaStream_t stream) {
  if (p.num_requests <= 0) return cudaSuccess;
  tree_virtual_paths_kernel<<<p.num_requests, kLayoutThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_draft_tree_select(const DraftTreeSelectParams& p, cudaStream_t stream) {
  if (p.groups <= 0) return cudaSuccess;
  if (p.k <= 0 || p.k > 32 || p.stride < 1) return cudaErrorInvalidValue;
  draft_tree_select_kernel<<<p.groups, kSelectThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_tree_layout(const TreeLayoutParams& p, cudaStream_t stream) {
  if (p.num_requests <= 0) return cudaSuccess;
  tree_layout_kernel<<<p.num_requests, kLayoutThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace arbor::kernels
