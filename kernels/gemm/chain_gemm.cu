// Chain GEMM (chain_gemm.h). Fragments: the tokens are the MMA's A operand (row g = token g,
// row g + 8 = token g + 8), the weights its B operand (column g = weight row g of the warp's
// 8). Lane (g, t) takes k 4t .. 4t + 3 of each 16-k step, one 8-byte shared-memory load per
// operand row: A slots (2t, 2t + 1) and B slots (2t, 2t + 1) hold k 4t, 4t + 1, slots (2t + 8,
// 2t + 9) hold 4t + 2, 4t + 3 (a permutation inside the step, the same for A and B, which does
// not change the result: tests/cuda/gemm_order_probe.cu).
//
// Variants measured on the H100 and dropped (tests/cuda/chain_gemm_probe.cu, docs/benchmarks.md):
// the weights as the A operand (16 rows per warp) with one bulk (TMA) copy per row segment
// (1.3-2x slower alone: the small copies bound it); both fragments by ldmatrix (16 token rows,
// those past N zero-filled), copy addresses computed once and each stage's fragments loaded
// before its MMAs: 4x fewer instructions, yet alone no faster and in a decode step slower
// (batch 1 155 vs 161 tok/s); 6-12 stages or stages of 64 / 256 k (slower in a step: more
// shared memory per CTA or more barriers); an L2 prefetch of each row 2-8 stages past the ring
// (slightly slower); on the H200 a producer warp issuing 2-D tensor (TMA) copies of 32 rows x
// 64 k into a 4-12-stage mbarrier ring (7-25% slower at one row, up to 1.6x at 16: the narrow
// boxes, not the bytes in flight, bound it). ncu (one 4096 x 4096 launch): one warp per
// scheduler, 0.21 instructions issued per cycle, 43% of the stalls on fixed-latency
// dependencies; SMs active 78% of the launch (ramp and tail), DRAM at 56% of peak.
#include <cuda_bf16.h>
#include <cstdlib>

#include "kernels/common/device_utils.cuh"
#include "kernels/common/pdl_launch.cuh"
#include "kernels/gemm/chain_gemm.h"

