// Bandwidth-bound linear layer for N <= 8 token rows (see skinny_gemm.h). A warp owns R output
// rows; each lane streams 16-byte chunks (8 bf16) of those rows, U chunks in flight, and reads
// the matching 8 fp32 activations of every token row from L1 (x is small and shared by all
// warps; weights bypass L1 so they do not evict it).
#include <cuda_bf16.h>

#include "kernels/common/device_utils.cuh"
#include "kernels/gemm/skinny_gemm.h"

namespace arbor::kernels {

namespace {

constexpr int kWarps = 4;  // warps per CTA

// bf16 pair in one 32-bit word (element 2i in the low half) -> two floats.
__device__ __forceinline__ float bf16_lo(uint32_t w) {
  return __uint_as_float(w << 16);
}
__device__ __forceinline__ float bf16_hi(uint32_t w) {
  return __uint_as_float(w & 0xffff0000u);
}

__device__ __forceinline__ float round_bf16(float v) {
  return __bfloat162float(__float2bfloat16_rn(v));
}

template <int N, int R, int U>
__global__ void __launch_bounds__(kWarps * 32) skinny_gemm_kernel(const SkinnyGemmParams p) {
  int s = 0;
#pragma unroll
  for (int i = 1; i < kSkinnyGemmMaxSegments; ++i)
    if (i < p.num_segments && static_cast<int>(blockIdx.x) >= p.seg_block_begin[i]) s = i;
  const SkinnyGemmSegment& seg = p.seg[s];
  const int lane = threadIdx.x & 31;
  const int64_t row0 =
      (static_cast<int64_t>(blockIdx.x - p.seg_block_begin[s]) * kWarps + threadIdx.x / 32) * R;
  if (row0 >= seg.out_features) return;
  const int64_t k_dim = p.in_features;
  const int64_t chunks = k_dim / 8;  // 16-byte weight chunks per row
  const uint4* wrow[R];
#pragma unroll
  for (int r = 0; r < R; ++r) {
    const int64_t row = row0 + r < seg.out_features ? row0 + r : row0;  // tail: duplicate
    wrow[r] =
        reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(seg.w) + row * k_dim);
  }
  float acc[R][N];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < N; ++n) acc[r][n] = 0.f;

  for (int64_t c0 = lane; c0 < chunks; c0 += 32 * U) {
    uint4 wv[U][R];
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * 32;
#pragma unroll
      for (int r = 0; r < R; ++r) wv[u][r] = c < chunks ? load_streaming(wrow[r] + c) : uint4{};
    }
#pragma unroll
    for (int u = 0; u < U; ++u) {
      const int64_t c = c0 + u * 32;
      if (c >= chunks) break;
      float wf[R][8];
#pragma unroll
      for (int r = 0; r < R; ++r) {
        const uint32_t words[4] = {wv[u][r].x, wv[u][r].y, wv[u][r].z, wv[u][r].w};
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          wf[r][2 * i] = bf16_lo(words[i]);
          wf[r][2 * i + 1] = bf16_hi(words[i]);
        }
      }
#pragma unroll
      for (int n = 0; n < N; ++n) {
        const float4* xp = reinterpret_cast<const float4*>(p.x + n * k_dim) + c * 2;
        const float4 a = __ldg(xp), b = __ldg(xp + 1);
        // Activations rounded to bf16 as for cuBLAS (linear()'s contract): the function does
        // not depend on which path the batch size picks (speculative == plain greedy).
        const float xs[8] = {round_bf16(a.x), round_bf16(a.y), round_bf16(a.z), round_bf16(a.w),
                             round_bf16(b.x), round_bf16(b.y), round_bf16(b.z), round_bf16(b.w)};
#pragma unroll
        for (int r = 0; r < R; ++r)
#pragma unroll
          for (int i = 0; i < 8; ++i) acc[r][n] = fmaf(wf[r][i], xs[i], acc[r][n]);
      }
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < N; ++n)
#pragma unroll
      for (int off = 16; off > 0; off /= 2)
        acc[r][n] += __shfl_xor_sync(0xffffffffu, acc[r][n], off);
        // Lane (r * N + n) writes output (n, row0 + r).
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int n = 0; n < N; ++n)
      if (lane == (r * N + n) % 32 && row0 + r < seg.out_features) {
        const float b = seg.bias != nullptr ? seg.bias[row0 + r] : 0.f;
        seg.out[n * seg.out_features + row0 + r] = acc[r][n] + b;
      }
}

template <int N, int R, int U>
cudaError_t launch(SkinnyGemmParams p, cudaStream_t stream) {
  const int64_t rows_per_cta = static_cast<int64_t>(kWarps) * R;
  int64_t blocks = 0;
  for (int s = 0; s < p.num_segments; ++s) {
    p.seg_block_begin[s] = static_cast<int32_t>(blocks);
    blocks += (p.seg[s].out_features + rows_per_cta - 1) / rows_per_cta;
  }
  p.seg_block_begin[p.num_segments] = static_cast<int32_t>(blocks);
  skinny_gemm_kernel<N, R, U><<<static_cast<unsigned>(blocks), kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace

bool skinny_gemm_supported(const SkinnyGemmParams& p) {
  if (p.rows < 1 || p.rows > kSkinnyGemmMaxRows || p.in_features <= 0 || p.in_features % 8 != 0 ||
      p.num_segments < 1 || p.num_segments > kSkinnyGemmMaxSegments ||
      reinterpret_cast<uintptr_t>(p.x) % 16 != 0)
    return false;
  int64_t total = 0;
  for (int s = 0; s < p.num_segments; ++s) {
    if (p.seg[s].out_features <= 0 || reinterpret_cast<uintptr_t>(p.seg[s].w) % 16 != 0)
      return false;
    total += p.seg[s].out_features;
  }
  return total < (int64_t{1} << 30);
}

cudaError_t launch_skinny_gemm(const SkinnyGemmParams& p, cudaStream_t stream) {
  if (!skinny_gemm_supported(p)) return cudaErrorInvalidValue;
  // One row per warp at N <= 2 (enough warps to keep the weight stream busy even at 1024
  // outputs); two at N >= 3 so each activation load from L1 serves two weight rows.
  switch (p.rows) {
    case 1:
      return launch<1, 1, 8>(p, stream);
    case 2:
      return launch<2, 1, 8>(p, stream);
    case 3:
      return launch<3, 2, 4>(p, stream);
    case 4:
      return launch<4, 2, 4>(p, stream);
    case 5:
      return launch<5, 2, 4>(p, stream);
    case 6:
      return launch<6, 2, 4>(p, stream);
    case 7:
      return launch<7, 2, 4>(p, stream);
    default:
      return launch<8, 2, 4>(p, stream);
  }
}

}  // namespace arbor::kernels
