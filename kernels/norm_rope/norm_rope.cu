// RMSNorm (one block per row, fp32 sum of squares) and RoPE (one thread per rotated pair).
#include <cuda_bf16.h>

#include "kernels/common/device_utils.cuh"
#include "kernels/common/pdl_launch.cuh"
#include "kernels/norm_rope/norm_rope.h"

namespace arbor::kernels {

namespace {

constexpr int kNormThreads = 256;

// Fast path for fp32 rows whose width is a multiple of 4 (every model's hidden size): each
// thread holds up to kMaxVec float4 of its row in registers, all of them loaded before any
// arithmetic, so a row costs one memory round trip instead of one per loop iteration (the loop
// kernels below store or re-read between loads and serialise on them: ~16 us for one 4096-wide
// row on the H100 against ~3 us). The sum of squares is a fixed tree (per-thread chunks in
// order, warp butterfly, warps in order), so a row's result depends only on that row.
constexpr int kMaxVec = 4;
constexpr int kMaxVecThreads = 1024;

__device__ __forceinline__ float block_sum_fixed(float v, float* partial) {
  v = warp_sum(v);
  const int warps = static_cast<int>(blockDim.x / 32);
  if (threadIdx.x % 32 == 0) partial[threadIdx.x / 32] = v;
  __syncthreads();
  if (threadIdx.x < 32) {
    float w = static_cast<int>(threadIdx.x) < warps ? partial[threadIdx.x] : 0.f;
    w = warp_sum(w);
    if (threadIdx.x == 0) partial[32] = w;
  }
  __syncthreads();
  return partial[32];
}

__device__ __forceinline__ void store_bf16x4(void* out_bf16, int64_t i4, const float4& v) {
  __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y);
  __nv_bfloat162 hi = __floats2bfloat162_rn(v.z, v.w);
  uint2 packed;
  packed.x = *reinterpret_cast<uint32_t*>(&lo);
  packed.y = *reinterpret_cast<uint32_t*>(&hi);
  reinterpret_cast<uint2*>(out_bf16)[i4] = packed;
}

// The row's weights as VEC float4 per thread (zeros past the row).
template <int VEC>
__device__ __forceinline__ void load_row_vec(const float4* src, int64_t n4, float4 (&v)[VEC]) {
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    v[j] = c < n4 ? src[c] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

template <int VEC>
__device__ __forceinline__ float sum_squares(const float4 (&v)[VEC]) {
  float ss = 0.f;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    ss += v[j].x * v[j].x;
    ss += v[j].y * v[j].y;
    ss += v[j].z * v[j].z;
    ss += v[j].w * v[j].w;
  }
  return ss;
}

// out = w * (v * inv) (the CPU reference's order), plus the optional bf16 copy.
__device__ __forceinline__ void store_normed(const float4& w, const float4& v, float inv,
                                             float4* out4, void* out_bf16, int64_t c,
                                             int64_t base4) {
  const float4 r =
      make_float4(w.x * (v.x * inv), w.y * (v.y * inv), w.z * (v.z * inv), w.w * (v.w * inv));
  out4[c] = r;
  if (out_bf16 != nullptr) store_bf16x4(out_bf16, base4 + c, r);
}

// RMSNorm of fp32 rows (x_type == out_type == kF32), cols % 4 == 0, VEC float4 per thread.
template <int VEC>
__global__ void __launch_bounds__(kMaxVecThreads) rms_norm_vec_kernel(const RmsNormParams p) {
  __shared__ float partial[33];
  const int64_t n4 = p.cols / 4;
  const int64_t base4 = static_cast<int64_t>(blockIdx.x) * n4;
  float4 w[VEC];
  load_row_vec(reinterpret_cast<const float4*>(p.weight), n4, w);  // not a previous output
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  float4 v[VEC];
  load_row_vec(static_cast<const float4*>(p.x) + base4, n4, v);
  const float ss = block_sum_fixed(sum_squares(v), partial);
  // Same order of operations as the CPU reference (transformers' LlamaRMSNorm in fp32).
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.cols) + p.eps);
  auto* out4 = static_cast<float4*>(p.out) + base4;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (c < n4) store_normed(w[j], v[j], inv, out4, p.out_bf16, c, base4);
  }
}

