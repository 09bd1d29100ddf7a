// Paged-KV bookkeeping for all sequences: each sequence's block table and committed length,
// reference-counted block sharing (fork, automatic prefix caching), copy-on-write, slot
// reservation for a step and compaction after verification. Metadata only: the K/V bytes live
// in the Backend, and every copy is returned as slot lists for Backend::copy_kv. See README.md.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/kv_cache/block_pool.h"

namespace arbor {

using SeqId = int64_t;

struct KvCacheConfig {
  int32_t num_blocks = 0;             // blocks in the pool (the Backend's KV tensors' dim 0)
  int32_t block_size = 16;            // tokens per block
  bool enable_prefix_caching = true;  // share full prompt blocks across sequences by content
  void validate() const;              // throws kInvalidArgument naming the field
};

// Copies for Backend::copy_kv: cache[dst_slots[i]] = cache[src_slots[i]]. Valid read either as
// simultaneous copies or one after another in order (no destination is a later source).
struct SlotCopies {
  std::vector<int64_t> src_slots;
  std::vector<int64_t> dst_slots;
  bool empty() const { return src_slots.empty(); }
  size_t size() const { return src_slots.size(); }
  // Adds `other`'s pairs after these (copies of independent sequences, run as one).
  void append(const SlotCopies& other) {
    src_slots.insert(src_slots.end(), other.src_slots.begin(), other.src_slots.end());
    dst_slots.insert(dst_slots.end(), other.dst_slots.begin(), other.dst_slots.end());
  }
};

// What apply(ReservePlan) will do; computed by the const plan_reserve.
struct ReservePlan {
  SeqId seq = -1;
  int32_t committed_len = 0;           // of the sequence when planned
  int32_t num_tokens = 0;              // T: logical indices [committed_len, committed_len + T)
  int32_t cow_table_index = -1;        // table entry replaced by a private copy, -1 if none
  int32_t cow_block = -1;              // the private copy's block
  std::vector<int32_t> append_blocks;  // blocks appended to the table, in order
  std::vector<int64_t> slots;          // [T] slot of logical index committed_len + t
  SlotCopies copies;                   // copy-on-write: run before the step writes K/V
  uint64_t version = 0;                // manager state the plan was made for
  int32_t num_new_blocks() const {
    return static_cast<int32_t>(append_blocks.size()) + (cow_block >= 0 ? 1 : 0);
  }
};

// What apply(CommitPlan) will do; computed by the const plan_commit.
struct CommitPlan {
  SeqId seq = -1;
  int32_t old_committed_len = 0;
  int32_t new_committed_len = 0;            // old + number of accepted nodes
  SlotCopies copies;                        // compaction: run before the next step reads the cache
  int32_t keep_blocks = 0;                  // table keeps its first keep_blocks entries
  std::vector<int32_t> released_blocks;     // table entries dropped (one reference each)
  std::vector<uint64_t> full_block_hashes;  // blocks that became full, in table order
  std::vector<int32_t> full_block_tokens;   // [full_block_hashes.size() * block_size]
  std::vector<int32_t> tail_tokens;         // tokens of the partly filled last block afterwards
  uint64_t version = 0;
};

struct KvCacheStats {
  int32_t num_blocks = 0;
  int32_t block_size = 0;
  int32_t free_blocks = 0;       // allocatable: plain free + evictable cached
  int32_t used_blocks = 0;       // referenced by at least one sequence
  int32_t cached_blocks = 0;     // in the prefix cache, any refcount
  int32_t evictable_blocks = 0;  // in the prefix cache and unreferenced
  int32_t num_sequences = 0;
  int64_t prefix_query_tokens = 0;  // prompt tokens looked up by create_sequence
  int64_t prefix_hit_tokens = 0;    // of those, found cached
  int64_t evictions = 0;            // cached blocks reclaimed for new content
  int64_t cow_copies = 0;           // blocks copied on write
  double usage() const { return num_blocks ? double(used_blocks) / num_blocks : 0.0; }
};

class KvCacheManager {
 public:
  explicit KvCacheManager(const KvCacheConfig& config);

  struct Created {
    SeqId seq = -1;
    int32_t cached_tokens = 0;  // leading prompt tokens whose K/V are already in the cache
  };
  // Prompt tokens create_sequence would find cached: whole blocks only, and never the last
  // prompt token (prefill must run at least one token to produce logits).
  int32_t cached_prefix_tokens(std::span<const int32_t> prompt) const;
  // New sequence whose committed prefix is the cached part of `prompt` (possibly empty). Never
  // allocates, so never fails.
  Created create_sequence(std::span<const int32_t> prompt = {});
  // New sequence sharing every block of `parent` (n > 1 samples of one prompt). The parent may
  // have no reservation in flight.
  SeqId fork(SeqId parent);
  // Drops the sequence and one reference on each of its blocks (a reservation in flight too).
  void free_sequence(SeqId seq);

