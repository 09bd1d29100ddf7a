// Randomized model check of KvCacheManager. Thousands of random operations (create with shared
// prompt prefixes, fork, reserve trees and prefill chunks, commit random accepted paths, cancel,
// free, preempt on exhaustion) run against a reference model that keeps each sequence's logical
// K/V content, and a simulated slot store where every copy plan is executed as a Backend would.
// After every step: refcounts equal the number of tables holding each block, free + used ==
// total, and the content read through each block table equals the model's (which proves that
// copy-on-write and compaction plans are right and that prefix hits reuse the right blocks).
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <tuple>
#include <vector>

#include "engine/kv_cache/kv_cache_manager.h"

namespace arbor {
namespace {

constexpr uint64_t kPoison = 0xdeadbeefdeadbeefull;  // content of a freshly allocated block
constexpr uint64_t kEmptyPrefix = 0x0123456789abcdefull;

// The simulated K/V of a token: a hash of the whole token prefix up to and including it, as real
// K/V depends on every earlier token. Independent of the manager's block hash.
uint64_t extend(uint64_t prefix_value, int32_t token) {
  uint64_t x = (prefix_value ^ static_cast<uint64_t>(token + 7)) * 0x100000001b3ull;
  x ^= x >> 31;
  x *= 0xd6e8feb86659fd93ull;
  x ^= x >> 32;
  return x;
}

struct ModelSeq {
  std::vector<int32_t> prompt;   // the whole prompt; prefill steps commit it chunk by chunk
  std::vector<int32_t> tokens;   // committed tokens
  std::vector<uint64_t> values;  // [committed] expected K/V at each logical index
  // The step in flight (pending == true): T nodes with parents, tokens and written values.
  bool pending = false;
  bool prefill = false;
  std::vector<int32_t> parent;
  std::vector<int32_t> node_tokens;
  std::vector<uint64_t> node_values;
  std::vector<int64_t> slots;
};

struct Counters {
  int64_t creates = 0, prefix_hit_tokens = 0, forks = 0, reserves = 0, exhausted = 0;
  int64_t commits = 0, cancels = 0, compaction_copies = 0, frees = 0;
};

class Harness {
 public:
  Harness(int32_t block_size, int32_t num_blocks, bool prefix, uint64_t seed)
      : kv_(config(block_size, num_blocks, prefix)),
        bs_(block_size),
        store_(static_cast<size_t>(num_blocks) * block_size, kPoison),
        rng_(seed) {
    for (auto& t : templates_) {
      t.resize(static_cast<size_t>(std::max(3 * bs_ + 2, 12)));
      for (int32_t& tok : t) tok = uniform(0, kVocab - 1);
    }
  }

  void step() {
    const int r = uniform(0, 99);
    if (r < 15) {
      if (static_cast<int>(seqs_.size()) < kMaxSeqs) create();
    } else if (r < 22) {
      fork();
    } else if (r < 58) {
      reserve();
    } else if (r < 94) {
      commit();
    } else {
      free_random(/*any=*/true);
    }
    verify();
  }

  void finish() {
    for (auto& [id, s] : seqs_) kv_.free_sequence(id);
    seqs_.clear();
    verify();
    EXPECT_EQ(kv_.num_free_blocks(), kv_.num_blocks());
  }

  const Counters& counters() const { return counters_; }
  KvCacheStats stats() const { return kv_.stats(); }

 private:
  static constexpr int32_t kVocab = 6;  // small, so random continuations collide and share
  static constexpr int kMaxSeqs = 10;

  static KvCacheConfig config(int32_t bs, int32_t n, bool prefix) {
    KvCacheConfig c;
    c.block_size = bs;
    c.num_blocks = n;
    c.enable_prefix_caching = prefix;
    return c;
  }
  int32_t uniform(int32_t lo, int32_t hi) {  // inclusive; portable (no std distributions)
    return lo + static_cast<int32_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  }
  bool chance(int percent) { return uniform(0, 99) < percent; }
  uint64_t last_value(const ModelSeq& s) const {
    return s.values.empty() ? kEmptyPrefix : s.values.back();
  }
  // A random sequence id satisfying pred, or -1.
  template <class Pred>
  SeqId pick(Pred pred) {
    std::vector<SeqId> ids;
    for (auto& [id, s] : seqs_)
      if (pred(s)) ids.push_back(id);
    if (ids.empty()) return -1;
    return ids[static_cast<size_t>(uniform(0, static_cast<int32_t>(ids.size()) - 1))];
  }

