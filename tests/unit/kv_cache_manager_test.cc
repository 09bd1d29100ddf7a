// KvCacheManager on hand-worked cases: slot layout, compaction plans for accepted tree paths,
// copy-on-write after fork, prefix sharing and its eviction, clean failure when out of blocks,
// and argument errors. The randomized model check is kv_cache_random_test.cc.
#include "engine/kv_cache/kv_cache_manager.h"

#include <gtest/gtest.h>

#include <functional>
#include <numeric>
#include <vector>

#include "engine/core/error.h"

namespace arbor {
namespace {

using Slots = std::vector<int64_t>;
using Ints = std::vector<int32_t>;

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no arbor::Error thrown";
  return ErrorCode::kInternal;
}

Ints iota_tokens(int32_t n, int32_t first = 100) {
  Ints t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), first);
  return t;
}

KvCacheManager make(int32_t num_blocks, int32_t block_size, bool prefix = true) {
  KvCacheConfig c;
  c.num_blocks = num_blocks;
  c.block_size = block_size;
  c.enable_prefix_caching = prefix;
  return KvCacheManager(c);
}

TEST(KvCacheManager, PrefillThenTreeCommitCompactsAcceptedNodes) {
  KvCacheManager kv = make(8, 4);
  const SeqId s = kv.create_sequence().seq;
  ReservePlan r;
  ASSERT_TRUE(kv.reserve(s, 5, &r));
  EXPECT_EQ(r.slots, (Slots{0, 1, 2, 3, 4}));  // blocks 0 and 1
  EXPECT_TRUE(r.copies.empty());
  EXPECT_EQ(kv.block_table(s), (Ints{0, 1}));
  CommitPlan c = kv.commit_all(s, iota_tokens(5));
  EXPECT_TRUE(c.copies.empty());
  EXPECT_EQ(kv.committed_len(s), 5);
  EXPECT_EQ(kv.num_free_blocks(), 6);

  // A 6-node tree at logical 5..10 fills block 1 and spills into a new block 2.
  ASSERT_TRUE(kv.reserve(s, 6, &r));
  EXPECT_EQ(kv.block_table(s), (Ints{0, 1, 2}));
  EXPECT_EQ(r.slots, (Slots{5, 6, 7, 8, 9, 10}));
  // Accept nodes {0, 2, 5}: node 0 stays at logical 5, node 2 moves 7 -> 6, node 5 moves 10 -> 7.
  const Ints accepted = {0, 2, 5};
  c = kv.plan_commit(s, accepted, Ints{7, 8, 9});
  EXPECT_EQ(c.copies.src_slots, (Slots{7, 10}));
  EXPECT_EQ(c.copies.dst_slots, (Slots{6, 7}));
  EXPECT_EQ(c.new_committed_len, 8);
  EXPECT_EQ(c.released_blocks, (Ints{2}));  // logical 8.. is no longer needed
  kv.apply(c);
  EXPECT_EQ(kv.committed_len(s), 8);
  EXPECT_EQ(kv.block_table(s), (Ints{0, 1}));
  EXPECT_EQ(kv.num_free_blocks(), 6);
  EXPECT_EQ(kv.slots(s, 6, 2), (Slots{6, 7}));
  kv.check_invariants();

  // Export for StepInputs.
  Ints table = {9};
  kv.append_block_table(s, 4, &table);
  EXPECT_EQ(table, (Ints{9, 0, 1, -1, -1}));
  EXPECT_EQ(code_of([&] { kv.append_block_table(s, 1, &table); }), ErrorCode::kInvalidArgument);

  kv.free_sequence(s);
  EXPECT_EQ(kv.num_free_blocks(), 8);
  kv.check_invariants();
}

TEST(KvCacheManager, CancelledReservationReleasesItsBlocks) {
  KvCacheManager kv = make(8, 4);
  const SeqId s = kv.create_sequence().seq;
  ASSERT_TRUE(kv.reserve(s, 3));
  kv.commit_all(s, iota_tokens(3));
  ASSERT_TRUE(kv.reserve(s, 9));  // logical 3..11: blocks 0, 1, 2
  EXPECT_EQ(kv.num_free_blocks(), 5);
  kv.apply(kv.plan_commit(s, Ints{}, Ints{}));
  EXPECT_EQ(kv.committed_len(s), 3);
  EXPECT_EQ(kv.block_table(s), (Ints{0}));
  EXPECT_EQ(kv.num_free_blocks(), 7);
  kv.check_invariants();
}

