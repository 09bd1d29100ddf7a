// The online softmax of one 64-key tile on the tensor-core attention path: the mask of the
// tile's invisible keys, the lazy reference max, the exponentials, the running sums, the O
// rescale and P packed as the next MMA's A fragments. Each row's arithmetic and its order are
// fixed (batch invariance: docs/kernels.md). Internal to kernels/attention
// (paged_tree_attention_mma.cu).
#pragma once

#include <cstdint>

#include "kernels/attention/attention_internal.cuh"
#include "kernels/common/device_utils.cuh"

namespace arbor::kernels::detail {

// 2^x on the SFU (2 ulp; 2^-inf = 0), without exp2f's range fix-ups.
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
}

// Online-softmax state update for one 64-key tile whose raw scores (q.k, unscaled) are in
// s (this warp's columns): masks invisible keys when the tile reaches the tree's own keys or the
// split's end, updates the running max / sum of the thread's two rows, leaves P = 2^(s*scale -
// m) in s and in alpha the factor by which O must be rescaled (rescale_o) before this tile's PV.
// Returns false when the warp's alphas are all 1 (kQuadVote's usual case: no rescale needed);
// without kQuadVote always true (the caller's rescale_o votes).
template <bool kQuadVote>
__device__ __forceinline__ bool softmax_tile(float (&s)[8][4], float (&alpha)[2], float (&m_run)[2],
                                             float (&l_run)[2], int warp_ntiles, int col0, int lane,
                                             bool need_mask, int n0, int kv_end, int committed,
                                             int tree_len, bool causal, const uint32_t* mask,
                                             int words, const int (&rows)[2], int total_rows,
                                             int group, float scale_log2, int job_node,
                                             int job_end) {
  // The thread's two rows go through each phase together (their reductions, shuffles and
  // exponentials are independent), so one row's latency hides behind the other's work; each
  // row's own arithmetic and its order are those of a row processed alone.
  if (need_mask) {  // warp-uniform: prefix tiles skip this entirely
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // A tree-group node job: only that node's rows see its keys (all below its end); the
      // others see nothing, an exact no-op of their state.
      const uint64_t vis = rows[h] >= total_rows ? 0ull
                           : job_node >= 0
                               ? (rows[h] / group == job_node ? bit_range(0, job_end - n0) : 0ull)
                               : tile_visibility(n0, kv_end, committed, tree_len, rows[h] / group,
                                                 causal, mask, words);
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) {
        if (nt < warp_ntiles) {
#pragma unroll
          for (int e = 0; e < 2; ++e) {
            const int c = col0 + nt * 8 + (lane % 4) * 2 + e;
            if (!((vis >> c) & 1ull)) s[nt][2 * h + e] = -INFINITY;
          }
        }
      }
    }
  }
  // Row max and sum as balanced trees (dependency depth 4 instead of chains of 16 / 32).
  float part[2][8];
#pragma unroll
  for (int h = 0; h < 2; ++h)
#pragma unroll
    for (int nt = 0; nt < 8; ++nt)
      part[h][nt] = nt < warp_ntiles ? fmaxf(s[nt][2 * h], s[nt][2 * h + 1]) : -INFINITY;