  void create() {
    ModelSeq s;
    const auto& base = templates_[static_cast<size_t>(uniform(0, 2))];
    const int32_t shared = uniform(0, static_cast<int32_t>(base.size()));
    s.prompt.assign(base.begin(), base.begin() + shared);
    const int32_t suffix = uniform(1, std::max(2 * bs_, 8));
    for (int32_t i = 0; i < suffix; ++i) s.prompt.push_back(uniform(0, kVocab - 1));
    const int32_t expected_hit = kv_.cached_prefix_tokens(s.prompt);
    const auto created = kv_.create_sequence(s.prompt);
    EXPECT_EQ(created.cached_tokens, expected_hit);
    EXPECT_EQ(created.cached_tokens % bs_, 0);
    EXPECT_LE(created.cached_tokens, (static_cast<int32_t>(s.prompt.size()) - 1) / bs_ * bs_);
    for (int32_t j = 0; j < created.cached_tokens; ++j) {
      s.values.push_back(extend(last_value(s), s.prompt[j]));
      s.tokens.push_back(s.prompt[j]);
    }
    ++counters_.creates;
    counters_.prefix_hit_tokens += created.cached_tokens;
    seqs_.emplace(created.seq, std::move(s));
  }

  void fork() {
    const SeqId parent = pick([](const ModelSeq& s) { return !s.pending; });
    if (parent < 0) return;
    const SeqId child = kv_.fork(parent);
    seqs_.emplace(child, seqs_.at(parent));
    ++counters_.forks;
  }

  void free_random(bool any) {
    const SeqId id = pick([any](const ModelSeq& s) { return any || !s.pending; });
    if (id < 0) return;
    kv_.free_sequence(id);
    seqs_.erase(id);
    ++counters_.frees;
  }

  std::vector<std::vector<int32_t>> tables() const {
    std::vector<std::vector<int32_t>> out;
    for (auto& [id, s] : seqs_) out.push_back(kv_.block_table(id));
    return out;
  }

  void reserve() {
    const SeqId id = pick([](const ModelSeq& s) { return !s.pending; });
    if (id < 0) return;
    ModelSeq& s = seqs_.at(id);
    const int32_t committed = static_cast<int32_t>(s.tokens.size());
    const int32_t remaining_prompt = static_cast<int32_t>(s.prompt.size()) - committed;
    int32_t T;
    s.parent.clear();
    s.node_tokens.clear();
    s.prefill = remaining_prompt > 0;
    if (s.prefill) {
      T = uniform(1, std::min(remaining_prompt, std::max(3 * bs_, 8)));
      for (int32_t t = 0; t < T; ++t) {
        s.parent.push_back(t - 1);
        s.node_tokens.push_back(s.prompt[static_cast<size_t>(committed + t)]);
      }
    } else {
      T = uniform(1, std::max(2 * bs_ + 2, 12));
      const bool chain = chance(30);
      for (int32_t t = 0; t < T; ++t) {
        s.parent.push_back(t == 0 ? -1 : (chain ? t - 1 : uniform(0, t - 1)));
        s.node_tokens.push_back(uniform(0, kVocab - 1));
      }
    }
    s.node_values.assign(static_cast<size_t>(T), 0);
    for (int32_t t = 0; t < T; ++t) {
      const uint64_t parent_value = s.parent[t] < 0 ? last_value(s) : s.node_values[s.parent[t]];
      s.node_values[t] = extend(parent_value, s.node_tokens[t]);
    }

    const int32_t needed = kv_.blocks_needed(id, T);
    const int32_t free_before = kv_.num_free_blocks();
    std::optional<ReservePlan> plan = kv_.plan_reserve(id, T);
    if (!plan) {
      // Clean failure: it was justified, and nothing changed.
      EXPECT_GT(needed, free_before);
      const auto tables_before = tables();
      const KvCacheStats before = kv_.stats();
      EXPECT_FALSE(kv_.reserve(id, T));
      EXPECT_EQ(tables(), tables_before);
      EXPECT_EQ(kv_.stats().free_blocks, before.free_blocks);
      EXPECT_EQ(kv_.stats().cached_blocks, before.cached_blocks);
      EXPECT_EQ(kv_.reserved_len(id), 0);
      ++counters_.exhausted;
      if (chance(60)) free_random(/*any=*/true);  // the scheduler preempts someone
      return;
    }
    EXPECT_LE(needed, free_before);
    EXPECT_EQ(plan->num_new_blocks(), needed);
    kv_.apply(*plan);
    EXPECT_EQ(kv_.num_free_blocks(), free_before - needed);
    EXPECT_EQ(kv_.slots(id, committed, T), plan->slots);
    // New blocks hold garbage until written; then the copy-on-write copies run, then the step
    // writes its tokens' K/V.
    std::vector<int32_t> fresh = plan->append_blocks;
    if (plan->cow_block >= 0) fresh.push_back(plan->cow_block);
    for (int32_t b : fresh)
      std::fill_n(store_.begin() + static_cast<std::ptrdiff_t>(b) * bs_, bs_, kPoison);
    run_copies(plan->copies);
    for (int32_t t = 0; t < T; ++t) store_[static_cast<size_t>(plan->slots[t])] = s.node_values[t];
    s.slots = plan->slots;
    s.pending = true;
    ++counters_.reserves;
  }

