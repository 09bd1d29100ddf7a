// k <= 16 (the EAGLE tree's top_k, 10 by default), rows up to 131072 wide, with a workspace:
// top_k_split_kernel, 8 blocks per row, one read of the row into registers, each block's
// candidates merged by the row's last block. Otherwise one block per row:
// top_k_kernel, the log-sum-exp (max, then a double sum of exp), then k passes, each a
// block-wide (value desc, index asc) maximum over the entries that come after the previous pick
// in that order, so no selected set needs storing. At 10 rows x 49152 (SmolLM2, EAGLE at batch
// 1) top_k_kernel took ~190 us (ncu): every pass re-read the 192 KB row from L2 with 4-byte
// loads.
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

// k <= 16 (the EAGLE tree's top_k) and rows of at most kSplits * kThreads * 32 entries: kSplits
// blocks per row, each loading its slice once into registers (entry i of the slice is element
// (i - lo) / kThreads of thread (i - lo) % kThreads: coalesced loads). Entries are compared as
// (value desc, index asc). Each block:
//   1. takes a threshold T, the k-th largest of its threads' maxima: each warp lists its k
//      largest lane maxima in k rounds of one redux.sync, and warp 0 merges the 16 lists in k
//      more. k threads hold an entry >= T, so every entry of the block among the row's k best is
//      >= T;
//   2. sums exp(x - its max) in double and collects its entries >= T (usually about k) as its
//      candidates. Where there are more than kCandidates (many equal values, masked rows) it
//      takes its exact k best instead: k warp rounds (a maximum of the lanes' best keys and a
//      minimum of the indices holding it; the winner rescans its registers) and a rank of the
//      warps' sorted lists by binary searches;
//   3. writes max, sum and candidates to the workspace and counts itself in the row's counter.
// The row's last block adds the sums in block order (a fixed order: the result does not depend
// on timing), lse = max + log(sum), ranks every candidate by counting the candidates better
// than it, writes min(x - lse, 0) of the k best and sets the counter back to 0.
// The version before ran one row per cluster of 8 blocks, read the row three times and merged
// warp, block and cluster lists one pick per round: 32 us at 10 x 49152, k = 10 on the H100
// (ncu), against 15 us now.
// The picks are ordered by raw logit. Since x - lse is monotonic in x they are the picks of the
// log-softmax values (top_k_kernel, host_math::top_k), except where two different logits round
// to the same value of x - lse: this kernel then puts the larger logit first (and keeps it at
// the k-th place), the others the lower index. NaN logits give unspecified picks. An entry never
// picked stands in as (-inf, a distinct index above every real one).
constexpr int kSplits = 8;
constexpr int kMaxKFast = 16;
constexpr int kCandidates = kThreads / kSplits;  // per block: the last block ranks one per thread

struct alignas(16) TopKPartial {
  float max;   // the block's max (-inf: no entry)
  int count;   // candidates
  double sum;  // sum of exp(x - max) over the block's entries
  Pick candidates[kCandidates];
};

// One row's part of the workspace, at the same place whatever the launch's row count (a counter
// must never sit where another launch wrote partials).
struct alignas(16) TopKRowWork {
  int counter;  // blocks of the row done; 0 between launches
  TopKPartial partials[kSplits];
};

// An unsigned key in the order of the floats (-inf .. +inf, -0 and +0 equal as better() has
// them; NaN unordered), and back (+0 for both zeros).
__device__ __forceinline__ unsigned order_key(float f) {
  const unsigned u = __float_as_uint(f == 0.0f ? 0.0f : f);
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}
__device__ __forceinline__ float key_value(unsigned key) {
  return __uint_as_float((key & 0x80000000u) ? (key & 0x7fffffffu) : ~key);
}

