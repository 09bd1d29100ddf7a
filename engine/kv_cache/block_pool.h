// The pool of paged-KV blocks as metadata: reference counts, the free list, and the prefix cache
// (content hash -> block) with LRU eviction of unreferenced cached blocks. The K/V bytes live in
// the Backend; a block id here indexes its [num_blocks, block_size, ...] cache tensors.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include <absl/container/flat_hash_map.h>

namespace arbor {

class BlockPool {
 public:
  BlockPool(int32_t num_blocks, int32_t block_size);

  int32_t num_blocks() const { return num_blocks_; }
  int32_t block_size() const { return block_size_; }
  // Blocks an allocation can take: never-cached free blocks plus unreferenced cached blocks.
  int32_t num_free() const { return free_count_ + evictable_count_; }
  int32_t num_cached() const { return static_cast<int32_t>(cache_.size()); }
  int32_t num_evictable() const { return evictable_count_; }
  int64_t num_evictions() const { return num_evictions_; }
  int32_t refcount(int32_t block) const;
  bool is_cached(int32_t block) const;

  // The blocks allocate() should take for n new blocks, in order: plain free blocks first (most
  // recently freed first), then cached blocks from least recently used. Requires n <= num_free().
  std::vector<int32_t> peek_allocation(int32_t n) const;
  // Takes free blocks (refcount 0 -> 1); a cached one loses its hash (it is evicted).
  void allocate(std::span<const int32_t> blocks);
  // Adds a reference. A cached block at refcount 0 leaves the evictable list (a prefix hit).
  void incref(int32_t block);
  // Drops a reference. At 0 a cached block becomes evictable (most recently used end), any other
  // block plain free. Dropping a reference the block does not have is a bug (ARBOR_CHECK).
  void decref(int32_t block);

  // The cached block holding exactly (parent_hash, tokens) under `hash`, or -1.
  int32_t lookup(uint64_t hash, uint64_t parent_hash, std::span<const int32_t> tokens) const;
  // Registers a referenced full block under `hash` ([block_size] tokens). Returns false and changes
  // nothing when another block already holds that content.
  bool register_block(int32_t block, uint64_t hash, uint64_t parent_hash,
                      std::span<const int32_t> tokens);

  // ARBOR_CHECKs list membership, counts, and the hash map against the per-block state.
  void check_invariants() const;

 private:
  enum List : uint8_t { kNoList = 0, kFreeList = 1, kEvictableList = 2 };
  int32_t sentinel(List list) const { return num_blocks_ + (list == kFreeList ? 0 : 1); }
  void check_block(int32_t block) const;
  void push_front(List list, int32_t block);
  void push_back(List list, int32_t block);
  void unlink(int32_t block);

  int32_t num_blocks_;
  int32_t block_size_;
  std::vector<int32_t> refcount_;  // [num_blocks]
  // Intrusive doubly linked lists over block ids: [num_blocks + 2], the last two entries are the
  // free list's and the evictable list's sentinels.
  std::vector<int32_t> prev_;
  std::vector<int32_t> next_;
  std::vector<List> list_of_;  // [num_blocks] which list holds the block (refcount 0 only)
  int32_t free_count_ = 0;
  int32_t evictable_count_ = 0;
  int64_t num_evictions_ = 0;
  // Prefix cache. A block is cached iff cached_[block]; its key is (hash, parent hash, tokens).
  // hash -> block. absl's open addressing: 2-5x faster than std::unordered_map on these random
  // 64-bit keys once the pool outgrows the cache (tests/bench/host_map_bench.cc).
  absl::flat_hash_map<uint64_t, int32_t> cache_;
  std::vector<uint8_t> cached_;        // [num_blocks]
  std::vector<uint64_t> hash_;         // [num_blocks]
  std::vector<uint64_t> parent_hash_;  // [num_blocks]
  std::vector<int32_t> tokens_;        // [num_blocks * block_size]
};

}  // namespace arbor
