// Chain GEMM (chain_gemm.h). Fragments: the tokens are the MMA's A operand (row g = token g,
// row g + 8 = token g + 8), the weights its B operand (column g = weight row g of the warp's
// 8). Lane (g, t) takes k 4t .. 4t + 3 of each 16-k step, one 8-byte shared-memory load per
// operand row: A slots (2t, 2t + 1) and B slots (2t, 2t + 1) hold k 4t, 4t + 1, slots (2t + 8,
// 2t + 9) hold 4t + 2, 4t + 3 (a permutation inside the step, the same for A and B, which does
// not change the result: tests/cuda/gemm_order_probe.cu).
//
// Variants measured on the H100 and dropped (tests/cuda/chain_gemm_probe.cu; docs/kernel_notes.md
// "Chain GEMM"):
// the weights as the A operand (16 rows per warp) with one bulk (TMA) copy per row segment
// (1.3-2x slower alone: the small copies bound it); both fragments by ldmatrix (16 token rows,
// those past N zero-filled), copy addresses computed once and each stage's fragments loaded
// before its MMAs: 4x fewer instructions, yet alone no faster and in a decode step slower
// (batch 1 155 vs 161 tok/s); 6-12 stages or stages of 64 / 256 k (slower in a step: more
// shared memory per CTA or more barriers; 256-k stages now serve the matrices of at most 8192
// rows, see launch_chain_gemm); an L2 prefetch of each row 2-8 stages past the ring
// (slightly slower); on the H200 a producer warp issuing 2-D tensor (TMA) copies of 32 rows x
// 64 k into a 4-12-stage mbarrier ring (7-25% slower at one row, up to 1.6x at 16: the narrow
// boxes, not the bytes in flight, bound it). ncu (one 4096 x 4096 launch): one warp per
// scheduler, 0.21 instructions issued per cycle, 43% of the stalls on fixed-latency
// dependencies; SMs active 78% of the launch (ramp and tail), DRAM at 56% of peak.
#include <cuda_bf16.h>

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

__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(v) : "r"(addr));
  return v;
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

  // Thread tid copies 16-byte chunk load_c of rows load_r0 + j * kRowStride of the weights and
  // of the tokens: sources and shared-memory offsets computed once, each stage adds its k (the
  // per-copy 64-bit address arithmetic was half of all instructions: ncu).
  constexpr int kRowStride = kThreads / kChunksPerRow;
  constexpr int kWeightLoads = kWeightRows / kRowStride;
  constexpr int kTokenLoads = (kTokenRows + kRowStride - 1) / kRowStride;
  static_assert(kThreads % kChunksPerRow == 0 && kWeightRows % kRowStride == 0, "load layout");
  const int load_r0 = tid / kChunksPerRow, load_c = tid % kChunksPerRow;
  const uint32_t load_dst = load_r0 * kRowBytes + load_c * 16;
  const uint16_t* w_src[kWeightLoads];
#pragma unroll
  for (int j = 0; j < kWeightLoads; ++j)  // rows past O copy a valid row (never stored)
    w_src[j] = w + min(row0 + load_r0 + j * kRowStride, O - 1) * K + load_c * 8;
  const uint16_t* x_src[kTokenLoads];
  bool x_row[kTokenLoads];
