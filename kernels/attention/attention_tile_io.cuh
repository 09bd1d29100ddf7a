// The shared-memory tile layouts of the tensor-core attention path, and how query rows come in
// and output rows go out: the swizzled K/V tiles (ldmatrix and wgmma layouts), Q staged for
// ldmatrix or loaded straight into wgmma A fragments, and stores of an output type known at run
// time. Internal to kernels/attention (paged_tree_attention_mma.cu).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>
#include <type_traits>

#include "kernels/attention/attention_internal.cuh"
#include "kernels/common/device_utils.cuh"

namespace arbor::kernels::detail {

// Element offset of (row, col) in a [rows][D] tile whose 16-byte chunks are XOR-swizzled by
// row so that ldmatrix's 8 rows at one column hit 8 different bank groups.
template <int D>
__device__ __forceinline__ int swz(int row, int col) {
  return row * D + ((((col >> 3) ^ (row & 7))) << 3) + (col & 7);
}

// The wgmma layout of a [64][D] K or V tile: D / 64 column blocks of [64 rows][64 elements],
// each row 128 bytes with the hardware's 128-byte swizzle (16-byte chunk ^= row % 8), so one
// descriptor walks K as a K-major and V as an MN-major operand.
template <int D>
__device__ __forceinline__ int swz128(int row, int col) {
  return (col >> 6) * (64 * 64) + row * 64 + ((((col & 63) >> 3) ^ (row & 7)) << 3) + (col & 7);
}

template <bool kWgmma, int D>
__device__ __forceinline__ int kv_offset(int row, int col) {
  if constexpr (kWgmma)
    return swz128<D>(row, col);
  else
    return swz<D>(row, col);
}

// Q rows [row_begin, row_begin + tile_rows) of the packed tile (row = node * group + head in
// the group) -> bf16 / fp16 in shared memory, swizzled for ldmatrix. Each thread owns one
// 16-byte chunk column; all its global loads are issued before the first store.
template <typename IoT, typename KvT, int D>
__device__ __forceinline__ void stage_q_tile(const PagedTreeAttentionParams& p, KvT* qs,
                                             int tile_rows, int row_begin, int total_rows,
                                             int group, int q0, int kvh, int tid) {
  constexpr int kChunks = D / 8;
  constexpr int kStep = kAttnThreads / kChunks;
  constexpr int kIters = kAttnMaxRowsPerTile / kStep;
  constexpr int kWords = sizeof(IoT) * 8 / 16;  // 16-byte words per 8 elements: 2 (fp32) or 1
  const int chunk = tid % kChunks;
  const int i0 = tid / kChunks;
  uint4 raw[kIters][kWords];
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int i = i0 + k * kStep;
    const int prow = row_begin + i;
#pragma unroll
    for (int w = 0; w < kWords; ++w) raw[k][w] = make_uint4(0u, 0u, 0u, 0u);
    if (i < tile_rows && prow < total_rows) {
      const int t = prow / group;
      const int h = kvh * group + prow % group;
      const uint4* src = reinterpret_cast<const uint4*>(
          static_cast<const IoT*>(p.q) + (static_cast<int64_t>(q0 + t) * p.num_q_heads + h) * D +
          chunk * 8);
#pragma unroll
      for (int w = 0; w < kWords; ++w) raw[k][w] = src[w];
    }
  }
#pragma unroll
  for (int k = 0; k < kIters; ++k) {
    const int i = i0 + k * kStep;
    if (i >= tile_rows) continue;
    float v[8];
    if constexpr (std::is_same_v<IoT, float>) {
      const float* f = reinterpret_cast<const float*>(&raw[k][0]);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = f[e];
    } else {
      const IoT* x = reinterpret_cast<const IoT*>(&raw[k][0]);
#pragma unroll
      for (int e = 0; e < 8; ++e) v[e] = to_float(x[e]);
    }
    uint4 packed;
    packed.x = pack2<KvT>(v[0], v[1]);
    packed.y = pack2<KvT>(v[2], v[3]);
    packed.z = pack2<KvT>(v[4], v[5]);
    packed.w = pack2<KvT>(v[6], v[7]);
    *reinterpret_cast<uint4*>(qs + swz<D>(i, chunk * 8)) = packed;
  }
}

// The wgmma A fragments of Q straight from global memory (no shared-memory staging): thread
// `lane` of a warp holds, for each 16-column step kk, rows rows[0] / rows[1] (= rows[0] + 8) at
// columns kk * 16 + 2 * (lane % 4) + {0, 1} and the same + 8, rounded to the cache type as
// stage_q_tile does; rows outside the tile are zero.
template <typename IoT, typename KvT, int D>
__device__ __forceinline__ void load_q_fragments(const PagedTreeAttentionParams& p,
                                                 uint32_t (&qf)[D / 16][4], const int (&rows)[2],
                                                 int row_begin, int tile_rows, int total_rows,
                                                 int group, int q0, int kvh, int lane) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int prow = rows[h];
    const bool valid = prow < total_rows && prow - row_begin < tile_rows;
    const int t = valid ? prow / group : 0;
    const int head = kvh * group + (valid ? prow % group : 0);
    const IoT* src = static_cast<const IoT*>(p.q) +
                     (static_cast<int64_t>(q0 + t) * p.num_q_heads + head) * D + 2 * (lane % 4);
#pragma unroll
    for (int kk = 0; kk < D / 16; ++kk)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        // The pair is one aligned 4-byte (16-bit I/O) or 8-byte (fp32) load; I/O of the cache's
        // own type is already the packed fragment.
        if constexpr (std::is_same_v<IoT, KvT>) {
          qf[kk][h + 2 * c] =
              valid ? *reinterpret_cast<const uint32_t*>(src + kk * 16 + c * 8) : 0u;
        } else if constexpr (std::is_same_v<IoT, float>) {
          const float2 v = valid ? *reinterpret_cast<const float2*>(src + kk * 16 + c * 8)
                                 : make_float2(0.f, 0.f);
          qf[kk][h + 2 * c] = pack2<KvT>(v.x, v.y);
        } else {
          float a = 0.f, b = 0.f;
          if (valid) {
            a = to_float(src[kk * 16 + c * 8]);
            b = to_float(src[kk * 16 + c * 8 + 1]);
          }
          qf[kk][h + 2 * c] = pack2<KvT>(a, b);
        }
      }
  }
}

// Two adjacent output elements (d even) of a tensor whose type is known at run time.
__device__ __forceinline__ void store_pair(void* out, ElemType t, int64_t i, float a, float b) {
  if (t == ElemType::kBF16)
    *reinterpret_cast<__nv_bfloat162*>(static_cast<__nv_bfloat16*>(out) + i) =
        __floats2bfloat162_rn(a, b);
  else if (t == ElemType::kF16)
    *reinterpret_cast<__half2*>(static_cast<__half*>(out) + i) = __floats2half2_rn(a, b);
  else
    *reinterpret_cast<float2*>(static_cast<float*>(out) + i) = make_float2(a, b);
}

}  // namespace arbor::kernels::detail