#pragma unroll
  for (int w = 4; w >= 1; w /= 2)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int nt = 0; nt < w; ++nt) part[h][nt] = fmaxf(part[h][nt], part[h][nt + w]);
  // The lazy reference max (below) moves only when a row's tile max exceeds it by more than 8.
  // kQuadVote: each thread's part of its rows decides that without the quad's shuffles. When
  // no thread of the warp has a score past its row's threshold (the usual case), no row max is
  // past it either (rounding is monotonic, so the largest scaled part is the scaled row max),
  // and the reference stays, as the full rule below would decide: the same bits, 1.5-3% faster
  // on the wgmma path (docs/kernel_notes.md "Tile loop"). The mma.sync kernels keep
  // the plain rule (there the branch made ptxas spill in the KV loop).
  float m_use[2];
  const bool past = !kQuadVote || part[0][0] * scale_log2 > m_run[0] + 8.f ||
                    part[1][0] * scale_log2 > m_run[1] + 8.f;
  const bool moved = !kQuadVote || __any_sync(0xffffffffu, past);
  if (moved) {
    float mx[2] = {part[0][0], part[1][0]};
#pragma unroll
    for (int d = 1; d <= 2; d *= 2) {
      const float o0 = __shfl_xor_sync(0xffffffffu, mx[0], d);
      const float o1 = __shfl_xor_sync(0xffffffffu, mx[1], d);
      mx[0] = fmaxf(mx[0], o0);
      mx[1] = fmaxf(mx[1], o1);
    }
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      // Reference max in the scaled (log2) domain (scale > 0 keeps the order of raw scores),
      // lazy as in FlashAttention-4: it moves only when the tile's max exceeds it by more than
      // 8 (a factor 2^8), so P <= 256 and O is rarely rescaled. The rule depends on the row's
      // own scores only, so a row's result stays independent of the batch around it.
      const float m_tile = mx[h] * scale_log2;
      const float m_new = m_tile > m_run[h] + 8.f ? m_tile : m_run[h];
      m_use[h] = m_new == -INFINITY ? 0.f : m_new;
      // A row whose max did not move keeps alpha = 1 (exp2(0) for a finite max; a row that has
      // seen no visible key yet has O = 0 and l = 0, for which 1 is as exact as 0), so warps of
      // padding rows do not vote for a rescale on every tile.
      alpha[h] = m_new == m_run[h] ? 1.f : fast_exp2(m_run[h] - m_use[h]);
      m_run[h] = m_new;
    }
  } else {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      m_use[h] = m_run[h] == -INFINITY ? 0.f : m_run[h];
      alpha[h] = 1.f;
    }
  }
#pragma unroll
  for (int nt = 0; nt < 8; ++nt) {
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      if (nt < warp_ntiles) {
#pragma unroll
        for (int e = 0; e < 2; ++e)
          s[nt][2 * h + e] = fast_exp2(fmaf(s[nt][2 * h + e], scale_log2, -m_use[h]));
        part[h][nt] = s[nt][2 * h] + s[nt][2 * h + 1];
      } else {
        part[h][nt] = 0.f;
      }
    }
  }
#pragma unroll
  for (int w = 4; w >= 1; w /= 2)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int nt = 0; nt < w; ++nt) part[h][nt] += part[h][nt + w];
#pragma unroll
  for (int h = 0; h < 2; ++h) l_run[h] = l_run[h] * alpha[h] + part[h][0];
  return moved;
}

// O *= alpha per row, after softmax_tile. One vote for both rows: multiplying a row whose max
// did not move by alpha = 1 is exact, so a warp whose rows all kept their max skips it.
template <int D>
__device__ __forceinline__ void rescale_o(float (&o)[D / 8][4], const float (&alpha)[2]) {
  if (__any_sync(0xffffffffu, alpha[0] != 1.f || alpha[1] != 1.f)) {
#pragma unroll
    for (int dt = 0; dt < D / 8; ++dt) {
      o[dt][0] *= alpha[0];
      o[dt][1] *= alpha[0];
      o[dt][2] *= alpha[1];
      o[dt][3] *= alpha[1];
    }
  }
}

// P (the S accumulators of 16 keys) as an m16n8k16 / wgmma A fragment.
template <typename KvT>
__device__ __forceinline__ void p_fragment(const float (&s)[8][4], int ks16, uint32_t (&a)[4]) {
  a[0] = pack2<KvT>(s[2 * ks16][0], s[2 * ks16][1]);
  a[1] = pack2<KvT>(s[2 * ks16][2], s[2 * ks16][3]);
  a[2] = pack2<KvT>(s[2 * ks16 + 1][0], s[2 * ks16 + 1][1]);
  a[3] = pack2<KvT>(s[2 * ks16 + 1][2], s[2 * ks16 + 1][3]);
}

}  // namespace arbor::kernels::detail
