#include "engine/kv_cache/kv_cache_manager.h"

#include <algorithm>
#include <string>

#include "engine/core/error.h"
#include "engine/kv_cache/block_hash.h"

namespace arbor {

namespace {
std::string str(int64_t v) {
  return std::to_string(v);
}
}  // namespace

void KvCacheConfig::validate() const {
  if (num_blocks <= 0)
    throw_error(ErrorCode::kInvalidArgument,
                "kv_cache.num_blocks must be positive, got " + str(num_blocks));
  if (block_size <= 0)
    throw_error(ErrorCode::kInvalidArgument,
                "kv_cache.block_size must be positive, got " + str(block_size));
}

KvCacheManager::KvCacheManager(const KvCacheConfig& config)
    : config_((config.validate(), config)), pool_(config.num_blocks, config.block_size) {}

const KvCacheManager::Sequence& KvCacheManager::get(SeqId seq) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) throw_error(ErrorCode::kInvalidArgument, "unknown sequence " + str(seq));
  return it->second;
}

KvCacheManager::Sequence& KvCacheManager::get(SeqId seq) {
  return const_cast<Sequence&>(static_cast<const KvCacheManager*>(this)->get(seq));
}

// --- creation and release ---------------------------------------------------------------------

int32_t KvCacheManager::cached_prefix_tokens(std::span<const int32_t> prompt) const {
  if (!config_.enable_prefix_caching || prompt.empty()) return 0;
  const int32_t bs = block_size();
  const int64_t max_blocks = static_cast<int64_t>(prompt.size() - 1) / bs;
  uint64_t parent = kRootBlockHash;
  int32_t hits = 0;
  for (int64_t i = 0; i < max_blocks; ++i) {
    auto tokens = prompt.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs));
    const uint64_t h = hash_block(parent, tokens);
    if (pool_.lookup(h, parent, tokens) < 0) break;
    parent = h;
    ++hits;
  }
  return hits * bs;
}

KvCacheManager::Created KvCacheManager::create_sequence(std::span<const int32_t> prompt) {
  Sequence s;
  if (config_.enable_prefix_caching && !prompt.empty()) {
    const int32_t bs = block_size();
    const int64_t max_blocks = static_cast<int64_t>(prompt.size() - 1) / bs;
    uint64_t parent = kRootBlockHash;
    for (int64_t i = 0; i < max_blocks; ++i) {
      auto tokens = prompt.subspan(static_cast<size_t>(i * bs), static_cast<size_t>(bs));
      const uint64_t h = hash_block(parent, tokens);
      const int32_t block = pool_.lookup(h, parent, tokens);
      if (block < 0) break;
      pool_.incref(block);
      s.block_table.push_back(block);
      s.block_hashes.push_back(h);
      parent = h;
    }
    s.committed_len = static_cast<int32_t>(s.block_table.size()) * bs;
    prefix_query_tokens_ += static_cast<int64_t>(prompt.size());
    prefix_hit_tokens_ += s.committed_len;
  }
  const SeqId id = next_seq_id_++;
  const int32_t cached = s.committed_len;
  seqs_.emplace(id, std::move(s));
  ++version_;
  return {id, cached};
}

SeqId KvCacheManager::fork(SeqId parent) {
  const Sequence& p = get(parent);
  if (p.reserved_len != 0)
    throw_error(ErrorCode::kInvalidArgument, "cannot fork sequence " + str(parent) + " with " +
                                                 str(p.reserved_len) +
                                                 " reserved slots in flight; commit first");
  Sequence child = p;
  for (int32_t b : child.block_table) pool_.incref(b);
  const SeqId id = next_seq_id_++;
  seqs_.emplace(id, std::move(child));
  ++version_;
  return id;
}

void KvCacheManager::free_sequence(SeqId seq) {
  Sequence& s = get(seq);
  // Release the tail first so that, among this sequence's cached blocks, the prompt's leading
  // blocks end up most recently used and are evicted last.
  for (auto it = s.block_table.rbegin(); it != s.block_table.rend(); ++it) pool_.decref(*it);
  seqs_.erase(seq);
  ++version_;
}

// --- reservation ------------------------------------------------------------------------------

bool KvCacheManager::needs_cow(const Sequence& s) const {
  // Only the block holding committed_len can be both written and already filled: blocks past
  // it are appended fresh. It needs a private copy when another table holds it.
  return s.committed_len % block_size() != 0 &&
         pool_.refcount(s.block_table[s.committed_len / block_size()]) > 1;
}

