// Tensor-core path of paged tree attention (head_dim 64 and 128; bf16 or fp16 KV): one CTA
// per work item (request, kv head, query-row tile, KV split), mma.sync m16n8k16 with fp32
// accumulation, online softmax in fp32 (log2 domain), K/V tiles of 64 keys streamed through a
// three-stage cp.async pipeline via the block table; on sm_90a (head_dim 128) warpgroup MMAs fed
// by a producer warpgroup, for one 64-row consumer warpgroup or two ("wide" 128-row CTAs, a
// six-stage ring, ping-ponged MMAs). See docs/kernels.md.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <climits>
#include <type_traits>

#include "kernels/attention/attention_internal.cuh"
#include "kernels/attention/attention_softmax.cuh"
#include "kernels/attention/attention_tile_io.cuh"
#include "kernels/common/device_utils.cuh"
#include "kernels/common/pdl_launch.cuh"
#include "kernels/common/wgmma.cuh"

namespace arbor::kernels::detail {

namespace {

constexpr int kTileN = kAttnKvTile;  // keys per KV tile
constexpr int kStages = 3;  // K/V tile stages (mma.sync: two loading while one is used; wgmma:
                            // S(t + 1) and PV(t) read two while the producer fills the third)
// Wide wgmma CTAs (128 rows: two consumer warpgroups sharing one producer, one CTA per SM): K/V
// stages of the ring (six, plus the two consumers' 16 KiB output tiles, fill the SM's shared
// memory; four measured the same).
constexpr int kStagesWide = 6;
constexpr int kWarps = kAttnThreads / 32;
// wgmma path: register budgets of the producer and consumer warpgroups (setmaxnreg). Narrow:
// two CTAs of 2 x 128 threads per SM launch with 128 registers per thread; wide: one CTA of
// 3 x 128 threads with 168. The budgets redistribute them.
constexpr int kProducerRegs = 24;
template <int kConsumers>
constexpr int kConsumerRegs = kConsumers == 2 ? 240 : 232;
template <bool kWgmma, int kConsumers>
constexpr int kStagesOf = kWgmma&& kConsumers == 2 ? kStagesWide : kStages;
// Shared memory of a CTA (after its 1024-byte alignment): the K and V stage rings, then (wide
// CTAs) each consumer's 16-bit [64][D] output tile for the staged epilogue.
template <typename KvT, int D, bool kWgmma, int kConsumers>
constexpr int kRingBytes = 2 * kStagesOf<kWgmma, kConsumers>* kTileN* D * sizeof(KvT);
template <int D>
constexpr int kOutTileBytes = 64 * D * 2;
constexpr float kLog2e = 1.4426950408889634f;

// m64nNk16 wgmma for the cache's element type.
template <typename KvT, int kTransB, int N>
__device__ __forceinline__ void wgmma_mma(float (&d)[N][4], const uint32_t (&a)[4], uint64_t desc,
                                          int scale_d) {
  constexpr bool kBf16 = std::is_same_v<KvT, __nv_bfloat16>;
  if constexpr (N == 8) {
    if constexpr (kBf16)
      wgmma_m64n64k16_bf16<kTransB>(d, a, desc, scale_d);
    else
      wgmma_m64n64k16_f16<kTransB>(d, a, desc, scale_d);
  } else {
    static_assert(N == 16);
    if constexpr (kBf16)
      wgmma_m64n128k16_bf16<kTransB>(d, a, desc, scale_d);
    else
      wgmma_m64n128k16_f16<kTransB>(d, a, desc, scale_d);
  }
}

// This CTA's profiling words (PagedTreeAttentionParams::phase_ns), for thread 0 only; looked up
// at each stamp so no register holds the pointer across the KV loop.
__device__ __forceinline__ unsigned long long* phase_stamps(const PagedTreeAttentionParams& p) {
  return p.phase_ns != nullptr && threadIdx.x == 0 ? p.phase_ns + blockIdx.x * kAttnPhaseWords
                                                   : nullptr;
}

// The CTA's last stamps: its end in cycles and in %globaltimer.
__device__ __forceinline__ void stamp_end(const PagedTreeAttentionParams& p) {
  if (unsigned long long* phase = phase_stamps(p)) {
    phase[4] = clock64();
    phase[7] = global_timer_ns();
  }
}

// kWgmma (head_dim 128): S and PV by warpgroup MMAs (each consumer warpgroup's 4 warps as one
// m64 tile, K/V read from shared memory once per CTA), S(t + 1) and PV(t) in flight while the
// softmax of tile t + 1 runs, and the last warpgroup as the K/V producer; kConsumers = 2 (wide):
// a 128-row tile, consumer c owning rows 64 c.., both reading every K/V tile the producer
// stages once. Else per-warp mma.sync with ldmatrix fragments (any rows-per-tile layout).
// One CTA's work item; kGroup: a tree group (item.nodes > 0), compiled separately so that
// ordinary items carry none of the job-list logic in their tile loop.
template <typename KvT, int D, bool kWgmma, int kConsumers, bool kGroup>
__device__ __forceinline__ void attention_cta(const PagedTreeAttentionParams& p,
                                              const AttentionWorkItem item) {
  static_assert(!kWgmma || D == 128 || D == 64, "the wgmma path is built for head_dim 64 and 128");
  static_assert(kConsumers == 1 || (kWgmma && !kGroup), "wide CTAs: wgmma, ordinary items");
  constexpr int kStages = kStagesOf<kWgmma, kConsumers>;
  extern __shared__ __align__(1024) unsigned char smem_dyn[];
  // 1024-byte aligned base (the swizzle atoms of the wgmma descriptors need it).
  unsigned char* smem_raw = smem_dyn + ((1024 - (smem_addr(smem_dyn) & 1023)) & 1023);
  KvT* k_smem = reinterpret_cast<KvT*>(smem_raw);      // [kStages][kTileN][D]
  KvT* v_smem = k_smem + kStages * kTileN * D;         // [kStages][kTileN][D]
  float* o_smem = reinterpret_cast<float*>(smem_raw);  // [64][D] after the KV loop
  __shared__ float red_m[kWarps][16], red_l[kWarps][16];
  __shared__ float row_m[kAttnMaxRowsPerTile], row_l[kAttnMaxRowsPerTile];

  if (unsigned long long* phase = phase_stamps(p)) {
    phase[0] = global_timer_ns();
    phase[1] = clock64();
    phase[5] = sm_id();
  }
  const int r = item.request;
  const int kvh = item.kv_head;
  const int warps_m = kWgmma ? kWarps : item.warps_m;
  const int warps_n = kWarps / warps_m;
  const int tid = threadIdx.x;
  const int warp = tid / 32, lane = tid % 32;
  const int wm = warp % warps_m, wn = kWgmma ? 0 : warp / warps_m;
  const int consumer = kWgmma ? tid / kAttnThreads : 0;  // (the producer's is kConsumers)
  const int cols_per_warp = kTileN / warps_n;            // 16, 32 or 64
  const int warp_ntiles = cols_per_warp / 8;             // n8 tiles of S per warp: 2, 4 or 8
  const int tile_rows = kWgmma ? 64 * kConsumers : 16 * warps_m;

  // A tree group (batch-invariant plans, item.nodes > 0): virtual requests r .. r + nodes - 1
  // are consecutive nodes of one tree (one query row each, rows packed node * group + head),
  // all over the same committed prefix [0, C). The CTA runs a job list: the split's tiles wholly
  // below C once for every row, then each node's own remaining tiles (its path) with every
  // other node's rows masked out, which leaves their softmax state exactly as it was. Each
  // row therefore sees the tiles, in the order and with the values of its own plain decode.
  const int group_nodes = item.nodes;
  constexpr bool tree_group = kGroup;
  const int q0 = p.qo_indptr[r];
  const int tree_len = tree_group ? group_nodes : p.qo_indptr[r + 1] - q0;
  const int committed = p.committed_len[r];
  const int kv_len = committed + tree_len;
  const int group = p.num_q_heads / p.num_kv_heads;
  const int total_rows = tree_len * group;
  const int splits = p.request_splits[r];
  const int kv_begin = item.split * p.request_kv_chunk[r];
  int kv_end = min(kv_len, kv_begin + p.request_kv_chunk[r]);
  const bool causal = p.mask_indptr[r] == p.mask_indptr[r + 1];
  const int words = (tree_len + 31) / 32;
  const uint32_t* mask = p.tree_mask + p.mask_indptr[r];
  const int row_begin = item.row_begin;
  if (causal) {  // keys after the tile's last node are visible to none of its rows
    const int last_row = min(row_begin + tile_rows, total_rows) - 1;
    kv_end = min(kv_end, committed + last_row / group + 1);
  }
  int num_tiles = kv_end > kv_begin ? (kv_end - kv_begin + kTileN - 1) / kTileN : 0;

  const KvT* k_cache = static_cast<const KvT*>(p.k_cache);
  const KvT* v_cache = static_cast<const KvT*>(p.v_cache);
  const int table_row = p.table_request != nullptr ? p.table_request[r] : r;
  const int32_t* table =
      p.block_tables + static_cast<int64_t>(table_row) * p.max_blocks_per_request;
  // Batch-invariant tree node: logical keys from path_base on are its path's tree keys.
  const int path_base = p.path != nullptr ? p.path_base[r] : INT_MAX;
  const int32_t* path = p.path != nullptr ? p.path + p.path_indptr[r] : nullptr;
  const int bs = p.block_size;
  const int bs_shift = __popc(bs) == 1 ? __ffs(bs) - 1 : -1;  // power-of-two block sizes

  // Tree-group job list (see above): job j covers keys [job_n0[j], + 64) for node job_node[j]
  // (-1: the shared prefix tiles, visible to every row).
  __shared__ int16_t job_tile[kAttnMaxGroupJobs];
  __shared__ int8_t job_node[kAttnMaxGroupJobs];
  __shared__ int node_kv_end[kAttnMaxGroupNodes];
  __shared__ int node_path_off[kAttnMaxGroupNodes];
  __shared__ int job_count;
  if constexpr (tree_group) {
    if (warp == 0) {
      const int chunk_tiles = p.request_kv_chunk[r] / kTileN;
      const int s_begin = item.split * chunk_tiles, s_end = s_begin + chunk_tiles;
      const int c_len = path_base;                        // the tree's committed prefix
      const int shared_end = min(s_end, c_len / kTileN);  // tiles wholly below it
      const int shared = max(0, shared_end - s_begin);
      int mine = 0;  // lane k: node k's tiles in this split from the first non-shared one
      if (lane < group_nodes) {
        const int end = p.committed_len[r + lane] + 1;  // T = 1 virtual request
        node_kv_end[lane] = end;
        node_path_off[lane] = p.path_indptr[r + lane];
        mine = max(0, min(s_end, (end + kTileN - 1) / kTileN) - max(s_begin, c_len / kTileN));
      }
      int before = mine;  // inclusive prefix sum over the lanes
#pragma unroll
      for (int d = 1; d < 32; d *= 2) {
        const int x = __shfl_up_sync(0xffffffffu, before, d);
        if (lane >= d) before += x;
      }
      const int first = max(s_begin, c_len / kTileN);
      for (int i = 0; i < mine; ++i) {
        job_tile[shared + before - mine + i] = static_cast<int16_t>(first + i);
        job_node[shared + before - mine + i] = static_cast<int8_t>(lane);
      }
      for (int i = lane; i < shared; i += 32) {
        job_tile[i] = static_cast<int16_t>(s_begin + i);
        job_node[i] = -1;
      }
      if (lane == 31) job_count = shared + before;
    }
    __syncthreads();
    num_tiles = job_count;
    kv_end = INT_MAX;  // shared tiles have no end; node jobs use their node's
  }
  // Job `it` of this CTA: its first key, its node (-2: an ordinary item, -1: shared prefix)
  // and the key range / path remap its loads use.
  auto job_n0 = [&](int it) { return tree_group ? job_tile[it] * kTileN : kv_begin + it * kTileN; };
  auto job_of = [&](int it) { return tree_group ? static_cast<int>(job_node[it]) : -2; };

  // This thread's share of a tile load: one 16-byte chunk column of kRowStep-spaced rows. The
  // swizzle term is the same for all of them (kRowStep is a multiple of 8).
  constexpr int kChunks = D / 8;  // 16-byte chunks per key row
  constexpr int kRowStep = kAttnThreads / kChunks;
  constexpr int kRowsPerThread = kTileN / kRowStep;
  static_assert(kRowStep % 8 == 0, "the swizzle term must not depend on the row step");
  const int load_row0 = tid / kChunks;
  const int load_chunk = tid % kChunks;
  const int load_dst0 = kv_offset<kWgmma, D>(load_row0, load_chunk * 8);
  // This thread's chunk of key slot 0; a slot adds slot * slot_bytes (one 32 x 32 -> 64-bit
  // multiply per row).
  const int head_off = kvh * D + load_chunk * 8;
  const char* k_thread = reinterpret_cast<const char*>(k_cache + head_off);
  const char* v_thread = reinterpret_cast<const char*>(v_cache + head_off);
  const int slot_bytes = p.num_kv_heads * D * static_cast<int>(sizeof(KvT));
  // wgmma loads (load_tile, producer warpgroup): its thread i = tid - 128 copies chunk i % 8 of
  // both 64-element halves of key rows i / 8 + 16 j, j < 4; their swizzle term is the same (16 j
  // is a multiple of 8).
  static_assert(!kWgmma || (kAttnThreads == 128 && kTileN == 64),
                "the wgmma copy mapping is one warpgroup of 16 row groups x 4 rows per tile");
  const int wg_row0 = (tid % kAttnThreads) / 8;
  const int wg_dst0 = wg_row0 * 64 + (((tid % 8) ^ (wg_row0 & 7)) << 3);
  const char* wg_k = reinterpret_cast<const char*>(k_cache + kvh * D + (tid % 8) * 8);
  const char* wg_v = reinterpret_cast<const char*>(v_cache + kvh * D + (tid % 8) * 8);

  // Page-table lookups, off the critical path: each loading warp resolves the 16 key rows of a
  // tile that it copies (path remap, then the block-table entry), one lookup per lane, one tile
  // before the tile is loaded; load_tile then takes each row's slot from the lane that resolved
  // it. `entry` is the block id (-1 past the end), `in_page` the offset.
  struct TileSlots {
    int entry;
    int in_page;
  };
  // A loading warp w (the wgmma producer's, or any warp of the mma.sync path) copies key rows
  // kWarpRows w + q + kRowGap i: q = lane / (32 / kWarpRows) (the threads of one row are
  // consecutive lanes), i < 16 / kWarpRows. Its lane l resolves row kWarpRows w + l % kWarpRows
  // + kRowGap (l / kWarpRows % (16 / kWarpRows)) (lanes 16-31 repeat 0-15), so row (q, i) is
  // lane q + kWarpRows i's.
  constexpr int kWarpRows = kWgmma ? 4 : 32 / kChunks;
  constexpr int kRowGap = kWgmma ? 16 : kRowStep;
  static_assert(kRowGap * (16 / kWarpRows) == kTileN && 4 * kWarpRows == kRowGap,
                "four warps of kWarpRows rows per step cover the tile's 64 rows");
  const int resolve_key =
      kWarpRows * (warp % 4) + lane % kWarpRows + kRowGap * ((lane / kWarpRows) % (16 / kWarpRows));
  auto resolve_slots = [&](int it, TileSlots& ts) {
    const int n0 = job_n0(it), node = job_of(it);
    // Shared prefix tiles lie wholly below path_base (no remap; kv_end is INT_MAX in a group); a
    // node's tiles end at its own key count and remap from path_base through its own path.
    const int end = node >= 0 ? node_kv_end[node] : kv_end;
    const int32_t* job_path = node >= 0 ? p.path + node_path_off[node] : path;
    int j = n0 + resolve_key;
    const bool valid = j < end;
    if (valid && j >= path_base) j = path_base + job_path[j - path_base];
    const int page = bs_shift >= 0 ? j >> bs_shift : j / bs;
    ts.in_page = bs_shift >= 0 ? j & (bs - 1) : j % bs;
    ts.entry = valid ? table[page] : -1;
  };
  auto load_tile = [&](int stage, const TileSlots& ts) {
    KvT* ks = k_smem + stage * kTileN * D;
    KvT* vs = v_smem + stage * kTileN * D;
    // This lane's resolved row (see resolve_key), shuffled to the lanes that copy it.
    const int lane_slot = ts.entry < 0 ? -1 : ts.entry * bs + ts.in_page;
    if constexpr (kWgmma) {
      // Eight threads per key row, each the same 16-byte chunk of both 128-byte halves: 4 rows
      // per thread (half the slot shuffles and addresses of one column of 8 rows), each warp
      // instruction still 4 rows x 128 contiguous bytes (4 cache lines).
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int slot = __shfl_sync(0xffffffffu, lane_slot, wg_row0 % 4 + 4 * i);
        // Unsigned 32 x 32 -> 64-bit offsets: one wide multiply-add per address (a slot < 0 is
        // past the end: zero fill).
        const uint64_t off = mul_wide_u32(max(slot, 0), slot_bytes);
        const char* k_row = wg_k + off;
        const char* v_row = wg_v + off;
#pragma unroll
        for (int blk = 0; blk < D / 64; ++blk) {
          const int dst = wg_dst0 + i * 16 * 64 + blk * 64 * 64;
          const int half = blk * 64 * static_cast<int>(sizeof(KvT));
          cp_async_16_or_zero(smem_addr(ks + dst), k_row + half, slot);
          cp_async_16_or_zero(smem_addr(vs + dst), v_row + half, slot);
        }
      }
    } else {
#pragma unroll
      for (int i = 0; i < kRowsPerThread; ++i) {
        // Key load_row0 + i * kRowStep of the tile (q = load_row0 % kWarpRows).
        const int slot = __shfl_sync(0xffffffffu, lane_slot, load_row0 % kWarpRows + kWarpRows * i);
        const uint64_t off = mul_wide_u32(max(slot, 0), slot_bytes);
        const int dst = load_dst0 + i * kRowStep * D;
        cp_async_16_or_zero(smem_addr(ks + dst), k_thread + off, slot);
        cp_async_16_or_zero(smem_addr(vs + dst), v_thread + off, slot);
      }
    }
  };

