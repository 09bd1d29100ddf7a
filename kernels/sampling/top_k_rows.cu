// k <= 16 (the EAGLE tree's top_k, 10 by default): top_k_cluster_kernel, a cluster of 8 blocks
// per row, three reads of the row (max, sum, per-thread candidate lists). Larger k, one block per
// row:
// top_k_kernel, the log-sum-exp (max, then a double sum of exp), then k passes, each a
// block-wide (value desc, index asc) maximum over the entries that come after the previous pick
// in that order, so no selected set needs storing. At 10 rows x 49152 (SmolLM2, EAGLE at batch
// 1) top_k_kernel took ~190 us (ncu): every pass re-read the 192 KB row from L2 with 4-byte
// loads.
#include <cooperative_groups.h>

#include <atomic>
#include <cmath>
#include <cstdint>

#include "kernels/sampling/top_k_rows.h"

namespace arbor::kernels {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr unsigned kFull = 0xffffffffu;

struct Pick {
  float v;
  int32_t i;
};

// a better than b: larger value, then lower index (an index of -1 / 0x7fffffff is "none").
__device__ __forceinline__ bool better(const Pick& a, const Pick& b) {
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

__global__ void __launch_bounds__(kThreads) top_k_kernel(const TopKRowsParams p) {
  __shared__ float red_f[kWarps];
  __shared__ double red_d[kWarps];
  __shared__ Pick red_p[kWarps];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int n = static_cast<int>(p.cols);
  const float* x = p.x + blockIdx.x * p.cols;

  float m = -INFINITY;
  for (int i = tid; i < n; i += kThreads) m = fmaxf(m, x[i]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  if (lane == 0) red_f[warp] = m;
  __syncthreads();
  m = red_f[0];
  for (int w = 1; w < kWarps; ++w) m = fmaxf(m, red_f[w]);
  double s = 0.0;
  for (int i = tid; i < n; i += kThreads) s += exp(static_cast<double>(x[i]) - m);
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
  if (lane == 0) red_d[warp] = s;
  __syncthreads();
  s = 0.0;
  for (int w = 0; w < kWarps; ++w) s += red_d[w];
  const float lse = m + static_cast<float>(log(s));

  Pick last{INFINITY, -1};
  for (int j = 0; j < p.k; ++j) {
    Pick best{-INFINITY, 0x7fffffff};
    for (int i = tid; i < n; i += kThreads) {
      const Pick c{fminf(x[i] - lse, 0.0f), i};
      if (better(last, c) && better(c, best)) best = c;
    }
    for (int o = 16; o > 0; o >>= 1) {
      Pick other{__shfl_xor_sync(kFull, best.v, o), __shfl_xor_sync(kFull, best.i, o)};
      if (better(other, best)) best = other;
    }
    __syncthreads();
    if (lane == 0) red_p[warp] = best;
    __syncthreads();
    best = red_p[0];
    for (int w = 1; w < kWarps; ++w)
      if (better(red_p[w], best)) best = red_p[w];
    if (tid == 0) {
      p.ids[blockIdx.x * p.k + j] = best.i;
      p.values[blockIdx.x * p.k + j] = best.v;
    }
    last = best;
  }
}

// k <= KMAX (the EAGLE tree's top_k): one row per cluster of kClusterRows blocks, each block
// reading 1 / kClusterRows of the row three times. One block per row was bound by the bytes one SM
// keeps in flight (~190 us for a 49152-wide row, whatever the row count). Phases, with cluster
// barriers between them and partials exchanged through distributed shared memory:
//   1. each block's max; the row max is the max over the blocks (in rank order);
//   2. each block's sum of float exponentials in double; the row sum adds the blocks' sums in
//      rank order (a fixed order: the result does not depend on timing);
//   3. each thread keeps its KMAX best entries (value desc, index asc; value = min(x - lse, 0))
//      sorted in registers; k rounds of a warp argmax give each warp's k best, k rounds over the
//      warps give the block's; block 0 merges the blocks' lists the same way and writes them.
// Every entry is in exactly one thread's list and the order is total, so the picks are those of
// top_k_kernel; lse can differ from it in the last bits (another summation order).
constexpr int kClusterRows = 8;

__device__ __forceinline__ Pick warp_argmax(Pick best, int& from, int lane) {
  from = lane;
  for (int o = 16; o > 0; o >>= 1) {
    const Pick other{__shfl_xor_sync(kFull, best.v, o), __shfl_xor_sync(kFull, best.i, o)};
    const int other_from = __shfl_xor_sync(kFull, from, o);
    if (better(other, best)) {
      best = other;
      from = other_from;
    }
  }
  return best;
}

// Worse than every entry of a row.
__device__ __forceinline__ Pick no_pick() {
  return Pick{-INFINITY, 0x7fffffff};
}

// k rounds of a warp argmax over sorted lists, one per lane (nullptr: none); the lane that wins
// a round advances its head, and lane 0 hands the picks, best first, to emit(j, pick).
template <typename Emit>
__device__ __forceinline__ void merge_sorted_lists(const Pick* list, int k, int lane, Emit emit) {
  int head = 0;
  for (int j = 0; j < k; ++j) {
    int from = 0;
    const Pick best = warp_argmax(list != nullptr && head < k ? list[head] : no_pick(), from, lane);
    if (lane == from) ++head;
    if (lane == 0) emit(j, best);
  }
}

// Launched with a cluster dimension of kClusterRows (launch_cluster); sm_90+ only.
template <int KMAX>
__global__ void __launch_bounds__(kThreads) top_k_cluster_kernel(const TopKRowsParams p) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  namespace cg = cooperative_groups;
  cg::cluster_group cluster = cg::this_cluster();
  __shared__ float red_f[kWarps];
  __shared__ double red_d[kWarps];
  __shared__ float block_max;
  __shared__ double block_sum;
  __shared__ Pick warp_best[kWarps][KMAX];
  __shared__ Pick block_best[KMAX];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int rank = static_cast<int>(cluster.block_rank());
  const int64_t row = blockIdx.x / kClusterRows;
  const int n = static_cast<int>(p.cols);
  const float* x = p.x + row * p.cols;
  // This block's slice [lo, hi), a multiple of 4 wide where the row allows 16-byte loads.
  const bool vec = n % 4 == 0 && (reinterpret_cast<uintptr_t>(x) & 15u) == 0;
  const int quantum = vec ? 4 : 1;
  const int units = n / quantum, per = (units + kClusterRows - 1) / kClusterRows;
  const int lo = min(n, rank * per * quantum), hi = min(n, (rank + 1) * per * quantum);
  const int n4 = vec ? (hi - lo) / 4 : 0;
  const float4* x4 = reinterpret_cast<const float4*>(x + lo);
  const int tail = lo + 4 * n4;  // scalar entries [tail, hi)

  float m = -INFINITY;
#pragma unroll 4
  for (int i = tid; i < n4; i += kThreads) {
    const float4 v = x4[i];
    m = fmaxf(m, fmaxf(fmaxf(v.x, v.y), fmaxf(v.z, v.w)));
  }
  for (int i = tail + tid; i < hi; i += kThreads) m = fmaxf(m, x[i]);
  for (int o = 16; o > 0; o >>= 1) m = fmaxf(m, __shfl_xor_sync(kFull, m, o));
  if (lane == 0) red_f[warp] = m;
  __syncthreads();
  if (tid == 0) {
    float bm = red_f[0];
    for (int w = 1; w < kWarps; ++w) bm = fmaxf(bm, red_f[w]);
    block_max = bm;
  }
  cluster.sync();
  m = *cluster.map_shared_rank(&block_max, 0);
  for (int r = 1; r < kClusterRows; ++r) m = fmaxf(m, *cluster.map_shared_rank(&block_max, r));

  double s = 0.0;
#pragma unroll 4
  for (int i = tid; i < n4; i += kThreads) {
    const float4 v = x4[i];
    s += static_cast<double>(expf(v.x - m)) + static_cast<double>(expf(v.y - m)) +
         static_cast<double>(expf(v.z - m)) + static_cast<double>(expf(v.w - m));
  }
  for (int i = tail + tid; i < hi; i += kThreads) s += static_cast<double>(expf(x[i] - m));
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
  if (lane == 0) red_d[warp] = s;
  __syncthreads();
  if (tid == 0) {
    double bs = 0.0;
    for (int w = 0; w < kWarps; ++w) bs += red_d[w];
    block_sum = bs;
  }
  cluster.sync();
  s = 0.0;
  for (int r = 0; r < kClusterRows; ++r) s += *cluster.map_shared_rank(&block_sum, r);
  const float lse = m + static_cast<float>(log(s));

  Pick list[KMAX];
#pragma unroll
  for (int j = 0; j < KMAX; ++j) list[j] = no_pick();
  auto visit = [&](float xv, int i) {
    const Pick c{fminf(xv - lse, 0.0f), i};
    if (better(c, list[KMAX - 1])) {
      list[KMAX - 1] = c;
#pragma unroll
      for (int j = KMAX - 1; j > 0; --j)
        if (better(list[j], list[j - 1])) {
          const Pick t = list[j];
          list[j] = list[j - 1];
          list[j - 1] = t;
        }
    }
  };
#pragma unroll 2
  for (int i = tid; i < n4; i += kThreads) {
    const float4 v = x4[i];
    const int i0 = lo + 4 * i;
    visit(v.x, i0);
    visit(v.y, i0 + 1);
    visit(v.z, i0 + 2);
    visit(v.w, i0 + 3);
  }
  for (int i = tail + tid; i < hi; i += kThreads) visit(x[i], i);

  // The warp's k best: k rounds of an argmax over the lanes' heads; the winner pops its head.
  for (int j = 0; j < p.k; ++j) {
    int from = 0;
    const Pick best = warp_argmax(list[0], from, lane);
    if (lane == from) {
#pragma unroll
      for (int q = 0; q + 1 < KMAX; ++q) list[q] = list[q + 1];
      list[KMAX - 1] = no_pick();
    }
    if (lane == 0) warp_best[warp][j] = best;
  }
  __syncthreads();
  // The block's k best from the warps' sorted lists (lane w < kWarps reads list w).
  if (warp == 0)
    merge_sorted_lists(lane < kWarps ? warp_best[lane] : nullptr, p.k, lane,
                       [&](int j, const Pick& best) { block_best[j] = best; });
  cluster.sync();
  // The row's k best: block 0 merges the blocks' sorted lists (lane r < kClusterRows reads
  // block r's), then the cluster waits until block 0 is done reading the others' shared memory.
  if (rank == 0 && warp == 0)
    merge_sorted_lists(lane < kClusterRows ? cluster.map_shared_rank(block_best, lane) : nullptr,
                       p.k, lane, [&](int j, const Pick& best) {
                         p.ids[row * p.k + j] = best.i;
                         p.values[row * p.k + j] = best.v;
                       });
  cluster.sync();
#else
  __trap();  // launch_cluster checks the device first
#endif
}

template <int KMAX>
cudaError_t launch_cluster(const TopKRowsParams& p, cudaStream_t stream) {
  cudaLaunchConfig_t config = {};
  config.gridDim = dim3(static_cast<unsigned>(p.rows) * kClusterRows);
  config.blockDim = dim3(kThreads);
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = kClusterRows;
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  config.attrs = attr;
  config.numAttrs = 1;
  return cudaLaunchKernelEx(&config, top_k_cluster_kernel<KMAX>, p);
}

// Whether the current device launches thread block clusters and the cluster kernel was built
// for sm_90+ (a build for an older target, JIT-compiled on a Hopper, would reach its __trap):
// asked once per device.
bool clusters_supported() {
  static std::atomic<int> cached[64];  // 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  if (cached[dev] == 0) {
    int v = 0;
    cudaFuncAttributes attr{};
    const bool ok = cudaDeviceGetAttribute(&v, cudaDevAttrClusterLaunch, dev) == cudaSuccess &&
                    v != 0 &&
                    cudaFuncGetAttributes(&attr, top_k_cluster_kernel<4>) == cudaSuccess &&
                    attr.binaryVersion >= 90 && attr.ptxVersion >= 90;
    cached[dev] = ok ? 1 : 2;
  }
  return cached[dev] == 1;
}

}  // namespace

cudaError_t launch_top_k_log_softmax(const TopKRowsParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.cols <= 0 || p.cols >= 0x7fffffff || p.k < 1 || p.k > 1024 || p.k > p.cols ||
      p.rows > 0x7fffffff)
    return cudaErrorInvalidValue;
  const unsigned grid = static_cast<unsigned>(p.rows);
  if (p.k <= 16 && p.rows <= 0x7fffffff / kClusterRows && clusters_supported()) {
    const cudaError_t e = p.k <= 4   ? launch_cluster<4>(p, stream)
                          : p.k <= 8 ? launch_cluster<8>(p, stream)
                                     : launch_cluster<16>(p, stream);
    if (e == cudaSuccess) return e;
    // A refused cluster launch (e.g. no 8 co-resident blocks on a partitioned GPU) is not
    // sticky: clear it and take the one-block-per-row kernel.
    (void)cudaGetLastError();
  }
  top_k_kernel<<<grid, kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace arbor::kernels