TEST(KvCacheManager, ForkSharesBlocksAndCopiesOnWrite) {
  KvCacheManager kv = make(8, 4);
  const SeqId a = kv.create_sequence().seq;
  ASSERT_TRUE(kv.reserve(a, 6));
  kv.commit_all(a, iota_tokens(6));  // blocks 0 (full) and 1 (2 of 4 used)
  const SeqId b = kv.fork(a);
  EXPECT_EQ(kv.block_table(b), (Ints{0, 1}));
  EXPECT_EQ(kv.refcount(0), 2);
  EXPECT_EQ(kv.refcount(1), 2);
  EXPECT_EQ(kv.blocks_needed(b, 1), 1);  // the copy of block 1

  ReservePlan r;
  ASSERT_TRUE(kv.reserve(b, 3, &r));  // logical 6..8: private copy of block 1, then a new block
  EXPECT_EQ(r.cow_block, 2);
  EXPECT_EQ(kv.block_table(b), (Ints{0, 2, 3}));
  EXPECT_EQ(r.copies.src_slots, (Slots{4, 5}));  // the committed part of block 1
  EXPECT_EQ(r.copies.dst_slots, (Slots{8, 9}));
  EXPECT_EQ(r.slots, (Slots{10, 11, 12}));
  EXPECT_EQ(kv.refcount(0), 2);
  EXPECT_EQ(kv.refcount(1), 1);
  EXPECT_EQ(kv.block_table(a), (Ints{0, 1}));
  EXPECT_EQ(kv.stats().cow_copies, 1);
  kv.check_invariants();

  // The parent now owns block 1 alone and writes it in place.
  ASSERT_TRUE(kv.reserve(a, 1, &r));
  EXPECT_TRUE(r.copies.empty());
  EXPECT_EQ(r.slots, (Slots{6}));
  kv.free_sequence(a);
  kv.free_sequence(b);
  EXPECT_EQ(kv.num_free_blocks(), 8);
  kv.check_invariants();
}

TEST(KvCacheManager, ForkAtBlockBoundaryNeedsNoCopy) {
  KvCacheManager kv = make(8, 4);
  const SeqId a = kv.create_sequence().seq;
  ASSERT_TRUE(kv.reserve(a, 8));
  kv.commit_all(a, iota_tokens(8));
  const SeqId b = kv.fork(a);
  ReservePlan r;
  ASSERT_TRUE(kv.reserve(b, 2, &r));
  EXPECT_TRUE(r.copies.empty());
  EXPECT_EQ(r.cow_block, -1);
  EXPECT_EQ(kv.block_table(b), (Ints{0, 1, 2}));
  kv.check_invariants();
}

TEST(KvCacheManager, SharesFullPromptBlocksAcrossRequests) {
  KvCacheManager kv = make(16, 4);
  const Ints prompt = iota_tokens(10);
  auto first = kv.create_sequence(prompt);
  EXPECT_EQ(first.cached_tokens, 0);
  ASSERT_TRUE(kv.reserve(first.seq, 6));  // chunked prefill: 6 then 4 tokens
  kv.commit_all(first.seq, Ints(prompt.begin(), prompt.begin() + 6));
  ASSERT_TRUE(kv.reserve(first.seq, 4));
  kv.commit_all(first.seq, Ints(prompt.begin() + 6, prompt.end()));
  EXPECT_TRUE(kv.is_cached(0));
  EXPECT_TRUE(kv.is_cached(1));
  EXPECT_FALSE(kv.is_cached(2));  // partly filled

  // Same prompt: both full blocks are reused; the rest is prefilled.
  EXPECT_EQ(kv.cached_prefix_tokens(prompt), 8);
  auto second = kv.create_sequence(prompt);
  EXPECT_EQ(second.cached_tokens, 8);
  EXPECT_EQ(kv.committed_len(second.seq), 8);
  EXPECT_EQ(kv.block_table(second.seq), (Ints{0, 1}));
  EXPECT_EQ(kv.refcount(0), 2);
  // A prompt of exactly 8 tokens keeps its last token to compute: only one block is reused.
  EXPECT_EQ(kv.create_sequence(Ints(prompt.begin(), prompt.begin() + 8)).cached_tokens, 4);
  // A different first block shares nothing, even with the same second block.
  Ints other = prompt;
  other[0] = 7;
  EXPECT_EQ(kv.create_sequence(other).cached_tokens, 0);
  // Same first block, different second block: one block.
  other = prompt;
  other[5] = 7;
  EXPECT_EQ(kv.create_sequence(other).cached_tokens, 4);
  KvCacheStats st = kv.stats();
  EXPECT_EQ(st.prefix_hit_tokens, 8 + 4 + 0 + 4);
  EXPECT_EQ(st.prefix_query_tokens, 10 + 10 + 8 + 10 + 10);

  // After everyone leaves, the cached blocks stay reusable...
  for (SeqId id : kv.sequence_ids()) kv.free_sequence(id);
  EXPECT_EQ(kv.num_free_blocks(), 16);
  EXPECT_EQ(kv.stats().evictable_blocks, 2);
  EXPECT_EQ(kv.cached_prefix_tokens(prompt), 8);
  kv.check_invariants();
  // ...until the pool needs them: 15 blocks take the 14 plain ones and evict the LRU block,
  // which is block 1 (a sequence releases its tail first), leaving block 0 reusable.
  const SeqId big = kv.create_sequence().seq;
  ASSERT_TRUE(kv.reserve(big, 15 * 4));
  EXPECT_EQ(kv.stats().evictions, 1);
  EXPECT_EQ(kv.cached_prefix_tokens(prompt), 4);
  kv.check_invariants();
}