  // wgmma path: warp-specialised. The last warpgroup (the producer, few registers) streams K/V
  // tiles into the stage ring and signals full[stage] as each thread's copies land; the
  // consumer warpgroups (the registers the MMAs and the softmax need) wait on full[stage],
  // compute, and release the stage on empty[stage] once their MMAs have read it.
  __shared__ uint64_t full_bar[kStages], empty_bar[kStages];
  // A wide CTA whose second 64 rows are all padding runs one consumer; the other exits.
  const int consumers = kConsumers == 2 && row_begin + 64 >= total_rows ? 1 : kConsumers;
  if constexpr (kWgmma) {
    if (tid == 0) {
#pragma unroll
      for (int st = 0; st < kStages; ++st) {
        mbarrier_init(&full_bar[st], kAttnThreads);         // one arrival per producer thread
        mbarrier_init(&empty_bar[st], kWarps * consumers);  // one per consumer warp
      }
    }
    __syncthreads();
    if (tid >= kConsumers * kAttnThreads) {
      setmaxnreg_dec<kProducerRegs>();
      TileSlots ts;
      if (num_tiles > 0) resolve_slots(0, ts);  // block tables: written before the previous kernel
      grid_dependency_wait();                   // (pdl_launch.cuh) K/V are read only from here
      for (int t = 0; t < num_tiles; ++t) {
        const int st = t % kStages;
        if (t >= kStages) mbarrier_wait(&empty_bar[st], ((t / kStages) - 1) & 1);
        load_tile(st, ts);
        cp_async_mbarrier_arrive(&full_bar[st]);
        if (t + 1 < num_tiles) resolve_slots(t + 1, ts);
      }
      cp_async_wait_all();  // (the consumers wait on `full` for every tile before they exit)
      return;
    }
    if (consumer >= consumers) return;
    setmaxnreg_inc<kConsumerRegs<kConsumers>>();
  }

