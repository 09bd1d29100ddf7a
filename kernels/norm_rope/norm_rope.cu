// RMSNorm (one block per row, fp32 sum of squares) and RoPE (one thread per rotated pair).
#include "kernels/common/device_utils.cuh"
#include "kernels/common/pdl_launch.cuh"
#include "kernels/norm_rope/norm_rope.h"

namespace arbor::kernels {

namespace {

constexpr int kNormThreads = 256;

__global__ void __launch_bounds__(kNormThreads) rms_norm_kernel(const RmsNormParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  __shared__ float partial[kNormThreads / 32];
  const int64_t row = blockIdx.x;
  const int64_t base = row * p.cols;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
    const float v = load_elem(p.x, p.x_type, base + c);
    ss += v * v;
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  // Same order of operations as the CPU reference (transformers' LlamaRMSNorm in fp32).
  const float inv = 1.0f / sqrtf(partial[0] / static_cast<float>(p.cols) + p.eps);
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
    const float v = p.weight[c] * (load_elem(p.x, p.x_type, base + c) * inv);
    store_elem(p.out, p.out_type, base + c, v);
    if (p.out_bf16 != nullptr) store_elem(p.out_bf16, ElemType::kBF16, base + c, v);
  }
}

__global__ void __launch_bounds__(kNormThreads) add_rms_norm_kernel(const AddRmsNormParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  __shared__ float partial[kNormThreads / 32];
  const int64_t base = static_cast<int64_t>(blockIdx.x) * p.cols;
  float ss = 0.f;
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
    const float v = p.a[base + c] + p.b[base + c];
    p.sum[base + c] = v;
    ss += v * v;
  }
  ss = warp_sum(ss);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = ss;
  __syncthreads();
  if (threadIdx.x < 32) {
    float v = threadIdx.x < blockDim.x / 32 ? partial[threadIdx.x] : 0.f;
    v = warp_sum(v);
    if (threadIdx.x == 0) partial[0] = v;
  }
  __syncthreads();
  const float inv = 1.0f / sqrtf(partial[0] / static_cast<float>(p.cols) + p.eps);
  // Each thread re-reads only the sums it wrote itself.
  for (int64_t c = threadIdx.x; c < p.cols; c += blockDim.x) {
    const float v = p.weight[c] * (p.sum[base + c] * inv);
    p.out[base + c] = v;
    if (p.out_bf16 != nullptr) store_elem(p.out_bf16, ElemType::kBF16, base + c, v);
  }
}

__global__ void rope_kernel(const RopeParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  const int half = p.head_dim / 2;
  const int heads = p.num_q_heads + p.num_k_heads;
  const int64_t idx = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const int64_t total = static_cast<int64_t>(p.num_tokens) * heads * half;
  if (idx >= total) return;
  const int i = static_cast<int>(idx % half);
  const int h = static_cast<int>((idx / half) % heads);
  const int64_t n = idx / (static_cast<int64_t>(half) * heads);
  const float angle = static_cast<float>(p.positions[n]) * p.inv_freq[i];
  float s, c;
  sincosf(angle, &s, &c);
  float* x = h < p.num_q_heads ? p.q + (n * p.num_q_heads + h) * p.head_dim
                               : p.k + (n * p.num_k_heads + (h - p.num_q_heads)) * p.head_dim;
  const float x0 = x[i];
  const float x1 = x[i + half];
  const float r0 = x0 * c - x1 * s;
  const float r1 = x1 * c + x0 * s;
  x[i] = r0;
  x[i + half] = r1;
  if (p.k_plane != nullptr && h >= p.num_q_heads) {  // fused write_kv of this K / V pair
    const int64_t width = static_cast<int64_t>(p.num_k_heads) * p.head_dim;
    const int64_t col = static_cast<int64_t>(h - p.num_q_heads) * p.head_dim + i;
    const int64_t dst = p.slots[n] * width + col, src = n * width + col;
    store_elem(p.k_plane, p.cache_type, dst, r0);
    store_elem(p.k_plane, p.cache_type, dst + half, r1);
    store_elem(p.v_plane, p.cache_type, dst, load_elem(p.v, p.v_type, src));
    store_elem(p.v_plane, p.cache_type, dst + half, load_elem(p.v, p.v_type, src + half));
  }
}

}  // namespace

cudaError_t launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const int threads =
      p.cols >= kNormThreads ? kNormThreads : 32 * static_cast<int>((p.cols + 31) / 32);
  return launch_pdl(rms_norm_kernel, dim3(static_cast<unsigned>(p.rows)), dim3(threads), 0, stream,
                    p);
}

cudaError_t launch_add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const int threads =
      p.cols >= kNormThreads ? kNormThreads : 32 * static_cast<int>((p.cols + 31) / 32);
  return launch_pdl(add_rms_norm_kernel, dim3(static_cast<unsigned>(p.rows)), dim3(threads), 0,
                    stream, p);
}

cudaError_t launch_rope(const RopeParams& p, cudaStream_t stream) {
  const int64_t total =
      static_cast<int64_t>(p.num_tokens) * (p.num_q_heads + p.num_k_heads) * (p.head_dim / 2);
  if (total == 0) return cudaSuccess;
  return launch_pdl(rope_kernel, dim3(static_cast<unsigned>((total + 255) / 256)), dim3(256), 0,
                    stream, p);
}

}  // namespace arbor::kernels