  // Slots for T new tokens at logical indices [committed_len, committed_len + T): a prefill
  // chunk, one decode token, or a tree of T nodes. nullopt when the pool has too few free blocks
  // (nothing changes; the scheduler preempts). One reservation at a time per sequence.
  std::optional<ReservePlan> plan_reserve(SeqId seq, int32_t num_tokens) const;
  void apply(const ReservePlan& plan);
  // plan_reserve + apply; false (nothing changed) when out of blocks.
  bool reserve(SeqId seq, int32_t num_tokens, ReservePlan* plan_out = nullptr);
  // Blocks a reservation of T tokens would take from the pool (new blocks + copy-on-write).
  int32_t blocks_needed(SeqId seq, int32_t num_tokens) const;

  // Ends the reservation: the tree nodes `accepted_nodes` (strictly ascending indices into the
  // T reserved tokens, e.g. {0, 2, 5}; all of 0..T-1 for prefill/decode; empty to cancel) become
  // logical indices committed_len + k, holding `accepted_tokens` (same length; used for the
  // prefix-cache hashes). Unused blocks beyond the new committed length are released.
  CommitPlan plan_commit(SeqId seq, std::span<const int32_t> accepted_nodes,
                         std::span<const int32_t> accepted_tokens) const;
  void apply(const CommitPlan& plan);
  // Chain case (prefill chunk, plain decode): accepts all reserved tokens; plan + apply. The
  // returned plan's copy list is empty.
  CommitPlan commit_all(SeqId seq, std::span<const int32_t> tokens);

  // --- queries --------------------------------------------------------------------------------
  bool has_sequence(SeqId seq) const { return seqs_.count(seq) != 0; }
  int32_t num_sequences() const { return static_cast<int32_t>(seqs_.size()); }
  std::vector<SeqId> sequence_ids() const;  // ascending
  int32_t committed_len(SeqId seq) const;
  int32_t reserved_len(SeqId seq) const;  // T of the reservation in flight, 0 if none
  const std::vector<int32_t>& block_table(SeqId seq) const;
  // Slot of a logical index below committed_len + reserved_len.
  int64_t slot(SeqId seq, int32_t logical_index) const;
  std::vector<int64_t> slots(SeqId seq, int32_t begin, int32_t count) const;
  // Appends the block table padded with -1 to `width` entries (StepInputs::block_tables row).
  void append_block_table(SeqId seq, int32_t width, std::vector<int32_t>* out) const;

  int32_t num_blocks() const { return pool_.num_blocks(); }
  int32_t block_size() const { return pool_.block_size(); }
  int32_t num_free_blocks() const { return pool_.num_free(); }
  int32_t refcount(int32_t block) const { return pool_.refcount(block); }
  bool is_cached(int32_t block) const { return pool_.is_cached(block); }
  KvCacheStats stats() const;
  // ARBOR_CHECKs every invariant of README.md (refcounts == tables holding each block, ...).
  void check_invariants() const;

 private:
  struct Sequence {
    std::vector<int32_t> block_table;    // covers [0, committed_len + reserved_len)
    int32_t committed_len = 0;           // tokens whose K/V are final
    int32_t reserved_len = 0;            // T of the step in flight, 0 when none
    std::vector<uint64_t> block_hashes;  // [committed_len / block_size] chained content hashes
    std::vector<int32_t> tail_tokens;    // [committed_len % block_size] last partial block
  };
  const Sequence& get(SeqId seq) const;
  Sequence& get(SeqId seq);
  int32_t blocks_for(int64_t tokens) const {
    return static_cast<int32_t>((tokens + block_size() - 1) / block_size());
  }
  bool needs_cow(const Sequence& s) const;

  KvCacheConfig config_;
  BlockPool pool_;
  std::unordered_map<SeqId, Sequence> seqs_;
  SeqId next_seq_id_ = 0;
  uint64_t version_ = 0;  // bumped by every mutation; a plan is applied to the state it saw
  int64_t prefix_query_tokens_ = 0;
  int64_t prefix_hit_tokens_ = 0;
  int64_t cow_copies_ = 0;
};

}  // namespace arbor