int32_t KvCacheManager::blocks_needed(SeqId seq, int32_t num_tokens) const {
  const Sequence& s = get(seq);
  if (num_tokens <= 0)
    throw_error(ErrorCode::kInvalidArgument, "reserve needs num_tokens >= 1, got " +
                                                 str(num_tokens) + " for sequence " + str(seq));
  return blocks_for(static_cast<int64_t>(s.committed_len) + num_tokens) -
         static_cast<int32_t>(s.block_table.size()) + (needs_cow(s) ? 1 : 0);
}

std::optional<ReservePlan> KvCacheManager::plan_reserve(SeqId seq, int32_t num_tokens) const {
  const Sequence& s = get(seq);
  if (s.reserved_len != 0)
    throw_error(ErrorCode::kInvalidArgument,
                "sequence " + str(seq) + " already has " + str(s.reserved_len) +
                    " reserved slots; commit them before reserving again");
  const int32_t needed = blocks_needed(seq, num_tokens);
  if (needed > pool_.num_free()) return std::nullopt;

  ReservePlan plan;
  plan.seq = seq;
  plan.committed_len = s.committed_len;
  plan.num_tokens = num_tokens;
  plan.version = version_;
  std::vector<int32_t> fresh = pool_.peek_allocation(needed);
  std::vector<int32_t> table = s.block_table;  // as it will be after apply
  const int32_t bs = block_size();
  size_t next = 0;
  if (needs_cow(s)) {
    plan.cow_table_index = s.committed_len / bs;
    plan.cow_block = fresh[next++];
    const int64_t src_base = static_cast<int64_t>(table[plan.cow_table_index]) * bs;
    const int64_t dst_base = static_cast<int64_t>(plan.cow_block) * bs;
    for (int32_t off = 0; off < s.committed_len % bs; ++off) {  // the committed part only
      plan.copies.src_slots.push_back(src_base + off);
      plan.copies.dst_slots.push_back(dst_base + off);
    }
    table[plan.cow_table_index] = plan.cow_block;
  }
  plan.append_blocks.assign(fresh.begin() + static_cast<std::ptrdiff_t>(next), fresh.end());
  table.insert(table.end(), plan.append_blocks.begin(), plan.append_blocks.end());
  plan.slots.resize(num_tokens);
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int64_t j = static_cast<int64_t>(s.committed_len) + t;
    plan.slots[t] = static_cast<int64_t>(table[j / bs]) * bs + j % bs;
  }
  return plan;
}

void KvCacheManager::apply(const ReservePlan& plan) {
  ARBOR_CHECK(plan.version == version_, "reserve plan for sequence " + str(plan.seq) +
                                            " is stale (made at version " +
                                            str(static_cast<int64_t>(plan.version)) + ", now " +
                                            str(static_cast<int64_t>(version_)) + ")");
  Sequence& s = get(plan.seq);
  if (plan.cow_block >= 0) {
    pool_.allocate(std::span<const int32_t>(&plan.cow_block, 1));
    const int32_t shared = s.block_table[plan.cow_table_index];
    s.block_table[plan.cow_table_index] = plan.cow_block;
    pool_.decref(shared);  // still referenced elsewhere: refcount was > 1
    ++cow_copies_;
  }
  pool_.allocate(plan.append_blocks);
  s.block_table.insert(s.block_table.end(), plan.append_blocks.begin(), plan.append_blocks.end());
  s.reserved_len = plan.num_tokens;
  ++version_;
}

bool KvCacheManager::reserve(SeqId seq, int32_t num_tokens, ReservePlan* plan_out) {
  std::optional<ReservePlan> plan = plan_reserve(seq, num_tokens);
  if (!plan) return false;
  apply(*plan);
  if (plan_out) *plan_out = std::move(*plan);
  return true;
}

// --- commit and compaction --------------------------------------------------------------------

