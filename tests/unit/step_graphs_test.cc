// StepGraphCache (engine/backend/step_graphs.h) without a device: when a step is recorded,
// replayed or run eagerly, LRU eviction, invalidation by the memory epoch, failed recordings,
// and the bucket / block-table padding helpers that keep graph keys steady.
#include "engine/backend/step_graphs.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <set>

namespace arbor {
namespace {

using Action = StepGraphCache::Action;

struct Released {
  std::vector<int64_t> ids;
};

StepGraphCache make_cache(Released* r, int32_t max_graphs = 64, int32_t eager_runs = 2) {
  StepGraphCache::Options o;
  o.max_graphs = max_graphs;
  o.eager_runs_before_capture = eager_runs;
  return StepGraphCache(o, [r](int64_t g) { r->ids.push_back(g); });
}

TEST(StepGraphCache, RecordsAfterTwoEagerRunsThenReplays) {
  Released rel;
  StepGraphCache c = make_cache(&rel);
  const StepGraphKey k = {1, 8, 8, 8, 4, 0};
  EXPECT_EQ(c.lookup(k, 1).action, Action::kEager);
  EXPECT_EQ(c.lookup(k, 1).action, Action::kEager);
  ASSERT_EQ(c.lookup(k, 1).action, Action::kCapture);
  Tensor logits{reinterpret_cast<void*>(0x1000), DType::kF32, 8, 512};
  c.captured(k, 7, {Tensor{}, logits});
  for (int i = 0; i < 3; ++i) {
    const auto d = c.lookup(k, 1);
    ASSERT_EQ(d.action, Action::kReplay);
    EXPECT_EQ(d.graph, 7);
    ASSERT_NE(d.outputs, nullptr);
    EXPECT_EQ((*d.outputs)[1].data, logits.data);
    EXPECT_EQ((*d.outputs)[1].cols, 512);
  }
  EXPECT_EQ(c.stats().eager, 2);
  EXPECT_EQ(c.stats().captures, 1);
  EXPECT_EQ(c.stats().replays, 3);
  EXPECT_TRUE(rel.ids.empty());
}

TEST(StepGraphCache, DifferentKeysAreCountedApart) {
  Released rel;
  StepGraphCache c = make_cache(&rel);
  const StepGraphKey a = {1, 1}, b = {1, 2};
  EXPECT_EQ(c.lookup(a, 1).action, Action::kEager);
  EXPECT_EQ(c.lookup(b, 1).action, Action::kEager);
  EXPECT_EQ(c.lookup(a, 1).action, Action::kEager);
  EXPECT_EQ(c.lookup(b, 1).action, Action::kEager);
  EXPECT_EQ(c.lookup(a, 1).action, Action::kCapture);
  c.captured(a, 0, {Tensor{}, Tensor{}});
  EXPECT_EQ(c.lookup(b, 1).action, Action::kCapture);
  c.captured(b, 1, {Tensor{}, Tensor{}});
  EXPECT_EQ(c.lookup(a, 1).graph, 0);
  EXPECT_EQ(c.lookup(b, 1).graph, 1);
}

TEST(StepGraphCache, EpochChangeDropsEveryRecording) {
  Released rel;
  StepGraphCache c = make_cache(&rel);
  const StepGraphKey a = {1, 1}, b = {1, 2};
  for (const auto& k : {a, b}) {
    c.lookup(k, 5);
    c.lookup(k, 5);
  }
  ASSERT_EQ(c.lookup(a, 5).action, Action::kCapture);
  c.captured(a, 10, {Tensor{}, Tensor{}});
  ASSERT_EQ(c.lookup(b, 5).action, Action::kCapture);
  c.captured(b, 11, {Tensor{}, Tensor{}});
  EXPECT_EQ(c.num_graphs(), 2u);
  // A buffer moved: the recordings point at freed memory and must never run again.
  const auto d = c.lookup(a, 6);
  EXPECT_EQ(d.action, Action::kCapture);  // steady key: recorded again at once
  EXPECT_EQ(std::set<int64_t>(rel.ids.begin(), rel.ids.end()), (std::set<int64_t>{10, 11}));
  EXPECT_EQ(c.num_graphs(), 0u);
  EXPECT_EQ(c.stats().invalidations, 1);
  c.captured(a, 12, {Tensor{}, Tensor{}});
  EXPECT_EQ(c.lookup(a, 6).graph, 12);
  EXPECT_EQ(c.lookup(b, 6).action, Action::kCapture);
}

TEST(StepGraphCache, EvictsLeastRecentlyUsedBeyondCap) {
  Released rel;
  StepGraphCache c = make_cache(&rel, /*max_graphs=*/2, /*eager_runs=*/1);
  const StepGraphKey a = {1}, b = {2}, d = {3};
  for (int64_t g = 0; g < 2; ++g) {
    const StepGraphKey& k = g == 0 ? a : b;
    ASSERT_EQ(c.lookup(k, 1).action, Action::kEager);
    ASSERT_EQ(c.lookup(k, 1).action, Action::kCapture);
    c.captured(k, g, {Tensor{}, Tensor{}});
  }
  EXPECT_EQ(c.lookup(a, 1).action, Action::kReplay);  // a is now more recent than b
  ASSERT_EQ(c.lookup(d, 1).action, Action::kEager);
  ASSERT_EQ(c.lookup(d, 1).action, Action::kCapture);
  c.captured(d, 2, {Tensor{}, Tensor{}});
  EXPECT_EQ(rel.ids, std::vector<int64_t>{1});  // b evicted
  EXPECT_EQ(c.num_graphs(), 2u);
  EXPECT_EQ(c.lookup(a, 1).graph, 0);
  EXPECT_EQ(c.lookup(d, 1).graph, 2);
  EXPECT_EQ(c.lookup(b, 1).action, Action::kCapture);  // seen before: recorded again
  EXPECT_EQ(c.stats().evictions, 1);
}

TEST(StepGraphCache, FailedRecordingIsNotRetried) {
  Released rel;
  StepGraphCache c = make_cache(&rel);
  const StepGraphKey k = {4, 2};
  c.lookup(k, 1);
  c.lookup(k, 1);
  ASSERT_EQ(c.lookup(k, 1).action, Action::kCapture);
  c.captured(k, -1, {});
  for (int i = 0; i < 5; ++i) EXPECT_EQ(c.lookup(k, 1).action, Action::kEager);
  EXPECT_EQ(c.stats().capture_failures, 1);
  EXPECT_EQ(c.num_graphs(), 0u);
}

TEST(StepGraphCache, DestructionAndClearReleaseEverything) {
  Released rel;
  {
    StepGraphCache c = make_cache(&rel, 64, 1);
    for (int64_t g = 0; g < 3; ++g) {
      const StepGraphKey k = {g};
      c.lookup(k, 1);
      ASSERT_EQ(c.lookup(k, 1).action, Action::kCapture);
      c.captured(k, g, {Tensor{}, Tensor{}});
    }
    c.clear();
    EXPECT_EQ(rel.ids.size(), 3u);
    const StepGraphKey k = {0};
    EXPECT_EQ(c.lookup(k, 1).action, Action::kEager);  // sightings forgotten too
    ASSERT_EQ(c.lookup(k, 1).action, Action::kCapture);
    c.captured(k, 9, {Tensor{}, Tensor{}});
  }
  EXPECT_EQ(rel.ids.back(), 9);
}

TEST(GraphBucket, RoundsUpWithBoundedPadding) {
  for (int64_t n = 0; n <= 8; ++n) EXPECT_EQ(graph_bucket(n), n);
  EXPECT_EQ(graph_bucket(9), 9);
  EXPECT_EQ(graph_bucket(17), 18);
  EXPECT_EQ(graph_bucket(64), 64);
  EXPECT_EQ(graph_bucket(65), 72);
  EXPECT_EQ(graph_bucket(1000), 1024);
  EXPECT_EQ(graph_bucket(33, 4), 40);
  int64_t distinct = 0, last = -1;
  for (int64_t n = 1; n <= 100000; ++n) {
    const int64_t b = graph_bucket(n);
    ASSERT_GE(b, n);
    ASSERT_LE(b - n, std::max<int64_t>(0, n / 8)) << n;
    ASSERT_EQ(graph_bucket(b), b) << n;  // buckets are fixed points
    if (b != last) ++distinct;
    last = b;
  }
  EXPECT_LT(distinct, 8 + 8 * 17);  // about 8 per power of two
}

TEST(GraphBucket, RequestCapacityIsAPowerOfTwoOfAtLeastEight) {
  for (int64_t r = 0; r <= 8; ++r) EXPECT_EQ(graph_request_capacity(r), 8) << r;
  EXPECT_EQ(graph_request_capacity(9), 16);
  EXPECT_EQ(graph_request_capacity(16), 16);
  EXPECT_EQ(graph_request_capacity(17), 32);
  EXPECT_EQ(graph_request_capacity(255), 256);
  for (int64_t r = 1; r <= 4096; ++r) {
    const int64_t c = graph_request_capacity(r);
    ASSERT_GE(c, r);
    ASSERT_LT(c, std::max<int64_t>(16, 2 * r)) << r;  // under 2x (or the minimum of 8)
    ASSERT_EQ(c & (c - 1), 0) << r;
  }
}

TEST(GraphBucket, BlockTablesPaddedWithMinusOne) {
  StepInputs s;
  s.token_ids = {5, 6};
  s.positions = {3, 9};
  s.slot_mapping = {3, 25};
  s.qo_indptr = {0, 1, 2};
  s.committed_len = {3, 9};
  s.mask_indptr = {0, 0, 0};
  s.logits_rows = {0, 1};
  s.max_blocks_per_request = 2;
  s.block_tables = {0, -1, 1, 2};
  const StepInputs p = with_block_table_width(s, 4);
  EXPECT_EQ(p.max_blocks_per_request, 4);
  EXPECT_EQ(p.block_tables, (std::vector<int32_t>{0, -1, -1, -1, 1, 2, -1, -1}));
  EXPECT_EQ(p.token_ids, s.token_ids);
  KvCacheShape kv;
  kv.num_layers = 1;
  kv.num_blocks = 4;
  kv.block_size = 8;
  kv.num_kv_heads = 1;
  kv.head_dim = 8;
  EXPECT_NO_THROW(p.validate(kv));
  EXPECT_EQ(with_block_table_width(s, 2).block_tables, s.block_tables);
}

TEST(GraphBucket, GraphTableWidthIsAPowerOfTwoNoSmallerThanTheMinimum) {
  auto step_of_width = [](int32_t w) {
    StepInputs s;
    s.token_ids = {5};
    s.positions = {3};
    s.slot_mapping = {3};
    s.qo_indptr = {0, 1};
    s.committed_len = {3};
    s.mask_indptr = {0, 0};
    s.logits_rows = {0};
    s.max_blocks_per_request = w;
    s.block_tables.assign(static_cast<size_t>(w), -1);
    s.block_tables[0] = 7;
    return s;
  };
  for (const int32_t w : {1, 2, 3, 16, 33, 64, 65, 100, 128, 300}) {
    const StepInputs s = step_of_width(w);
    StepInputs storage;
    const StepInputs& g = with_graph_table_width(s, &storage);
    int32_t want = 1;
    while (want < w) want *= 2;
    want = std::max<int32_t>(want, static_cast<int32_t>(kGraphMinTableWidth));
    EXPECT_EQ(g.max_blocks_per_request, want) << w;
    ASSERT_EQ(g.block_tables.size(), static_cast<size_t>(want)) << w;
    EXPECT_EQ(g.block_tables[0], 7) << w;
    for (int32_t b = 1; b < want; ++b) EXPECT_EQ(g.block_tables[static_cast<size_t>(b)], -1);
    // A width that is already a bucket is used as is (no copy).
    EXPECT_EQ(&g == &s, want == w) << w;
  }
}

}  // namespace
}  // namespace arbor