template <int VEC>
__global__ void __launch_bounds__(kMaxVecThreads)
    add_rms_norm_vec_kernel(const AddRmsNormParams p) {
  __shared__ float partial[33];
  const int64_t n4 = p.cols / 4;
  const int64_t base4 = static_cast<int64_t>(blockIdx.x) * n4;
  float4 w[VEC];
  load_row_vec(reinterpret_cast<const float4*>(p.weight), n4, w);
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  const auto* a4 = reinterpret_cast<const float4*>(p.a) + base4;
  const auto* b4 = reinterpret_cast<const float4*>(p.b) + base4;
  float4 v[VEC];
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (c < n4) {
      const float4 x = a4[c], y = b4[c];
      v[j] = make_float4(x.x + y.x, x.y + y.y, x.z + y.z, x.w + y.w);
    } else {
      v[j] = make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  // Every thread has read its a / b before anyone writes sum / out (they may alias them).
  const float ss = block_sum_fixed(sum_squares(v), partial);
  const float inv = 1.0f / sqrtf(ss / static_cast<float>(p.cols) + p.eps);
  auto* sum4 = reinterpret_cast<float4*>(p.sum) + base4;
  auto* out4 = reinterpret_cast<float4*>(p.out) + base4;
#pragma unroll
  for (int j = 0; j < VEC; ++j) {
    const int64_t c = threadIdx.x + static_cast<int64_t>(j) * blockDim.x;
    if (c >= n4) continue;
    sum4[c] = v[j];
    store_normed(w[j], v[j], inv, out4, p.out_bf16, c, base4);
  }
}

// Threads and float4 per thread for a vectorised row of `cols` fp32 (cols % 4 == 0), or
// vec = 0 when the row is too wide for the register arrays.
struct VecShape {
  int threads = 0;
  int vec = 0;
};
VecShape vec_shape(int64_t cols) {
  const int64_t n4 = cols / 4;
  int64_t threads = (n4 + 1) / 2;  // two float4 per thread when the row allows it
  threads = (threads + 31) / 32 * 32;
  if (threads > kMaxVecThreads) threads = kMaxVecThreads;
  if (threads < 32) threads = 32;
  const int64_t vec = (n4 + threads - 1) / threads;
  if (vec > kMaxVec) return {};
  return {static_cast<int>(threads), vec <= 1 ? 1 : vec <= 2 ? 2 : 4};
}

bool aligned16(const void* p) {
  return (reinterpret_cast<uintptr_t>(p) & 15u) == 0;
}

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
  const bool is_q = h < p.num_q_heads;
  float* x = is_q ? p.q + (n * p.num_q_heads + h) * p.head_dim
                  : p.k + (n * p.num_k_heads + (h - p.num_q_heads)) * p.head_dim;
  const float* xin = x;
  if (p.q_in != nullptr)  // strided input: the fused projection's row n
    xin = is_q ? p.q_in + n * p.in_stride + static_cast<int64_t>(h) * p.head_dim
               : p.k_in + n * p.in_stride + static_cast<int64_t>(h - p.num_q_heads) * p.head_dim;
  const float x0 = xin[i];
  const float x1 = xin[i + half];
  const float r0 = x0 * c - x1 * s;
  const float r1 = x1 * c + x0 * s;
  x[i] = r0;
  x[i + half] = r1;
  if (is_q) return;
  const int64_t width = static_cast<int64_t>(p.num_k_heads) * p.head_dim;
  const int64_t col = static_cast<int64_t>(h - p.num_q_heads) * p.head_dim + i;
  if (p.v_out != nullptr) {  // the V columns of the unsplit projection, as a split would
    p.v_out[n * width + col] = p.v_in[n * p.in_stride + col];
    p.v_out[n * width + col + half] = p.v_in[n * p.in_stride + col + half];
  }
  if (p.k_plane != nullptr) {  // fused write_kv of this K / V pair
    const int64_t dst = p.slots[n] * width + col;
    const int64_t src = n * (p.v_stride != 0 ? p.v_stride : width) + col;
    store_elem(p.k_plane, p.cache_type, dst, r0);
    store_elem(p.k_plane, p.cache_type, dst + half, r1);
    store_elem(p.v_plane, p.cache_type, dst, load_elem(p.v, p.v_type, src));
    store_elem(p.v_plane, p.cache_type, dst + half, load_elem(p.v, p.v_type, src + half));
  }
}

// One CTA per row: the register-row kernel for its float4 width when `vec_ok` and the row
// fits, else the loop kernel.
template <typename Params>
cudaError_t launch_norm(const Params& p, bool vec_ok, void (*vec1)(Params), void (*vec2)(Params),
                        void (*vec4)(Params), void (*loop)(Params), cudaStream_t stream) {
  if (p.rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.rows));
  const VecShape v = vec_ok ? vec_shape(p.cols) : VecShape{};
  if (v.vec != 0)
    return launch_pdl(v.vec == 1   ? vec1
                      : v.vec == 2 ? vec2
                                   : vec4,
                      grid, dim3(static_cast<unsigned>(v.threads)), 0, stream, p);
  const int threads =
      p.cols >= kNormThreads ? kNormThreads : 32 * static_cast<int>((p.cols + 31) / 32);
  return launch_pdl(loop, grid, dim3(threads), 0, stream, p);
}

bool bf16_copy_aligned(const void* out_bf16) {
  return out_bf16 == nullptr || (reinterpret_cast<uintptr_t>(out_bf16) & 7u) == 0;
}

}  // namespace

cudaError_t launch_rms_norm(const RmsNormParams& p, cudaStream_t stream) {
  const bool vec_ok = p.x_type == ElemType::kF32 && p.out_type == ElemType::kF32 &&
                      p.cols % 4 == 0 && aligned16(p.x) && aligned16(p.out) &&
                      aligned16(p.weight) && bf16_copy_aligned(p.out_bf16);
  return launch_norm(p, vec_ok, rms_norm_vec_kernel<1>, rms_norm_vec_kernel<2>,
                     rms_norm_vec_kernel<4>, rms_norm_kernel, stream);
}

cudaError_t launch_add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream) {
  const bool vec_ok = p.cols % 4 == 0 && aligned16(p.a) && aligned16(p.b) && aligned16(p.sum) &&
                      aligned16(p.out) && aligned16(p.weight) && bf16_copy_aligned(p.out_bf16);
  return launch_norm(p, vec_ok, add_rms_norm_vec_kernel<1>, add_rms_norm_vec_kernel<2>,
                     add_rms_norm_vec_kernel<4>, add_rms_norm_kernel, stream);
}

cudaError_t launch_rope(const RopeParams& p, cudaStream_t stream) {
  const int64_t total =
      static_cast<int64_t>(p.num_tokens) * (p.num_q_heads + p.num_k_heads) * (p.head_dim / 2);
  if (total == 0) return cudaSuccess;
  return launch_pdl(rope_kernel, dim3(static_cast<unsigned>((total + 255) / 256)), dim3(256), 0,
                    stream, p);
}

}  // namespace arbor::kernels