CommitPlan KvCacheManager::plan_commit(SeqId seq, std::span<const int32_t> accepted_nodes,
                                       std::span<const int32_t> accepted_tokens) const {
  const Sequence& s = get(seq);
  if (accepted_nodes.size() != accepted_tokens.size())
    throw_error(ErrorCode::kInvalidArgument,
                "commit for sequence " + str(seq) + ": " + str(accepted_nodes.size()) +
                    " accepted nodes but " + str(accepted_tokens.size()) + " tokens");
  for (size_t k = 0; k < accepted_nodes.size(); ++k) {
    const int32_t node = accepted_nodes[k];
    if (node < 0 || node >= s.reserved_len)
      throw_error(ErrorCode::kInvalidArgument,
                  "commit for sequence " + str(seq) + ": accepted node " + str(node) +
                      " outside the " + str(s.reserved_len) + " reserved tokens");
    if (k > 0 && node <= accepted_nodes[k - 1])
      throw_error(ErrorCode::kInvalidArgument,
                  "commit for sequence " + str(seq) + ": accepted nodes must be strictly " +
                      "ascending, got " + str(accepted_nodes[k - 1]) + " then " + str(node));
  }
  const int32_t bs = block_size();
  CommitPlan plan;
  plan.seq = seq;
  plan.version = version_;
  plan.old_committed_len = s.committed_len;
  plan.new_committed_len = s.committed_len + static_cast<int32_t>(accepted_nodes.size());
  for (size_t k = 0; k < accepted_nodes.size(); ++k) {
    const int32_t node = accepted_nodes[k];
    if (node == static_cast<int32_t>(k)) continue;  // already in place
    // node > k, so every source lies beyond every earlier destination: in-order copies are safe.
    plan.copies.src_slots.push_back(slot(seq, s.committed_len + node));
    plan.copies.dst_slots.push_back(slot(seq, s.committed_len + static_cast<int32_t>(k)));
  }
  plan.keep_blocks = blocks_for(plan.new_committed_len);
  plan.released_blocks.assign(s.block_table.begin() + plan.keep_blocks, s.block_table.end());

  // Content hashes of the blocks that become full, chained from the last full block.
  std::vector<int32_t> pending = s.tail_tokens;
  uint64_t parent = s.block_hashes.empty() ? kRootBlockHash : s.block_hashes.back();
  for (int32_t token : accepted_tokens) {
    pending.push_back(token);
    if (static_cast<int32_t>(pending.size()) == bs) {
      parent = hash_block(parent, pending);
      plan.full_block_hashes.push_back(parent);
      plan.full_block_tokens.insert(plan.full_block_tokens.end(), pending.begin(), pending.end());
      pending.clear();
    }
  }
  plan.tail_tokens = std::move(pending);
  return plan;
}

void KvCacheManager::apply(const CommitPlan& plan) {
  ARBOR_CHECK(plan.version == version_, "commit plan for sequence " + str(plan.seq) +
                                            " is stale (made at version " +
                                            str(static_cast<int64_t>(plan.version)) + ", now " +
                                            str(static_cast<int64_t>(version_)) + ")");
  Sequence& s = get(plan.seq);
  const int32_t bs = block_size();
  const size_t first_full = s.block_hashes.size();
  for (size_t i = 0; i < plan.full_block_hashes.size(); ++i) {
    const size_t index = first_full + i;
    const uint64_t parent = index == 0
                                ? kRootBlockHash
                                : (i == 0 ? s.block_hashes.back() : plan.full_block_hashes[i - 1]);
    if (config_.enable_prefix_caching) {
      // The block is private (written this step after copy-on-write); if another block already
      // holds this content it simply stays uncached.
      pool_.register_block(s.block_table[index], plan.full_block_hashes[i], parent,
                           std::span<const int32_t>(plan.full_block_tokens)
                               .subspan(i * static_cast<size_t>(bs), static_cast<size_t>(bs)));
    }
  }
  s.block_hashes.insert(s.block_hashes.end(), plan.full_block_hashes.begin(),
                        plan.full_block_hashes.end());
  for (auto it = plan.released_blocks.rbegin(); it != plan.released_blocks.rend(); ++it)
    pool_.decref(*it);
  s.block_table.resize(plan.keep_blocks);
  s.committed_len = plan.new_committed_len;
  s.reserved_len = 0;
  s.tail_tokens = plan.tail_tokens;
  ++version_;
}

CommitPlan KvCacheManager::commit_all(SeqId seq, std::span<const int32_t> tokens) {
  const int32_t reserved = get(seq).reserved_len;
  if (static_cast<int32_t>(tokens.size()) != reserved)
    throw_error(ErrorCode::kInvalidArgument, "commit_all for sequence " + str(seq) + ": " +
                                                 str(tokens.size()) + " tokens for " +
                                                 str(reserved) + " reserved slots");
  std::vector<int32_t> nodes(static_cast<size_t>(reserved));
  for (int32_t i = 0; i < reserved; ++i) nodes[i] = i;
  CommitPlan plan = plan_commit(seq, nodes, tokens);
  apply(plan);
  return plan;
}

// --- queries ----------------------------------------------------------------------------------

std::vector<SeqId> KvCacheManager::sequence_ids() const {
  std::vector<SeqId> ids;
  ids.reserve(seqs_.size());
  for (const auto& [id, s] : seqs_) ids.push_back(id);
  std::sort(ids.begin(), ids.end());
  return ids;
}

