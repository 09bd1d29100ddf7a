// The scheduler as tick tables (no model, no device): each tick lists what the step carries,
// e.g. "A:P6* B:P2" (A prefills 6 tokens, its last chunk; B prefills 2), "A:D4" (A verifies a
// 4-node tree), "-B" (B was preempted this tick), "+A" (admitted). After each tick the harness
// plays the model: prefill chunks are committed (a last chunk then samples one token), a tree
// accepts a chain of `accept` nodes. KV invariants are checked every tick.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <map>

#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"
#include "engine/scheduler/scheduler.h"

namespace arbor {
namespace {

struct Harness {
  KvCacheManager kv;
  Scheduler sched;
  std::map<ReqId, std::string> names;
  std::map<std::string, ReqId> ids;
  int32_t accept = 1;  // draft nodes accepted per tree (chain)
  int32_t next_token = 7;

  Harness(int32_t blocks, int32_t block_size, SchedulerConfig cfg)
      : kv(KvCacheConfig{blocks, block_size, true}), sched(kv, cfg) {}

  void add(const std::string& name, int32_t prompt_len, bool spec, int32_t first_token = 1) {
    const ReqId id = static_cast<ReqId>(ids.size() + 1);
    ids[name] = id;
    names[id] = name;
    std::vector<int32_t> prompt(static_cast<size_t>(prompt_len));
    for (int32_t i = 0; i < prompt_len; ++i) prompt[static_cast<size_t>(i)] = first_token + i;
    sched.add(id, prompt, spec);
  }

