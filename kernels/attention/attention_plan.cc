// Host-side planning of a paged tree-attention launch: the work list (no CTA idles on padding
// rows of another request) and the split-KV choice from the shape.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <string>

#include "kernels/attention/paged_tree_attention.h"

namespace arbor::kernels {

namespace {
constexpr int32_t kMinTilesPerSplit = 4;  // 256 keys: below that the merge costs more than it saves
}

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

AttentionPlan plan_paged_tree_attention(const AttentionPlanInputs& in) {
  AttentionPlan plan;
  const int32_t r_count = in.num_requests;
  const int32_t group = in.num_q_heads / in.num_kv_heads;
  plan.tensor_core = in.head_dim == 64 || in.head_dim == 128;
  plan.wgmma = in.wgmma && in.head_dim == 128;  // the wgmma kernel is built for 128
  plan.request_splits.assign(r_count, 1);
  plan.request_kv_chunk.assign(r_count, 0);
  plan.request_partial_row.assign(r_count, 0);
  if (!plan.tensor_core) {  // generic path: one warp per (row, head), no splits
    for (int32_t r = 0; r < r_count; ++r)
      plan.request_kv_chunk[r] = in.committed_len[r] + in.qo_indptr[r + 1] - in.qo_indptr[r];
    return plan;
  }

  // Rows per tile and tiles per (request, kv head).
  std::vector<int32_t> warps_m(r_count), row_tiles(r_count), kv_tiles(r_count);
  int64_t units = 0, work_tiles = 0;
  for (int32_t r = 0; r < r_count; ++r) {
    const int32_t t = in.qo_indptr[r + 1] - in.qo_indptr[r];
    const int32_t rows = t * group;
    // mma.sync: the smallest tile that holds the rows (the other warps split the KV tile);
    // wgmma: always one m64 tile.
    warps_m[r] = plan.wgmma ? 4 : rows <= 16 ? 1 : rows <= 32 ? 2 : 4;
    row_tiles[r] = (rows + 16 * warps_m[r] - 1) / (16 * warps_m[r]);
    const int32_t kv_len = in.committed_len[r] + t;
    kv_tiles[r] = (kv_len + kAttnKvTile - 1) / kAttnKvTile;
    units += static_cast<int64_t>(in.num_kv_heads) * row_tiles[r];
    work_tiles += static_cast<int64_t>(in.num_kv_heads) * row_tiles[r] * kv_tiles[r];
  }

  // Split-KV: aim for about one full wave of resident CTAs. Each CTA should stream at least
  // `tiles_per_cta` KV tiles; requests longer than that are cut, shorter ones are not, so a
  // long request beside many short ones is split while the short ones are left alone.
  // Resident CTAs per SM of the tensor-core kernel: 2 at head_dim 128 (243 registers), else 3.
  const int32_t ctas_per_sm = in.ctas_per_sm > 0 ? in.ctas_per_sm : in.head_dim == 128 ? 2 : 3;
  const int64_t target = static_cast<int64_t>(in.num_sms) * ctas_per_sm;
  int64_t tiles_per_cta = std::max<int64_t>(kMinTilesPerSplit, (work_tiles + target - 1) / target);
  if (in.max_splits == 1) tiles_per_cta = INT32_MAX;
  for (int32_t r = 0; r < r_count; ++r) {
    int64_t splits = (kv_tiles[r] + tiles_per_cta - 1) / tiles_per_cta;
    if (in.max_splits > 1) splits = std::min<int64_t>(splits, in.max_splits);
    splits = std::min<int64_t>(splits, kAttnMaxSplits);
    splits = std::max<int64_t>(1, splits);
    const int32_t chunk_tiles = static_cast<int32_t>((kv_tiles[r] + splits - 1) / splits);
    // Recount so no split is empty.
    splits = (kv_tiles[r] + chunk_tiles - 1) / chunk_tiles;
    plan.request_splits[r] = static_cast<int32_t>(splits);
    plan.request_kv_chunk[r] = chunk_tiles * kAttnKvTile;
    if (splits > 1) {
      plan.needs_merge = true;
      plan.request_partial_row[r] = static_cast<int32_t>(plan.num_partial_rows);
      plan.num_partial_rows += splits * (in.qo_indptr[r + 1] - in.qo_indptr[r]);
      plan.max_splits_used = std::max(plan.max_splits_used, static_cast<int32_t>(splits));
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
    const int32_t splits = plan.request_splits[r];
    const int32_t chunk_tiles = plan.request_kv_chunk[r] / kAttnKvTile;
    for (int32_t s = 0; s < splits; ++s) {
      const int32_t tiles = std::min(chunk_tiles, kv_tiles[r] - s * chunk_tiles);
      for (int32_t h = 0; h < in.num_kv_heads; ++h)
        for (int32_t rt = 0; rt < row_tiles[r]; ++rt)
          items.push_back(
              {tiles, AttentionWorkItem{r, h, rt * 16 * warps_m[r], static_cast<int16_t>(s),
                                        static_cast<int16_t>(warps_m[r])}});
    }
  }
  std::stable_sort(items.begin(), items.end(),
                   [](const Keyed& a, const Keyed& b) { return a.cost > b.cost; });
  plan.work.reserve(items.size());
  for (const Keyed& k : items) plan.work.push_back(k.item);
  return plan;
}

}  // namespace arbor::kernels
