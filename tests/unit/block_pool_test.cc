// BlockPool: allocation order, reference counts, double-free detection, prefix-cache lookup and
// LRU eviction of unreferenced cached blocks.
#include "engine/kv_cache/block_pool.h"

#include <gtest/gtest.h>

#include <functional>
#include <vector>

#include "engine/core/error.h"
#include "engine/kv_cache/block_hash.h"

namespace arbor {
namespace {

ErrorCode code_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const Error& e) {
    return e.code();
  }
  ADD_FAILURE() << "no arbor::Error thrown";
  return ErrorCode::kInternal;
}

TEST(BlockPool, AllocatesInOrderAndCountsReferences) {
  BlockPool pool(4, 2);
  EXPECT_EQ(pool.num_free(), 4);
  std::vector<int32_t> blocks = pool.peek_allocation(3);
  EXPECT_EQ(blocks, (std::vector<int32_t>{0, 1, 2}));
  pool.allocate(blocks);
  EXPECT_EQ(pool.num_free(), 1);
  pool.incref(1);
  EXPECT_EQ(pool.refcount(1), 2);
  pool.decref(1);
  EXPECT_EQ(pool.refcount(1), 1);
  pool.decref(1);
  EXPECT_EQ(pool.refcount(1), 0);
  EXPECT_EQ(pool.num_free(), 2);
  // The most recently freed plain block is handed out first.
  EXPECT_EQ(pool.peek_allocation(2), (std::vector<int32_t>{1, 3}));
  pool.check_invariants();
}

TEST(BlockPool, DoubleFreeAndBadIncrefAreInternalErrors) {
  BlockPool pool(2, 4);
  pool.allocate(pool.peek_allocation(1));
  pool.decref(0);
  EXPECT_EQ(code_of([&] { pool.decref(0); }), ErrorCode::kInternal);
  EXPECT_EQ(code_of([&] { pool.incref(1); }), ErrorCode::kInternal);  // free and uncached
  EXPECT_EQ(code_of([&] { pool.decref(7); }), ErrorCode::kInternal);
  const int32_t used[] = {0};
  pool.allocate(used);
  EXPECT_EQ(code_of([&] { pool.allocate(used); }), ErrorCode::kInternal);
  pool.check_invariants();
}

TEST(BlockPool, RejectsBadGeometry) {
  EXPECT_EQ(code_of([] { BlockPool(0, 16); }), ErrorCode::kInvalidArgument);
  EXPECT_EQ(code_of([] { BlockPool(8, 0); }), ErrorCode::kInvalidArgument);
}

TEST(BlockPool, CachedBlocksAreReusableUntilEvictedLeastRecentlyUsedFirst) {
  BlockPool pool(4, 2);
  pool.allocate(pool.peek_allocation(3));  // blocks 0, 1, 2
  const std::vector<std::vector<int32_t>> tokens = {{1, 2}, {3, 4}, {5, 6}};
  std::vector<uint64_t> hashes;
  for (int32_t b = 0; b < 3; ++b) {
    hashes.push_back(hash_block(kRootBlockHash, tokens[b]));
    EXPECT_TRUE(pool.register_block(b, hashes[b], kRootBlockHash, tokens[b]));
  }
  // Same content under another block is not registered twice.
  pool.allocate(pool.peek_allocation(1));  // block 3
  EXPECT_FALSE(pool.register_block(3, hashes[0], kRootBlockHash, tokens[0]));
  EXPECT_FALSE(pool.is_cached(3));
  pool.decref(3);

  EXPECT_EQ(pool.lookup(hashes[1], kRootBlockHash, tokens[1]), 1);
  EXPECT_EQ(pool.lookup(hashes[1], kRootBlockHash, tokens[0]), -1);  // content must match too
  EXPECT_EQ(pool.lookup(hashes[1], hashes[0], tokens[1]), -1);       // and the parent

  pool.decref(2);
  pool.decref(0);
  pool.decref(1);  // LRU order of the evictable list: 2, 0, 1
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.num_evictable(), 3);
  EXPECT_EQ(pool.peek_allocation(4), (std::vector<int32_t>{3, 2, 0, 1}));
  // A prefix hit revives block 0: it leaves the evictable list and keeps its hash.
  pool.incref(0);
  EXPECT_EQ(pool.num_free(), 3);
  EXPECT_EQ(pool.peek_allocation(3), (std::vector<int32_t>{3, 2, 1}));
  // Allocating 2 blocks takes the plain block 3, then evicts block 2 (its hash is dropped).
  pool.allocate(pool.peek_allocation(2));
  EXPECT_EQ(pool.num_evictions(), 1);
  EXPECT_FALSE(pool.is_cached(2));
  EXPECT_EQ(pool.lookup(hashes[2], kRootBlockHash, tokens[2]), -1);
  EXPECT_EQ(pool.lookup(hashes[0], kRootBlockHash, tokens[0]), 0);
  pool.decref(0);
  EXPECT_EQ(pool.peek_allocation(2), (std::vector<int32_t>{1, 0}));  // 0 is now most recent
  pool.check_invariants();
}

TEST(BlockHash, ChainsParentAndDependsOnEveryToken) {
  const std::vector<int32_t> a = {1, 2, 3, 4};
  const std::vector<int32_t> b = {1, 2, 3, 5};
  EXPECT_NE(hash_block(kRootBlockHash, a), hash_block(kRootBlockHash, b));
  EXPECT_NE(hash_block(kRootBlockHash, a), hash_block(hash_block(kRootBlockHash, b), a));
  EXPECT_EQ(hash_block(kRootBlockHash, a), hash_block(kRootBlockHash, std::vector<int32_t>(a)));
}

}  // namespace
}  // namespace arbor
