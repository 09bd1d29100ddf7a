// Host-side planning of a paged tree-attention launch: the work list (no CTA idles on padding
// rows of another request) and the split-KV choice from the shape.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>

#include "kernels/attention/paged_tree_attention.h"

namespace arbor::kernels {

namespace {
// Shortest split (KV tiles). Short contexts at batch 1 are latency-bound: 2-tile splits beat 4
// (H200; docs/kernel_notes.md "Work decomposition").
constexpr int32_t kMinTilesPerSplit = 2;
// Wide wgmma CTAs only where some CTA runs at least this many KV tiles: a wide CTA has its SM
// alone (its prologue and epilogue are not hidden behind a second CTA), which cost 1-4% on
// launches of 2-9 tiles per CTA and gains 1-17% from 16 up (H200; wide CTAs in
// docs/kernel_notes.md "Tile loop").
constexpr int32_t kMinWideTiles = 16;
// No split of short units that are already balanced over the SMs. When the longest unit is at
// most 9/8 of the tiles each SM would run with the work spread perfectly, splits only add a
// second resident CTA per SM (the same tiles per SM): that streams KV ~8% faster, but the
// partials' round trip and the merge launch cost ~4-6 us, which only long units repay. H200,
// 128 units of 64 rows (batch 16, T 16) on 132 SMs, unsplit against 2 splits: 1024 keys 27.6
// against 31.9 us, 2048 keys 44.2 against 46.9, 8192 keys 143.6 against 136.9, 32768 keys
// 543.8 against 497.9 (docs/kernel_notes.md "Work decomposition"). Decode units (4 rows)
// have little to merge and gain from splits at every length (2048 keys: 42.3 unsplit, 41.6 in
// 2), so the rule needs kBalancedMinRows rows. A long request beside many short ones is still
// split: its units are far longer than the balance.
constexpr int64_t kBalancedNinths = 9;     // longest unit <= 9/8 of the balanced per-SM load
constexpr int32_t kBalancedMaxTiles = 64;  // ... and at most this many KV tiles long
constexpr int32_t kBalancedMinRows = 32;   // ... and every unit's row tile this full
// One CTA per SM instead of two when two would leave splits this short (in KV tiles): with 2-4
// tiles a CTA's prologue, partial stores and the merge weigh more than the second resident
// CTA gains, so twice as long splits in half as many CTAs are faster. Only for the 64-row wgmma
// CTAs of units with 64+ rows (T >= 16 at 4 query heads per kv head: units of 4-16 rows have
// little to merge; at T = 4 the rule lost 3-7% at batch 2-4). H200, 1-6 requests
// (docs/kernel_notes.md "Work decomposition"): (1, 8192, 16) 33 -> 15 splits, 21.3 -> 19.6
// us; (1, 1024, 64) 6 -> 4, 15.8 -> 14.9; (4, 1024, 16) 6 -> 4, 17.6 -> 16.7; at 5+ tiles the
// two CTAs win ((1, 1024, 128) 4 splits 17.9 us, 2 splits 19.8).
constexpr int32_t kShortSplitTiles = 4;
constexpr int32_t kShortSplitMinRows = 64;

// Split length (64-key tiles) of a batch-invariant plan for a request of `kv_tiles` tiles:
// `base`, doubled only as often as keeps the splits within kAttnMaxSplits.
int32_t invariant_chunk_tiles(int32_t kv_tiles, int32_t base) {
  int32_t chunk = base;
  while ((kv_tiles + chunk - 1) / chunk > kAttnMaxSplits) chunk *= 2;
  return chunk;
}
}  // namespace

std::string attention_unsupported_reason(int32_t num_q_heads, int32_t num_kv_heads,
                                         int32_t head_dim) {
  if (num_kv_heads <= 0 || num_q_heads <= 0)
    return "attention needs positive head counts, got " + std::to_string(num_q_heads) +
           " query heads and " + std::to_string(num_kv_heads) + " kv heads";
  if (num_q_heads % num_kv_heads != 0)
    return std::to_string(num_q_heads) + " query heads are not a multiple of " +
           std::to_string(num_kv_heads) + " kv heads";
  if (head_dim <= 0 || head_dim > kAttnMaxGenericHeadDim)
    return "head_dim " + std::to_string(head_dim) + " is not supported (1.." +
           std::to_string(kAttnMaxGenericHeadDim) + "; 64 and 128 use tensor cores)";
  if (head_dim % 2 != 0)
    return "head_dim " + std::to_string(head_dim) + " is odd; the kernels need an even head_dim";
  return "";
}

namespace {

// The virtual requests of a batch-invariant plan (see AttentionVirtualRequests).
AttentionVirtualRequests make_virtual_requests(const AttentionPlanInputs& in) {
  AttentionVirtualRequests v;
  v.qo_indptr.push_back(0);
  v.path_indptr.push_back(0);
  v.token_request.assign(static_cast<size_t>(std::max(in.num_tokens, 0)), 0);
  for (int32_t r = 0; r < in.num_requests; ++r) {
    const int32_t q0 = in.qo_indptr[r], t = in.qo_indptr[r + 1] - q0;
    const int32_t committed = in.committed_len[r];
    const bool causal = in.mask_indptr == nullptr || in.mask_indptr[r] == in.mask_indptr[r + 1];
    if (causal) {
      v.committed_len.push_back(committed);
      v.table_request.push_back(r);
      v.path_base.push_back(INT32_MAX);
      v.path_indptr.push_back(static_cast<int32_t>(v.path.size()));
      for (int32_t i = 0; i < t; ++i)
        v.token_request[q0 + i] = static_cast<int32_t>(v.committed_len.size()) - 1;
      v.qo_indptr.push_back(q0 + t);
      continue;
    }
    const int32_t words = (t + 31) / 32;
    const uint32_t* mask = in.tree_mask + in.mask_indptr[r];
    for (int32_t i = 0; i < t; ++i) {
      const uint32_t* row = mask + static_cast<int64_t>(i) * words;
      int32_t len = 0;
      for (int32_t w = 0; w < words; ++w) {  // the set bits: the node's ancestors and itself
        uint32_t m = row[w];
        if (w == words - 1 && t % 32 != 0) m &= (1u << (t % 32)) - 1;
        for (; m != 0; m &= m - 1) {
          v.path.push_back(w * 32 + __builtin_ctz(m));
          ++len;
        }
      }
      // The node is the one new key of its virtual request: keys [0, committed + len), the
      // last visible tree key (the node itself in an ancestor mask) playing the new token.
      v.committed_len.push_back(committed + len - 1);
      v.table_request.push_back(r);
      v.path_base.push_back(committed);
      v.path_indptr.push_back(static_cast<int32_t>(v.path.size()));
      v.token_request[q0 + i] = static_cast<int32_t>(v.committed_len.size()) - 1;
      v.qo_indptr.push_back(q0 + i + 1);
    }
  }
  v.mask_indptr.assign(v.committed_len.size() + 1, in.mask_indptr ? in.mask_indptr[0] : 0);
  return v;
}

}  // namespace

AttentionPlan plan_paged_tree_attention(const AttentionPlanInputs& in_real) {
  AttentionPlan plan;
  AttentionPlanInputs in = in_real;
  if (in.batch_invariant) {
    plan.batch_invariant = true;
    plan.virt = make_virtual_requests(in_real);
    in.qo_indptr = plan.virt.qo_indptr.data();
    in.committed_len = plan.virt.committed_len.data();
    in.num_requests = static_cast<int32_t>(plan.virt.committed_len.size());
  }
  const int32_t r_count = in.num_requests;
  const int32_t group = in.num_q_heads / in.num_kv_heads;
  plan.tensor_core = in.head_dim == 64 || in.head_dim == 128;
  plan.wgmma = in.wgmma && plan.tensor_core;  // head_dim 64 and 128
  plan.request_splits.assign(r_count, 1);
  plan.request_kv_chunk.assign(r_count, 0);
  plan.request_partial_row.assign(r_count, 0);
  if (!plan.tensor_core) {  // generic path: one warp per (row, head), no splits (and the same
                            // per-row key loop at any batch shape)
    for (int32_t r = 0; r < r_count; ++r)
      plan.request_kv_chunk[r] = in.committed_len[r] + in.qo_indptr[r + 1] - in.qo_indptr[r];
    return plan;
  }

  // Wide wgmma tiles (128 rows, two consumer warpgroups on each K/V tile the producer stages):
  // half the K/V traffic from L2 into shared memory per row, where the rows fill them. A row's
  // arithmetic is that of a 64-row tile (its consumer warpgroup runs the same code over the same
  // tiles), so batch-invariant plans may take them too (prefill chunks, when their splits are
  // long enough, kMinWideTiles); their tree groups are then off (groups are 64-row work;
  // scoring nodes one by one gives the same bits).
  const int32_t invariant_base =
      in.invariant_chunk_tiles > 0 ? in.invariant_chunk_tiles : kAttnInvariantChunkTiles;
  if (plan.wgmma && in.wide != 0) {
    int64_t padded64 = 0, padded128 = 0;
    int32_t longest_invariant = 0;  // longest CTA of a batch-invariant plan (fixed splits)
    for (int32_t r = 0; r < r_count; ++r) {
      const int32_t t = in.qo_indptr[r + 1] - in.qo_indptr[r];
      const int64_t rows = static_cast<int64_t>(t) * group;
      padded64 += (rows + 63) / 64 * 64;
      padded128 += (rows + 127) / 128 * 128;
      if (in.batch_invariant) {
        const int32_t tiles = (in.committed_len[r] + t + kAttnKvTile - 1) / kAttnKvTile;
        longest_invariant = std::max(longest_invariant,
                                     std::min(tiles, invariant_chunk_tiles(tiles, invariant_base)));
      }
    }
    plan.wide = in.wide == 1 || padded128 * 8 <= padded64 * 9;
    // The automatic choice also needs a CTA of kMinWideTiles or more. Batch-invariant splits
    // are known here; shape-tuned ones are checked once the splits are chosen (below).
    if (in.wide < 0 && in.batch_invariant && longest_invariant < kMinWideTiles) plan.wide = false;
  }

  // Rows per tile and tiles per (request, kv head).
  std::vector<int32_t> warps_m(r_count), row_tiles(r_count), kv_tiles(r_count);
  int64_t units = 0;
  int64_t unit_tiles = 0;        // KV tiles over all unsplit units
  int32_t min_rows = INT32_MAX;  // fewest packed rows of a (request, kv head)
  for (int32_t r = 0; r < r_count; ++r) {
    const int32_t t = in.qo_indptr[r + 1] - in.qo_indptr[r];
    const int32_t rows = t * group;
    // mma.sync: the smallest tile that holds the rows (the other warps split the KV tile);
    // wgmma: always one m64 tile per consumer warpgroup (two when wide).
    // Batch-invariant: one layout for every row count (16-row tiles, the 4 warps splitting
    // each KV tile's columns), so a row's reduction order never depends on its neighbours.
    warps_m[r] = plan.wide            ? 8
                 : plan.wgmma         ? 4
                 : in.batch_invariant ? 1
                 : rows <= 16         ? 1
                 : rows <= 32         ? 2
                                      : 4;
    row_tiles[r] = (rows + 16 * warps_m[r] - 1) / (16 * warps_m[r]);
    const int32_t kv_len = in.committed_len[r] + t;
    kv_tiles[r] = (kv_len + kAttnKvTile - 1) / kAttnKvTile;
    units += static_cast<int64_t>(in.num_kv_heads) * row_tiles[r];
    unit_tiles += static_cast<int64_t>(in.num_kv_heads) * row_tiles[r] * kv_tiles[r];
    min_rows = std::min(min_rows, rows);
  }

  // Split-KV: the shortest chunk (in KV tiles, at least kMinTilesPerSplit) whose CTAs all fit
  // in one wave of num_sms * ctas_per_sm resident CTAs; requests longer than the chunk are cut
  // into about equal splits, shorter ones are not, so a long request beside many short ones is
  // split while the short ones are left alone. When the unsplit units fill the wave already,
  // nothing is split. A second wave costs more than the shorter splits save: on the H200 the
  // old rule (chunk = ceil(total tiles / wave)) rounded (8, 2048, 64) into 2 splits and 512
  // CTAs, 72 us against 54 us unsplit (docs/kernel_notes.md "Work decomposition").
  // Resident CTAs per SM of the tensor-core kernel: 2 at head_dim 128 and on the wgmma path
  // (mma.sync: 128 threads at up to 255 registers; wgmma: 256 threads at 128), 1 wide (384
  // threads, 193 KiB of stages), else 3 (mma.sync at head_dim 64).
  const int32_t ctas_per_sm = in.ctas_per_sm > 0                 ? in.ctas_per_sm
                              : plan.wide                        ? 1
                              : in.head_dim == 128 || plan.wgmma ? 2
                                                                 : 3;
  const int64_t wave = static_cast<int64_t>(in.num_sms) * ctas_per_sm;
  int32_t max_kv_tiles = 1;
  for (int32_t r = 0; r < r_count; ++r) max_kv_tiles = std::max(max_kv_tiles, kv_tiles[r]);
  auto ctas_at = [&](int64_t chunk) {  // CTAs when every request is cut into `chunk`-tile splits
    int64_t n = 0;
    for (int32_t r = 0; r < r_count; ++r)
      n += static_cast<int64_t>(in.num_kv_heads) * row_tiles[r] *
           std::min<int64_t>(kAttnMaxSplits, (kv_tiles[r] + chunk - 1) / chunk);
    return n;
  };
  int64_t tiles_per_cta = max_kv_tiles;  // no split
  const bool balanced =
      max_kv_tiles <= kBalancedMaxTiles && min_rows >= kBalancedMinRows &&
      static_cast<int64_t>(max_kv_tiles) * in.num_sms * 8 <= unit_tiles * kBalancedNinths;
  // The shortest chunk whose CTAs fit in `fill` resident CTAs (ctas_at(max_kv_tiles) = units).
  auto shortest_chunk = [&](int64_t fill) {
    int64_t lo = kMinTilesPerSplit, hi = max_kv_tiles;
    while (lo < hi) {
      const int64_t mid = (lo + hi) / 2;
      if (ctas_at(mid) <= fill)
        hi = mid;
      else
        lo = mid + 1;
    }
    return lo;
  };
  if (!in.batch_invariant && in.max_splits != 1 && units < wave && !balanced &&
      max_kv_tiles > kMinTilesPerSplit) {
    tiles_per_cta = shortest_chunk(wave);
    // (64-row wgmma CTAs at head_dim 128 run two per SM unless the caller fixed the wave.)
    if (plan.wgmma && in.head_dim == 128 && !plan.wide && in.ctas_per_sm == 0 &&
        tiles_per_cta <= kShortSplitTiles && min_rows >= kShortSplitMinRows && units <= in.num_sms)
      tiles_per_cta = shortest_chunk(in.num_sms);
  }
  for (int32_t r = 0; r < r_count; ++r) {
    int64_t splits = 0;
    int32_t chunk_tiles = 0;
    if (in.batch_invariant) {
      // Fixed boundaries: a row's splits are those of a plain decode at its position (extra,
      // empty splits of a longer causal chunk merge with weight exactly 0).
      chunk_tiles = invariant_chunk_tiles(kv_tiles[r], invariant_base);
      splits = std::max<int64_t>(1, (kv_tiles[r] + chunk_tiles - 1) / chunk_tiles);
    } else {
      splits =
          in.fixed_splits > 0 ? in.fixed_splits : (kv_tiles[r] + tiles_per_cta - 1) / tiles_per_cta;
      if (in.max_splits >= 1) splits = std::min<int64_t>(splits, in.max_splits);
      splits = std::min<int64_t>(splits, kAttnMaxSplits);
      splits = std::max<int64_t>(1, splits);
      chunk_tiles = static_cast<int32_t>((kv_tiles[r] + splits - 1) / splits);
      // Recount so no split is empty.
      splits = (kv_tiles[r] + chunk_tiles - 1) / chunk_tiles;
    }
    plan.request_splits[r] = static_cast<int32_t>(splits);
    plan.request_kv_chunk[r] = chunk_tiles * kAttnKvTile;
    if (splits > 1) {
      plan.needs_merge = true;
      plan.request_partial_row[r] = static_cast<int32_t>(plan.num_partial_rows);
      plan.num_partial_rows += splits * (in.qo_indptr[r + 1] - in.qo_indptr[r]);
      plan.max_splits_used = std::max(plan.max_splits_used, static_cast<int32_t>(splits));
    }
  }

  // The automatic choice: long enough CTAs only (batch-invariant plans were checked above, so
  // only a shape-tuned plan is ever planned again).
  if (plan.wide && in_real.wide < 0) {
    int32_t longest = 0;
    for (int32_t r = 0; r < r_count; ++r)
      longest = std::max(longest, std::min(plan.request_kv_chunk[r] / kAttnKvTile, kv_tiles[r]));
    if (longest < kMinWideTiles) {
      AttentionPlanInputs narrow = in_real;
      narrow.wide = 0;
      return plan_paged_tree_attention(narrow);
    }
  }

  // Batch-invariant trees: consecutive nodes of one tree (same real request and prefix) in
  // groups of up to max_nodes (AttentionWorkItem::nodes). A node qualifies when its keys past
  // the last tile wholly below the prefix fit in kAttnMaxGroupTailTiles tiles and its split
  // is at most kAttnMaxGroupSplitTiles (the CTA's job list stays within kAttnMaxGroupJobs).
  std::vector<int32_t> group_of(r_count, 0);  // > 0: first node of a group of that size; -1: in one
  if (in.batch_invariant && in.tree_groups > 0 && !plan.wide) {
    const int32_t tile_rows = plan.wgmma ? 64 : 16;
    // Grouping trades parallelism for fewer prefix reads: a group's node tails run one after
    // another in its CTA. So groups only grow until the items still fill the GPU (results
    // are the same at any group size; only the time differs).
    int64_t node_items = 0;
    for (int32_t v = 0; v < r_count; ++v)
      node_items += static_cast<int64_t>(plan.request_splits[v]) * in.num_kv_heads;
    const int64_t fill = in.tree_groups >= 2 ? int64_t{kAttnMaxGroupNodes}
                                             : std::max<int64_t>(1, (node_items + wave - 1) / wave);
    const int32_t max_nodes =
        static_cast<int32_t>(std::min<int64_t>({kAttnMaxGroupNodes, tile_rows / group, fill}));
    auto eligible = [&](int32_t v) {
      const int32_t c = plan.virt.path_base[v];
      if (c == INT32_MAX) return false;  // a causal request
      if (plan.request_kv_chunk[v] / kAttnKvTile > kAttnMaxGroupSplitTiles) return false;
      const int32_t end = in.committed_len[v] + 1;
      const int32_t tiles = (end + kAttnKvTile - 1) / kAttnKvTile;
      if (tiles > INT16_MAX) return false;  // the CTA's job list holds tile indices as int16
      return tiles - c / kAttnKvTile <= kAttnMaxGroupTailTiles;
    };
    for (int32_t v = 0; max_nodes >= 2 && v < r_count;) {
      if (!eligible(v)) {
        ++v;
        continue;
      }
      int32_t n = 1;
      while (v + n < r_count && n < max_nodes && eligible(v + n) &&
             plan.virt.table_request[v + n] == plan.virt.table_request[v] &&
             plan.virt.path_base[v + n] == plan.virt.path_base[v] &&
             plan.request_kv_chunk[v + n] == plan.request_kv_chunk[v])
        ++n;
      if (n >= 2) {
        group_of[v] = n;
        for (int32_t k = 1; k < n; ++k) group_of[v + k] = -1;
      }
      v += n;
    }
  }

  // Work list, longest first (the tail of the launch is then short ones); the row tiles of one
  // (request, kv head, split) stay adjacent so their shared K/V reads meet in L2.
  struct Keyed {
    int32_t cost;
    AttentionWorkItem item;
  };
  std::vector<Keyed> items;
  items.reserve(static_cast<size_t>(units) * 2);
  for (int32_t r = 0; r < r_count; ++r) {
    if (group_of[r] < 0) continue;  // scored by its group's items
    if (group_of[r] > 0) {
      const int32_t n = group_of[r];
      int32_t splits = 0;
      for (int32_t k = 0; k < n; ++k) splits = std::max(splits, plan.request_splits[r + k]);
      const int32_t chunk_tiles = plan.request_kv_chunk[r] / kAttnKvTile;
      plan.tree_group_items += splits * in.num_kv_heads;
      for (int32_t s = 0; s < splits; ++s)
        for (int32_t h = 0; h < in.num_kv_heads; ++h)
          items.push_back({chunk_tiles + 2 * n, AttentionWorkItem{r, h, 0, static_cast<int16_t>(s),
                                                                  static_cast<int16_t>(warps_m[r]),
                                                                  static_cast<int16_t>(n), 0}});
      continue;
    }
    const int32_t splits = plan.request_splits[r];
    const int32_t chunk_tiles = plan.request_kv_chunk[r] / kAttnKvTile;
    for (int32_t s = 0; s < splits; ++s) {
      const int32_t tiles = std::min(chunk_tiles, kv_tiles[r] - s * chunk_tiles);
      for (int32_t h = 0; h < in.num_kv_heads; ++h)
        for (int32_t rt = 0; rt < row_tiles[r]; ++rt)
          items.push_back(
              {tiles, AttentionWorkItem{r, h, rt * 16 * warps_m[r], static_cast<int16_t>(s),
                                        static_cast<int16_t>(warps_m[r]), 0, 0}});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Keyed& a, const Keyed& b) { return a.cost > b.cost; });
  plan.work.reserve(items.size());
  for (const Keyed& k : items) plan.work.push_back(k.item);
  return plan;
}

}  // namespace arbor::kernels
