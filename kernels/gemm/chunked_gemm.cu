// Chunked batch-invariant GEMM (chunked_gemm.h). Fragment layout: for a 32-k block at kb, lane
// (g = lane / 4, t = lane % 4) loads 16 bytes of weight rows g and g + 8 and of token row g at
// k = kb + 8t .. kb + 8t + 7, and step_form() trades half of them with lane t ^ 2 so that the
// first MMA takes k kb .. kb + 15 and the second kb + 16 .. kb + 31 (inside one 16-k step the
// slot order does not change the result, which 16 k share a step does: the wgmma kernel uses
// the standard slot order with the same steps).
#include <cuda_bf16.h>

#include "kernels/common/device_utils.cuh"
#include "kernels/common/pdl_launch.cuh"
#include "kernels/gemm/chunked_gemm.h"

namespace arbor::kernels {

namespace {

constexpr int kSmallWarps = 8;

// A lane's 16 bytes of one row (k 8t .. 8t + 7 of a 32-k block) -> its share of the two 16-k
// steps: .x, .y for the first (k 0-3, 8-11, 4-7, 12-15 for t = 0..3), .z, .w for the second
// (k 20-23, 28-31, 16-19, 24-27). Every lane of the warp must call it (shuffles).
__device__ __forceinline__ uint4 step_form(const uint4& v, int t) {
  const uint32_t pz = __shfl_xor_sync(0xffffffffu, v.z, 2);
  const uint32_t pw = __shfl_xor_sync(0xffffffffu, v.w, 2);
  return t < 2 ? make_uint4(v.x, v.y, pz, pw) : make_uint4(pz, pw, v.x, v.y);
}

// One 32-k block: two MMAs into acc (weights rows g / g + 8 in wl / wh, token g in xv).
__device__ __forceinline__ void block_mma(float (&acc)[4], const uint4& wl, const uint4& wh,
                                          const uint4& xv) {
  const uint32_t a0[4] = {wl.x, wh.x, wl.y, wh.y};
  mma_16816<__nv_bfloat16>(acc, a0, xv.x, xv.y);
  const uint32_t a1[4] = {wl.z, wh.z, wl.w, wh.w};
  mma_16816<__nv_bfloat16>(acc, a1, xv.z, xv.w);
}

__host__ __device__ __forceinline__ int num_chunks(int64_t K) {
  return static_cast<int>((K + kChunkedGemmChunk - 1) / kChunkedGemmChunk);
}

// Small N: one CTA per 16 weight rows; warp w of W computes chunks w, w + W, ... of every token
// (NT n8 tiles) and parks each chunk sum in shared memory; the sums are then added in chunk
// order. Dynamic shared memory: [chunks][16 rows][NT * 8 tokens] fp32.
// BB: 32-k blocks of weights in flight per lane.
template <int NT, int BB>
__global__ void __launch_bounds__(kSmallWarps * 32, 2)
    chunked_gemm_small_kernel(const ChunkedGemmParams p) {
  extern __shared__ float part[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t K = p.in_features, O = p.out_features;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * 16;
  const int chunks = num_chunks(K);
  const auto* w = static_cast<const uint16_t*>(p.w);
  const auto* x = static_cast<const uint16_t*>(p.x);
  // Rows past O read a valid row (their results are never stored).
  const uint16_t* w_lo = w + min(r0 + g, O - 1) * K;
  const uint16_t* w_hi = w + min(r0 + g + 8, O - 1) * K;
  constexpr int kTok = NT * 8;
  bool waited = false;
  const int warps = blockDim.x / 32;
  for (int c = warp; c < chunks; c += warps) {
    const int64_t kc0 = static_cast<int64_t>(c) * kChunkedGemmChunk;
    const int blocks = static_cast<int>(min(static_cast<int64_t>(kChunkedGemmChunk), K - kc0) / 32);
    float acc[NT][4] = {};
    for (int b0 = 0; b0 < blocks; b0 += BB) {
      uint4 wl[BB], wh[BB];
#pragma unroll
      for (int i = 0; i < BB; ++i) {
        if (b0 + i < blocks) {
          const int64_t k = kc0 + (b0 + i) * 32 + 8 * t;
          wl[i] = load_streaming(w_lo + k);
          wh[i] = load_streaming(w_hi + k);
        }
      }
      if (!waited) {  // weights are constant: only x waits for the producing kernel
        grid_dependency_wait();
        waited = true;
      }
      bool converted = false;
#pragma unroll
      for (int nt = 0; nt < NT; ++nt) {
        const int tok = nt * 8 + g;
        uint4 xv[BB];
#pragma unroll
        for (int i = 0; i < BB; ++i) {
          const int64_t k = kc0 + (b0 + i) * 32 + 8 * t;
          xv[i] = (tok < p.rows && b0 + i < blocks)
                      ? *reinterpret_cast<const uint4*>(x + tok * K + k)
                      : make_uint4(0u, 0u, 0u, 0u);
        }
#pragma unroll
        for (int i = 0; i < BB; ++i)
          if (b0 + i < blocks) {  // warp-uniform: the shuffles run on every lane
            if (!converted) {
              wl[i] = step_form(wl[i], t);
              wh[i] = step_form(wh[i], t);
            }
            block_mma(acc[nt], wl[i], wh[i], step_form(xv[i], t));
          }
        converted = true;
      }
    }
    float* pc = part + static_cast<int64_t>(c) * 16 * kTok;
#pragma unroll
    for (int nt = 0; nt < NT; ++nt) {
      const int tok = nt * 8 + 2 * t;
      pc[g * kTok + tok] = acc[nt][0];
      pc[g * kTok + tok + 1] = acc[nt][1];
      pc[(g + 8) * kTok + tok] = acc[nt][2];
      pc[(g + 8) * kTok + tok + 1] = acc[nt][3];
    }
  }
  if (!waited) grid_dependency_wait();  // a warp without chunks still stores below
  trigger_dependent_launch();
  __syncthreads();
  for (int idx = threadIdx.x; idx < 16 * kTok; idx += blockDim.x) {
    const int row = idx % 16, tok = idx / 16;
    if (tok >= p.rows || r0 + row >= O) continue;
    float total = 0.f;
    for (int c = 0; c < chunks; ++c) total = __fadd_rn(total, part[(c * 16 + row) * kTok + tok]);
    p.out[tok * O + r0 + row] = total;
  }
}

// N > 16: a CTA owns 16 * RT weight rows x 8 * NT tokens, so every activation load serves RT
// row tiles (the small kernel re-reads the activations per 16 weight rows, which bounds it by
// L2 traffic from ~32 rows on). Warp w computes chunk c0 + w of each round of kSmallWarps
// chunks into registers, parks it in shared memory, and after the round each thread adds the
// round's sums of its kPer output elements to its running total in chunk order. Dynamic
// shared memory: [kSmallWarps][NT * 8 tokens][16 * RT + 4 rows] fp32 (the 4 pad keeps the
// fragment stores off each other's banks).
template <int RT, int NT, int BB>
__global__ void __launch_bounds__(kSmallWarps * 32, 1)
    chunked_gemm_tile_kernel(const ChunkedGemmParams p) {
  extern __shared__ float part[];
  constexpr int kRows = 16 * RT, kTok = 8 * NT, kStride = kRows + 4;
  constexpr int kPer = kRows * kTok / (kSmallWarps * 32);
  static_assert(kRows * kTok % (kSmallWarps * 32) == 0, "tile elements per thread");
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t = lane % 4;
  const int64_t K = p.in_features, O = p.out_features;
  const int64_t r0 = static_cast<int64_t>(blockIdx.x) * kRows;
  const int64_t n0 = static_cast<int64_t>(blockIdx.y) * kTok;
  const int chunks = num_chunks(K);
  const auto* w = static_cast<const uint16_t*>(p.w);
  const auto* x = static_cast<const uint16_t*>(p.x);
  const uint16_t* wrow[RT][2];
#pragma unroll
  for (int rt = 0; rt < RT; ++rt) {  // rows past O read a valid row (never stored)
    wrow[rt][0] = w + min(r0 + rt * 16 + g, O - 1) * K;
    wrow[rt][1] = w + min(r0 + rt * 16 + g + 8, O - 1) * K;
  }
  const uint16_t* xrow[NT];
  bool xvalid[NT];
#pragma unroll
  for (int nt = 0; nt < NT; ++nt) {
    const int64_t tok = n0 + nt * 8 + g;
    xvalid[nt] = tok < p.rows;
    xrow[nt] = x + (xvalid[nt] ? tok : 0) * K;
  }
  float* mine = part + warp * kTok * kStride;
  float total[kPer];
#pragma unroll
  for (int e = 0; e < kPer; ++e) total[e] = 0.f;
  bool waited = false;
  for (int c0 = 0; c0 < chunks; c0 += kSmallWarps) {
    const int c = c0 + warp;
    if (c < chunks) {
      const int64_t kc0 = static_cast<int64_t>(c) * kChunkedGemmChunk;
      const int blocks =
          static_cast<int>(min(static_cast<int64_t>(kChunkedGemmChunk), K - kc0) / 32);
      float acc[RT][NT][4];
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[rt][nt][e] = 0.f;
      for (int b0 = 0; b0 < blocks; b0 += BB) {
        uint4 wv[BB][RT][2];
#pragma unroll
        for (int i = 0; i < BB; ++i)
          if (b0 + i < blocks) {
            const int64_t k = kc0 + (b0 + i) * 32 + 8 * t;
#pragma unroll
            for (int rt = 0; rt < RT; ++rt) {
              wv[i][rt][0] = load_streaming(wrow[rt][0] + k);
              wv[i][rt][1] = load_streaming(wrow[rt][1] + k);
            }
          }
        if (!waited) {  // weights are constant: only x waits for the producing kernel
          grid_dependency_wait();
          waited = true;
        }
        // Every activation load of the block(s) is issued before the first MMA, so the block
        // costs one memory round trip, not one per token tile.
        uint4 xv[BB][NT];
#pragma unroll
        for (int i = 0; i < BB; ++i)
#pragma unroll
          for (int nt = 0; nt < NT; ++nt) {
            const int64_t k = kc0 + (b0 + i) * 32 + 8 * t;
            xv[i][nt] = (xvalid[nt] && b0 + i < blocks)
                            ? *reinterpret_cast<const uint4*>(xrow[nt] + k)
                            : make_uint4(0u, 0u, 0u, 0u);
          }
#pragma unroll
        for (int i = 0; i < BB; ++i)
          if (b0 + i < blocks) {  // warp-uniform: the shuffles run on every lane
#pragma unroll
            for (int rt = 0; rt < RT; ++rt) {
              wv[i][rt][0] = step_form(wv[i][rt][0], t);
              wv[i][rt][1] = step_form(wv[i][rt][1], t);
            }
#pragma unroll
            for (int nt = 0; nt < NT; ++nt) {
              const uint4 xs = step_form(xv[i][nt], t);
#pragma unroll
              for (int rt = 0; rt < RT; ++rt)
                block_mma(acc[rt][nt], wv[i][rt][0], wv[i][rt][1], xs);
            }
          }
      }
#pragma unroll
      for (int rt = 0; rt < RT; ++rt)
#pragma unroll
        for (int nt = 0; nt < NT; ++nt) {
          const int row = rt * 16 + g, tok = nt * 8 + 2 * t;
          mine[tok * kStride + row] = acc[rt][nt][0];
          mine[(tok + 1) * kStride + row] = acc[rt][nt][1];
          mine[tok * kStride + row + 8] = acc[rt][nt][2];
          mine[(tok + 1) * kStride + row + 8] = acc[rt][nt][3];
        }
    }
    if (!waited) {  // a warp without a chunk this round
      grid_dependency_wait();
      waited = true;
    }
    __syncthreads();
    const int here = min(kSmallWarps, chunks - c0);
#pragma unroll
    for (int e = 0; e < kPer; ++e) {
      const int idx = threadIdx.x + e * kSmallWarps * 32;
      const int off = (idx / kRows) * kStride + idx % kRows;
      for (int s = 0; s < here; ++s) total[e] = __fadd_rn(total[e], part[s * kTok * kStride + off]);
    }
    __syncthreads();
  }
  trigger_dependent_launch();
#pragma unroll
  for (int e = 0; e < kPer; ++e) {
    const int idx = threadIdx.x + e * kSmallWarps * 32;
    const int64_t tok = n0 + idx / kRows, row = r0 + idx % kRows;
    if (tok < p.rows && row < O) p.out[tok * O + row] = total[e];
  }
}

template <int NT, int BB>
cudaError_t launch_small(const ChunkedGemmParams& p, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(num_chunks(p.in_features)) * 16 * NT * 8 * 4;
  static size_t configured = 0;  // per instantiation; raised as larger K appear
  if (smem > configured) {
    const cudaError_t e =
        cudaFuncSetAttribute(chunked_gemm_small_kernel<NT, BB>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    configured = smem;
  }
  const dim3 grid(static_cast<unsigned>((p.out_features + 15) / 16));
  // 5..8 warps, the count that leaves the fewest idle warp slots in the last round of chunks
  // (28 chunks of a 14336-wide input: 7 warps x 4, not 8 x 3.5).
  const int chunks = num_chunks(p.in_features);
  int warps = kSmallWarps;
  if (chunks > kSmallWarps) {
    int best_idle = kSmallWarps;
    for (int w = kSmallWarps; w >= 5; --w) {
      const int idle = (chunks + w - 1) / w * w - chunks;
      if (idle < best_idle) {
        best_idle = idle;
        warps = w;
      }
    }
  }
  return launch_pdl(chunked_gemm_small_kernel<NT, BB>, grid, dim3(warps * 32), smem, stream, p);
}

template <int RT, int NT, int BB>
cudaError_t launch_tile(const ChunkedGemmParams& p, cudaStream_t stream) {
  const size_t smem = static_cast<size_t>(kSmallWarps) * NT * 8 * (16 * RT + 4) * 4;
  static bool configured = false;  // per instantiation (the size does not depend on K)
  if (!configured) {
    const cudaError_t e =
        cudaFuncSetAttribute(chunked_gemm_tile_kernel<RT, NT, BB>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem));
    if (e != cudaSuccess) return e;
    configured = true;
  }
  const dim3 grid(static_cast<unsigned>((p.out_features + 16 * RT - 1) / (16 * RT)),
                  static_cast<unsigned>((p.rows + NT * 8 - 1) / (NT * 8)));
  return launch_pdl(chunked_gemm_tile_kernel<RT, NT, BB>, grid, dim3(kSmallWarps * 32), smem,
                    stream, p);
}

}  // namespace

bool chunked_gemm_supported(const ChunkedGemmParams& p) {
  return p.in_features > 0 && p.in_features % 32 == 0 &&
         (reinterpret_cast<uintptr_t>(p.x) & 15u) == 0 &&
         (reinterpret_cast<uintptr_t>(p.w) & 15u) == 0;
}

cudaError_t launch_chunked_gemm(const ChunkedGemmParams& p, cudaStream_t stream) {
  if (p.rows == 0 || p.out_features == 0) return cudaSuccess;
  if (!chunked_gemm_supported(p)) return cudaErrorInvalidValue;
  // The small kernel keeps every chunk sum of its tile in shared memory: at most 112 KiB.
  const int64_t small_smem = static_cast<int64_t>(num_chunks(p.in_features)) * 16 * 16 * 4;
  if (p.rows <= kChunkedGemmSmallRows && small_smem <= (112 << 10)) {
    // 4 blocks in flight per lane: 2 and 8 measured no faster (8: slower, fewer CTAs per SM).
    if (p.rows <= 8) return launch_small<1, 4>(p, stream);
    return launch_small<2, 4>(p, stream);
  }
  // The wgmma kernel (Hopper), as p.wgmma_mode asks.
  const int wgmma_mode = p.wgmma_mode;
  static const int sms = [] {
    int dev = 0, major = 0, n = 0;
    cudaGetDevice(&dev);
    cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev);
    return major == 9 ? n : 0;  // 0: no wgmma
  }();
  if (sms > 0 && wgmma_mode != 0 && detail::chunked_gemm_wgmma_supported(p)) {
    // Measured on the H100 (model_bench --linear): above 64 rows always; at 17-64 rows only
    // where its tiles fill two CTAs per SM (gate|up), else the tile kernel's split over chunks
    // streams faster (q|k|v, o, down).
    const int64_t ctas = (p.out_features + 63) / 64 * ((p.rows + 127) / 128);
    if (wgmma_mode == 1 || p.rows > 64 || ctas >= 2 * sms)
      return detail::launch_chunked_gemm_wgmma(p, stream);
  }
  // Tile kernel: 32 weight rows per CTA (RT = 2; measured against 16 and 64 on the H100 at
  // 32..2048 rows when the tile path was added, commit 28ca5cd), 32 or 64 tokens.
  if (p.rows <= 32) return launch_tile<2, 4, 2>(p, stream);
  return launch_tile<2, 8, 2>(p, stream);
}

}  // namespace arbor::kernels