  // Prologue (mma.sync path): tiles 0 and 1 in flight (one commit group each, empty groups
  // included, so the wait counts below hold for any tile count); the slots of tile 2 resolved.
  TileSlots slots;
  if constexpr (!kWgmma) {  // block tables: written before the previous kernel
    if (num_tiles > 0) resolve_slots(0, slots);
  }
  // Launched as a programmatic dependent (pdl_launch.cuh): Q and the K/V written by the kernels
  // before this one are read only from here.
  grid_dependency_wait();
  if constexpr (!kWgmma) {
    if (num_tiles > 0) load_tile(0, slots);
    cp_async_commit();
    if (num_tiles > 1) {
      resolve_slots(1, slots);
      load_tile(1, slots);
    }
    cp_async_commit();
    if (num_tiles > 2) resolve_slots(2, slots);
  }

  const int row_a = row_begin + consumer * 64 + wm * 16 + lane / 4;  // this thread's two rows
  const int rows[2] = {row_a, row_a + 8};
  uint32_t qf[D / 16][4];
  if constexpr (kWgmma) {
    if (p.io_type == ElemType::kF32)
      load_q_fragments<float, KvT, D>(p, qf, rows, row_begin, tile_rows, total_rows, group, q0, kvh,
                                      lane);
    else if (p.io_type == ElemType::kBF16)
      load_q_fragments<__nv_bfloat16, KvT, D>(p, qf, rows, row_begin, tile_rows, total_rows, group,
                                              q0, kvh, lane);
    else
      load_q_fragments<__half, KvT, D>(p, qf, rows, row_begin, tile_rows, total_rows, group, q0,
                                       kvh, lane);
  } else {
    // Q tile -> shared (K stage 2, free until tile 2 is loaded) -> registers.
    KvT* qs = k_smem + 2 * kTileN * D;
    if (p.io_type == ElemType::kF32)
      stage_q_tile<float, KvT, D>(p, qs, tile_rows, row_begin, total_rows, group, q0, kvh, tid);
    else if (p.io_type == ElemType::kBF16)
      stage_q_tile<__nv_bfloat16, KvT, D>(p, qs, tile_rows, row_begin, total_rows, group, q0, kvh,
                                          tid);
    else
      stage_q_tile<__half, KvT, D>(p, qs, tile_rows, row_begin, total_rows, group, q0, kvh, tid);
    __syncthreads();
    {
      const KvT* qs = k_smem + 2 * kTileN * D;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qf[kk],
                    smem_addr(qs + swz<D>(wm * 16 + (lane % 16), kk * 16 + (lane / 16) * 8)));
    }
    __syncthreads();
  }
  if (unsigned long long* phase = phase_stamps(p)) {
    phase[2] = clock64();
    phase[6] = num_tiles;
  }