int32_t KvCacheManager::committed_len(SeqId seq) const {
  return get(seq).committed_len;
}
int32_t KvCacheManager::reserved_len(SeqId seq) const {
  return get(seq).reserved_len;
}
const std::vector<int32_t>& KvCacheManager::block_table(SeqId seq) const {
  return get(seq).block_table;
}

int64_t KvCacheManager::slot(SeqId seq, int32_t logical_index) const {
  const Sequence& s = get(seq);
  const int32_t end = s.committed_len + s.reserved_len;
  if (logical_index < 0 || logical_index >= end)
    throw_error(ErrorCode::kInvalidArgument, "logical index " + str(logical_index) +
                                                 " of sequence " + str(seq) + " outside its " +
                                                 str(end) + " committed + reserved tokens");
  const int32_t bs = block_size();
  return static_cast<int64_t>(s.block_table[logical_index / bs]) * bs + logical_index % bs;
}

std::vector<int64_t> KvCacheManager::slots(SeqId seq, int32_t begin, int32_t count) const {
  std::vector<int64_t> out(static_cast<size_t>(std::max(count, 0)));
  for (int32_t i = 0; i < count; ++i) out[i] = slot(seq, begin + i);
  return out;
}

void KvCacheManager::append_block_table(SeqId seq, int32_t width, std::vector<int32_t>* out) const {
  const std::vector<int32_t>& table = get(seq).block_table;
  if (static_cast<int32_t>(table.size()) > width)
    throw_error(ErrorCode::kInvalidArgument, "sequence " + str(seq) + " has " + str(table.size()) +
                                                 " blocks, more than the block table width " +
                                                 str(width));
  out->insert(out->end(), table.begin(), table.end());
  out->insert(out->end(), static_cast<size_t>(width) - table.size(), -1);
}

KvCacheStats KvCacheManager::stats() const {
  KvCacheStats st;
  st.num_blocks = num_blocks();
  st.block_size = block_size();
  st.free_blocks = pool_.num_free();
  st.used_blocks = num_blocks() - pool_.num_free();
  st.cached_blocks = pool_.num_cached();
  st.evictable_blocks = pool_.num_evictable();
  st.num_sequences = num_sequences();
  st.prefix_query_tokens = prefix_query_tokens_;
  st.prefix_hit_tokens = prefix_hit_tokens_;
  st.evictions = pool_.num_evictions();
  st.cow_copies = cow_copies_;
  return st;
}

void KvCacheManager::check_invariants() const {
  pool_.check_invariants();
  const int32_t bs = block_size();
  std::vector<int32_t> holders(static_cast<size_t>(num_blocks()), 0);
  for (const auto& [id, s] : seqs_) {
    const std::string name = "sequence " + str(id);
    ARBOR_CHECK(static_cast<int64_t>(s.block_table.size()) ==
                    blocks_for(static_cast<int64_t>(s.committed_len) + s.reserved_len),
                name + " has " + str(s.block_table.size()) + " blocks for " + str(s.committed_len) +
                    " committed + " + str(s.reserved_len) + " reserved");
    ARBOR_CHECK(static_cast<int32_t>(s.block_hashes.size()) == s.committed_len / bs &&
                    static_cast<int32_t>(s.tail_tokens.size()) == s.committed_len % bs,
                name + " token bookkeeping disagrees with committed_len " + str(s.committed_len));
    for (int32_t b : s.block_table) {
      ARBOR_CHECK(b >= 0 && b < num_blocks(), name + " holds bad block " + str(b));
      ++holders[b];
    }
    // The blocks a reservation in flight writes must be private (copy-on-write happened).
    if (s.reserved_len > 0) {
      for (size_t i = static_cast<size_t>(s.committed_len / bs); i < s.block_table.size(); ++i)
        ARBOR_CHECK(pool_.refcount(s.block_table[i]) == 1,
                    name + " writes shared block " + str(s.block_table[i]));
    }
  }
  int32_t used = 0;
  for (int32_t b = 0; b < num_blocks(); ++b) {
    ARBOR_CHECK(holders[b] == pool_.refcount(b), "block " + str(b) + " has refcount " +
                                                     str(pool_.refcount(b)) + " but " +
                                                     str(holders[b]) + " tables hold it");
    used += holders[b] > 0 ? 1 : 0;
  }
  ARBOR_CHECK(
      used + pool_.num_free() == num_blocks(),
      str(used) + " used + " + str(pool_.num_free()) + " free blocks != " + str(num_blocks()));
}

}  // namespace arbor