  // Runs one tick; returns its description.
  std::string tick() {
    std::map<ReqId, int32_t> drafted;
    PlannedStep planned = sched.plan_step();
    std::vector<int32_t> sizes;
    for (const auto& [id, b] : planned.trees) {
      drafted[id] = b.max_nodes;
      sizes.push_back(b.max_nodes);
    }
    StepPlan plan = sched.reserve_step(std::move(planned), sizes);
    std::ostringstream o;
    for (ReqId id : plan.admitted) o << "+" << names[id] << " ";
    for (ReqId id : plan.preempted) o << "-" << names[id] << " ";
    for (const ScheduledItem& it : plan.items) {
      o << names[it.id] << ":" << (it.decode ? "D" : "P") << it.num_tokens
        << (it.last_chunk ? "*" : "") << " ";
    }
    kv.check_invariants();
    // Play the model.
    for (const ScheduledItem& it : plan.items) {
      if (!it.decode) {
        sched.commit_prefill(it);
        if (it.last_chunk) {
          const int32_t t = next_token++;
          sched.append(it.id, std::span<const int32_t>(&t, 1));
        }
        continue;
      }
      const int32_t k = std::min(accept, it.num_tokens - 1);
      std::vector<int32_t> nodes, tokens, out;
      for (int32_t i = 0; i <= k; ++i) {
        nodes.push_back(i);
        tokens.push_back(i == 0 ? sched.context(it.id).back() : next_token++);
        if (i > 0) out.push_back(tokens.back());
      }
      sched.commit_tree(it.id, nodes, tokens);
      out.push_back(next_token++);  // bonus
      sched.append(it.id, out);
    }
    kv.check_invariants();
    std::string s = o.str();
    if (!s.empty()) s.pop_back();
    return s;
  }
};

SchedulerConfig fixed_trees(int32_t step_tokens, int32_t max_running, int32_t max_nodes,
                            int32_t lookahead = SchedulerConfig{}.admission_lookahead) {
  SchedulerConfig c;
  c.max_step_tokens = step_tokens;
  c.max_running = max_running;
  c.tree.adaptive = false;
  c.tree.max_tree = {max_nodes, 8};
  c.admission_lookahead = lookahead;
  return c;
}

TEST(SchedulerTicks, ChunkedPrefillSharesStepsWithSpeculativeDecode) {
  Harness h(64, 4, fixed_trees(8, 4, 4));
  h.add("A", 6, /*spec=*/true);
  h.add("B", 10, /*spec=*/false, 100);
  h.accept = 3;
  EXPECT_EQ(h.tick(), "+A +B A:P6* B:P2");  // both admitted; the budget of 8 is split
  EXPECT_EQ(h.tick(), "A:D1 B:P7");         // prefill comes first: one node left for A's tree
  EXPECT_EQ(h.tick(), "A:D4 B:P1*");        // a 4-node tree verified beside B's last chunk
  EXPECT_EQ(h.tick(), "A:D4 B:D1");         // B does not speculate: one node
  EXPECT_EQ(h.sched.context(h.ids["A"]).size(), 6u + 1 + 1 + 4 + 4);
}

TEST(SchedulerTicks, AdaptiveTreesFirstMeasureThePlainStep) {
  SchedulerConfig c;
  c.max_step_tokens = 64;
  c.max_running = 4;
  c.tree.max_tree = {8, 3};
  c.cost.fixed_ms = 5.0;  // weight-bound: tree tokens are nearly free
  c.cost.per_token_ms = 0.001;
  Harness h(64, 4, c);
  h.add("A", 6, /*spec=*/true);
  h.accept = 3;
  EXPECT_EQ(h.tick(), "+A A:P6*");
  // No plain step at batch 1 measured yet: min_obs (3) plain steps first, then trees.
  for (int i = 0; i < 3; ++i) {
    EXPECT_EQ(h.tick(), "A:D1") << i;
    h.sched.observe_step(1, 1, 5.0);
  }
  EXPECT_EQ(h.tick(), "A:D8");
  EXPECT_TRUE(h.sched.speculating(h.ids["A"]));  // the plain steps did not detach it
  // Offline (a fixed curve) nothing is explored.
  CostModelConfig off = c.cost;
  off.online = false;
  EXPECT_TRUE(CostModel(off).measured(1, 1));
  EXPECT_FALSE(CostModel(c.cost).measured(1, 1));
}

// Adaptive trees of up to 8 nodes / depth 3, judged with a fixed (offline) cost model under
// which tree tokens are nearly free (weight-bound), without probes.
SchedulerConfig weight_bound(int32_t step_tokens, int32_t max_running, int32_t detach_after) {
  SchedulerConfig c;
  c.max_step_tokens = step_tokens;
  c.max_running = max_running;
  c.tree.max_tree = {8, 3};
  c.cost.fixed_ms = 5.0;
  c.cost.per_token_ms = 0.001;
  c.cost.online = false;  // no plain-step exploration
  c.detach_after = detach_after;
  c.probe_every = 0;
  return c;
}

TEST(SchedulerTicks, AProbeRevisesAPessimisticAcceptanceEstimate) {
  for (int32_t probe_every : {0, 2}) {
    SCOPED_TRACE(probe_every);
    SchedulerConfig c = weight_bound(64, 4, /*detach_after=*/3);
    c.probe_every = probe_every;
    Harness h(64, 4, c);
    h.add("A", 4, /*spec=*/true);
    EXPECT_EQ(h.tick(), "+A A:P4*");
    EXPECT_EQ(h.tick(), "A:D8");  // the prior (0.6) says trees pay
    // Every tree of A is rejected at depth 1: the server-wide estimate turns pessimistic.
    VerifyResult rejected;
    rejected.accepted_nodes = {0};
    rejected.children_tried = {1};
    for (int i = 0; i < 40; ++i) h.sched.record_acceptance(h.ids["A"], rejected, 8);
    h.sched.remove(h.ids["A"]);
    h.add("B", 4, true, 20);  // admitted 2nd: a probe when probe_every is 2
    if (probe_every == 0) {
      EXPECT_EQ(h.tick(), "+B B:P4*");
      EXPECT_FALSE(h.sched.speculating(h.ids["B"]));  // never starts
      EXPECT_EQ(h.tick(), "B:D1");
    } else {
      EXPECT_EQ(h.tick(), "+B B:P4*");
      EXPECT_TRUE(h.sched.speculating(h.ids["B"]));
      // A probe starts from the prior, not the server-wide estimate: trees pay.
      EXPECT_EQ(h.tick(), "B:D8");
      // B's own trees fail too. Its first detach_after (3) decode steps still draft (a 4-node
      // tree where the policy would not), then the policy's word: no tree, detached.
      for (int i = 0; i < 40; ++i) h.sched.record_acceptance(h.ids["B"], rejected, 8);
      for (int i = 0; i < 2; ++i) EXPECT_EQ(h.tick(), "B:D4") << i;
      for (int i = 0; i < 3; ++i) EXPECT_EQ(h.tick(), "B:D1") << i;
      EXPECT_FALSE(h.sched.speculating(h.ids["B"]));
    }
  }
  SchedulerConfig bad;
  bad.probe_every = -1;
  EXPECT_THROW(bad.validate(), Error);
}

// The engine may raise a planned tree's budget before drafting (up to the largest tree; step
// graphs want the step's token count on a bucket): reserve_step holds the tree to the raised
// budget and the item carries it; beyond the largest tree, or below what was planned, is refused.
TEST(SchedulerTicks, APlannedTreeBudgetMayBeRaisedUpToTheLargestTree) {
  SchedulerConfig c;
  c.max_step_tokens = 64;
  c.max_running = 4;
  c.tree.max_tree = {8, 3};
  c.cost.fixed_ms = 5.0;
  c.cost.per_token_ms = 0.5;  // tree tokens cost enough that the policy plans less than 8
  c.cost.online = false;
  c.probe_every = 0;
  for (int32_t raised : {8, 9, 1}) {
    SCOPED_TRACE(raised);
    Harness h(64, 4, c);
    h.add("A", 4, /*spec=*/true);
    h.add("B", 4, /*spec=*/false, 50);
    EXPECT_EQ(h.tick(), "+A +B A:P4* B:P4*");
    PlannedStep p = h.sched.plan_step();
    ASSERT_EQ(p.trees.size(), 1u);
    const int32_t planned = p.trees[0].second.max_nodes;
    ASSERT_GT(planned, 1);
    ASSERT_LT(planned, 8);
    EXPECT_EQ(p.decodes_without_tree(), 1);  // B
    EXPECT_FALSE(p.has_prefill());
    p.trees[0].second.max_nodes = raised;
    const std::vector<int32_t> sizes = {raised};
    if (raised != 8) {
      EXPECT_THROW(h.sched.reserve_step(std::move(p), sizes), Error);
      continue;
    }
    const StepPlan plan = h.sched.reserve_step(std::move(p), sizes);
    ASSERT_EQ(plan.items.size(), 2u);
    EXPECT_EQ(plan.items[0].num_tokens, 8);
    EXPECT_EQ(plan.items[0].budget.max_nodes, 8);
    EXPECT_EQ(plan.items[1].num_tokens, 1);
  }
}

TEST(SchedulerTicks, AdmissionWaitsForBlocksAndRunningSlots) {
  // 6 blocks of 4 tokens; max_running 2; a look-ahead of 4 tokens (one block).
  Harness h(6, 4, fixed_trees(64, 2, 1, /*lookahead=*/4));
  h.add("A", 8, false);
  h.add("B", 8, false, 50);
  h.add("C", 4, false, 90);
  EXPECT_EQ(h.tick(), "+A +B A:P8* B:P8*");  // C waits: max_running
  EXPECT_EQ(h.tick(), "A:D1 B:D1");
  EXPECT_EQ(h.sched.num_waiting(), 1u);
  h.sched.remove(h.ids["A"]);  // cancellation frees A's blocks at once
  // C's 4 tokens + 4 of look-ahead (2 blocks) and B's next 4 tokens (1 more block) fit in 3.
  EXPECT_EQ(h.tick(), "+C B:D1 C:P4*");
}

TEST(SchedulerTicks, AdmissionLeavesTheRunningRequestsRoomToGrow) {
  // 10 blocks of 4 tokens; three requests of 8 prompt tokens (2 blocks each).
  {
    // Without a look-ahead all three start, grow together and the newest is preempted.
    Harness h(10, 4, fixed_trees(64, 4, 1, /*lookahead=*/0));
    h.add("A", 8, false);
    h.add("B", 8, false, 50);
    h.add("C", 8, false, 90);
    EXPECT_EQ(h.tick(), "+A +B +C A:P8* B:P8* C:P8*");
    for (int t = 0; t < 4; ++t) EXPECT_EQ(h.tick(), "A:D1 B:D1 C:D1") << t;
    EXPECT_EQ(h.tick(), "-C A:D1 B:D1");  // 9 blocks used, A and B each need a 4th
  }
  // With 8 tokens of look-ahead C waits: its 4 blocks (8 + 8 tokens) beside A's and B's next
  // 8 tokens (2-3 blocks each) do not fit in what A and B leave free.
  Harness h(10, 4, fixed_trees(64, 4, 1, /*lookahead=*/8));
  h.add("A", 8, false);
  h.add("B", 8, false, 50);
  h.add("C", 8, false, 90);
  EXPECT_EQ(h.tick(), "+A +B A:P8* B:P8*");
  for (int t = 0; t < 2; ++t) EXPECT_EQ(h.tick(), "A:D1 B:D1") << t;
  // A ends: 7 blocks free; B's next 8 tokens need 2 more, C's 4.
  h.sched.remove(h.ids["A"]);
  EXPECT_EQ(h.tick(), "+C B:D1 C:P8*");
  for (int t = 0; t < 8; ++t) EXPECT_EQ(h.tick(), "B:D1 C:D1") << t;
  EXPECT_EQ(h.sched.preemptions(h.ids["C"]), 0);
}

TEST(SchedulerTicks, APreemptedRequestKeepsItsArrivalOrderAndWidensTheLookahead) {
  // 8 blocks of 4 tokens, max_running 2, a look-ahead of 4 tokens. A and B (8 tokens each)
  // start, C waits for a running slot; A and B grow until they collide.
  Harness h(8, 4, fixed_trees(64, 2, 1, /*lookahead=*/4));
  h.add("A", 8, false);
  h.add("B", 8, false, 50);
  h.add("C", 4, false, 90);
  EXPECT_EQ(h.tick(), "+A +B A:P8* B:P8*");
  for (int t = 0; t < 8; ++t) EXPECT_EQ(h.tick(), "A:D1 B:D1") << t;
  EXPECT_EQ(h.sched.lookahead(), 4);
  // 16 tokens each fill the 8 blocks; A (the older) takes B's blocks and B waits ahead of C,
  // which arrived after it. B was admitted under the look-ahead in force, which proved too
  // short: it widens by twice the configured 4 tokens.
  EXPECT_EQ(h.tick(), "-B A:D1");
  EXPECT_EQ(h.sched.lookahead(), 12);
  // B (17 tokens of context + 12) does not fit beside A's next 12 tokens; C waits behind it.
  for (int t = 0; t < 3; ++t) EXPECT_EQ(h.tick(), "A:D1") << t;
  // A ends in a step that preempted nothing: the look-ahead narrows by a quarter of 4 tokens.
  h.sched.remove(h.ids["A"]);
  EXPECT_EQ(h.sched.lookahead(), 11);
  // B first. A's 5th block was B's last one (a freed sequence's tail is evicted first), so 3
  // of B's blocks are still cached and 5 of its 17 tokens are recomputed. C (4 + 11 tokens: 4
  // blocks) does not fit beside B's next 11 tokens in what is left.
  EXPECT_EQ(h.tick(), "+B B:P5*");
  EXPECT_EQ(h.tick(), "B:D1");
  EXPECT_EQ(h.sched.preemptions(h.ids["B"]), 1);
  h.sched.remove(h.ids["B"]);
  EXPECT_EQ(h.sched.lookahead(), 10);
  EXPECT_EQ(h.tick(), "+C C:P4*");
  h.sched.remove(h.ids["C"]);
  for (int i = 0; i < 6; ++i) {  // never below the configured look-ahead
    h.add("D" + std::to_string(i), 4, false, 200 + 10 * i);
    EXPECT_EQ(h.tick(), "+D" + std::to_string(i) + " D" + std::to_string(i) + ":P4*");
    h.sched.remove(h.ids["D" + std::to_string(i)]);
  }
  EXPECT_EQ(h.sched.lookahead(), 4);
  EXPECT_EQ(h.kv.stats().used_blocks, 0);
}

TEST(SchedulerTicks, TheLookaheadWidensOnceForAWaveOfOverAdmission) {
  // 8 blocks of 4 tokens, a look-ahead of 4 tokens: four requests of 4 tokens start together
  // (2 blocks each with the look-ahead) and outgrow the pool at their 9th token.
  Harness h(8, 4, fixed_trees(64, 4, 1, /*lookahead=*/4));
  for (const char* name : {"A", "B", "C", "D"}) h.add(name, 4, false, 10 * (name[0] - 'A'));
  EXPECT_EQ(h.tick(), "+A +B +C +D A:P4* B:P4* C:P4* D:P4*");
  for (int t = 0; t < 4; ++t) EXPECT_EQ(h.tick(), "A:D1 B:D1 C:D1 D:D1") << t;
  // Two victims in one step, both admitted under the look-ahead in force: it widens once.
  EXPECT_EQ(h.tick(), "-D -C A:D1 B:D1");
  EXPECT_EQ(h.sched.lookahead(), 12);
  for (int t = 0; t < 7; ++t) EXPECT_EQ(h.tick(), "A:D1 B:D1") << t;
  // B was admitted under the old look-ahead of 4: its preemption says nothing about 12.
  EXPECT_EQ(h.tick(), "-B A:D1");
  EXPECT_EQ(h.sched.lookahead(), 12);
}

TEST(SchedulerTicks, PreemptsTheNewestWhenBlocksRunOutAndRecomputesIt) {
  // 5 blocks of 4 tokens = 20 slots; two requests of 8 prompt tokens grow until they collide
  // (no look-ahead, so both start).
  Harness h(5, 4, fixed_trees(64, 4, 1, /*lookahead=*/0));
  h.add("A", 8, false);
  h.add("B", 8, false, 50);
  EXPECT_EQ(h.tick(), "+A +B A:P8* B:P8*");  // 4 blocks used
  // Both need a 3rd block, one is left: A (oldest) takes it, B (newest) gives its 2 back.
  EXPECT_EQ(h.tick(), "-B A:D1");
  EXPECT_EQ(h.sched.preemptions(h.ids["B"]), 1);
  // B (9 tokens of context: 3 blocks) waits while only 2 blocks are free; it never fails.
  for (int t = 0; t < 3; ++t) EXPECT_EQ(h.tick(), "A:D1");
  EXPECT_EQ(h.sched.num_waiting(), 1u);
  EXPECT_EQ(h.sched.preemptions(h.ids["A"]), 0);
  // Once A is gone B comes back: its two full prompt blocks are still in the prefix cache, so
  // only the tail (the generated token) is recomputed.
  h.sched.remove(h.ids["A"]);
  EXPECT_EQ(h.tick(), "+B B:P1*");
  EXPECT_EQ(h.tick(), "B:D1");
  h.sched.remove(h.ids["B"]);
  EXPECT_EQ(h.kv.stats().used_blocks, 0);
  EXPECT_TRUE(h.sched.idle());
}

TEST(SchedulerTicks, TreeFallsBackToItsRootWhenItsBlocksAreShort) {
  // 4 blocks of 4: A holds 3 blocks after prefill of 11 + 1 generated; a 8-node tree needs 2
  // more blocks, only 1 is free: the tree shrinks to the root alone instead of preempting.
  Harness h(4, 4, fixed_trees(64, 2, 8));
  h.add("A", 11, true);
  EXPECT_EQ(h.tick(), "+A A:P11*");
  EXPECT_EQ(h.tick(), "A:D1");  // 8 nodes at positions 11..18 need 2 new blocks; 1 free
}

TEST(SchedulerTicks, TreesShrinkToTheirRootsBeforeAnotherRequestIsPreempted) {
  // 5 blocks of 4. A (speculating, 7 tokens: its root fits in its 2nd block) and B (8 tokens:
  // its next token needs a 3rd block) hold 4 blocks. A's 4-node tree would take the last free
  // block, which B's next token needs: the tree shrinks to its root and nobody is preempted.
  Harness h(5, 4, fixed_trees(64, 2, 4, /*lookahead=*/0));
  h.add("A", 7, true);
  h.add("B", 8, false, 50);
  EXPECT_EQ(h.tick(), "+A +B A:P7* B:P8*");
  EXPECT_EQ(h.tick(), "A:D1 B:D1");
  EXPECT_EQ(h.sched.preemptions(h.ids["B"]), 0);
  // With B gone the tree has the pool to itself.
  h.sched.remove(h.ids["B"]);
  EXPECT_EQ(h.tick(), "A:D4");
}

// A burst of `n` requests of `prompt` tokens, each generating `gen` tokens and then ending, on
// `blocks` blocks of 16 tokens with the server's step settings: how the scheduler copes.
struct Burst {
  int64_t preemptions = 0;
  int32_t most = 0;  // preemptions of the most preempted request
  int32_t done = 0;
  int32_t ticks = 0;
  int32_t blocks_left = 0;
  int32_t sequences_left = 0;
};
Burst run_burst(int32_t n, int32_t prompt, int32_t gen, int32_t blocks, int32_t lookahead) {
  Harness h(blocks, 16, fixed_trees(512, 64, 1, lookahead));
  for (int32_t i = 0; i < n; ++i) h.add("R" + std::to_string(i), prompt, false, 1 + i);
  Burst b;
  while (!h.sched.idle() && b.ticks < 100000) {
    h.tick();
    ++b.ticks;
    for (int32_t i = 0; i < n; ++i) {
      const ReqId id = h.ids["R" + std::to_string(i)];
      if (!h.sched.has(id) || !h.sched.decoding(id)) continue;
      if (static_cast<int32_t>(h.sched.context(id).size()) - prompt < gen) continue;
      b.preemptions += h.sched.preemptions(id);
      b.most = std::max(b.most, h.sched.preemptions(id));
      h.sched.remove(id);
      ++b.done;
    }
  }
  b.blocks_left = h.kv.stats().used_blocks;
  b.sequences_left = h.kv.num_sequences();
  return b;
}

TEST(SchedulerTicks, OverloadCompletesEveryRequestWithAtMostOnePreemptionEach) {
  // 4x and 16x more requests than the pool holds at their full length, all at once. Every
  // request completes; preemptions stay under one per request on average.
  struct Case {
    int32_t prompt, gen, overload;
  };
  for (const Case& c : {Case{8, 120, 4}, Case{8, 120, 16}, Case{40, 200, 4}, Case{40, 200, 16},
                        Case{8, 480, 4}, Case{8, 480, 16}}) {
    const int32_t n = 4 * c.overload;
    const int32_t blocks = 4 * ((c.prompt + c.gen + 15) / 16);
    const Burst b = run_burst(n, c.prompt, c.gen, blocks, SchedulerConfig{}.admission_lookahead);
    SCOPED_TRACE("prompt " + std::to_string(c.prompt) + " gen " + std::to_string(c.gen) + " " +
                 std::to_string(c.overload) + "x: " + std::to_string(b.preemptions) +
                 " preemptions, at most " + std::to_string(b.most) + " per request, " +
                 std::to_string(b.ticks) + " ticks");
    EXPECT_EQ(b.done, n);
    EXPECT_LE(b.preemptions, n);
    EXPECT_LE(b.most, 2);
    EXPECT_EQ(b.blocks_left, 0);
    EXPECT_EQ(b.sequences_left, 0);
    if (c.overload == 16) {
      // Without the look-ahead the same burst preempts more than once per request.
      const Burst blind = run_burst(n, c.prompt, c.gen, blocks, 0);
      EXPECT_EQ(blind.done, n);
      EXPECT_GT(blind.preemptions, n);
    }
  }
}

TEST(SchedulerTicks, ForkSharesThePromptBlocks) {
  Harness h(16, 4, fixed_trees(64, 8, 1));
  h.add("A", 9, false);
  PlannedStep planned = h.sched.plan_step();
  ASSERT_TRUE(planned.trees.empty());
  StepPlan plan = h.sched.reserve_step(std::move(planned), {});
  ASSERT_EQ(plan.items.size(), 1u);
  h.sched.commit_prefill(plan.items[0]);
  const int32_t used = h.kv.stats().used_blocks;
  h.sched.fork(h.ids["A"], 99, false);
  h.names[99] = "A2";
  EXPECT_EQ(h.kv.stats().used_blocks, used);  // no new block: shared
  int32_t t1 = 5, t2 = 6;
  h.sched.append(h.ids["A"], std::span<const int32_t>(&t1, 1));
  h.sched.append(99, std::span<const int32_t>(&t2, 1));
  EXPECT_EQ(h.tick(), "A:D1 A2:D1");
  h.sched.remove(h.ids["A"]);
  h.sched.remove(99);
  EXPECT_EQ(h.kv.stats().used_blocks, 0);
}

// --- the tree-budget policy --------------------------------------------------------------------

// An H100-like verify curve: flat (weight-bandwidth bound) up to 64 tokens, then compute-bound
// (proportional to the tokens).
CostModelConfig gpu_curve() {
  CostModelConfig c;
  for (int32_t b : {1, 8, 32, 64}) {
    std::vector<CostCurvePoint> pts;
    for (int32_t t : {1, 16, 64, 128, 256, 512, 1024, 4096}) {
      const int32_t tokens = std::max(t, b);
      if (!pts.empty() && pts.back().tokens >= tokens) continue;
      const double flat = 5.0 + 0.02 * b;
      pts.push_back({tokens, tokens > 64 ? flat * tokens / 64.0 : flat});
    }
    c.curves[b] = pts;
  }
  c.online = false;
  return c;
}

TreePolicyConfig policy() {
  TreePolicyConfig tp;
  tp.max_tree = {64, 8};
  tp.max_step_tokens = 8192;
  return tp;
}

std::vector<int32_t> budgets(int32_t batch, double acceptance, const CostModelConfig& cc,
                             const DraftCost& draft = {}) {
  AcceptanceEstimate est(acceptance);
  std::vector<TreeCandidate> cands(static_cast<size_t>(batch), TreeCandidate{&est});
  CostModel cost(cc);
  std::vector<int32_t> out;
  for (const TreeBudget& b : choose_tree_budgets(cands, 0, 0, batch, cost, draft, policy()))
    out.push_back(b.max_nodes);
  return out;
}

// Expected emitted tokens per ms, written out here from the definitions (tree depth of a budget,
// acceptance by depth, the cost curve, drafting cost per step by the deepest budget).
double predicted_throughput(const std::vector<int32_t>& nodes, double acceptance,
                            const CostModelConfig& cc, const DraftCost& draft) {
  CostModel cost(cc);
  double e = 0;
  int32_t t = 0, depth = 0;
  for (int32_t n : nodes) {
    int32_t d = 0;
    while ((2 << d) <= n) ++d;
    d = std::min(d, 8);
    double p = 1;
    e += 1;
    for (int32_t k = 1; k <= d; ++k) e += (p *= acceptance);
    t += n;
    depth = std::max(depth, d);
  }
  const double draft_ms =
      depth == 0 ? 0.0 : draft.fixed_ms + draft.per_level_ms * static_cast<double>(depth - 1);
  return e / (cost.step_ms(static_cast<int32_t>(nodes.size()), t) + draft_ms);
}

TEST(TreePolicy, SpeculationShrinksThenTurnsOffAsTheBatchGrows) {
  const CostModelConfig cc = gpu_curve();
  const auto b1 = budgets(1, 0.8, cc);
  const auto b8 = budgets(8, 0.8, cc);
  const auto b64 = budgets(64, 0.8, cc);
  EXPECT_GE(b1[0], 16);  // alone: verification is free up to ~64 tokens
  int64_t s8 = 0;
  for (int32_t n : b8) s8 += n;
  EXPECT_LT(s8, 8 * b1[0]);  // smaller per request at batch 8
  for (int32_t n : b64) EXPECT_EQ(n, 1) << "batch 64 is compute-bound: no speculation";
}

// Adaptive trees of up to 8 nodes / depth 3 on gpu_curve, up to 64 running, no probes.
SchedulerConfig adaptive_at_64() {
  SchedulerConfig c;
  c.max_step_tokens = 8192;
  c.max_running = 64;
  c.tree = policy();
  c.tree.max_tree = {8, 3};
  c.cost = gpu_curve();
  c.probe_every = 0;
  return c;
}

VerifyResult chain_of_3() {  // a tree that accepted a chain of 3
  VerifyResult v;
  v.accepted_nodes = {0, 1, 2, 3};
  v.accepted_tokens = {1, 2, 3};
  v.children_tried = {1, 1, 1, 1};
  return v;
}

VerifyResult first_child_rejected() {
  VerifyResult v;
  v.accepted_nodes = {0};
  v.children_tried = {1};
  return v;
}

TEST(SchedulerTicks, ABurstOfArrivalsIsJudgedAtTheBatchItJoins) {
  // Trees pay alone and not at batch 64 (gpu_curve). 64 requests arriving at once are admitted
  // in one step and decode at batch 64: none of them starts speculating, though the first ones
  // would have if each were judged by the requests admitted before it.
  const SchedulerConfig c = adaptive_at_64();
  Harness h(4096, 4, c);
  h.add("A", 4, /*spec=*/true);
  EXPECT_EQ(h.tick(), "+A A:P4*");
  EXPECT_TRUE(h.sched.speculating(h.ids["A"]));  // nothing measured yet: it starts
  const VerifyResult good = chain_of_3();
  for (int i = 0; i < 40; ++i) h.sched.record_acceptance(h.ids["A"], good, 8);
  h.sched.remove(h.ids["A"]);
  for (int i = 0; i < 64; ++i) h.add("R" + std::to_string(i), 4, true, 10 + i);
  h.tick();
  EXPECT_EQ(h.sched.num_running(), 64u);
  for (int i = 0; i < 64; ++i)
    EXPECT_FALSE(h.sched.speculating(h.ids["R" + std::to_string(i)])) << i;
  // The same estimate admits a request arriving alone speculating.
  for (int i = 0; i < 64; ++i) h.sched.remove(h.ids["R" + std::to_string(i)]);
  h.add("B", 4, true, 200);
  h.tick();
  EXPECT_TRUE(h.sched.speculating(h.ids["B"]));
}

TEST(SchedulerTicks, ABurstThatPaysForItsDraftTogetherSpeculatesTogether) {
  // A drafting cost of 3 ms a step that one tree in a batch of 8 cannot pay (it adds ~2 tokens
  // to the step's 8) and eight trees together do: eight arrivals at an empty engine, judged
  // as the group they decode in, all speculate.
  const SchedulerConfig c = adaptive_at_64();
  Harness h(4096, 4, c);
  h.add("A", 4, /*spec=*/true);
  h.tick();
  const VerifyResult good = chain_of_3();
  for (int i = 0; i < 40; ++i) h.sched.record_acceptance(h.ids["A"], good, 8);
  for (int i = 0; i < 10; ++i) h.sched.record_draft_step(3, 3.0);
  h.sched.remove(h.ids["A"]);
  for (int i = 0; i < 8; ++i) h.add("R" + std::to_string(i), 4, true, 10 + i);
  h.tick();
  EXPECT_EQ(h.sched.num_running(), 8u);
  for (int i = 0; i < 8; ++i) EXPECT_TRUE(h.sched.speculating(h.ids["R" + std::to_string(i)])) << i;
  // One arrival alone at a batch of 8 plain decodes does not pay for the draft.
  for (int i = 0; i < 7; ++i) h.add("P" + std::to_string(i), 4, false, 100 + i);
  for (int i = 0; i < 8; ++i) h.sched.remove(h.ids["R" + std::to_string(i)]);
  h.tick();
  h.add("S", 4, true, 300);
  h.tick();
  EXPECT_FALSE(h.sched.speculating(h.ids["S"]));
}

TEST(SchedulerTicks, AdmissionFollowsWhatTheStepPolicyDidAtThatLoad) {
  // 17 requests start speculating together (nothing measured: not judged). The step policy
  // gives 16 of them no tree (their own trees failed) and they are detached; the server-wide
  // estimate ends on the 17th's good trees, so admission alone would start the next burst of
  // that size speculating again. With min_tree_uptake it follows the record of that load
  // (1 request in 17 had trees): the burst starts plain, a request arriving alone (another
  // load) still speculates, and a scheduler restored from this one's state judges the same.
  for (double floor : {0.0, 0.25}) {
    SCOPED_TRACE(floor);
    SchedulerConfig c = weight_bound(512, 64, /*detach_after=*/2);
    c.min_tree_uptake = floor;
    Harness h(4096, 4, c);
    std::vector<std::string> first;
    for (int i = 0; i < 17; ++i) {
      first.push_back("R" + std::to_string(i));
      h.add(first.back(), 4, /*spec=*/true, 10 + i);
    }
    h.tick();
    for (const auto& r : first) ASSERT_TRUE(h.sched.speculating(h.ids[r])) << r;
    for (int i = 1; i < 17; ++i)
      for (int k = 0; k < 40; ++k)
        h.sched.record_acceptance(h.ids[first[static_cast<size_t>(i)]], first_child_rejected(), 8);
    for (int k = 0; k < 40; ++k) h.sched.record_acceptance(h.ids["R0"], chain_of_3(), 8);
    std::string step = "R0:D8";
    for (int i = 1; i < 17; ++i) step += " R" + std::to_string(i) + ":D1";
    for (int t = 0; t < 2; ++t) EXPECT_EQ(h.tick(), step) << t;
    EXPECT_TRUE(h.sched.speculating(h.ids["R0"]));
    for (int i = 1; i < 17; ++i) EXPECT_FALSE(h.sched.speculating(h.ids[first[i]])) << i;
    for (const auto& r : first) h.sched.remove(h.ids[r]);

    auto burst = [&](Harness& x, const std::string& name) {
      for (int i = 0; i < 16; ++i) x.add(name + std::to_string(i), 4, true, 100 + i);
      x.tick();
      int speculating = 0;
      for (int i = 0; i < 16; ++i)
        speculating += x.sched.speculating(x.ids[name + std::to_string(i)]);
      for (int i = 0; i < 16; ++i) x.sched.remove(x.ids[name + std::to_string(i)]);
      return speculating;
    };
    Harness restored(4096, 4, c);
    restored.sched.restore_policy_state(h.sched.policy_state());
    EXPECT_EQ(burst(h, "S"), floor > 0 ? 0 : 16);
    EXPECT_EQ(burst(restored, "S"), floor > 0 ? 0 : 16);
    h.add("alone", 4, true, 300);
    h.tick();
    EXPECT_TRUE(h.sched.speculating(h.ids["alone"]));
  }
  SchedulerConfig bad;
  bad.min_tree_uptake = 1.5;
  EXPECT_THROW(bad.validate(), Error);
}

TEST(SchedulerTicks, OneRequestsFailingTreesDoNotLockTheNextOnesOut) {
  // Batch 1, one request after another: A's trees accept chains of 3, B's first children all
  // fail and B is detached. The server-wide estimate weighs A and B alike (it was B's last
  // trees), so C, arriving alone, still starts speculating; a request whose own trees fail
  // stops speculating by itself.
  SchedulerConfig c = weight_bound(64, 4, /*detach_after=*/3);
  c.cost.per_token_ms = 0.05;  // an 8-node tree costs 8% more than a plain step
  Harness h(64, 4, c);
  h.add("A", 4, /*spec=*/true);
  EXPECT_EQ(h.tick(), "+A A:P4*");
  for (int i = 0; i < 40; ++i) h.sched.record_acceptance(h.ids["A"], chain_of_3(), 8);
  EXPECT_EQ(h.tick(), "A:D8");
  h.sched.remove(h.ids["A"]);
  h.add("B", 4, true, 20);
  EXPECT_EQ(h.tick(), "+B B:P4*");
  EXPECT_TRUE(h.sched.speculating(h.ids["B"]));
  for (int i = 0; i < 40; ++i) h.sched.record_acceptance(h.ids["B"], first_child_rejected(), 8);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(h.tick(), "B:D1") << i;
  EXPECT_FALSE(h.sched.speculating(h.ids["B"]));
  h.sched.remove(h.ids["B"]);
  h.add("C", 4, true, 40);
  EXPECT_EQ(h.tick(), "+C C:P4*");
  EXPECT_TRUE(h.sched.speculating(h.ids["C"]));
  EXPECT_EQ(h.tick(), "C:D8");
}

// A, alone, accepting chains of 3 under a policy that finds trees nearly free: an 8-node tree
// every step. Returns yield plans of batch 1 with trees and without.
std::pair<StepPlan, StepPlan> start_tree_stepping(Harness& h) {
  h.add("A", 4, /*spec=*/true);
  EXPECT_EQ(h.tick(), "+A A:P4*");
  for (int i = 0; i < 40; ++i) h.sched.record_acceptance(h.ids["A"], chain_of_3(), 8);
  EXPECT_EQ(h.tick(), "A:D8");
  StepPlan with, without;
  with.yield_batch = without.yield_batch = 1;
  with.policy_trees = true;
  return {with, without};
}

TEST(SchedulerTicks, TreesThatDeliveredLessThanPlainStepsAreOverruled) {
  // The policy's model says trees are nearly free and A's accept chains of 3, so it gives A an
  // 8-node tree every step. What the steps delivered says otherwise: 2 tokens in 10 ms with
  // trees, 1 in 2 ms without. With yield_recheck 4 the policy's trees are overruled but in
  // every 4th such step; with 0, or when trees delivered more, they stand.
  for (const auto& [recheck, tree_ms] : {std::pair{4, 10.0}, {0, 10.0}, {4, 3.0}}) {
    SCOPED_TRACE(std::to_string(recheck) + " " + std::to_string(tree_ms));
    SchedulerConfig c = weight_bound(64, 4, /*detach_after=*/100);
    c.yield_recheck = recheck;
    Harness h(256, 4, c);
    const auto [with, without] = start_tree_stepping(h);
    for (int i = 0; i < 8; ++i) {
      h.sched.record_step_yield(with, 2, tree_ms);
      h.sched.record_step_yield(without, 1, 2.0);
    }
    const bool lose = recheck > 0 && tree_ms > 4.0;
    EXPECT_EQ(h.sched.step_yield().trees_lose(1, 8), tree_ms > 4.0);
    for (int i = 0; i < 8; ++i) EXPECT_EQ(h.tick(), !lose || i % 4 == 3 ? "A:D8" : "A:D1") << i;
    // A larger batch not measured borrows batch 1's verdict: B, joining A (load 2), starts
    // plain where trees lose.
    EXPECT_EQ(h.sched.step_yield().trees_lose(64, 8), tree_ms > 4.0);
    h.add("B", 4, true, 100);
    h.tick();
    EXPECT_EQ(h.sched.speculating(h.ids["B"]), !lose);
  }
  SchedulerConfig bad;
  bad.yield_recheck = -1;
  EXPECT_THROW(bad.validate(), Error);
}

TEST(SchedulerTicks, APlainSideMeasuredLongAgoIsMeasuredAgain) {
  // A's trees stand (2 tokens in 1.7 ms against 1 in 1 ms without, or in 1 ms: they win
  // either way). After 4 * yield_recheck (16) tree steps recorded at its batch since the last
  // plain one, the next step runs plain to measure that side again, whatever the margin; a
  // plain step recorded resets the count.
  for (const double tree_ms : {1.7, 1.0}) {
    SCOPED_TRACE(tree_ms);
    SchedulerConfig c = weight_bound(64, 4, /*detach_after=*/100);
    c.yield_recheck = 4;
    Harness h(256, 4, c);
    const auto [with, without] = start_tree_stepping(h);
    for (int i = 0; i < 4; ++i) h.sched.record_step_yield(without, 1, 1.0);
    for (int i = 0; i < 16; ++i) {
      EXPECT_EQ(h.tick(), "A:D8") << i;
      h.sched.record_step_yield(with, 2, tree_ms);
    }
    EXPECT_FALSE(h.sched.step_yield().trees_lose(1, 4));
    EXPECT_EQ(h.tick(), "A:D1");
    h.sched.record_step_yield(without, 1, 1.0);
    EXPECT_EQ(h.tick(), "A:D8");
  }
}

TEST(TreePolicy, StepYieldComparesEachStepWithAPlainStepAtItsOwnBatch) {
  // Plain steps at batch 33 take 1.0 ms, the curve's plain step there; tree steps at batch 63,
  // whose plain step the curve puts at 1.2 ms, emit 1.1 tokens a request in 1.25 ms. Per request
  // and ms they deliver less (0.88 against 1.0), but against a plain step at their own batch
  // they are 6% faster: trees win. Slower trees (1.4 ms) lose.
  for (const double tree_ms : {1.25, 1.4}) {
    StepYield y;
    for (int i = 0; i < 4; ++i) {
      y.record(33, false, 33, 1.0, 1.0);
      y.record(63, true, 63 * 11 / 10, tree_ms, 1.2);
    }
    EXPECT_EQ(y.trees_lose(40, 4), tree_ms > 1.3) << tree_ms;
    EXPECT_NEAR(y.speed(40, false), 1.0, 1e-9);
  }
}

TEST(SchedulerTicks, ARestoredPolicyStateJudgesAdmissionsAsTheOneItCameFrom) {
  // A scheduler that measured trees failing declines a request arriving alone; a fresh one
  // (nothing measured) starts it speculating; one restored from the first declines it too.
  const SchedulerConfig c = adaptive_at_64();
  Harness learned(4096, 4, c);
  learned.add("A", 4, /*spec=*/true);
  learned.tick();
  const VerifyResult miss = first_child_rejected();
  for (int i = 0; i < 40; ++i) learned.sched.record_acceptance(learned.ids["A"], miss, 8);
  learned.sched.record_draft_step(3, 2.0);
  learned.sched.remove(learned.ids["A"]);
  learned.add("B", 4, true, 100);
  learned.tick();
  EXPECT_FALSE(learned.sched.speculating(learned.ids["B"]));

  Harness fresh(4096, 4, c);
  fresh.add("B", 4, true, 100);
  fresh.tick();
  EXPECT_TRUE(fresh.sched.speculating(fresh.ids["B"]));

  Harness restored(4096, 4, c);
  restored.sched.restore_policy_state(learned.sched.policy_state());
  EXPECT_EQ(restored.sched.draft_cost().samples(), 1);
  EXPECT_NEAR(restored.sched.draft_cost().cost().ms(3), 2.0, 1e-9);
  restored.add("B", 4, true, 100);
  restored.tick();
  EXPECT_FALSE(restored.sched.speculating(restored.ids["B"]));
}

TEST(TreePolicy, StepBucketsCostATreeAtItsBucket) {
  // Decode steps with a tree run padded to graph_bucket(tokens, 4) (step graphs): at batch 64
  // one 2-node tree makes 65 tokens, run as 80.
  CostModelConfig cc;
  cc.fixed_ms = 1.0;
  cc.per_token_ms = 0.01;
  cc.online = false;
  CostModel cost(cc);
  AcceptanceEstimate est(0.7);
  const std::vector<TreeCandidate> cands(64, TreeCandidate{&est});
  TreePolicyConfig bucketed = policy();
  bucketed.step_token_buckets = 4;
  std::vector<int32_t> nodes(64, 1);
  const double plain = 64.0 / cost.step_ms(64, 64);  // plain decoding keeps its 64 tokens
  EXPECT_NEAR(predicted_throughput(cands, nodes, 0, 0, 64, cost, {}, bucketed), plain, 1e-12);
  nodes[0] = 2;
  EXPECT_NEAR(predicted_throughput(cands, nodes, 0, 0, 64, cost, {}, bucketed),
              64.7 / cost.step_ms(64, 80), 1e-12);
  EXPECT_NEAR(predicted_throughput(cands, nodes, 0, 0, 64, cost, {}, policy()),
              64.7 / cost.step_ms(64, 65), 1e-12);
  // The choice never predicts (at the bucket's cost) a slower step than plain decoding.
  std::vector<int32_t> chosen;
  for (const TreeBudget& b : choose_tree_budgets(cands, 0, 0, 64, cost, {}, bucketed))
    chosen.push_back(b.max_nodes);
  EXPECT_GE(predicted_throughput(cands, chosen, 0, 0, 64, cost, {}, bucketed), plain);
}

TEST(TreePolicy, LowAcceptanceOrLinearCostMeansNoSpeculation) {
  // (Free drafting on a flat curve makes even 2% acceptance a hair faster; drafting is not free.)
  for (int32_t n : budgets(4, 0.02, gpu_curve(), DraftCost{0.1, 0.05})) EXPECT_EQ(n, 1);
  CostModelConfig cpu;  // compute-bound: every token costs the same
  cpu.fixed_ms = 0.1;
  cpu.per_token_ms = 1.0;
  cpu.online = false;
  for (int32_t n : budgets(1, 0.7, cpu)) EXPECT_EQ(n, 1);
  // A large drafting cost turns speculation off where it would otherwise pay.
  for (int32_t n : budgets(1, 0.8, gpu_curve(), DraftCost{100.0, 0.0})) EXPECT_EQ(n, 1);
}

TEST(TreePolicy, DraftingCostIsPerStepSoABatchSharesIt) {
  // SmolLM2 + EAGLE at batch 8 on an H200, roughly: a 2.4 ms plain step, 0.45 ms for the
  // feedback forward, 0.5 ms per further draft level.
  CostModelConfig cc;
  cc.fixed_ms = 2.4;
  cc.per_token_ms = 0.002;
  cc.online = false;
  const DraftCost draft{0.45, 0.5};
  const double a = 0.7;
  const auto b8 = budgets(8, a, cc, draft);
  const std::vector<int32_t> plain(8, 1);
  const double chosen = predicted_throughput(b8, a, cc, draft);
  EXPECT_GT(chosen, 1.2 * predicted_throughput(plain, a, cc, draft));
  // No common budget beats the choice (by more than rounding).
  for (int32_t u : {2, 4, 8, 16, 32, 64})
    EXPECT_GE(chosen * (1 + 1e-9), predicted_throughput(std::vector<int32_t>(8, u), a, cc, draft))
        << u;
  // Each deeper level costs the whole step 0.5 ms, so the trees stay shallow: depth 8 would
  // cost 3.95 ms of drafting for ~0.2 more tokens per request.
  for (int32_t n : b8) EXPECT_LE(n, 16);

  // A 3 ms drafting cost that no single request's tree pays in a batch of 8 (one tree adds at
  // most ~2 tokens to the step's 8), but eight trees together do: growing one request at a time
  // from plain decoding never gets there, starting from a common budget does.
  const DraftCost big{3.0, 0.0};
  const double plain_big = predicted_throughput(plain, a, cc, big);
  for (int32_t u : {2, 4, 8, 16, 32, 64}) {
    std::vector<int32_t> one = plain;
    one[0] = u;
    EXPECT_LT(predicted_throughput(one, a, cc, big), plain_big) << u;
  }
  const auto shared = budgets(8, a, cc, big);
  EXPECT_GT(predicted_throughput(shared, a, cc, big), 1.1 * plain_big);
  for (int32_t n : shared) EXPECT_GT(n, 1);
}

TEST(TreePolicy, PredictedThroughputMatchesTheWrittenOutModel) {
  const CostModelConfig cc = gpu_curve();
  const DraftCost draft{0.4, 0.3};
  AcceptanceEstimate est(0.6);
  CostModel cost(cc);
  const std::vector<int32_t> nodes = {1, 2, 8, 64, 4};
  const std::vector<TreeCandidate> cands(nodes.size(), TreeCandidate{&est});
  EXPECT_NEAR(predicted_throughput(cands, nodes, 0, 0, 5, cost, draft, policy()),
              predicted_throughput(nodes, 0.6, cc, draft), 1e-12);
  EXPECT_THROW(predicted_throughput(cands, {1, 2}, 0, 0, 5, cost, draft, policy()), Error);
}

TEST(TreePolicy, DraftCostEstimateFitsTheMeasuredSteps) {
  DraftCostEstimate one_depth;
  for (int i = 0; i < 20; ++i) one_depth.observe(4, 2.0);
  // Only depth 4 seen: each level after the first costs half the first (level_share 0.5).
  EXPECT_NEAR(one_depth.cost().ms(4), 2.0, 1e-9);
  EXPECT_NEAR(one_depth.cost().ms(1), 0.8, 1e-9);
  EXPECT_NEAR(one_depth.cost().ms(8), 0.8 + 7 * 0.4, 1e-9);
  EXPECT_EQ(one_depth.cost().ms(0), 0.0);
  DraftCostEstimate proportional(0.1, 1.0);  // level_share 1: every level costs the first's
  for (int i = 0; i < 20; ++i) proportional.observe(4, 2.0);
  EXPECT_NEAR(proportional.cost().ms(1), 0.5, 1e-9);

  DraftCostEstimate line(0.2);
  for (int i = 0; i < 200; ++i) {
    const int32_t d = 1 + i % 6;
    line.observe(d, 0.45 + 0.5 * (d - 1));
  }
  EXPECT_NEAR(line.cost().fixed_ms, 0.45, 1e-6);
  EXPECT_NEAR(line.cost().per_level_ms, 0.5, 1e-6);
  line.observe(0, 100.0);  // no tree drafted: ignored
  line.observe(3, -1.0);   // not a time: ignored
  EXPECT_EQ(line.samples(), 200);

  DraftCostEstimate falling;  // noise that makes deeper trees look cheaper: never negative
  for (int i = 0; i < 100; ++i) falling.observe(1 + i % 2, i % 2 == 0 ? 1.0 : 0.5);
  EXPECT_GE(falling.cost().per_level_ms, 0.0);
  EXPECT_GE(falling.cost().fixed_ms, 0.0);
}

TEST(TreePolicy, NeverPredictsSlowerThanPlainDecoding) {
  const CostModelConfig cc = gpu_curve();
  for (int32_t batch : {1, 2, 4, 8, 16, 32, 64, 100})
    for (double a : {0.01, 0.2, 0.5, 0.8, 0.95})
      for (const DraftCost& draft : {DraftCost{0, 0}, DraftCost{0.5, 0.2}, DraftCost{3.0, 1.0}}) {
        const auto chosen = budgets(batch, a, cc, draft);
        const std::vector<int32_t> plain(static_cast<size_t>(batch), 1);
        EXPECT_GE(predicted_throughput(chosen, a, cc, draft),
                  predicted_throughput(plain, a, cc, draft) - 1e-12)
            << "batch " << batch << " acceptance " << a << " draft " << draft.fixed_ms;
      }
}

TEST(TreePolicy, AcceptanceEstimateFollowsObservedSteps) {
  AcceptanceEstimate est(0.6, 0.2);
  EXPECT_DOUBLE_EQ(est.rate(1, 8), 0.6);
  for (int i = 0; i < 50; ++i) est.update({1, 1}, {1, 0}, 8);  // depth 1 always, depth 2 never
  EXPECT_GT(est.rate(1, 8), 0.95);
  EXPECT_LT(est.rate(2, 8), 0.05);
  EXPECT_LT(est.rate(3, 8), 0.05);  // unseen deeper levels are no better than the deepest seen
  EXPECT_NEAR(est.expected_emitted(8, 3),
              1 + est.rate(1, 8) + est.rate(1, 8) * est.rate(2, 8) +
                  est.rate(1, 8) * est.rate(2, 8) * est.rate(3, 8),
              1e-12);
  est.update({1}, {1}, 1);  // a root alone is no tree: ignored
  EXPECT_EQ(est.samples(), 50);
}

TEST(TreePolicy, AcceptanceIsKeptPerTreeSize) {
  // Chains of single children (2-node trees) accept 45% at depth 1; the proposer's 64-node
  // trees 68%. Each size class keeps its own rate, and a size not measured is extrapolated from
  // the nearest measured one (a tenth of the misses fewer per doubling), not read as the
  // narrow trees' rate.
  AcceptanceEstimate est(0.6, 0.05);
  // Bresenham-spread outcomes: 9 of every 20 accepted, evenly.
  for (int i = 0; i < 400; ++i) est.update({1}, {(i + 1) * 9 / 20 - i * 9 / 20}, 2);
  const double narrow = est.rate(1, 2);
  EXPECT_NEAR(narrow, 0.45, 0.08);
  const double extrapolated = 1 - (1 - narrow) * std::pow(0.9, 5);  // 2 -> 64 nodes
  EXPECT_NEAR(est.rate(1, 64), extrapolated, 1e-12);
  EXPECT_NEAR(est.rate(1, 3), narrow, 1e-12);  // the same class
  for (int i = 0; i < 400; ++i) est.update({1}, {(i + 1) * 17 / 25 - i * 17 / 25}, 64);
  const double wide = est.rate(1, 64);
  EXPECT_NEAR(wide, 0.68, 0.08);
  EXPECT_NEAR(est.rate(1, 16), narrow + (wide - narrow) * 3.0 / 5.0, 1e-12);  // interpolated
  EXPECT_NEAR(est.rate(1, 127), wide, 1e-12);
  EXPECT_NEAR(est.rate(1, 128), 1 - (1 - wide) * 0.9, 1e-12);
}

TEST(TreePolicy, SmallTreesMeasuredFirstDoNotCapTheBudget) {
  // What a server saw at one client (SmolLM2 + EAGLE on an H200): its first trees were 2-node
  // chains (depth 1, 45% accepted, 0.3 ms of drafting), while verification stays nearly free up
  // to 64 tokens. Read as the acceptance of any tree and a draft whose every level costs the
  // first's, that kept every later tree at 2 nodes (then none); a fixed 60-node tree ran 1.25x
  // plain. The budget now grows.
  AcceptanceEstimate est(0.6, 0.05);
  for (int i = 0; i < 200; ++i) est.update({1}, {(i + 1) * 9 / 20 - i * 9 / 20}, 2);
  DraftCostEstimate draft;
  for (int i = 0; i < 20; ++i) draft.observe(1, 0.3);
  CostModelConfig cc;
  cc.curves[1] = {{1, 1.0}, {16, 1.04}, {64, 1.15}, {128, 1.4}};
  cc.online = false;
  const CostModel cost(cc);
  TreePolicyConfig tp;
  tp.max_tree = {64, 6};
  const std::vector<TreeCandidate> one = {TreeCandidate{&est}};
  const auto b = choose_tree_budgets(one, 0, 0, 1, cost, draft.cost(), tp);
  EXPECT_GE(b[0].max_nodes, 16);
  EXPECT_GT(predicted_throughput(one, {b[0].max_nodes}, 0, 0, 1, cost, draft.cost(), tp),
            predicted_throughput(one, {2}, 0, 0, 1, cost, draft.cost(), tp));
}

TEST(CostModel, CurveInterpolatesAndOnlineObservationsCorrectTheLevel) {
  CostModelConfig c;
  c.curves[1] = {{1, 5.0}, {64, 5.0}, {128, 7.0}};
  c.curves[8] = {{8, 6.0}, {64, 6.0}, {128, 9.0}};
  CostModel m(c);
  EXPECT_DOUBLE_EQ(m.step_ms(1, 32), 5.0);
  EXPECT_DOUBLE_EQ(m.step_ms(1, 96), 6.0);
  EXPECT_DOUBLE_EQ(m.step_ms(1, 256), 11.0);  // extrapolated with the last slope
  EXPECT_DOUBLE_EQ(m.step_ms(4, 32), 5.0 + (6.0 - 5.0) * 3.0 / 7.0);
  for (int i = 0; i < 10; ++i) m.observe(1, 32, 10.0);  // this machine is 2x slower
  EXPECT_NEAR(m.step_ms(1, 32), 10.0, 1e-9);
  EXPECT_NEAR(m.step_ms(1, 96), 12.0, 1e-9);  // the neighbours scale with it
  CostModelConfig bad;
  bad.curves[1] = {{10, 1.0}, {5, 2.0}};
  EXPECT_THROW(CostModel{bad}, Error);
}

TEST(CostModel, LoadsTheMeasuredCurvesPerRequestTokens) {
  // configs/verify_cost_{h100,h200}.json list [tree tokens per request, ms] per batch size; the
  // model works in total step tokens.
  for (const char* gpu : {"h100", "h200"}) {
    const std::string path =
        std::string(ARBOR_TEST_DATA_DIR) + "/../../configs/verify_cost_" + gpu + ".json";
    SCOPED_TRACE(path);
    CostModelConfig c = load_cost_model(path);
    c.online = false;
    const nlohmann::json j = nlohmann::json::parse(std::ifstream(path));
    CostModel m(c);
    for (const char* b : {"1", "8", "32"})
      for (const auto& p : j["batch"][b]) {
        const int32_t batch = std::stoi(b);
        EXPECT_NEAR(m.step_ms(batch, p[0].get<int32_t>() * batch), p[1].get<double>(), 1e-9)
            << "batch " << b << " T " << p[0];
      }
    // A big tree at batch 32 costs far more than one token per request.
    EXPECT_GT(m.step_ms(32, 32 * 64), 5 * m.step_ms(32, 32));
    EXPECT_THROW(load_cost_model(path + ".missing"), Error);
  }
}

}  // namespace
}  // namespace arbor
