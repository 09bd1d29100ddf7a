// Paged tree attention over a flat batch of requests (DESIGN.md "The paged tree-attention
// kernel"): one launch scores every request's query rows (plain decode, causal prefill chunks,
// speculation trees with packed ancestor masks) against its paged KV prefix plus its own new
// tokens. Plain C++ interface: a host-built plan (work list, split-KV choice) and POD params.
//
// Semantics (identical to the CPU reference, engine/backend/cpu): request r owns query rows
// [qo_indptr[r], qo_indptr[r+1]) (T_r rows). Its keys are logical indices [0, committed_len[r]
// + T_r); index j lives in slot block_tables[r][j / block_size] * block_size + j % block_size.
// Every row sees the committed prefix; row i sees new token t iff bit t of its packed mask row
// is set, or t <= i when the request has no mask words (causal).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>
#include <vector>

#include "kernels/common/kernel_types.h"

namespace arbor::kernels {

// Tile geometry of the tensor-core path: a work unit's query tile is 16 * warps_m packed rows
// (row = node * group + head_in_group); KV tiles are 64 logical keys.
constexpr int kAttnKvTile = 64;
constexpr int kAttnMaxRowsPerTile = 64;
constexpr int kAttnThreads = 128;
constexpr int kAttnMaxGenericHeadDim = 256;
constexpr int kAttnMaxSplits = 256;  // KV splits of one request (the merge kernel's limit)

// One CTA's work: packed query rows [row_begin, row_begin + 16 * warps_m) of (request,
// kv_head), over KV split `split` of the request. request < 0: an empty item (the CTA exits;
// step graphs pad the work list to a bucket so that the grid size stays put).
//
// Tree group (batch-invariant plans only, nodes > 0): virtual requests request .. request +
// nodes - 1 are consecutive nodes of one tree (T = 1 each, one committed prefix); the CTA
// scores all their rows (node * group + head, row_begin 0) for split `split`, reading the
// split's tiles below the prefix end once for all of them (docs/kernels.md).
struct AttentionWorkItem {
  int32_t request;
  int32_t kv_head;
  int32_t row_begin;
  int16_t split;
  int16_t warps_m;  // 1, 2 or 4: warps along rows; the other 4 / warps_m split each KV tile
  int16_t nodes;    // > 0: a tree group of that many nodes
  int16_t reserved;
};
// Tree groups: at most this many nodes, each with at most kAttnMaxGroupTailTiles tiles at or
// past the last tile wholly below the prefix end, so a CTA's job list is bounded.
constexpr int kAttnMaxGroupNodes = 16;
constexpr int kAttnMaxGroupTailTiles = 2;
constexpr int kAttnMaxGroupSplitTiles = 16;  // longest split (in 64-key tiles) a group covers
constexpr int kAttnMaxGroupJobs =
    kAttnMaxGroupSplitTiles + kAttnMaxGroupNodes * kAttnMaxGroupTailTiles;

// Host inputs of the planner.
struct AttentionPlanInputs {
  const int32_t* qo_indptr = nullptr;      // [R + 1] host
  const int32_t* committed_len = nullptr;  // [R] host
  int32_t num_requests = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t num_sms = 132;
  int32_t ctas_per_sm = 0;   // resident CTAs per SM of the tensor-core kernel (0: its own)
  int32_t max_splits = 0;    // 0: chosen from the shape; 1 disables split-KV; > 1 caps it
  int32_t fixed_splits = 0;  // > 0: every request in that many splits (at most one per KV tile;
                             // benchmarks sweep it; not with batch_invariant)
  bool wgmma = false;        // plan for the wgmma kernel (head_dim 64 / 128: every tile 64 rows)
  // wgmma, head_dim 128: tiles of 128 rows (two consumer warpgroups sharing each K/V tile, one CTA
  // per SM; same bits per row as 64-row tiles; no tree groups then). -1: where the rows fill them
  // (at most 1/8 more padded rows than 64-row tiles) and some CTA runs 16 or more KV tiles (so not
  // in batch-invariant plans with their default 8-tile splits); 0: never; 1: always.
  int32_t wide = -1;
  // Batch-invariant plan (docs/kernels.md "Batch invariance"): every query row's result is a
  // function of its own query and visible keys only. Fixed KV split chunk
  // (kAttnInvariantChunkTiles), fixed warp layout, and each tree node scored as its own T = 1
  // causal "virtual request" over prefix + its ancestor path in depth order (the keys a plain
  // decode of that token would see, in the same logical positions). Needs the masks below.
  bool batch_invariant = false;
  const uint32_t* tree_mask = nullptr;   // [sum_r T_r * ceil(T_r / 32)] host (batch_invariant)
  const int32_t* mask_indptr = nullptr;  // [R + 1] host (batch_invariant)
  int32_t num_tokens = 0;                // sum_r T_r (batch_invariant)
  // Keys per split of a batch-invariant plan in 64-key tiles (0: kAttnInvariantChunkTiles).
  int32_t invariant_chunk_tiles = 0;
  // Batch-invariant plans: score the nodes of a tree in groups that read the prefix once
  // (AttentionWorkItem::nodes) instead of one CTA per node. Same results bit for bit.
  // 0: never; 1: groups only as large as keeps the GPU filled; 2: always the largest groups.
  int32_t tree_groups = 1;
};

// Keys per KV split in a batch-invariant plan, in 64-key tiles: the split boundaries are the
// same for every row at every batch shape (doubled only past kAttnMaxSplits splits, i.e. past
// 128 Ki keys, where invariance between different context lengths is no longer promised).
constexpr int32_t kAttnInvariantChunkTiles = 8;

// Batch-invariant plans score the step's rows as "virtual requests": a causal request as
// itself, each node of a tree request as a T = 1 causal request whose keys are the real
// request's committed prefix followed by the node's visible tree keys (its ancestor path, in
// index order, itself last), read through `key_path`. The kernel then sees every request as
// causal; `table_request` maps a virtual request to the real request's block-table row.
struct AttentionVirtualRequests {
  std::vector<int32_t> qo_indptr;      // [V + 1] token rows of each virtual request
  std::vector<int32_t> committed_len;  // [V] keys before the virtual request's own row(s)
  std::vector<int32_t> mask_indptr;    // [V + 1] all zero (every virtual request is causal)
  std::vector<int32_t> table_request;  // [V] real request (block-table row)
  std::vector<int32_t> path_base;      // [V] logical key where the path remap starts (real
                                       // committed_len; INT32_MAX for causal requests)
  std::vector<int32_t> path_indptr;    // [V + 1] into path
  std::vector<int32_t> path;           // tree-node indices: key path_base + k reads node path[k]
  std::vector<int32_t> token_request;  // [num_tokens] virtual request of each row
};

// The host-built launch plan: the work list, per-request KV splits and where split partials go.
struct AttentionPlan {
  bool tensor_core = false;                  // head_dim 64/128 path; else the generic path
  bool wgmma = false;                        // tensor-core path through wgmma (sm_90a)
  bool wide = false;                         // wgmma with 128-row tiles (AttentionPlanInputs)
  std::vector<AttentionWorkItem> work;       // [W] (tensor-core path only)
  std::vector<int32_t> request_splits;       // [R] KV splits of each request (>= 1)
  std::vector<int32_t> request_kv_chunk;     // [R] keys per split (multiple of kAttnKvTile)
  std::vector<int32_t> request_partial_row;  // [R] first partial row of the request
  int64_t num_partial_rows = 0;              // sum over split requests of splits * T_r
  bool needs_merge = false;                  // some request has > 1 split
  int32_t max_splits_used = 1;
  int32_t tree_group_items = 0;   // work items that are tree groups (AttentionWorkItem::nodes)
  bool batch_invariant = false;   // planned over `virt` (the launch must use its arrays)
  AttentionVirtualRequests virt;  // batch-invariant plans only
};

// Returns "" when (head_dim, group) is supported, else the reason (for the caller's error).
std::string attention_unsupported_reason(int32_t num_q_heads, int32_t num_kv_heads,
                                         int32_t head_dim);

// Builds the work list: rows are packed per (request, kv head) and cut into tiles of 16, 32 or
// 64 rows (smallest that holds the request's rows, so decode rows are not padded to 64); KV is
// split when the units do not fill num_sms * ctas_per_sm CTAs (see docs/kernels.md).
AttentionPlan plan_paged_tree_attention(const AttentionPlanInputs& in);

struct PagedTreeAttentionParams {
  // Tensors (device).
  const void* q = nullptr;  // [num_tokens, num_q_heads * head_dim] io_type
  void* out = nullptr;      // [num_tokens, num_q_heads * head_dim] io_type
  // Optional bf16 copy of out (same layout, round to nearest): the o-projection's GEMM input.
  void* out_bf16 = nullptr;
  const void* k_cache = nullptr;  // [num_blocks, block_size, num_kv_heads, head_dim] kv_type
  const void* v_cache = nullptr;  // same
  ElemType io_type = ElemType::kF32;
  ElemType kv_type = ElemType::kBF16;  // kBF16 or kF16
  // Step metadata (device).
  const int32_t* qo_indptr = nullptr;      // [R + 1]
  const int32_t* committed_len = nullptr;  // [R]
  const int32_t* block_tables = nullptr;   // [R, max_blocks_per_request]
  const uint32_t* tree_mask = nullptr;     // packed rows, [sum_r T_r * ceil(T_r / 32)]
  const int32_t* mask_indptr = nullptr;    // [R + 1]
  const int32_t* token_request = nullptr;  // [num_tokens] request of each row (merge kernel)
  int32_t max_blocks_per_request = 0;
  // Batch-invariant plans (AttentionVirtualRequests; the arrays above are then the virtual
  // ones): block-table row and key-path remap of each request. nullptr: identity / no remap.
  const int32_t* table_request = nullptr;  // [R]
  const int32_t* path_base = nullptr;      // [R]
  const int32_t* path_indptr = nullptr;    // [R + 1]
  const int32_t* path = nullptr;           // [path_indptr[R]]
  int32_t num_requests = 0;
  int32_t num_tokens = 0;
  int32_t num_q_heads = 0;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t block_size = 0;
  float sm_scale = 0.f;  // usually 1 / sqrt(head_dim)
  // Plan (device copies of AttentionPlan's arrays).
  bool tensor_core = false;
  bool wgmma = false;  // the plan's choice; only on sm_90a (attention_wgmma_available)
  bool wide = false;   // the plan's choice: 128-row wgmma tiles
  const AttentionWorkItem* work = nullptr;  // [num_work]
  int32_t num_work = 0;
  const int32_t* request_splits = nullptr;       // [R]
  const int32_t* request_kv_chunk = nullptr;     // [R]
  const int32_t* request_partial_row = nullptr;  // [R]
  bool needs_merge = false;
  int32_t max_splits = 0;  // AttentionPlan::max_splits_used (the merge kernel's unroll; 0: small)
  float* partial_out = nullptr;  // [num_partial_rows, num_q_heads, head_dim] fp32
  float* partial_lse = nullptr;  // [num_partial_rows, num_q_heads] fp32, log2 domain
  // Profiling only (attention_bench --phases): when set, thread 0 of each tensor-core CTA
  // writes kAttnPhaseWords words at phase_ns + blockIdx.x * kAttnPhaseWords: %globaltimer at
  // entry, then clock64 at entry, after the prologue (Q in registers, first tiles in flight),
  // after the KV loop and at the end, the SM id, the tile count and %globaltimer at the end.
  unsigned long long* phase_ns = nullptr;
};
inline constexpr int kAttnPhaseWords = 8;

// Launches the attention (and the split merge when the plan has splits) on `stream`. Inputs
// must have been validated by the caller (attention_unsupported_reason, StepInputs); returns
// the launch error.
cudaError_t launch_paged_tree_attention(const PagedTreeAttentionParams& p, cudaStream_t stream);

// Whether this build's kernels carry wgmma code for the current device (sm_90a); runs a
// one-thread probe kernel.
cudaError_t attention_wgmma_available(bool* available);

}  // namespace arbor::kernels