namespace arbor::kernels {

namespace {

// Bytes of one row of a stage of `stage_k` k: + 32 so that a half-warp's 8-byte loads of 8 rows
// hit 32 different banks.
constexpr int row_bytes(int stage_k) {
  return stage_k * 2 + 32;
}

__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0, %1}, [%2];\n" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}

// One CTA: WARPS x 8 weight rows, all tokens. M16: more than 8 tokens (A rows g + 8). SK: k per
// ring stage (SK / 16 MMA steps).
template <int WARPS, bool M16, int STAGES, int SK>
__global__ void __launch_bounds__(WARPS * 32) chain_gemm_kernel(const ChainGemmParams p) {
  extern __shared__ __align__(16) unsigned char smem[];
  constexpr int kStageK = SK, kChunksPerRow = SK / 8, kRowBytes = row_bytes(SK);
  constexpr int kTokenRows = M16 ? 16 : 8;
  constexpr int kWeightRows = WARPS * 8;
  constexpr int kStageBytes = (kWeightRows + kTokenRows) * kRowBytes;
  constexpr int kThreads = WARPS * 32;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32, g = lane / 4, t = lane % 4;
  const int64_t K = p.in_features, O = p.out_features;
  const int n_tok = static_cast<int>(p.rows);
  const int64_t row0 = static_cast<int64_t>(blockIdx.x) * kWeightRows;
  const int stages = static_cast<int>((K + kStageK - 1) / kStageK);
  const auto* w = static_cast<const uint16_t*>(p.w);
  const auto* x = static_cast<const uint16_t*>(p.x);
  const uint32_t base = smem_addr(smem);

  auto load_weights = [&](int s) {
    const int64_t k0 = static_cast<int64_t>(s) * kStageK;
    const uint32_t dst = base + (s % STAGES) * kStageBytes;
#pragma unroll
    for (int j = 0; j < kWeightRows * kChunksPerRow / kThreads; ++j) {
      const int i = tid + j * kThreads;
      const int r = i / kChunksPerRow, c = i % kChunksPerRow;
      const int64_t k = k0 + c * 8;
      // Rows past O copy a valid row (their sums are never stored).
      if (k < K) cp_async_16(dst + r * kRowBytes + c * 16, w + min(row0 + r, O - 1) * K + k, 16);
    }
  };
  auto load_tokens = [&](int s) {
    const int64_t k0 = static_cast<int64_t>(s) * kStageK;
    const uint32_t dst = base + (s % STAGES) * kStageBytes + kWeightRows * kRowBytes;
    for (int i = tid; i < n_tok * kChunksPerRow; i += kThreads) {
      const int r = i / kChunksPerRow, c = i % kChunksPerRow;
      const int64_t k = k0 + c * 8;
      if (k < K) cp_async_16(dst + r * kRowBytes + c * 16, x + r * K + k, 16);
    }
  };

  // Weights are constant: their first stages are in flight before the wait for the kernel
  // that writes x.
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s)
    if (s < stages) load_weights(s);
  grid_dependency_wait();
#pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) {
    if (s < stages) load_tokens(s);
    cp_async_commit();
  }

  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  const uint32_t w_off = (warp * 8 + g) * kRowBytes + t * 8;
  const uint32_t x_lo = (kWeightRows + g) * kRowBytes + t * 8;
  const uint32_t x_hi = x_lo + 8 * kRowBytes;
  const bool have_lo = g < n_tok, have_hi = M16 && g + 8 < n_tok;
  auto step = [&](uint32_t sb, int j) {
    const uint2 lo = have_lo ? lds64(sb + x_lo + j * 32) : make_uint2(0u, 0u);
    const uint2 hi = have_hi ? lds64(sb + x_hi + j * 32) : make_uint2(0u, 0u);
    const uint32_t a[4] = {lo.x, hi.x, lo.y, hi.y};
    const uint2 b = lds64(sb + w_off + j * 32);
    mma_16816<__nv_bfloat16>(acc, a, b.x, b.y);
  };

  for (int s = 0; s < stages; ++s) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // stage s landed for every thread; slot (s - 1) % STAGES is free
    const int next = s + STAGES - 1;
    if (next < stages) {
      load_weights(next);
      load_tokens(next);
    }
    cp_async_commit();
    const uint32_t sb = base + (s % STAGES) * kStageBytes;
    const int64_t left = K - static_cast<int64_t>(s) * kStageK;
    if (left >= kStageK) {
#pragma unroll
      for (int j = 0; j < kStageK / 16; ++j) step(sb, j);
    } else {
      for (int j = 0; j < static_cast<int>(left / 16); ++j) step(sb, j);
    }
  }
  trigger_dependent_launch();

  // acc: (token g, rows 2t, 2t + 1) and (token g + 8, same rows) of the warp's 8 rows.
  const int64_t r = row0 + warp * 8 + 2 * t;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int tok = g + 8 * h;
    if (tok >= n_tok) continue;
    float* o = p.out + tok * O + r;
    if (r < O) o[0] = acc[2 * h];
    if (r + 1 < O) o[1] = acc[2 * h + 1];
  }
}

template <int WARPS, bool M16, int STAGES, int SK>
cudaError_t launch(const ChainGemmParams& p, cudaStream_t stream) {
  constexpr size_t kSmem =
      static_cast<size_t>(STAGES) * (WARPS * 8 + (M16 ? 16 : 8)) * row_bytes(SK);
  static bool configured = false;  // per instantiation
  if (!configured) {
    const cudaError_t e =
        cudaFuncSetAttribute(chain_gemm_kernel<WARPS, M16, STAGES, SK>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(kSmem));
    if (e != cudaSuccess) return e;
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>((p.out_features + WARPS * 8 - 1) / (WARPS * 8)));
  return launch_pdl(chain_gemm_kernel<WARPS, M16, STAGES, SK>, grid, dim3(WARPS * 32), kSmem,
                    stream, p);
}