  float o[D / 8][4];
#pragma unroll
  for (int i = 0; i < D / 8; ++i) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
  float m_run[2] = {-INFINITY, -INFINITY};
  float l_run[2] = {0.f, 0.f};
  const float scale_log2 = p.sm_scale * kLog2e;
  const int col0 = wn * cols_per_warp;  // this warp's first column in the KV tile
  auto job_needs_mask = [&](int n0, int node) {
    return node >= 0 || (node == -2 && (n0 + kTileN > committed || n0 + kTileN > kv_end));
  };

  if constexpr (kWgmma) {
    // S_t = Q K_t^T for the tile in `stage` into acc (issued, not waited).
    // Descriptors of stage 0's K (K-major) and V (MN-major) tiles; a stage is 16 KiB further.
    constexpr uint32_t kStageBytes = kTileN * D * sizeof(KvT);
    const uint64_t k_desc0 = wgmma_desc_sw128(smem_addr(k_smem), 16, 1024);
    const uint64_t v_desc0 = wgmma_desc_sw128(smem_addr(v_smem), 64 * 64 * 2, 1024);
    auto issue_s = [&](float(&acc)[8][4], int stage) {
      const uint64_t k_desc = wgmma_desc_advance(k_desc0, stage * kStageBytes);
      fence_accumulators(acc);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
        // K-major B: 16 columns of d = 32 bytes into the 128-byte rows of block kk / 4.
        const uint64_t desc = wgmma_desc_advance(k_desc, (kk / 4) * (64 * 64 * 2) + (kk % 4) * 32);
        wgmma_mma<KvT, 0>(acc, qf[kk], desc, kk > 0 ? 1 : 0);
      }
      wgmma_commit();
    };
    // FlashAttention-3's intra-warpgroup order: S of tile t + 1 and PV of tile t are in flight
    // together, and the softmax of tile t + 1 runs under PV(t); O is rescaled by tile t + 1's
    // factor once PV(t) has landed. Each row's arithmetic and its order are those of the plain
    // order (rescale, then PV, tile after tile), so results are bitwise unchanged.
    float s_acc[8][4];
#pragma unroll
    for (int nt = 0; nt < 8; ++nt) s_acc[nt][0] = s_acc[nt][1] = s_acc[nt][2] = s_acc[nt][3] = 0.f;
    uint32_t p_cur[4][4], p_next[4][4];  // P of tile t (read by PV(t)) and of tile t + 1
    float alpha[2];
    // Tile t is in stage t % kStages, full after the (t / kStages)-th fill of that stage. The
    // loop keeps both as running counters: st, the stage of the step's PV tile, and st_next /
    // phase_next those of the tile after it.
    int st = 0, st_next = 1;
    uint32_t phase_next = 0;
    auto wait_full = [&](int stage, uint32_t phase) {
      mbarrier_wait(&full_bar[stage], phase);
      fence_proxy_async_smem();  // the producer's generic-proxy copies before the MMAs' reads
    };
    // Softmax of tile t (its S in s_acc, waited for) -> P fragments; alpha for rescale_o, and
    // false when the warp's alphas are all 1 (no rescale).
    auto softmax_to_p = [&](int t, uint32_t(&pf)[4][4]) {
      const int n0 = job_n0(t);
      const int node = job_of(t);
      const bool moved =
          softmax_tile<true>(s_acc, alpha, m_run, l_run, 8, 0, lane, job_needs_mask(n0, node), n0,
                             kv_end, committed, tree_len, causal, mask, words, rows, total_rows,
                             group, scale_log2, node, node >= 0 ? node_kv_end[node] : 0);
#pragma unroll
      for (int ks16 = 0; ks16 < 4; ++ks16) p_fragment<KvT>(s_acc, ks16, pf[ks16]);
      return moved;
    };
    auto issue_pv = [&](int stage, const uint32_t(&pf)[4][4]) {
      const uint64_t v_desc = wgmma_desc_advance(v_desc0, stage * kStageBytes);
      fence_accumulators(o);
      wgmma_fence();
#pragma unroll
      for (int ks16 = 0; ks16 < 4; ++ks16) {
        // MN-major B: keys 16 * ks16.. are two 8-row groups (1024 bytes each); the two
        // 64-column blocks of d are 8 KiB apart.
        const uint64_t desc = wgmma_desc_advance(v_desc, ks16 * 2048);
        wgmma_mma<KvT, 1>(o, pf[ks16], desc, 1);
      }
      wgmma_commit();
    };
    // Wide CTAs: FlashAttention-3's ping-pong. The two consumers take turns issuing their MMAs
    // (named barriers 1 and 2, one per consumer: each waits for its turn, issues, and passes the
    // turn on), so one's tensor-core work runs while the other is in its softmax. Consumer 0
    // goes first (consumer 1's first arrival) and takes consumer 1's last hand-off at the end.
    const bool pingpong = kConsumers == 2 && consumers == 2;
    auto turn_wait = [&] {
      if (pingpong) named_barrier_sync(1 + consumer, 2 * kAttnThreads);
    };
    auto turn_pass = [&] {
      if (pingpong) named_barrier_arrive(2 - consumer, 2 * kAttnThreads);
    };
    if (pingpong && consumer == 1) named_barrier_arrive(1, 2 * kAttnThreads);
    if (num_tiles > 0) {
      wait_full(0, 0);
      turn_wait();
      issue_s(s_acc, 0);
      turn_pass();
      wgmma_wait<0>();
      fence_accumulators(s_acc);
      softmax_to_p(0, p_cur);  // O is still zero: no rescale
    }
    // One step: tile it's PV with P in p_in, the softmax of tile it + 1 into p_out. Steps go in
    // pairs with the P buffers swapped (no register copies, which ptxas would coalesce into the
    // PV's in-flight operands and serialise every wgmma); the odd step runs after the loop.
    auto step = [&](int it, const uint32_t(&p_in)[4][4], uint32_t(&p_out)[4][4]) {
      wait_full(st_next, phase_next);
      turn_wait();
      issue_s(s_acc, st_next);  // s_acc is free: P of tile it is packed
      issue_pv(st, p_in);
      turn_pass();
      wgmma_wait<1>();  // S of tile it + 1 (PV of tile it may still run)
      fence_accumulators(s_acc);
      const bool moved = softmax_to_p(it + 1, p_out);
      wgmma_wait<0>();  // PV of tile it
      fence_accumulators(o);
      if (moved) rescale_o<D>(o, alpha);
      if (lane == 0) mbarrier_arrive(&empty_bar[st]);  // K and V of tile it are read
      st = st_next;
      st_next = st_next + 1 == kStages ? 0 : st_next + 1;
      phase_next ^= st_next == 0 ? 1u : 0u;
    };
    int it = 0;
    for (; it + 2 < num_tiles; it += 2) {
      step(it, p_cur, p_next);
      step(it + 1, p_next, p_cur);
    }
    if (it + 1 < num_tiles) {  // two tiles left: one step, then the last PV from p_next
      step(it, p_cur, p_next);
      turn_wait();
      issue_pv(st, p_next);  // (tile it + 1's stage)
      turn_pass();
    } else if (num_tiles > 0) {
      turn_wait();
      issue_pv(st, p_cur);
      turn_pass();
    }
    if (pingpong && consumer == 0) named_barrier_sync(1, 2 * kAttnThreads);
    wgmma_wait<0>();
    fence_accumulators(o);
  } else {
    for (int it = 0; it < num_tiles; ++it) {
      const int n0 = job_n0(it);
      const int node = job_of(it);
      // Tile it + 2 goes into the stage tile it - 1 used (released by the barrier that ended
      // the previous iteration); then wait until only the two newest groups may be pending.
      if (it + 2 < num_tiles) load_tile((it + 2) % kStages, slots);
      cp_async_commit();
      if (it + 3 < num_tiles) resolve_slots(it + 3, slots);  // used next iteration
      cp_async_wait<2>();
      __syncthreads();
      const int stage = it % kStages;
      const KvT* ks = k_smem + stage * kTileN * D;
      const KvT* vs = v_smem + stage * kTileN * D;

      // S = Q K^T over this warp's columns.
      float s[8][4];
#pragma unroll
      for (int nt = 0; nt < 8; ++nt) s[nt][0] = s[nt][1] = s[nt][2] = s[nt][3] = 0.f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int np = 0; np < 4; ++np) {
          if (np * 2 < warp_ntiles) {
            uint32_t b[4];
            const int mtx = lane / 8, rr = lane % 8;
            const int n = col0 + np * 16 + (mtx / 2) * 8 + rr;
            ldmatrix_x4(b, smem_addr(ks + swz<D>(n, kk * 16 + (mtx % 2) * 8)));
            mma_16816<KvT>(s[2 * np], qf[kk], b[0], b[1]);
            mma_16816<KvT>(s[2 * np + 1], qf[kk], b[2], b[3]);
          }
        }
      }
      float alpha[2];
      softmax_tile<false>(s, alpha, m_run, l_run, warp_ntiles, col0, lane, job_needs_mask(n0, node),
                          n0, kv_end, committed, tree_len, causal, mask, words, rows, total_rows,
                          group, scale_log2, node, node >= 0 ? node_kv_end[node] : 0);
      rescale_o<D>(o, alpha);
      // O += P V over this warp's columns (16 keys per step).
