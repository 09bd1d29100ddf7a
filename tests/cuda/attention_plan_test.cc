// The shape-tuned attention plan's split-KV rule (kernels/attention/attention_plan.cc), host
// only (no GPU needed): splits never start a second wave of CTAs, a shorter chunk would, every
// split is non-empty, short units already balanced over the SMs are not split, and
// fixed_splits / max_splits are honoured. docs/kernels.md "Work decomposition"; the
// measurements behind the rule are in docs/kernel_notes.md "Work decomposition".
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "kernels/attention/paged_tree_attention.h"

namespace arbor {
namespace {

using kernels::AttentionPlan;
using kernels::AttentionPlanInputs;
using kernels::kAttnKvTile;

struct Batch {
  std::vector<int32_t> qo{0}, committed;
  void add(int32_t t, int32_t c) {
    qo.push_back(qo.back() + t);
    committed.push_back(c);
  }
};

// Llama-3-8B heads (32 query, 8 kv, head_dim 128) on 132 SMs; `b` must outlive the inputs.
AttentionPlanInputs inputs_for(const Batch& b, bool wgmma) {
  AttentionPlanInputs in;
  in.qo_indptr = b.qo.data();
  in.committed_len = b.committed.data();
  in.num_requests = static_cast<int32_t>(b.committed.size());
  in.num_q_heads = 32;
  in.num_kv_heads = 8;
  in.head_dim = 128;
  in.num_sms = 132;
  in.wgmma = wgmma;
  in.num_tokens = b.qo.back();
  return in;
}

AttentionPlan plan_for(const Batch& b, bool wgmma, int32_t fixed = 0, int32_t max_splits = 0,
                       int32_t wide = -1, bool invariant = false) {
  AttentionPlanInputs in = inputs_for(b, wgmma);
  in.fixed_splits = fixed;
  in.max_splits = max_splits;
  in.wide = wide;
  in.batch_invariant = invariant;
  return kernels::plan_paged_tree_attention(in);
}

int32_t kv_tiles(const Batch& b, size_t r) {
  const int32_t t = b.qo[r + 1] - b.qo[r];
  return (b.committed[r] + t + kAttnKvTile - 1) / kAttnKvTile;
}

// Every (request, kv head, row tile, split) appears exactly once, every split is non-empty, and
// (the automatic rule) a split is at least 2 tiles long; returns the item count.
int64_t check_items(const Batch& b, const AttentionPlan& p, bool automatic = true) {
  std::map<std::tuple<int32_t, int32_t, int32_t, int32_t>, int> seen;
  for (const auto& w : p.work) {
    EXPECT_GE(w.request, 0);
    EXPECT_LT(w.split, p.request_splits[w.request]);
    ++seen[{w.request, w.kv_head, w.row_begin, w.split}];
  }
  for (const auto& [key, n] : seen) EXPECT_EQ(n, 1);
  for (size_t r = 0; r < b.committed.size(); ++r) {
    const int32_t splits = p.request_splits[r], chunk = p.request_kv_chunk[r] / kAttnKvTile;
    EXPECT_GE(static_cast<int64_t>(splits) * chunk, kv_tiles(b, r)) << r;      // covers the keys
    EXPECT_LT(static_cast<int64_t>(splits - 1) * chunk, kv_tiles(b, r)) << r;  // none empty
    if (automatic && splits > 1) {
      EXPECT_GE(chunk, 2) << r;
    }
  }
  return static_cast<int64_t>(p.work.size());
}

TEST(AttentionPlan, SplitsFillOneWaveAndNoMore) {
  std::mt19937 rng(5);
  int split_plans = 0, wide_split_plans = 0, one_per_sm = 0, two_per_sm = 0;
  for (int trial = 0; trial < 400; ++trial) {
    const bool wgmma = trial % 2 == 0;
    Batch b;
    const int r_count = std::uniform_int_distribution<int>(1, 48)(rng);
    const int t_choice[] = {1, 4, 16, 32, 64, 128};
    for (int r = 0; r < r_count; ++r)
      b.add(t_choice[std::uniform_int_distribution<int>(0, 5)(rng)],
            std::uniform_int_distribution<int>(0, trial % 3 == 0 ? 40000 : 3000)(rng));
    // (a quarter of the trials with 128-row tiles forced, the rest the automatic choice)
    const AttentionPlan p = plan_for(b, wgmma, 0, 0, trial % 4 == 2 ? 1 : -1);
    // head_dim 128: 2 resident CTAs per SM, 1 with 128-row wgmma tiles.
    const int64_t wave = 132 * (p.wide ? 1 : 2);
    const int64_t items = check_items(b, p);
    // Units: items without splits.
    int64_t units = 0;
    for (const auto& w : p.work) units += w.split == 0;
    if (units >= wave) {
      EXPECT_EQ(p.max_splits_used, 1) << trial;
      continue;
    }
    if (p.max_splits_used == 1) continue;
    ++split_plans;
    wide_split_plans += p.wide;
    EXPECT_LE(items, wave) << trial << ": a split started a second wave";
    // The chunk is the shortest that fits: one tile less would need more than a wave (or the
    // chunk is the minimum, 2 tiles, or a request is at the 256-split limit). The wave is one
    // CTA per SM instead of two where two would leave splits of at most 4 tiles (64-row wgmma
    // CTAs, units of 64+ rows, at most one unit per SM).
    std::vector<int64_t> request_units(b.committed.size(), 0);
    int32_t min_rows = INT32_MAX;
    for (const auto& w : p.work)
      if (w.split == 0) ++request_units[static_cast<size_t>(w.request)];
    for (size_t r = 0; r < b.committed.size(); ++r)
      min_rows = std::min(min_rows, (b.qo[r + 1] - b.qo[r]) * 4);
    auto ctas_at = [&](int64_t c) {  // CTAs with `c`-tile splits
      int64_t n = 0;
      for (size_t r = 0; r < b.committed.size(); ++r)
        n += request_units[r] *
             std::min<int64_t>(kernels::kAttnMaxSplits, (kv_tiles(b, r) + c - 1) / c);
      return n;
    };
    int64_t fill = wave;
    if (wgmma && !p.wide && min_rows >= 64 && units <= 132) {
      int64_t c2 = 2;  // the shortest chunk for two CTAs per SM, by linear search
      while (ctas_at(c2) > wave) ++c2;
      if (c2 <= 4) fill = 132;
    }
    EXPECT_LE(items, fill) << trial;
    ++(fill == wave ? two_per_sm : one_per_sm);
    int32_t chunk = 0;
    for (size_t r = 0; r < b.committed.size(); ++r)
      if (p.request_splits[r] > 1) chunk = std::max(chunk, p.request_kv_chunk[r] / kAttnKvTile);
    if (chunk <= 2) continue;
    EXPECT_GT(ctas_at(chunk - 1), fill) << trial << ": chunk " << chunk << " is not the shortest";
  }
  EXPECT_GT(split_plans, 50);  // the random batches do exercise the split rule
  EXPECT_GT(one_per_sm, 0);    // ... both waves of it
  EXPECT_GT(two_per_sm, 20);
  EXPECT_GT(wide_split_plans, 5);
}

TEST(AttentionPlan, IssuePointsAndExamples) {
  // (8, 2048, 64): 256 units of 33 tiles fill the wave; no split (the old rule made 2).
  Batch a;
  for (int r = 0; r < 8; ++r) a.add(64, 2048);
  EXPECT_EQ(plan_for(a, true).max_splits_used, 1);
  // (1, 32768, 64): 32 units of 64 rows; 8 splits of 65 tiles give 256 CTAs.
  Batch c;
  c.add(64, 32768);
  const AttentionPlan pc = plan_for(c, true, 0, 0, /*wide=*/0);
  EXPECT_EQ(pc.request_splits[0], 8);
  EXPECT_EQ(check_items(c, pc), 256);
  // The same with 128-row tiles (the default here): 16 units, one CTA per SM, 8 splits give 128.
  const AttentionPlan pw = plan_for(c, true);
  EXPECT_TRUE(pw.wide);
  EXPECT_EQ(pw.request_splits[0], 8);
  EXPECT_EQ(check_items(c, pw), 128);
  // One long request beside many short ones: only the long one is split.
  Batch d;
  d.add(1, 30000);
  for (int r = 0; r < 20; ++r) d.add(1, 100);
  const AttentionPlan pd = plan_for(d, false);
  EXPECT_GT(pd.request_splits[0], 1);
  for (int r = 1; r <= 20; ++r) EXPECT_EQ(pd.request_splits[r], 1) << r;
  check_items(d, pd);
  // Short units already balanced over the SMs are not split: (16, 1024, 16) and (16, 2048, 16)
  // are 128 equal 64-row units on 132 SMs (2 splits were 15% and 6% slower on the H200). Long
  // ones are: at 8192 keys 2 splits were 5% faster. So are decode units (4 rows, little to
  // merge): 2 splits were as fast at 2048 keys and 7% faster at 8192.
  auto uniform = [](int32_t n, int32_t t, int32_t c) {
    Batch b;
    for (int r = 0; r < n; ++r) b.add(t, c);
    return b;
  };
  for (const bool wgmma : {true, false}) {
    EXPECT_EQ(plan_for(uniform(16, 16, 1024), wgmma).max_splits_used, 1);
    EXPECT_EQ(plan_for(uniform(16, 16, 2048), wgmma).max_splits_used, 1);
    EXPECT_EQ(plan_for(uniform(16, 16, 8192), wgmma).max_splits_used, 2);
    EXPECT_EQ(plan_for(uniform(16, 1, 2048), wgmma).max_splits_used, 2);
  }
  // Fewer equal units (here 96) leave SMs idle and are split; and so is one long request among
  // 120 short units (its 8 units set the time).
  EXPECT_EQ(plan_for(uniform(12, 16, 2048), true).max_splits_used, 2);
  Batch g;
  g.add(16, 30000);
  for (int r = 0; r < 15; ++r) g.add(16, 2048);
  const AttentionPlan pg = plan_for(g, true);
  EXPECT_GT(pg.request_splits[0], 1);
  check_items(g, pg);
  // Where two 64-row wgmma CTAs per SM would leave splits of 2-4 tiles, one CTA per SM with
  // about twice as long splits (the H200 sweep in docs/kernel_notes.md): (1, 8192, 16) 15
  // splits of 9 tiles, not 33 of 4; (1, 1024, 64) 4 of 5, not 6 of 3. Not at 5+ tiles ((1,
  // 1024, 128) keeps 4 splits of 5), not for units of fewer than 64 rows ((1, 8192, 1) keeps 33
  // splits, (2, 1024, 4) 9), not on the mma.sync path, nor when the caller fixes the resident
  // CTAs.
  EXPECT_EQ(plan_for(uniform(1, 16, 8192), true).request_splits[0], 15);
  EXPECT_EQ(plan_for(uniform(1, 64, 1024), true).request_splits[0], 4);
  EXPECT_EQ(plan_for(uniform(1, 32, 2048), true).request_splits[0], 7);
  EXPECT_EQ(plan_for(uniform(1, 128, 1024), true).request_splits[0], 4);
  EXPECT_EQ(plan_for(uniform(1, 1, 8192), true).request_splits[0], 33);
  EXPECT_EQ(plan_for(uniform(2, 4, 1024), true).request_splits[0], 9);   // 16-row units
  EXPECT_EQ(plan_for(uniform(4, 16, 1024), true).request_splits[0], 4);  // 6 splits of 3 before
  EXPECT_EQ(plan_for(uniform(1, 16, 8192), false).request_splits[0], 33);
  EXPECT_EQ(plan_for(uniform(8, 16, 1024), true).request_splits[0], 4);  // 5-tile splits
  const Batch one = uniform(1, 16, 8192);
  AttentionPlanInputs fixed_wave = inputs_for(one, true);
  fixed_wave.ctas_per_sm = 2;  // the caller's wave is kept
  EXPECT_EQ(kernels::plan_paged_tree_attention(fixed_wave).request_splits[0], 33);
}

// 128-row wgmma tiles: taken where they add at most 1/8 padded rows over 64-row tiles, only
// on the wgmma path and only in shape-tuned plans; items then start every 128 rows.
TEST(AttentionPlan, WideTiles) {
  auto batch = [](int32_t n, int32_t t, int32_t c) {
    Batch b;
    for (int r = 0; r < n; ++r) b.add(t, c);
    return b;
  };
  const Batch t64 = batch(8, 64, 2048);  // 256 rows per (request, kv head)
  const AttentionPlan w = plan_for(t64, true);
  EXPECT_TRUE(w.wide);
  EXPECT_EQ(check_items(t64, w), 8 * 8 * 2);
  for (const auto& item : w.work) EXPECT_EQ(item.row_begin % 128, 0);
  EXPECT_TRUE(plan_for(batch(32, 32, 4096), true).wide);  // 128 rows: no padding
  EXPECT_TRUE(plan_for(batch(4, 60, 2000), true).wide);   // 240 rows: 256 padded either way
  EXPECT_FALSE(plan_for(batch(4, 40, 500), true).wide);   // 160 rows: 256 against 192 padded
  EXPECT_FALSE(plan_for(batch(8, 16, 2048), true).wide);  // 64 rows: twice the padded rows
  EXPECT_FALSE(plan_for(batch(8, 1, 2048), true).wide);   // decode rows
  EXPECT_FALSE(plan_for(t64, false).wide);                // mma.sync
  EXPECT_FALSE(plan_for(t64, true, 0, 0, /*wide=*/0).wide);
  {  // head_dim 64: the wgmma kernel too, with the same choice of 128-row tiles
    AttentionPlanInputs in = inputs_for(t64, true);
    in.head_dim = 64;
    const AttentionPlan p64 = kernels::plan_paged_tree_attention(in);
    EXPECT_TRUE(p64.wgmma);
    EXPECT_TRUE(p64.wide);
    EXPECT_EQ(check_items(t64, p64), 8 * 8 * 2);
    in.wide = 0;  // 64-row tiles: 256 units fill 2 x 132 CTAs, no split
    const AttentionPlan n64 = kernels::plan_paged_tree_attention(in);
    EXPECT_FALSE(n64.wide);
    EXPECT_EQ(check_items(t64, n64), 8 * 8 * 4);
  }
  // Short CTAs (here 4 splits of <= 5 tiles) stay narrow unless forced.
  EXPECT_FALSE(plan_for(batch(1, 64, 1024), true).wide);
  EXPECT_TRUE(plan_for(batch(1, 64, 1024), true, 0, 0, /*wide=*/1).wide);
  // Batch-invariant plans: a causal chunk is one request (here 256 rows, whose rows get the
  // bits of 64-row tiles), but their fixed 8-tile splits are short: wide only when forced.
  EXPECT_FALSE(plan_for(t64, true, 0, 0, -1, /*invariant=*/true).wide);
  const AttentionPlan inv = plan_for(t64, true, 0, 0, /*wide=*/1, /*invariant=*/true);
  EXPECT_TRUE(inv.wide);
  EXPECT_EQ(inv.tree_group_items, 0);

  const Batch t16 = batch(8, 16, 2048);
  const AttentionPlan forced = plan_for(t16, true, 0, 0, /*wide=*/1);
  EXPECT_TRUE(forced.wide);
  check_items(t16, forced);
  int64_t units = 0;  // one 128-row tile per (request, kv head); 64 units split in two
  for (const auto& item : forced.work) units += item.split == 0 && item.row_begin == 0;
  EXPECT_EQ(units, 8 * 8);
  EXPECT_EQ(forced.work.size(), 2u * 8 * 8);
}

TEST(AttentionPlan, FixedAndMaxSplits) {
  Batch b;
  b.add(16, 5000);
  b.add(1, 100);  // 2 tiles: at most 2 splits
  const AttentionPlan fixed = plan_for(b, true, /*fixed=*/3);
  EXPECT_EQ(fixed.request_splits[0], 3);
  EXPECT_EQ(fixed.request_splits[1], 2);
  check_items(b, fixed, /*automatic=*/false);
  EXPECT_EQ(plan_for(b, true, /*fixed=*/3, /*max_splits=*/1).max_splits_used, 1);
  EXPECT_EQ(plan_for(b, true, 0, 1).max_splits_used, 1);
  const AttentionPlan capped = plan_for(b, true, 0, 4);
  EXPECT_LE(capped.max_splits_used, 4);
  check_items(b, capped);
}

}  // namespace
}  // namespace arbor
