// Internal to kernels/attention: the per-path launchers behind launch_paged_tree_attention and
// the mask helpers the paths share.
#pragma once

#include <cstdint>

#include "kernels/attention/paged_tree_attention.h"

namespace arbor::kernels::detail {

cudaError_t launch_tree_attention_mma(const PagedTreeAttentionParams& p, cudaStream_t stream);
cudaError_t launch_tree_attention_generic(const PagedTreeAttentionParams& p, cudaStream_t stream);
cudaError_t launch_attention_merge(const PagedTreeAttentionParams& p, cudaStream_t stream);

// Bits [lo, hi) of a 64-bit word (clamped to [0, 64)).
__device__ __forceinline__ uint64_t bit_range(int lo, int hi) {
  lo = lo < 0 ? 0 : lo;
  hi = hi > 64 ? 64 : hi;
  if (hi <= lo) return 0;
  const uint64_t upto_hi = hi == 64 ? ~0ull : ((1ull << hi) - 1);
  const uint64_t below_lo = lo == 0 ? 0ull : ((1ull << lo) - 1);
  return upto_hi & ~below_lo;
}

// Bits [start, start + 64) of a packed mask row of `words` words (bits outside the row read 0).
__device__ __forceinline__ uint64_t mask_window(const uint32_t* row, int words, int start) {
  const int w0 = start >= 0 ? start / 32 : -((-start + 31) / 32);
  const int shift = start - w0 * 32;  // 0..31
  auto get = [&](int w) -> uint64_t { return (w >= 0 && w < words) ? row[w] : 0u; };
  const uint64_t lo = get(w0) | (get(w0 + 1) << 32);
  const uint64_t hi = get(w0 + 2);
  return (lo >> shift) | (shift != 0 ? (hi << (64 - shift)) : 0ull);
}

// Visibility of logical keys [n0, n0 + 64) for query node `node` of a request: bit c set iff
// key n0 + c is visible (committed prefix, or the node's causal / ancestor-mask bit) and
// n0 + c < kv_end.
__device__ __forceinline__ uint64_t tile_visibility(int n0, int kv_end, int committed, int tree_len,
                                                    int node, bool causal, const uint32_t* mask,
                                                    int words) {
  uint64_t vis = bit_range(0, committed - n0);  // prefix columns
  const int b0 = n0 - committed;                // tree bit of column 0
  if (causal) {
    vis |= bit_range(-b0, node - b0 + 1);
  } else {
    vis |= mask_window(mask + static_cast<int64_t>(node) * words, words, b0) &
           bit_range(-b0, tree_len - b0);
  }
  return vis & bit_range(0, kv_end - n0);
}

}  // namespace arbor::kernels::detail
