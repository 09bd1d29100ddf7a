// One 512-thread block per row: the log-sum-exp (max, then a double sum of exp), then k passes,
// each a block-wide (value desc, index asc) maximum over the entries that come after the
// previous pick in that order, so no selected set needs storing. k is small (the EAGLE tree's
// top_k, 10 by default).
#include <cmath>

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

}  // namespace

cudaError_t launch_top_k_log_softmax(const TopKRowsParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  if (p.cols <= 0 || p.cols >= 0x7fffffff || p.k < 1 || p.k > 1024 || p.k > p.cols ||
      p.rows > 0x7fffffff)
    return cudaErrorInvalidValue;
  top_k_kernel<<<static_cast<unsigned>(p.rows), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace arbor::kernels
