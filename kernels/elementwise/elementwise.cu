// Grid-stride elementwise kernels; memory-bound, so one simple form serves every dtype mix.
#include "kernels/common/device_utils.cuh"
#include "kernels/common/pdl_launch.cuh"
#include "kernels/elementwise/elementwise.h"

namespace arbor::kernels {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 16 ? b : 65535 * 16);
}

__global__ void add_kernel(const AddParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_elem(p.out, p.out_type, i, load_elem(p.a, p.a_type, i) + load_elem(p.b, p.b_type, i));
}

__global__ void silu_mul_kernel(const SiluMulParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t src = p.in_stride != 0 ? (i / p.cols) * p.in_stride + i % p.cols : i;
    const float g = load_elem(p.gate, p.gate_type, src);
    const float u = load_elem(p.up, p.up_type, src);
    if (p.gate_copy != nullptr) p.gate_copy[i] = g;
    if (p.up_copy != nullptr) p.up_copy[i] = u;
    const float v = (g / (1.0f + expf(-g))) * u;
    store_elem(p.out, p.out_type, i, v);
    if (p.out_bf16 != nullptr) store_elem(p.out_bf16, ElemType::kBF16, i, v);
  }
}

__global__ void convert_kernel(const ConvertParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_elem(p.dst, p.dst_type, i, load_elem(p.src, p.src_type, i));
}

__global__ void add_bias_kernel(const AddBiasParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  const int64_t n = p.rows * p.cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x)
    store_elem(p.out, p.out_type, i, load_elem(p.out, p.out_type, i) + p.bias[i % p.cols]);
}

__global__ void gather_rows_kernel(const GatherRowsParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  const int64_t n = p.num_rows * p.cols;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t m = i / p.cols, c = i % p.cols;
    const int64_t row = p.index[m] - p.index_offset;
    const float v = p.src_rows >= 0 && (row < 0 || row >= p.src_rows)
                        ? 0.0f
                        : load_elem(p.src, p.src_type, row * p.cols + c);
    store_elem(p.dst, p.dst_type, i, v);
  }
}

__device__ __forceinline__ uint64_t splitmix64(uint64_t z) {
  z += 0x9e3779b97f4a7c15ull;
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_random_kernel(const FillRandomParams p) {
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < p.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t g = p.index_base + (p.cols > 0 ? (i / p.cols) * p.src_stride + i % p.cols : i);
    const uint64_t h = splitmix64(p.seed * 0x2545f4914f6cdd1dull + static_cast<uint64_t>(g));
    const float u = static_cast<float>(h >> 40) * (2.0f / 16777216.0f) - 1.0f;  // [-1, 1)
    store_elem(p.dst, p.dst_type, i, p.offset + p.scale * u);
  }
}

}  // namespace

cudaError_t launch_fill_random(const FillRandomParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  fill_random_kernel<<<blocks_for(p.n), kThreads, 0, stream>>>(p);
  return cudaGetLastError();
}

cudaError_t launch_add(const AddParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  return launch_pdl(add_kernel, dim3(blocks_for(p.n)), dim3(kThreads), 0, stream, p);
}

cudaError_t launch_silu_mul(const SiluMulParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  return launch_pdl(silu_mul_kernel, dim3(blocks_for(p.n)), dim3(kThreads), 0, stream, p);
}

cudaError_t launch_convert(const ConvertParams& p, cudaStream_t stream) {
  if (p.n == 0) return cudaSuccess;
  return launch_pdl(convert_kernel, dim3(blocks_for(p.n)), dim3(kThreads), 0, stream, p);
}

cudaError_t launch_add_bias(const AddBiasParams& p, cudaStream_t stream) {
  if (p.rows * p.cols == 0) return cudaSuccess;
  return launch_pdl(add_bias_kernel, dim3(blocks_for(p.rows * p.cols)), dim3(kThreads), 0, stream,
                    p);
}

cudaError_t launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream) {
  if (p.num_rows == 0 || p.cols == 0) return cudaSuccess;
  return launch_pdl(gather_rows_kernel, dim3(blocks_for(p.num_rows * p.cols)), dim3(kThreads), 0,
                    stream, p);
}

}  // namespace arbor::kernels