  void commit() {
    const SeqId id = pick([](const ModelSeq& s) { return s.pending; });
    if (id < 0) return;
    ModelSeq& s = seqs_.at(id);
    const int32_t T = static_cast<int32_t>(s.node_tokens.size());
    std::vector<int32_t> path;
    if (chance(10)) {
      ++counters_.cancels;  // nothing accepted (e.g. the step was abandoned)
    } else if (s.prefill) {
      for (int32_t t = 0; t < T; ++t) path.push_back(t);
    } else {
      for (int32_t node = uniform(0, T - 1); node >= 0; node = s.parent[node]) path.push_back(node);
      std::reverse(path.begin(), path.end());
    }
    std::vector<int32_t> tokens;
    for (int32_t node : path) tokens.push_back(s.node_tokens[node]);
    const CommitPlan plan = kv_.plan_commit(id, path, tokens);
    size_t moved = 0;
    for (size_t k = 0; k < path.size(); ++k) moved += path[k] != static_cast<int32_t>(k);
    EXPECT_EQ(plan.copies.size(), moved);
    kv_.apply(plan);
    run_copies(plan.copies);
    for (int32_t node : path) {
      s.tokens.push_back(s.node_tokens[node]);
      s.values.push_back(s.node_values[node]);
    }
    s.pending = false;
    ++counters_.commits;
    counters_.compaction_copies += static_cast<int64_t>(moved);
  }

  // Backend::copy_kv semantics: all sources are read before any destination is written.
  void run_copies(const SlotCopies& copies) {
    ASSERT_EQ(copies.src_slots.size(), copies.dst_slots.size());
    std::vector<uint64_t> read;
    for (int64_t src : copies.src_slots) read.push_back(store_.at(static_cast<size_t>(src)));
    for (size_t i = 0; i < read.size(); ++i)
      store_.at(static_cast<size_t>(copies.dst_slots[i])) = read[i];
  }

