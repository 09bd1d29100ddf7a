// One block per row: each thread scans a strided slice in ascending index order (strict >, so it
// keeps its slice's lowest index among equal maxima), then a warp-shuffle and shared-memory
// reduction keeps the larger value, the lower index on equal values. That pairwise rule is
// associative and commutative, so the result is the row's lowest-index maximum whatever the
// reduction order: bit-identical to the host's std::max_element.
#include <cmath>

#include "kernels/common/pdl_launch.cuh"
#include "kernels/sampling/argmax_rows.h"

namespace arbor::kernels {

namespace {

constexpr int kThreads = 256;
constexpr int kWarps = kThreads / 32;
constexpr int32_t kNoIndex = 0x7fffffff;  // loses every tie against a real index

struct Best {
  float value;
  int32_t index;
  bool rejected;  // a NaN or +inf seen
  bool finite;    // a value other than -inf seen
};

__device__ __forceinline__ Best combine(Best a, const Best& b) {
  if (b.value > a.value || (b.value == a.value && b.index < a.index)) {
    a.value = b.value;
    a.index = b.index;
  }
  a.rejected = a.rejected || b.rejected;
  a.finite = a.finite || b.finite;
  return a;
}

__device__ __forceinline__ Best shuffle_down(const Best& b, int offset) {
  Best o;
  o.value = __shfl_down_sync(0xffffffffu, b.value, offset);
  o.index = __shfl_down_sync(0xffffffffu, b.index, offset);
  o.rejected = __shfl_down_sync(0xffffffffu, static_cast<int>(b.rejected), offset) != 0;
  o.finite = __shfl_down_sync(0xffffffffu, static_cast<int>(b.finite), offset) != 0;
  return o;
}

__device__ __forceinline__ Best warp_reduce(Best b) {
  for (int offset = 16; offset > 0; offset >>= 1) b = combine(b, shuffle_down(b, offset));
  return b;
}

__global__ void __launch_bounds__(kThreads) argmax_rows_kernel(const ArgmaxRowsParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  const int64_t row = blockIdx.x;
  const float* x = p.logits + row * p.cols;
  Best b{-INFINITY, kNoIndex, false, false};
  for (int64_t c = threadIdx.x; c < p.cols; c += kThreads) {
    const float v = x[c];
    b.rejected = b.rejected || isnan(v) || v == INFINITY;
    b.finite = b.finite || v != -INFINITY;
    if (v > b.value) {  // NaN never wins; the row is rejected anyway
      b.value = v;
      b.index = static_cast<int32_t>(c);
    }
  }
  b = warp_reduce(b);
  __shared__ Best partial[kWarps];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) partial[warp] = b;
  __syncthreads();
  if (warp != 0) return;
  b = lane < kWarps ? partial[lane] : Best{-INFINITY, kNoIndex, false, false};
  b = warp_reduce(b);
  if (lane == 0) p.out[row] = b.rejected || !b.finite ? -1 : b.index;
}

}  // namespace

cudaError_t launch_argmax_rows(const ArgmaxRowsParams& p, cudaStream_t stream) {
  if (p.num_rows == 0) return cudaSuccess;
  if (p.cols <= 0 || p.cols >= kNoIndex || p.num_rows > 0x7fffffff) return cudaErrorInvalidValue;
  return launch_pdl(argmax_rows_kernel, dim3(static_cast<unsigned>(p.num_rows)), dim3(kThreads), 0,
                    stream, p);
}

}  // namespace arbor::kernels
