// Chunked GEMM, wgmma path (chunked_gemm.h): many token rows on sm_90a. A CTA (one warpgroup)
// owns 64 weight rows x 128 tokens: the weights are the wgmma A operand (16 rows per warp,
// standard m16n8k16 fragments by ldmatrix), the tokens the B operand (K-major descriptor);
// both are staged in shared memory by 16-byte cp.async in [rows][64 k] stages with the
// 128-byte swizzle, four stages in flight. Each 16-k wgmma step holds the same 16 k as the
// mma.sync kernels' steps (the slot order inside a step differs, which does not change the
// result: tests/cuda/gemm_order_probe.cu). Per chunk the accumulator restarts at 0 (scale-d 0
// on its first step) and is added to the running total when the chunk ends, so every element
// runs the same sequence as in the small and tile kernels, bitwise.
#include <cuda_bf16.h>

#include "kernels/common/device_utils.cuh"
#include "kernels/common/pdl_launch.cuh"
#include "kernels/common/wgmma.cuh"
#include "kernels/gemm/chunked_gemm.h"

namespace arbor::kernels::detail {

namespace {

constexpr int kRows = 64;                  // weight rows per CTA (wgmma M)
constexpr int kTok = 128;                  // tokens per CTA (wgmma N)
constexpr int kStages = 4;                 // stages of 64 k in shared memory (tokens and weights)
constexpr int kStageBytes = kTok * 128;    // tokens: [128][64] bf16, 128-byte swizzled
constexpr int kWStageBytes = kRows * 128;  // weights: [64][64] bf16, the same swizzle
constexpr int kStagesPerChunk = kChunkedGemmChunk / 64;

// Rows [row0, row0 + ROWS) x k [k0, k0 + 64) of a [rows][K] bf16 matrix into one stage,
// 16-byte copies into the 128-byte swizzle (chunk c of row r at c ^ r % 8). Rows past the
// matrix are zero-filled without a read (the tokens of a partial 128-token tile: copying the
// last row into each instead made 96 of 128 rows read one address per stage at 32 tokens, and
// the gate|up launch 2.5x slower).
template <int ROWS>
__device__ __forceinline__ void load_stage(const void* mat, int64_t rows, int64_t K,
                                           uint32_t stage_addr, int64_t row0, int64_t k0, int tid) {
  const auto* m = static_cast<const uint16_t*>(mat);
#pragma unroll
  for (int i = 0; i < ROWS * 8 / 128; ++i) {
    const int piece = tid + i * 128;
    const int r = piece / 8, c = piece % 8;
    const bool valid = row0 + r < rows;
    const uint16_t* src = m + (valid ? row0 + r : 0) * K + k0 + 8 * c;
    cp_async_16(stage_addr + r * 128 + ((c ^ (r % 8)) * 16), src, valid ? 16 : 0);
  }
}

__global__ void __launch_bounds__(128, 2) chunked_gemm_wgmma_kernel(const ChunkedGemmParams p) {
  extern __shared__ uint8_t smem_raw[];
  const uint32_t base = (smem_addr(smem_raw) + 1023u) & ~1023u;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t K = p.in_features, O = p.out_features;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTok;
  const int stages = static_cast<int>(K / 64);
  const uint32_t wbase = base + kStages * kStageBytes;
  // Weights do not depend on the previous kernel: their first stages are requested before the
  // programmatic-launch wait (committed with the tokens' groups below).
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i)
    if (i < stages)
      load_stage<kRows>(p.w, O, K, wbase + i * kWStageBytes, r0, static_cast<int64_t>(i) * 64, tid);
  grid_dependency_wait();
  trigger_dependent_launch();
#pragma unroll
  for (int i = 0; i < kStages - 1; ++i) {
    if (i < stages)
      load_stage<kTok>(p.x, p.rows, K, base + i * kStageBytes, n0, static_cast<int64_t>(i) * 64,
                       tid);
    cp_async_commit();
  }
  // ldmatrix rows of this lane: weight row 16 * warp + lane % 16, 8-k chunk lane / 16 of a step.
  const int lrow = 16 * warp + lane % 16;

  float acc[16][4], total[16][4];
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) acc[j][e] = total[j][e] = 0.f;

  const uint64_t desc0 = wgmma_desc_sw128(base, 16, 1024);
  for (int s = 0; s < stages; ++s) {
    const int ahead = s + kStages - 1;
    if (ahead < stages) {
      const int64_t k0 = static_cast<int64_t>(ahead) * 64;
      load_stage<kRows>(p.w, O, K, wbase + (ahead % kStages) * kWStageBytes, r0, k0, tid);
      load_stage<kTok>(p.x, p.rows, K, base + (ahead % kStages) * kStageBytes, n0, k0, tid);
    }
    cp_async_commit();
    cp_async_wait<kStages - 1>();  // stage s landed
    fence_proxy_async_smem();
    __syncthreads();
    // Standard m16n8k16 A fragments of the four 16-k steps (the tokens' B tile is unpermuted).
    uint32_t af[4][4];
    {
      const uint32_t ws = wbase + (s % kStages) * kWStageBytes + lrow * 128;
#pragma unroll
      for (int j = 0; j < 4; ++j)
        ldmatrix_x4(af[j], ws + (((2 * j + lane / 16) ^ (lrow % 8)) * 16));
    }
    const uint64_t desc = wgmma_desc_advance(desc0, (s % kStages) * kStageBytes);
    const bool chunk_start = s % kStagesPerChunk == 0;
    fence_accumulators(acc);
    wgmma_fence();
#pragma unroll
    for (int j = 0; j < 4; ++j)  // 16-k steps of the stage, in k order
      wgmma_m64n128k16_bf16<0>(acc, af[j], wgmma_desc_advance(desc, j * 32),
                               chunk_start && j == 0 ? 0 : 1);
    wgmma_commit();
    wgmma_wait<0>();
    fence_accumulators(acc);
    if (s % kStagesPerChunk == kStagesPerChunk - 1 || s == stages - 1) {
#pragma unroll
      for (int j = 0; j < 16; ++j)
#pragma unroll
        for (int e = 0; e < 4; ++e) total[j][e] = __fadd_rn(total[j][e], acc[j][e]);
    }
    __syncthreads();  // stage s % kStages is refilled at the next iteration
  }
  // total[j]: weight rows r0 + 16 warp + g (0, 1) / + 8 (2, 3), tokens n0 + 8j + 2t (+1).
  const int64_t row = r0 + 16 * warp + g;
#pragma unroll
  for (int j = 0; j < 16; ++j)
#pragma unroll
    for (int e = 0; e < 4; ++e) {
      const int64_t tok = n0 + 8 * j + 2 * t + (e % 2);
      const int64_t rr = row + (e >= 2 ? 8 : 0);
      if (tok < p.rows && rr < O) p.out[tok * O + rr] = total[j][e];
    }
}

}  // namespace

bool chunked_gemm_wgmma_supported(const ChunkedGemmParams& p) {
  return p.in_features % 64 == 0;
}

cudaError_t launch_chunked_gemm_wgmma(const ChunkedGemmParams& p, cudaStream_t stream) {
  const size_t smem = kStages * (kStageBytes + kWStageBytes) + 1024;
  static bool configured = false;
  if (!configured) {
    const cudaError_t e =
        cudaFuncSetAttribute(chunked_gemm_wgmma_kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>((p.out_features + kRows - 1) / kRows),
                  static_cast<unsigned>((p.rows + kTok - 1) / kTok));
  return launch_pdl(chunked_gemm_wgmma_kernel, grid, dim3(128), smem, stream, p);
}

}  // namespace arbor::kernels::detail