template <int WARPS, int STAGES, int SK>
cudaError_t launch_rows(const ChainGemmParams& p, cudaStream_t stream) {
  return p.rows <= 8 ? launch<WARPS, false, STAGES, SK>(p, stream)
                     : launch<WARPS, true, STAGES, SK>(p, stream);
}

}  // namespace

bool chain_gemm_supported(const ChainGemmParams& p) {
  return p.rows >= 1 && p.rows <= kChainGemmMaxRows && p.in_features > 0 &&
         p.in_features % 16 == 0 && p.out_features > 0 &&
         (reinterpret_cast<uintptr_t>(p.x) & 15u) == 0 &&
         (reinterpret_cast<uintptr_t>(p.w) & 15u) == 0;
}

namespace detail {
cudaError_t launch_chain_gemm_config(const ChainGemmParams& p, int warps, int stages, int stage_k,
                                     cudaStream_t stream) {
  if (!chain_gemm_supported(p)) return cudaErrorInvalidValue;
  switch (warps * 10000 + stages * 1000 + stage_k) {
    case 44128:
      return launch_rows<4, 4, 128>(p, stream);
    case 43128:
      return launch_rows<4, 3, 128>(p, stream);
    case 46128:
      return launch_rows<4, 6, 128>(p, stream);
    case 24128:
      return launch_rows<2, 4, 128>(p, stream);
    case 48064:
      return launch_rows<4, 8, 64>(p, stream);
    case 44256:
      return launch_rows<4, 4, 256>(p, stream);
    case 43256:
      return launch_rows<4, 3, 256>(p, stream);
    case 48128:
      return launch_rows<4, 8, 128>(p, stream);
    case 46256:
      return launch_rows<4, 6, 256>(p, stream);
    default:
      return cudaErrorInvalidValue;
  }
}
}  // namespace detail

namespace {
// <warps><stages><stage k> from the environment variable `name`, else `fallback`.
int env_tiling(const char* name, int fallback) {
  const char* e = std::getenv(name);
  return e != nullptr ? std::atoi(e) : fallback;
}
cudaError_t launch_tiling(const ChainGemmParams& p, int tiling, cudaStream_t stream) {
  return detail::launch_chain_gemm_config(p, tiling / 10000, tiling / 1000 % 10, tiling % 1000,
                                          stream);
}
}  // namespace

cudaError_t launch_chain_gemm(const ChainGemmParams& p, cudaStream_t stream) {
  if (!chain_gemm_supported(p)) return cudaErrorInvalidValue;
  // 4 warps (32 weight rows), 4 stages of 128 k: 55 KiB of shared memory at <= 8 tokens. In a
  // decode step (graph replay) it beat 4 x 256 k, 3 and 6 stages, 2 warps and 8 x 64 k
  // (model_bench, docs/benchmarks.md); alone (chain_gemm_probe) they are within a few percent.
  // Except for matrices of at most 8192 rows and 4096 inputs (Llama-3-8B's q|k|v and o: one CTA
  // per SM): stages of 256 k, 16.7 vs 19.2 us (q|k|v) and 14.2 vs 17.3 us (o) per launch in a
  // replayed step (ncu), 199 vs 197 tok/s at batch 1. The down projection (14336 inputs) is 12 us
  // faster alone with them but makes the step 4% slower: its CTAs, resident early as a programmatic
  // dependent, take the SMs that the gate|up GEMM's later waves need (docs/benchmarks.md
  // "Fourteenth session"). Same bits at every tiling (chain_gemm_probe).
  // ARBOR_CHAIN_SMALL=<warps><stages><stage k> (e.g. 44128, the old choice) overrides the tiling of
  // those shapes for A/B runs.
  // ARBOR_CHAIN_DEEP: the same override for matrices of at most 8192 rows and more inputs (the
  // down projection).
  static const int small_config = env_tiling("ARBOR_CHAIN_SMALL", 44256);
  static const int deep_config = env_tiling("ARBOR_CHAIN_DEEP", 44128);
  if (p.out_features <= 8192)
    return launch_tiling(p, p.in_features <= 4096 ? small_config : deep_config, stream);
  return launch_rows<4, 4, 128>(p, stream);
}

}  // namespace arbor::kernels
