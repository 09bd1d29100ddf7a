// One thread per 4 consecutive input columns of a row where the widths allow float4 (every
// width a multiple of 4 and 16-byte aligned rows), else one per element; grid over rows.
#include <algorithm>
#include <cstdint>

#include "kernels/common/pdl_launch.cuh"
#include "kernels/elementwise/split_cols.h"

namespace arbor::kernels {
namespace {

__global__ void split_cols_kernel(const SplitColsParams p, int64_t cols, int vec) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  const int64_t row = blockIdx.y;
  const float* x = p.x + row * cols;
  for (int64_t c = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * vec; c < cols;
       c += static_cast<int64_t>(gridDim.x) * blockDim.x * vec) {
    int j = 0;
    int64_t base = 0;
    while (c >= base + p.width[j]) base += p.width[j++];
    float* dst = p.out[j] + row * p.width[j] + (c - base);
    if (vec == 4)
      *reinterpret_cast<float4*>(dst) = *reinterpret_cast<const float4*>(x + c);
    else
      *dst = x[c];
  }
}

}  // namespace

cudaError_t launch_split_cols(const SplitColsParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const int64_t cols = p.width[0] + p.width[1] + p.width[2];
  if (p.rows > 65535 || cols <= 0) return cudaErrorInvalidValue;
  bool aligned = reinterpret_cast<uintptr_t>(p.x) % 16 == 0;
  for (int j = 0; j < 3; ++j)
    aligned = aligned && p.width[j] % 4 == 0 && reinterpret_cast<uintptr_t>(p.out[j]) % 16 == 0;
  const int vec = aligned ? 4 : 1;
  const int threads = 256;
  const int64_t blocks_x = std::min<int64_t>((cols / vec + threads - 1) / threads, 64);
  return launch_pdl(split_cols_kernel,
                    dim3(static_cast<unsigned>(blocks_x), static_cast<unsigned>(p.rows)),
                    dim3(threads), 0, stream, p, cols, vec);
}

}  // namespace arbor::kernels