#pragma unroll
  for (int j = 0; j < kTokenLoads; ++j) {
    const int r = load_r0 + j * kRowStride;
    x_row[j] = r < n_tok;
    x_src[j] = x + (x_row[j] ? r : 0) * K + load_c * 8;
  }
  auto load_weights = [&](int s) {
    const int64_t k0 = static_cast<int64_t>(s) * kStageK;
    if (k0 + load_c * 8 >= K) return;  // K is a multiple of 16: a chunk is wholly in or out
    const uint32_t dst = base + (s % STAGES) * kStageBytes + load_dst;
#pragma unroll
    for (int j = 0; j < kWeightLoads; ++j)
      cp_async_16(dst + j * kRowStride * kRowBytes, w_src[j] + k0, 16);
  };
  auto load_tokens = [&](int s) {
    const int64_t k0 = static_cast<int64_t>(s) * kStageK;
    if (k0 + load_c * 8 >= K) return;
    const uint32_t dst = base + (s % STAGES) * kStageBytes + kWeightRows * kRowBytes + load_dst;
#pragma unroll
    for (int j = 0; j < kTokenLoads; ++j)
      if (x_row[j]) cp_async_16(dst + j * kRowStride * kRowBytes, x_src[j] + k0, 16);
  };

  // Token rows n_tok .. kTokenRows - 1 of every stage: zero (the copies never write them).
  {
    constexpr int kWordsPerRow = kRowBytes / 4;
    const int zero_words = (kTokenRows - n_tok) * kWordsPerRow;
    for (int i = tid; i < STAGES * zero_words; i += kThreads) {
      const int st = i / zero_words, wd = i % zero_words;
      asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(base + st * kStageBytes +
                                                     (kWeightRows + n_tok) * kRowBytes + wd * 4),
                   "r"(0u));
    }
  }
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
  // A lane whose token row is past n_tok reads row n_tok instead, which no copy writes and which
  // is zeroed once above (all such lanes read one address: a broadcast). Each half of an A pair
  // is loaded straight into its fragment register (two 4-byte loads; an 8-byte load needed two
  // moves and a zeroing per step), with no predicate.
  const int lo_row = g < n_tok ? g : n_tok;
  const int hi_row = g + 8 < n_tok ? g + 8 : n_tok;
  const uint32_t x_lo = (kWeightRows + lo_row) * kRowBytes + t * 8;
  const uint32_t x_hi = (kWeightRows + hi_row) * kRowBytes + t * 8;
  auto step = [&](uint32_t sb, int j) {
    uint32_t a[4];
    a[0] = lds32(sb + x_lo + j * 32);
    a[2] = lds32(sb + x_lo + j * 32 + 4);
    if constexpr (M16) {
      a[1] = lds32(sb + x_hi + j * 32);
      a[3] = lds32(sb + x_hi + j * 32 + 4);
    } else {
      a[1] = a[3] = 0u;
    }
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
cudaError_t launch_tiling(const ChainGemmParams& p, int tiling, cudaStream_t stream) {
  return detail::launch_chain_gemm_config(p, tiling / 10000, tiling / 1000 % 10, tiling % 1000,
                                          stream);
}
}  // namespace

cudaError_t launch_chain_gemm(const ChainGemmParams& p, cudaStream_t stream) {
  if (!chain_gemm_supported(p)) return cudaErrorInvalidValue;
  // 4 warps (32 weight rows), 4 stages of 128 k: 55 KiB of shared memory at <= 8 tokens. In a
  // decode step (graph replay) it beat 4 x 256 k, 3 and 6 stages, 2 warps and 8 x 64 k
  // (model_bench; docs/kernel_notes.md "Chain GEMM"); alone (chain_gemm_probe) they are within a
  // few percent.
  // Except for matrices of at most 8192 rows (Llama-3-8B's q|k|v, o and down: about one CTA per
  // SM): stages of 256 k. q|k|v and o: 16.7 vs 19.2 us and 14.2 vs 17.3 us per launch in a
  // replayed step (ncu). The down projection (14336 inputs): with the per-copy address arithmetic
  // hoisted out of the loop 41 vs 48 us alone and batch-1 / batch-8 decode
  // 207 / 1560 vs 199 / 1373 tok/s with 128-k stages (H200; docs/kernel_notes.md "Chain GEMM";
  // with the address arithmetic per copy, 256-k stages made the step 4% slower).
  // p.small_tiling / p.deep_tiling override the tilings of these matrices for A/B runs.
  constexpr int kDefaultTiling = 44256;
  const int small_config = p.small_tiling != 0 ? p.small_tiling : kDefaultTiling;
  const int deep_config = p.deep_tiling != 0 ? p.deep_tiling : kDefaultTiling;
  if (p.out_features <= 8192)
    return launch_tiling(p, p.in_features <= 4096 ? small_config : deep_config, stream);
  return launch_rows<4, 4, 128>(p, stream);
}

}  // namespace arbor::kernels