#pragma unroll
      for (int ks16 = 0; ks16 < 4; ++ks16) {
        if (ks16 * 2 < warp_ntiles) {
          uint32_t a[4];
          p_fragment<KvT>(s, ks16, a);
#pragma unroll
          for (int dp = 0; dp < D / 16; ++dp) {
            uint32_t b[4];
            const int mtx = lane / 8, rr = lane % 8;
            const int kv_row = col0 + ks16 * 16 + (mtx % 2) * 8 + rr;
            ldmatrix_x4_trans(b, smem_addr(vs + swz<D>(kv_row, dp * 16 + (mtx / 2) * 8)));
            mma_16816<KvT>(o[2 * dp], a, b[0], b[1]);
            mma_16816<KvT>(o[2 * dp + 1], a, b[2], b[3]);
          }
        }
      }
      __syncthreads();  // the next iteration's loads overwrite this stage
    }
  }

  if (unsigned long long* phase = phase_stamps(p)) phase[3] = clock64();
#pragma unroll
  for (int h = 0; h < 2; ++h) {  // row sums across the quad that shares a row
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 1);
    l_run[h] += __shfl_xor_sync(0xffffffffu, l_run[h], 2);
  }
  // Where the row of node t goes: the output row (q0 + t) or this split's partial row; false
  // when (tree group) the node's own request has no such split.
  const int64_t partial_base =
      splits > 1 ? static_cast<int64_t>(p.request_partial_row[r]) + item.split * tree_len : 0;
  auto row_target = [&](int t, bool& is_partial, int64_t& row) {
    if constexpr (tree_group) {
      const int node_splits = p.request_splits[r + t];
      if (item.split >= node_splits) return false;
      is_partial = node_splits > 1;
      row = is_partial ? static_cast<int64_t>(p.request_partial_row[r + t]) + item.split : q0 + t;
      return true;
    }
    is_partial = splits > 1;
    row = is_partial ? partial_base + t : q0 + t;
    return true;
  };
  if constexpr (kWgmma) {
    if constexpr (kConsumers == 2) {
      // Wide CTAs with 16-bit outputs and no split: O goes through this consumer's tile in
      // shared memory (after the ring; [64 rows][16 chunks of 8 elements], chunk ^= row % 8, so
      // both the 4-byte writes from the accumulators and the 16-byte reads are conflict-free)
      // and leaves as 16-byte stores, two whole 256-byte rows per warp instruction, instead of
      // 4-byte stores spread over 8 rows.
      if (splits == 1 && p.io_type != ElemType::kF32 && p.out_bf16 == nullptr) {
        uint32_t* ot = reinterpret_cast<uint32_t*>(
            smem_raw + kRingBytes<KvT, D, kWgmma, kConsumers> + consumer * kOutTileBytes<D>);
        const bool bf16_out = p.io_type == ElemType::kBF16;
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int lr = wm * 16 + lane / 4 + 8 * h;  // row within this consumer's 64
          const float inv = l_run[h] > 0.f ? 1.f / l_run[h] : 0.f;
#pragma unroll
          for (int dt = 0; dt < D / 8; ++dt) {
            const float a = o[dt][2 * h] * inv, b = o[dt][2 * h + 1] * inv;
            ot[lr * (D / 2) + ((dt ^ (lr & 7)) * 4) + lane % 4] =
                bf16_out ? pack2<__nv_bfloat16>(a, b) : pack2<__half>(a, b);
          }
        }
        named_barrier_sync(3 + consumer, kAttnThreads);  // this consumer's tile is written
        const int ltid = tid % kAttnThreads;
        const int chunk = ltid % (D / 8);
#pragma unroll
        for (int k = 0; k < 64 / (kAttnThreads / (D / 8)); ++k) {
          const int lr = ltid / (D / 8) + (kAttnThreads / (D / 8)) * k;
          const int prow = row_begin + consumer * 64 + lr;
          if (prow >= total_rows) continue;
          const int t = prow / group;
          const int head = kvh * group + prow % group;
          const uint4 v =
              *reinterpret_cast<const uint4*>(ot + lr * (D / 2) + ((chunk ^ (lr & 7)) * 4));
          *reinterpret_cast<uint4*>(static_cast<uint16_t*>(p.out) +
                                    (static_cast<int64_t>(q0 + t) * p.num_q_heads + head) * D +
                                    chunk * 8) = v;
        }
        stamp_end(p);
        return;
      }
    }
    // One warpgroup owns whole rows (no column split): each thread normalises and writes its
    // two rows straight from the accumulators.
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int prow = rows[h];
      if (prow >= total_rows || rows[h] - row_begin >= tile_rows) continue;
      const int t = prow / group;
      const int head = kvh * group + prow % group;
      bool partial = false;
      int64_t target = 0;
      if (!row_target(t, partial, target)) continue;
      const float total = l_run[h];
      const float inv = total > 0.f ? 1.f / total : 0.f;
      if (!partial) {
        const int64_t base = (target * p.num_q_heads + head) * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt) {
          const float a = o[dt][2 * h] * inv, b = o[dt][2 * h + 1] * inv;
          store_pair(p.out, p.io_type, base + dt * 8 + (lane % 4) * 2, a, b);
          if (p.out_bf16 != nullptr)
            store_pair(p.out_bf16, ElemType::kBF16, base + dt * 8 + (lane % 4) * 2, a, b);
        }
      } else {
        const int64_t prow_global = target;
        float* dst = p.partial_out + (prow_global * p.num_q_heads + head) * D;
#pragma unroll
        for (int dt = 0; dt < D / 8; ++dt)
          *reinterpret_cast<float2*>(dst + dt * 8 + (lane % 4) * 2) =
              make_float2(o[dt][2 * h] * inv, o[dt][2 * h + 1] * inv);
        if (lane % 4 == 0)
          p.partial_lse[prow_global * p.num_q_heads + head] =
              total > 0.f ? m_run[h] + log2f(total) : -INFINITY;
      }
    }
    stamp_end(p);
    return;
  }
  // Merge the warps that split the KV tile's columns (warps_n > 1), staging O in shared memory.
  if (lane % 4 == 0) {
    red_m[warp][lane / 4] = m_run[0];
    red_m[warp][lane / 4 + 8] = m_run[1];
    red_l[warp][lane / 4] = l_run[0];
    red_l[warp][lane / 4 + 8] = l_run[1];
  }
  __syncthreads();
  float factor[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int rr = lane / 4 + 8 * h;
    float mx = -INFINITY;
    for (int k = 0; k < warps_n; ++k) mx = fmaxf(mx, red_m[wm + k * warps_m][rr]);
    const float m_use = mx == -INFINITY ? 0.f : mx;
    float total = 0.f;
    for (int k = 0; k < warps_n; ++k)
      total += red_l[wm + k * warps_m][rr] * exp2f(red_m[wm + k * warps_m][rr] - m_use);
    factor[h] = exp2f(m_run[h] - m_use);
    if (wn == 0 && lane % 4 == 0) {
      row_m[wm * 16 + rr] = mx;
      row_l[wm * 16 + rr] = total;
    }
  }
  for (int k = 0; k < warps_n; ++k) {
    if (wn == k) {
#pragma unroll
      for (int dt = 0; dt < D / 8; ++dt) {
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int rr = wm * 16 + lane / 4 + 8 * h;
          const int d = dt * 8 + (lane % 4) * 2;
          float2* dst = reinterpret_cast<float2*>(o_smem + rr * D + d);
          float2 v = make_float2(o[dt][2 * h] * factor[h], o[dt][2 * h + 1] * factor[h]);
          if (k > 0) {
            const float2 prev = *dst;
            v.x += prev.x;
            v.y += prev.y;
          }
          *dst = v;
        }
      }
    }
    __syncthreads();
  }

  // Normalise and write: the final output, or this split's partial and its log-sum-exp.
  for (int idx = tid; idx < tile_rows * (D / 4); idx += kAttnThreads) {
    const int i = idx / (D / 4);
    const int d = (idx % (D / 4)) * 4;
    const int prow = row_begin + i;
    if (prow >= total_rows) continue;
    const int t = prow / group;
    const int h = kvh * group + prow % group;
    bool partial = false;
    int64_t target = 0;
    if (!row_target(t, partial, target)) continue;
    const float total = row_l[i];
    const float inv = total > 0.f ? 1.f / total : 0.f;
    const float4 acc = *reinterpret_cast<const float4*>(o_smem + i * D + d);
    const float v[4] = {acc.x * inv, acc.y * inv, acc.z * inv, acc.w * inv};
    if (!partial) {
      const int64_t base = (target * p.num_q_heads + h) * D + d;
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        store_elem(p.out, p.io_type, base + e, v[e]);
        if (p.out_bf16 != nullptr) store_elem(p.out_bf16, ElemType::kBF16, base + e, v[e]);
      }
    } else {
      const int64_t prow_global = target;
      float* dst = p.partial_out + (prow_global * p.num_q_heads + h) * D + d;
      *reinterpret_cast<float4*>(dst) = make_float4(v[0], v[1], v[2], v[3]);
      if (d == 0)
        p.partial_lse[prow_global * p.num_q_heads + h] =
            total > 0.f ? row_m[i] + log2f(total) : -INFINITY;
    }
  }
  stamp_end(p);
}