TEST(KvCacheManager, PrefixCachingCanBeDisabled) {
  KvCacheManager kv = make(16, 4, /*prefix=*/false);
  const Ints prompt = iota_tokens(10);
  auto first = kv.create_sequence(prompt);
  ASSERT_TRUE(kv.reserve(first.seq, 10));
  kv.commit_all(first.seq, prompt);
  EXPECT_FALSE(kv.is_cached(0));
  EXPECT_EQ(kv.create_sequence(prompt).cached_tokens, 0);
  EXPECT_EQ(kv.stats().cached_blocks, 0);
}

TEST(KvCacheManager, OutOfBlocksFailsWithoutChangingAnything) {
  KvCacheManager kv = make(4, 4);
  const SeqId a = kv.create_sequence().seq;
  ASSERT_TRUE(kv.reserve(a, 6));
  kv.commit_all(a, iota_tokens(6));
  const SeqId b = kv.fork(a);
  ASSERT_TRUE(kv.reserve(a, 5));  // logical 6..10: COW of block 1 + 1 new block = 2 blocks
  EXPECT_EQ(kv.num_free_blocks(), 0);
  EXPECT_EQ(kv.blocks_needed(b, 1), 0);  // a took the copy; b owns block 1 alone now
  EXPECT_EQ(kv.blocks_needed(b, 3), 1);
  const KvCacheStats before = kv.stats();
  const Ints table_before = kv.block_table(b);
  EXPECT_FALSE(kv.plan_reserve(b, 3).has_value());
  EXPECT_FALSE(kv.reserve(b, 3));
  EXPECT_EQ(kv.block_table(b), table_before);
  EXPECT_EQ(kv.reserved_len(b), 0);
  EXPECT_EQ(kv.stats().free_blocks, before.free_blocks);
  EXPECT_EQ(kv.stats().used_blocks, before.used_blocks);
  ASSERT_TRUE(kv.reserve(b, 2));  // fits in b's own block 1
  kv.check_invariants();
}

TEST(KvCacheManager, StalePlansAndBadArgumentsAreRejected) {
  KvCacheManager kv = make(8, 4);
  const SeqId s = kv.create_sequence().seq;
  std::optional<ReservePlan> plan = kv.plan_reserve(s, 2);
  ASSERT_TRUE(plan);
  kv.create_sequence();  // any mutation invalidates the plan
  EXPECT_EQ(code_of([&] { kv.apply(*plan); }), ErrorCode::kInternal);

  EXPECT_EQ(code_of([&] { kv.plan_reserve(99, 1); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { kv.plan_reserve(s, 0); }), ErrorCode::kInvalidArgument);
  ASSERT_TRUE(kv.reserve(s, 4));
  EXPECT_EQ(code_of([&] { kv.plan_reserve(s, 1); }), ErrorCode::kInvalidArgument);  // in flight
  EXPECT_EQ(code_of([&] { kv.fork(s); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              kv.plan_commit(s, Ints{0, 0}, Ints{1, 1});
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] {
              kv.plan_commit(s, Ints{2, 1}, Ints{1, 1});
            }),
            ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { kv.plan_commit(s, Ints{4}, Ints{1}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { kv.plan_commit(s, Ints{0, 1}, Ints{1}); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { kv.slot(s, 4); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([&] { kv.free_sequence(42); }), ErrorCode::kInvalidArgument);
  KvCacheConfig bad;
  bad.num_blocks = 0;
  EXPECT_EQ(code_of([&] { KvCacheManager m(bad); }), ErrorCode::kInvalidArgument);
  try {
    bad.num_blocks = 4;
    bad.block_size = -2;
    bad.validate();
    ADD_FAILURE() << "block_size -2 accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("block_size"), std::string::npos) << e.what();
  }
  kv.check_invariants();
}

}  // namespace
}  // namespace arbor
