// Dispatch of paged tree attention, the generic path (any even head_dim up to 256: one warp per
// (query row, query head), fp32 math, correct rather than fast; stories260K's head_dim 8 and
// the test models' 16 use it), and the split-KV merge (log-sum-exp weighted sum of partials).
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>

#include "kernels/attention/attention_internal.cuh"
#include "kernels/common/device_utils.cuh"
#include "kernels/common/pdl_launch.cuh"
#include "kernels/common/wgmma.cuh"

namespace arbor::kernels {

namespace detail {

namespace {

constexpr int kGenericWarps = 4;
constexpr int kMaxDimsPerLane = kAttnMaxGenericHeadDim / 32;
constexpr float kLog2e = 1.4426950408889634f;

template <typename KvT>
__global__ void __launch_bounds__(kGenericWarps * 32)
    tree_attention_generic_kernel(const PagedTreeAttentionParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  __shared__ float q_smem[kGenericWarps][kAttnMaxGenericHeadDim];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * kGenericWarps + warp;
  if (unit >= static_cast<int64_t>(p.num_tokens) * p.num_q_heads) return;
  const int n = static_cast<int>(unit / p.num_q_heads);
  const int h = static_cast<int>(unit % p.num_q_heads);
  const int D = p.head_dim;
  const int r = p.token_request[n];
  const int q0 = p.qo_indptr[r];
  const int node = n - q0;
  const int tree_len = p.qo_indptr[r + 1] - q0;
  const int committed = p.committed_len[r];
  const int kv_len = committed + tree_len;
  const bool causal = p.mask_indptr[r] == p.mask_indptr[r + 1];
  const int words = (tree_len + 31) / 32;
  const uint32_t* mask_row = p.tree_mask + p.mask_indptr[r] + static_cast<int64_t>(node) * words;
  const int kvh = h / (p.num_q_heads / p.num_kv_heads);
  const int table_row = p.table_request != nullptr ? p.table_request[r] : r;
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(table_row) * p.max_blocks_per_request;
  const int path_base = p.path != nullptr ? p.path_base[r] : INT_MAX;
  const int32_t* path = p.path != nullptr ? p.path + p.path_indptr[r] : nullptr;
  const KvT* k_cache = static_cast<const KvT*>(p.k_cache);
  const KvT* v_cache = static_cast<const KvT*>(p.v_cache);
  const float scale_log2 = p.sm_scale * kLog2e;

  float* q = q_smem[warp];
  const int64_t q_base = (static_cast<int64_t>(n) * p.num_q_heads + h) * D;
  for (int d = lane; d < D; d += 32) q[d] = load_elem(p.q, p.io_type, q_base + d) * scale_log2;
  __syncwarp();

  float o[kMaxDimsPerLane];
#pragma unroll
  for (int k = 0; k < kMaxDimsPerLane; ++k) o[k] = 0.f;
  float m_run = -INFINITY, l_run = 0.f;
  for (int j0 = 0; j0 < kv_len; j0 += 32) {
    const int j = j0 + lane;
    float score = -INFINITY;
    int64_t row = 0;  // element offset of this key's head slice
    if (j < kv_len) {
      const int b = j - committed;
      const bool visible = b < 0 || (causal ? b <= node : ((mask_row[b / 32] >> (b % 32)) & 1u));
      const int jk = j >= path_base ? path_base + path[j - path_base] : j;  // batch-invariant
      row = ((static_cast<int64_t>(table[jk / p.block_size]) * p.block_size + jk % p.block_size) *
                 p.num_kv_heads +
             kvh) *
            D;
      if (visible) {
        float acc = 0.f;
        for (int d = 0; d < D; ++d) acc += q[d] * to_float(k_cache[row + d]);
        score = acc;
      }
    }
    const float mx = warp_max(score);
    const float m_new = fmaxf(m_run, mx);
    const float m_use = m_new == -INFINITY ? 0.f : m_new;
    const float alpha = exp2f(m_run - m_use);
    const float pr = exp2f(score - m_use);
    l_run = l_run * alpha + warp_sum(pr);
    m_run = m_new;
#pragma unroll
    for (int k = 0; k < kMaxDimsPerLane; ++k) o[k] *= alpha;
    const int in_chunk = min(32, kv_len - j0);
    for (int kk = 0; kk < in_chunk; ++kk) {
      const float pk = __shfl_sync(0xffffffffu, pr, kk);
      const int64_t rk = __shfl_sync(0xffffffffu, row, kk);
      if (pk == 0.f) continue;
#pragma unroll
      for (int k = 0; k < kMaxDimsPerLane; ++k) {
        const int d = lane + 32 * k;
        if (d < D) o[k] += pk * to_float(v_cache[rk + d]);
      }
    }
  }
  const float inv = l_run > 0.f ? 1.f / l_run : 0.f;
#pragma unroll
  for (int k = 0; k < kMaxDimsPerLane; ++k) {
    const int d = lane + 32 * k;
    if (d < D) {
      store_elem(p.out, p.io_type, q_base + d, o[k] * inv);
      if (p.out_bf16 != nullptr) store_elem(p.out_bf16, ElemType::kBF16, q_base + d, o[k] * inv);
    }
  }
}

// out[n, h] = sum_s 2^(lse_s - M) O_s / sum_s 2^(lse_s - M) over the splits of n's request.
// One warp per (row, head): the lanes reduce over the splits (max, then weights into shared
// memory), then over head_dim, the loads of several splits issued before their sums. kBatch 8:
// 56 registers, so one wave of merge CTAs covers the many rows of a batched launch; 16 (launches
// with more than 8 splits, which have few rows): LSEs loaded once and 16 partial loads in
// flight, fewer round trips at ~170 registers. Per element the same sum in the same split order
// for either kBatch, so the bits do not depend on the launch.
// Launched as a programmatic dependent of the attention kernel (sm_90): its CTAs may start
// while the attention CTAs still run, read the step metadata (written before the attention
// launch; all of it before the wait, so after it only the LSEs and then the partials are
// dependent round trips), and wait for the attention grid's completion before reading the
// partials. Every thread waits, also those with nothing to merge: a grid that completed without
// waiting would let the kernel after it (which waits only for this grid) run before the
// attention finished. It triggers its own dependent (the o projection) at entry, so that GEMM's
// CTAs become resident and request their first weights while the attention and the merge run,
// as they already do after a split-free attention (which triggers at entry too). That is safe
// for every kernel that can follow: before its wait a kernel of this repo reads only what was
// written before the attention launched (weights, step metadata), and its wait returns only once
// this grid, and with it the attention, has completed.
template <int kBatch>
__global__ void __launch_bounds__(128) attention_merge_kernel(const PagedTreeAttentionParams p) {
  trigger_dependent_launch();
  __shared__ float weights[4][kAttnMaxSplits];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int64_t unit = static_cast<int64_t>(blockIdx.x) * 4 + warp;
  const bool in_range = unit < static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
  const int n = in_range ? static_cast<int>(unit / p.num_q_heads) : 0;
  const int h = in_range ? static_cast<int>(unit % p.num_q_heads) : 0;
  const int r = in_range ? p.token_request[n] : 0;
  const int splits = in_range ? p.request_splits[r] : 0;
  const int q0 = splits > 1 ? p.qo_indptr[r] : 0;
  const int q1 = splits > 1 ? p.qo_indptr[r + 1] : 0;
  const int partial_row = splits > 1 ? p.request_partial_row[r] : 0;
  grid_dependency_wait();  // the attention grid's partials and LSEs are complete from here
  if (!in_range || splits <= 1) return;  // split-free rows: written by the attention kernel
  const int tree_len = q1 - q0;
  const int D = p.head_dim;
  const int64_t first = static_cast<int64_t>(partial_row) + (n - q0);
  const int64_t row_stride = static_cast<int64_t>(tree_len) * p.num_q_heads;  // between splits
  const float* lse = p.partial_lse + first * p.num_q_heads + h;
  // kBatch 16: each lane's LSEs (splits lane, lane + 32, ...) loaded once, all in flight; 8: a
  // max pass and a weight pass (the second from L1), fewer registers.
  constexpr int kLsePerLane = kBatch == 16 ? kAttnMaxSplits / 32 : 1;
  float lv[kLsePerLane];
  float mx = -INFINITY;
  if constexpr (kBatch == 16) {
#pragma unroll
    for (int k = 0; k < kLsePerLane; ++k) {
      const int s = lane + 32 * k;
      lv[k] = s < splits ? lse[s * row_stride] : -INFINITY;
      mx = fmaxf(mx, lv[k]);
    }
  } else {
    for (int s = lane; s < splits; s += 32) mx = fmaxf(mx, lse[s * row_stride]);
  }
  mx = warp_max(mx);
  const float m_use = mx == -INFINITY ? 0.f : mx;
  float total = 0.f;
  if constexpr (kBatch == 16) {
#pragma unroll
    for (int k = 0; k < kLsePerLane; ++k) {
      const int s = lane + 32 * k;
      if (s < splits) {
        const float w = exp2f(lv[k] - m_use);
        weights[warp][s] = w;
        total += w;
      }
    }
  } else {
    for (int s = lane; s < splits; s += 32) {
      const float w = exp2f(lse[s * row_stride] - m_use);
      weights[warp][s] = w;
      total += w;
    }
  }
  total = warp_sum(total);
  __syncwarp();
  const float inv = total > 0.f ? 1.f / total : 0.f;
  const float* part = p.partial_out + (first * p.num_q_heads + h) * D;
  const int64_t part_stride = row_stride * D;
  const int64_t out_base = (static_cast<int64_t>(n) * p.num_q_heads + h) * D;
  if (D % 4 == 0) {
    // Four dims per lane with 16-byte loads (partial rows are 16-byte aligned when D % 4 == 0).
    for (int d = 4 * lane; d < D; d += 128) {
      float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
      if constexpr (kBatch == 16) {  // kBatch loads in flight, then their sums in split order
        for (int s0 = 0; s0 < splits; s0 += kBatch) {
          float4 v[kBatch];
#pragma unroll
          for (int k = 0; k < kBatch; ++k)
            if (s0 + k < splits)
              v[k] = *reinterpret_cast<const float4*>(part + (s0 + k) * part_stride + d);
#pragma unroll
          for (int k = 0; k < kBatch; ++k) {
            if (s0 + k < splits) {
              const float ws = weights[warp][s0 + k];
              acc.x += ws * v[k].x;
              acc.y += ws * v[k].y;
              acc.z += ws * v[k].z;
              acc.w += ws * v[k].w;
            }
          }
        }
      } else {
#pragma unroll 8
        for (int s = 0; s < splits; ++s) {
          const float ws = weights[warp][s];
          const float4 v = *reinterpret_cast<const float4*>(part + s * part_stride + d);
          acc.x += ws * v.x;
          acc.y += ws * v.y;
          acc.z += ws * v.z;
          acc.w += ws * v.w;
        }
      }
      const float r[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        store_elem(p.out, p.io_type, out_base + d + e, r[e]);
        if (p.out_bf16 != nullptr) store_elem(p.out_bf16, ElemType::kBF16, out_base + d + e, r[e]);
      }
    }
    return;
  }
  for (int d = lane; d < D; d += 32) {
    float acc = 0.f;
#pragma unroll 8
    for (int s = 0; s < splits; ++s) acc += weights[warp][s] * part[s * part_stride + d];
    store_elem(p.out, p.io_type, out_base + d, acc * inv);
    if (p.out_bf16 != nullptr) store_elem(p.out_bf16, ElemType::kBF16, out_base + d, acc * inv);
  }
}

}  // namespace

cudaError_t launch_tree_attention_generic(const PagedTreeAttentionParams& p, cudaStream_t stream) {
  const int64_t units = static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
  if (units == 0) return cudaSuccess;
  const unsigned blocks = static_cast<unsigned>((units + kGenericWarps - 1) / kGenericWarps);
  if (p.kv_type == ElemType::kBF16)
    return launch_pdl(tree_attention_generic_kernel<__nv_bfloat16>, dim3(blocks),
                      dim3(kGenericWarps * 32), 0, stream, p);
  return launch_pdl(tree_attention_generic_kernel<__half>, dim3(blocks), dim3(kGenericWarps * 32),
                    0, stream, p);
}

cudaError_t launch_attention_merge(const PagedTreeAttentionParams& p, cudaStream_t stream) {
  const int64_t units = static_cast<int64_t>(p.num_tokens) * p.num_q_heads;
  if (units == 0) return cudaSuccess;
  // A programmatic dependent of the attention kernel: its launch and metadata loads overlap
  // the attention's tail; its grid_dependency_wait() orders the partial reads.
  const dim3 grid(static_cast<unsigned>((units + 3) / 4));
  if (p.max_splits > 8)
    return launch_pdl(attention_merge_kernel<16>, grid, dim3(128), 0, stream, p);
  return launch_pdl(attention_merge_kernel<8>, grid, dim3(128), 0, stream, p);
}

__global__ void wgmma_probe_kernel(int* out) {
  *out = ARBOR_HAS_WGMMA;
}

}  // namespace detail

cudaError_t attention_wgmma_available(bool* available) {
  *available = false;
  int* flag = nullptr;
  cudaError_t e = cudaMalloc(&flag, sizeof(int));
  if (e != cudaSuccess) return e;
  detail::wgmma_probe_kernel<<<1, 1>>>(flag);
  int host = 0;
  e = cudaGetLastError();
  if (e == cudaSuccess) e = cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost);
  cudaFree(flag);
  *available = host == 1;
  return e;
}

cudaError_t launch_paged_tree_attention(const PagedTreeAttentionParams& p, cudaStream_t stream) {
  if (p.kv_type != ElemType::kBF16 && p.kv_type != ElemType::kF16) return cudaErrorInvalidValue;
  if (!p.tensor_core) return detail::launch_tree_attention_generic(p, stream);
  cudaError_t e = detail::launch_tree_attention_mma(p, stream);
  if (e != cudaSuccess || !p.needs_merge) return e;
  return detail::launch_attention_merge(p, stream);
}

}  // namespace arbor::kernels