  void verify() {
    kv_.check_invariants();
    std::vector<int32_t> holders(static_cast<size_t>(kv_.num_blocks()), 0);
    std::vector<SeqId> ids;
    for (auto& [id, s] : seqs_) {
      ids.push_back(id);
      for (int32_t b : kv_.block_table(id)) ++holders.at(static_cast<size_t>(b));
    }
    ASSERT_EQ(kv_.sequence_ids(), ids);
    int32_t used = 0;
    for (int32_t b = 0; b < kv_.num_blocks(); ++b) {
      ASSERT_EQ(kv_.refcount(b), holders[b]) << "block " << b;
      used += holders[b] > 0;
    }
    ASSERT_EQ(used + kv_.num_free_blocks(), kv_.num_blocks());
    ASSERT_EQ(kv_.stats().used_blocks, used);
    for (auto& [id, s] : seqs_) {
      const int32_t committed = static_cast<int32_t>(s.tokens.size());
      const int32_t reserved = s.pending ? static_cast<int32_t>(s.node_tokens.size()) : 0;
      ASSERT_EQ(kv_.committed_len(id), committed);
      ASSERT_EQ(kv_.reserved_len(id), reserved);
      ASSERT_EQ(static_cast<int32_t>(kv_.block_table(id).size()),
                (committed + reserved + bs_ - 1) / bs_);
      for (int32_t j = 0; j < committed; ++j)
        ASSERT_EQ(store_[static_cast<size_t>(kv_.slot(id, j))], s.values[j])
            << "sequence " << id << " logical index " << j;
      for (int32_t t = 0; t < reserved; ++t) {
        ASSERT_EQ(kv_.slot(id, committed + t), s.slots[t]);
        ASSERT_EQ(store_[static_cast<size_t>(s.slots[t])], s.node_values[t])
            << "sequence " << id << " tree node " << t << " was overwritten";
      }
    }
  }

  KvCacheManager kv_;
  int32_t bs_;
  std::vector<uint64_t> store_;  // [num_blocks * block_size] simulated K/V per slot
  std::map<SeqId, ModelSeq> seqs_;
  std::mt19937_64 rng_;
  std::vector<int32_t> templates_[3];  // shared prompt prefixes
  Counters counters_;
};

// (block_size, num_blocks, prefix caching, seed)
class KvCacheRandom
    : public ::testing::TestWithParam<std::tuple<int32_t, int32_t, bool, uint64_t>> {};

TEST_P(KvCacheRandom, MatchesReferenceModel) {
  const auto [block_size, num_blocks, prefix, seed] = GetParam();
  Harness h(block_size, num_blocks, prefix, seed);
  constexpr int kSteps = 5000;
  for (int i = 0; i < kSteps && !::testing::Test::HasFatalFailure(); ++i) {
    h.step();
    if (::testing::Test::HasFailure()) {
      ADD_FAILURE() << "first failure at step " << i;
      return;
    }
  }
  h.finish();
  // The run exercised what it claims to.
  const Counters& c = h.counters();
  const KvCacheStats st = h.stats();
  EXPECT_GT(c.exhausted, 10);
  EXPECT_GT(c.forks, 50);
  EXPECT_GT(c.compaction_copies, 100);
  EXPECT_GT(c.cancels, 20);
  if (block_size > 1) {
    EXPECT_GT(st.cow_copies, 10);
  }
  if (prefix) {
    EXPECT_GT(c.prefix_hit_tokens, 100);
    EXPECT_GT(st.evictions, 10);
  } else {
    EXPECT_EQ(c.prefix_hit_tokens, 0);
  }
  std::printf(
      "bs %d blocks %d prefix %d seed %llu: creates %lld hits %lld forks %lld reserves %lld "
      "exhausted %lld commits %lld cancels %lld moved %lld frees %lld cow %lld evictions %lld\n",
      block_size, num_blocks, prefix, static_cast<unsigned long long>(seed), (long long)c.creates,
      (long long)c.prefix_hit_tokens, (long long)c.forks, (long long)c.reserves,
      (long long)c.exhausted, (long long)c.commits, (long long)c.cancels,
      (long long)c.compaction_copies, (long long)c.frees, (long long)st.cow_copies,
      (long long)st.evictions);
}

INSTANTIATE_TEST_SUITE_P(Seeds, KvCacheRandom,
                         ::testing::Combine(::testing::Values(4), ::testing::Values(48),
                                            ::testing::Bool(),
                                            ::testing::Values(1u, 2u, 3u, 4u, 5u)));
INSTANTIATE_TEST_SUITE_P(LargeBlocks, KvCacheRandom,
                         ::testing::Combine(::testing::Values(16), ::testing::Values(20),
                                            ::testing::Values(true), ::testing::Values(6u, 7u)));
INSTANTIATE_TEST_SUITE_P(TokenBlocks, KvCacheRandom,
                         ::testing::Combine(::testing::Values(1), ::testing::Values(160),
                                            ::testing::Values(true), ::testing::Values(8u, 9u)));

}  // namespace
}  // namespace arbor