template <typename KvT, int D, bool kWgmma, int kConsumers>
__global__ void __launch_bounds__(kWgmma ? (kConsumers + 1) * kAttnThreads : kAttnThreads,
                                  kConsumers == 2      ? 1
                                  : D == 128 || kWgmma ? 2
                                                       : 3)
    tree_attention_mma_kernel(const PagedTreeAttentionParams p) {
  // The split merge (a programmatic dependent launch) may start now: it waits for this whole
  // grid's completion before it reads any partial.
  trigger_dependent_launch();
  const AttentionWorkItem item = p.work[blockIdx.x];
  if (item.request < 0) {    // padding of a grid rounded up to a bucket (step graphs)
    grid_dependency_wait();  // complete only after the kernels before (pdl_launch.cuh)
    return;
  }
  if constexpr (kConsumers == 1) {
    if (item.nodes > 0) {
      attention_cta<KvT, D, kWgmma, 1, true>(p, item);
      return;
    }
  }
  attention_cta<KvT, D, kWgmma, kConsumers, false>(p, item);  // (wide plans have no groups)
}

template <typename KvT, int D, bool kWgmma, int kConsumers>
cudaError_t launch_typed(const PagedTreeAttentionParams& p, cudaStream_t stream) {
  // K/V stages (and wide CTAs' output tiles) plus slack to align the base to 1024 bytes.
  const int smem = kRingBytes<KvT, D, kWgmma, kConsumers> +
                   (kConsumers == 2 ? kConsumers * kOutTileBytes<D> : 0) + 1024;
  static bool configured = false;  // one attribute call per instantiation
  if (!configured) {
    const cudaError_t e =
        cudaFuncSetAttribute(tree_attention_mma_kernel<KvT, D, kWgmma, kConsumers>,
                             cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
    if (e != cudaSuccess) return e;
    configured = true;
  }
  return launch_pdl(tree_attention_mma_kernel<KvT, D, kWgmma, kConsumers>, dim3(p.num_work),
                    dim3(kWgmma ? (kConsumers + 1) * kAttnThreads : kAttnThreads), smem, stream, p);
}

template <int D, bool kWgmma, int kConsumers>
cudaError_t launch_dim(const PagedTreeAttentionParams& p, cudaStream_t stream) {
  return p.kv_type == ElemType::kBF16
             ? launch_typed<__nv_bfloat16, D, kWgmma, kConsumers>(p, stream)
             : launch_typed<__half, D, kWgmma, kConsumers>(p, stream);
}

// The plan's kernel at head_dim D: mma.sync, or wgmma with 64- or 128-row ("wide") tiles.
template <int D>
cudaError_t launch_head(const PagedTreeAttentionParams& p, cudaStream_t stream) {
  if (!p.wgmma) return launch_dim<D, false, 1>(p, stream);
  return p.wide ? launch_dim<D, true, 2>(p, stream) : launch_dim<D, true, 1>(p, stream);
}

}  // namespace

cudaError_t launch_tree_attention_mma(const PagedTreeAttentionParams& p, cudaStream_t stream) {
  if (p.num_work == 0) return cudaSuccess;
  if (p.head_dim == 64) return launch_head<64>(p, stream);
  if (p.head_dim == 128) return launch_head<128>(p, stream);
  return cudaErrorInvalidValue;
}

}  // namespace arbor::kernels::detail