// Entries of the sorted (best first) list[0, n) better than c.
__device__ __forceinline__ int count_better(const Pick* list, int n, const Pick& c) {
  int lo = 0, hi = n;
  while (lo < hi) {
    const int mid = (lo + hi) / 2;
    if (better(list[mid], c))
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// The best untaken entry of v: (order_key << 32) | (E - e), the lower e first among equal keys;
// 0 when every entry is taken. A pairwise tree, so a rescan is a short dependency chain.
template <int E>
__device__ __forceinline__ uint64_t best_entry(const float (&v)[E], uint64_t taken) {
  constexpr int H = (E + 1) / 2;
  uint64_t t[H];
#pragma unroll
  for (int i = 0; i < H; ++i) {
    const int a = 2 * i, b = 2 * i + 1;
    const uint64_t ka = ((taken >> a) & 1) ? 0 : (uint64_t{order_key(v[a])} << 32) | (E - a);
    const uint64_t kb =
        b >= E || ((taken >> b) & 1) ? 0 : (uint64_t{order_key(v[b])} << 32) | (E - b);
    t[i] = ka > kb ? ka : kb;
  }
#pragma unroll
  for (int w = 1; w < H; w *= 2)
#pragma unroll
    for (int i = 0; i + w < H; i += 2 * w) t[i] = t[i] > t[i + w] ? t[i] : t[i + w];
  return t[0];
}

// E: entries per thread (ceil(slice / kThreads) <= E).
template <int E>
__global__ void __launch_bounds__(kThreads) top_k_split_kernel(const TopKRowsParams p) {
  __shared__ unsigned warp_keys[kWarps][kMaxKFast];  // each warp's largest lane maxima
  __shared__ unsigned block_key[2];                  // the block's threshold and max
  __shared__ double red_d[kWarps];
  __shared__ int num_candidates;
  __shared__ bool last_block;
  __shared__ Pick candidates[kCandidates];
  __shared__ Pick warp_best[kWarps][kMaxKFast];
  __shared__ float all_max[kSplits];
  __shared__ double all_sum[kSplits];
  __shared__ int all_count[kSplits];
  __shared__ Pick all[kSplits][kCandidates];  // the last block: every block's candidates
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int64_t row = blockIdx.x / kSplits;
  const int part = static_cast<int>(blockIdx.x % kSplits);
  const int n = static_cast<int>(p.cols), k = p.k;
  const float* x = p.x + row * p.cols;
  const int per = (n + kSplits - 1) / kSplits;
  const int lo = min(n, part * per), hi = min(n, lo + per);
  TopKRowWork& work = static_cast<TopKRowWork*>(p.workspace)[row];
  TopKPartial* partials = work.partials;
  if (tid == 0) num_candidates = 0;

  float v[E];
  uint64_t taken = 0;  // bit e: entry e picked, or past the slice
  unsigned lane_max = 0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = lo + tid + e * kThreads;
    v[e] = i < hi ? x[i] : -INFINITY;
    if (i >= hi) taken |= uint64_t{1} << e;
    lane_max = max(lane_max, i < hi ? order_key(v[e]) : 0u);
  }

  // 1. The threshold: the k-th largest thread maximum (0: fewer than k threads hold one).
  {
    unsigned mine = lane_max;
    for (int j = 0; j < k; ++j) {
      const unsigned best = __reduce_max_sync(kFull, mine);
      if (lane == 0) warp_keys[warp][j] = best;
      const unsigned holders = __ballot_sync(kFull, mine == best && best != 0);
      if (holders != 0 && lane == __ffs(holders) - 1) mine = 0;
    }
  }
  __syncthreads();
  if (warp == 0) {
    int pos = 0;
    unsigned head = lane < kWarps ? warp_keys[lane][0] : 0, best = 0, top = 0;
    for (int j = 0; j < k; ++j) {
      best = __reduce_max_sync(kFull, head);
      if (j == 0) top = best;
      const unsigned holders = __ballot_sync(kFull, head == best && best != 0);
      if (holders != 0 && lane == __ffs(holders) - 1) head = ++pos < k ? warp_keys[lane][pos] : 0;
    }
    if (lane == 0) {
      block_key[0] = best;
      block_key[1] = top;
    }
  }
  __syncthreads();

  // 2. The sum and the candidates.
  const unsigned threshold = block_key[0];
  const float m = block_key[1] != 0 ? key_value(block_key[1]) : -INFINITY;
  double s = 0.0;
#pragma unroll
  for (int e = 0; e < E; ++e) {
    const int i = lo + tid + e * kThreads;
    if (i >= hi) continue;
    if (m != -INFINITY) s += static_cast<double>(expf(v[e] - m));
    if (order_key(v[e]) >= threshold) {
      const int slot = atomicAdd(&num_candidates, 1);
      if (slot < kCandidates) candidates[slot] = Pick{v[e], i};
    }
  }
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(kFull, s, o);
  if (lane == 0) red_d[warp] = s;
  __syncthreads();
  int count = num_candidates;
  if (count > kCandidates) {  // the block's exact k best instead
    count = k;
    uint64_t mine = best_entry(v, taken);
    for (int j = 0; j < k; ++j) {
      const unsigned key = static_cast<unsigned>(mine >> 32);
      const int e = E - static_cast<int>(mine & 0xffffffffu);
      const unsigned index = key != 0 ? static_cast<unsigned>(lo + tid + e * kThreads) : ~0u;
      const unsigned best_key = __reduce_max_sync(kFull, key);
      const unsigned best_index = __reduce_min_sync(kFull, key == best_key ? index : ~0u);
      if (best_key == 0) {  // no entry left in the warp: a distinct stand-in
        if (lane == 0) warp_best[warp][j] = Pick{-INFINITY, 0x7fffffff - warp * kMaxKFast - j};
      } else if (key == best_key && index == best_index) {
        warp_best[warp][j] = Pick{key_value(key), static_cast<int32_t>(index)};
        taken |= uint64_t{1} << e;
        mine = best_entry(v, taken);
      }
    }
    __syncthreads();
    if (tid < kWarps * k) {  // rank each warp's entries among all the warps' sorted lists
      const int w = tid / k, j = tid % k;
      const Pick c = warp_best[w][j];
      int r = j;
      for (int o = 0; o < kWarps; ++o)
        if (o != w) r += count_better(warp_best[o], k, c);
      if (r < k) candidates[r] = c;
    }
    __syncthreads();
  }

  // 3. This block's partial, then the row's last block merges.
  if (tid < count) partials[part].candidates[tid] = candidates[tid];
  if (tid == 0) {
    double bs = 0.0;
    for (int w = 0; w < kWarps; ++w) bs += red_d[w];
    partials[part].max = m;
    partials[part].sum = bs;
    partials[part].count = count;
  }
  __threadfence();
  __syncthreads();
  if (tid == 0) last_block = atomicAdd(&work.counter, 1) == kSplits - 1;
  __syncthreads();
  if (!last_block) return;
  __threadfence();
  if (tid < kSplits) {
    all_max[tid] = __ldcg(&partials[tid].max);
    all_sum[tid] = __ldcg(&partials[tid].sum);
    all_count[tid] = __ldcg(&partials[tid].count);
  }
  if (tid == 0) work.counter = 0;  // for the next launch
  __syncthreads();
  const int b = tid / kCandidates, q = tid % kCandidates;
  if (q < all_count[b]) {
    const int2 c = __ldcg(reinterpret_cast<const int2*>(&partials[b].candidates[q]));
    all[b][q] = Pick{__int_as_float(c.x), c.y};
  }
  __syncthreads();
  if (q >= all_count[b]) return;
  const Pick c = all[b][q];
  int r = 0;
  for (int o = 0; o < kSplits; ++o)
    for (int t = 0; t < all_count[o]; ++t) r += better(all[o][t], c);
  if (r >= k) return;
  float row_max = -INFINITY;
  for (int o = 0; o < kSplits; ++o) row_max = fmaxf(row_max, all_max[o]);
  double sum = 0.0;
  for (int o = 0; o < kSplits; ++o)
    if (all_max[o] != -INFINITY)
      sum += all_sum[o] * static_cast<double>(expf(all_max[o] - row_max));
  const float lse = row_max + static_cast<float>(log(sum));
  p.ids[row * k + r] = c.i;
  p.values[row * k + r] = fminf(c.v - lse, 0.0f);
}

}  // namespace

size_t top_k_workspace_bytes(int64_t rows) {
  return static_cast<size_t>(rows) * sizeof(TopKRowWork);
}

cudaError_t launch_top_k_log_softmax(const TopKRowsParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.cols <= 0 || p.cols >= 0x7fffffff || p.k < 1 || p.k > 1024 || p.k > p.cols ||
      p.rows > 0x7fffffff / kSplits)
    return cudaErrorInvalidValue;
  // Entries per thread of the split kernel.
  const int64_t per_thread = (p.cols + int64_t{kSplits} * kThreads - 1) / (kSplits * kThreads);
  if (p.k <= kMaxKFast && per_thread <= 32 && p.workspace != nullptr) {
    const dim3 grid(static_cast<unsigned>(p.rows * kSplits));
    if (per_thread <= 8)
      top_k_split_kernel<8><<<grid, kThreads, 0, stream>>>(p);
    else if (per_thread <= 16)
      top_k_split_kernel<16><<<grid, kThreads, 0, stream>>>(p);
    else
      top_k_split_kernel<32><<<grid, kThreads, 0, stream>>>(p);
    return cudaGetLastError();
  }
  top_k_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace arbor::kernels
