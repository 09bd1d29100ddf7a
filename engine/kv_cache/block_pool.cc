#include "engine/kv_cache/block_pool.h"

#include <algorithm>
#include <string>

#include "engine/core/error.h"

namespace arbor {

BlockPool::BlockPool(int32_t num_blocks, int32_t block_size)
    : num_blocks_(num_blocks), block_size_(block_size) {
  if (num_blocks <= 0 || block_size <= 0)
    throw_error(ErrorCode::kInvalidArgument,
                "block pool needs num_blocks > 0 and block_size > 0, got num_blocks " +
                    std::to_string(num_blocks) + " and block_size " + std::to_string(block_size));
  refcount_.assign(num_blocks, 0);
  prev_.assign(num_blocks + 2, -1);
  next_.assign(num_blocks + 2, -1);
  for (List list : {kFreeList, kEvictableList}) {
    prev_[sentinel(list)] = next_[sentinel(list)] = sentinel(list);
  }
  list_of_.assign(num_blocks, kNoList);
  cached_.assign(num_blocks, 0);
  hash_.assign(num_blocks, 0);
  parent_hash_.assign(num_blocks, 0);
  tokens_.assign(static_cast<size_t>(num_blocks) * block_size, 0);
  for (int32_t b = 0; b < num_blocks; ++b) push_back(kFreeList, b);
}

void BlockPool::check_block(int32_t block) const {
  ARBOR_CHECK(
      block >= 0 && block < num_blocks_,
      "block " + std::to_string(block) + " outside [0, " + std::to_string(num_blocks_) + ")");
}

int32_t BlockPool::refcount(int32_t block) const {
  check_block(block);
  return refcount_[block];
}

bool BlockPool::is_cached(int32_t block) const {
  check_block(block);
  return cached_[block] != 0;
}

void BlockPool::push_front(List list, int32_t block) {
  const int32_t s = sentinel(list);
  const int32_t first = next_[s];
  prev_[block] = s;
  next_[block] = first;
  prev_[first] = block;
  next_[s] = block;
  list_of_[block] = list;
  (list == kFreeList ? free_count_ : evictable_count_) += 1;
}

void BlockPool::push_back(List list, int32_t block) {
  const int32_t s = sentinel(list);
  const int32_t last = prev_[s];
  prev_[block] = last;
  next_[block] = s;
  next_[last] = block;
  prev_[s] = block;
  list_of_[block] = list;
  (list == kFreeList ? free_count_ : evictable_count_) += 1;
}

void BlockPool::unlink(int32_t block) {
  const List list = list_of_[block];
  ARBOR_CHECK(list != kNoList, "block " + std::to_string(block) + " is in no free list");
  next_[prev_[block]] = next_[block];
  prev_[next_[block]] = prev_[block];
  prev_[block] = next_[block] = -1;
  list_of_[block] = kNoList;
  (list == kFreeList ? free_count_ : evictable_count_) -= 1;
}

std::vector<int32_t> BlockPool::peek_allocation(int32_t n) const {
  ARBOR_CHECK(n >= 0 && n <= num_free(), "asked for " + std::to_string(n) + " blocks, " +
                                             std::to_string(num_free()) + " free");
  std::vector<int32_t> out;
  out.reserve(n);
  for (List list : {kFreeList, kEvictableList}) {
    for (int32_t b = next_[sentinel(list)];
         b != sentinel(list) && static_cast<int32_t>(out.size()) < n; b = next_[b]) {
      out.push_back(b);
    }
  }
  return out;
}

void BlockPool::allocate(std::span<const int32_t> blocks) {
  for (int32_t b : blocks) {
    check_block(b);
    ARBOR_CHECK(refcount_[b] == 0, "allocating block " + std::to_string(b) + " with refcount " +
                                       std::to_string(refcount_[b]));
    unlink(b);
    if (cached_[b]) {
      cache_.erase(hash_[b]);
      cached_[b] = 0;
      ++num_evictions_;
    }
    refcount_[b] = 1;
  }
}

void BlockPool::incref(int32_t block) {
  check_block(block);
  if (refcount_[block] == 0) {
    ARBOR_CHECK(list_of_[block] == kEvictableList,
                "incref of free block " + std::to_string(block) + " that is not cached");
    unlink(block);
  }
  ++refcount_[block];
}

void BlockPool::decref(int32_t block) {
  check_block(block);
  ARBOR_CHECK(refcount_[block] > 0, "double free of block " + std::to_string(block));
  if (--refcount_[block] == 0) {
    if (cached_[block]) {
      push_back(kEvictableList, block);
    } else {
      push_front(kFreeList, block);
    }
  }
}

int32_t BlockPool::lookup(uint64_t hash, uint64_t parent_hash,
                          std::span<const int32_t> tokens) const {
  auto it = cache_.find(hash);
  if (it == cache_.end()) return -1;
  const int32_t b = it->second;
  if (parent_hash_[b] != parent_hash || static_cast<int32_t>(tokens.size()) != block_size_)
    return -1;
  const int32_t* stored = tokens_.data() + static_cast<size_t>(b) * block_size_;
  return std::equal(tokens.begin(), tokens.end(), stored) ? b : -1;
}

bool BlockPool::register_block(int32_t block, uint64_t hash, uint64_t parent_hash,
                               std::span<const int32_t> tokens) {
  check_block(block);
  ARBOR_CHECK(refcount_[block] > 0,
              "registering unreferenced block " + std::to_string(block) + " in the prefix cache");
  ARBOR_CHECK(!cached_[block], "block " + std::to_string(block) + " is already cached");
  ARBOR_CHECK(static_cast<int32_t>(tokens.size()) == block_size_,
              "registering a block with " + std::to_string(tokens.size()) + " tokens");
  if (cache_.count(hash) != 0) return false;
  cache_.emplace(hash, block);
  cached_[block] = 1;
  hash_[block] = hash;
  parent_hash_[block] = parent_hash;
  std::copy(tokens.begin(), tokens.end(),
            tokens_.begin() + static_cast<size_t>(block) * block_size_);
  return true;
}

void BlockPool::check_invariants() const {
  int32_t free_seen = 0;
  int32_t evictable_seen = 0;
  for (List list : {kFreeList, kEvictableList}) {
    const int32_t s = sentinel(list);
    for (int32_t b = next_[s]; b != s; b = next_[b]) {
      ARBOR_CHECK(b >= 0 && b < num_blocks_, "corrupt free list link " + std::to_string(b));
      ARBOR_CHECK(list_of_[b] == list, "block " + std::to_string(b) + " in the wrong list");
      ARBOR_CHECK(next_[prev_[b]] == b, "broken back link at block " + std::to_string(b));
      (list == kFreeList ? free_seen : evictable_seen) += 1;
      ARBOR_CHECK(free_seen + evictable_seen <= num_blocks_, "cycle in the free lists");
    }
  }
  ARBOR_CHECK(free_seen == free_count_ && evictable_seen == evictable_count_,
              "list counts " + std::to_string(free_count_) + "/" +
                  std::to_string(evictable_count_) + " but walked " + std::to_string(free_seen) +
                  "/" + std::to_string(evictable_seen));
  int32_t num_cached = 0;
  for (int32_t b = 0; b < num_blocks_; ++b) {
    const std::string name = "block " + std::to_string(b);
    ARBOR_CHECK(refcount_[b] >= 0, name + " has a negative refcount");
    if (refcount_[b] > 0) {
      ARBOR_CHECK(list_of_[b] == kNoList, name + " is referenced but in a free list");
    } else {
      ARBOR_CHECK(list_of_[b] == (cached_[b] ? kEvictableList : kFreeList),
                  name + " is unreferenced but in the wrong list");
    }
    if (cached_[b]) {
      ++num_cached;
      auto it = cache_.find(hash_[b]);
      ARBOR_CHECK(it != cache_.end() && it->second == b, name + " is cached but not mapped");
    }
  }
  ARBOR_CHECK(num_cached == static_cast<int32_t>(cache_.size()),
              "hash map has " + std::to_string(cache_.size()) + " entries for " +
                  std::to_string(num_cached) + " cached blocks");
}

}  // namespace arbor
