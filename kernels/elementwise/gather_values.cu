#include "kernels/elementwise/gather_values.h"

namespace arbor::kernels {
namespace {

__global__ void gather_ids_kernel(const int32_t* src, const int64_t* index, int32_t* out,
                                  int64_t n) {
  const int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i < n && index[i] >= 0) out[i] = src[index[i]];
}

}  // namespace

cudaError_t launch_gather_ids(const int32_t* src, const int64_t* index, int32_t* out, int64_t n,
                              cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const int threads = 256;
  gather_ids_kernel<<<static_cast<unsigned>((n + threads - 1) / threads), threads, 0, stream>>>(
      src, index, out, n);
  return cudaGetLastError();
}

}  // namespace arbor::kernels
