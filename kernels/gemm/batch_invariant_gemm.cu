// One CTA: 32 token rows x 64 outputs (4 warps x 16 outputs); each warp keeps 2 x 2 m16n8
// accumulators and walks K in steps of 16 with A/B fragments loaded straight from global memory
// (32-bit pairs; out-of-range rows, outputs and the K tail read as zero). The per-element MMA
// sequence depends only on K.
#include <cuda_bf16.h>

#include "kernels/common/device_utils.cuh"
#include "kernels/gemm/batch_invariant_gemm.h"

namespace arbor::kernels {

namespace {

constexpr int kRowsPerCta = 32;
constexpr int kOutsPerWarp = 16;
constexpr int kWarps = 4;

__device__ __forceinline__ uint32_t load_pair(const uint16_t* base, int64_t row, int64_t rows,
                                              int64_t k, int64_t K) {
  if (row >= rows || k >= K) return 0u;
  return *reinterpret_cast<const uint32_t*>(base + row * K + k);
}

__global__ void __launch_bounds__(kWarps * 32)
    batch_invariant_gemm_kernel(const BatchInvariantGemmParams p) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t row0 = static_cast<int64_t>(blockIdx.y) * kRowsPerCta;
  const int64_t out0 = (static_cast<int64_t>(blockIdx.x) * kWarps + warp) * kOutsPerWarp;
  if (out0 >= p.out_features) return;
  const auto* x = static_cast<const uint16_t*>(p.x);
  const auto* w = static_cast<const uint16_t*>(p.w);
  const int64_t K = p.in_features;
  float acc[2][2][4] = {};
#pragma unroll 2
  for (int64_t k0 = 0; k0 < K; k0 += 16) {
    uint32_t a[2][4], b[2][2];
#pragma unroll
    for (int mt = 0; mt < 2; ++mt) {
      const int64_t r = row0 + mt * 16 + g;
      a[mt][0] = load_pair(x, r, p.rows, k0 + 2 * t, K);
      a[mt][1] = load_pair(x, r + 8, p.rows, k0 + 2 * t, K);
      a[mt][2] = load_pair(x, r, p.rows, k0 + 2 * t + 8, K);
      a[mt][3] = load_pair(x, r + 8, p.rows, k0 + 2 * t + 8, K);
    }
#pragma unroll
    for (int nt = 0; nt < 2; ++nt) {
      const int64_t n = out0 + nt * 8 + g;
      b[nt][0] = load_pair(w, n, p.out_features, k0 + 2 * t, K);
      b[nt][1] = load_pair(w, n, p.out_features, k0 + 2 * t + 8, K);
    }
#pragma unroll
    for (int mt = 0; mt < 2; ++mt)
#pragma unroll
      for (int nt = 0; nt < 2; ++nt)
        mma_16816<__nv_bfloat16>(acc[mt][nt], a[mt], b[nt][0], b[nt][1]);
  }
#pragma unroll
  for (int mt = 0; mt < 2; ++mt)
#pragma unroll
    for (int nt = 0; nt < 2; ++nt)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        const int64_t r = row0 + mt * 16 + g + (e >= 2 ? 8 : 0);
        const int64_t n = out0 + nt * 8 + 2 * t + (e % 2);
        if (r < p.rows && n < p.out_features) p.out[r * p.out_features + n] = acc[mt][nt][e];
      }
}

}  // namespace

cudaError_t launch_batch_invariant_gemm(const BatchInvariantGemmParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.out_features == 0) return cudaSuccess;
  if (p.in_features % 2 != 0) return cudaErrorInvalidValue;
  const int64_t outs_per_cta = kWarps * kOutsPerWarp;
  const dim3 grid(static_cast<unsigned>((p.out_features + outs_per_cta - 1) / outs_per_cta),
                  static_cast<unsigned>((p.rows + kRowsPerCta - 1) / kRowsPerCta));
  batch_invariant_gemm_kernel<<<grid, kWarps * 32, 0, stream>>>(p);
  return cudaGetLastError();
}

}  // namespace arbor::kernels
