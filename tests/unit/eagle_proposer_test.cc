// EAGLE-1/2 and EAGLE-3 draft layers and the dynamic-tree proposer against the PyTorch reference
// (scripts/spec_heads_reference.py: the official cnets1.py / cnets.py Model and topK_genrate):
// draft logits of every committed row to 1e-4 over two rounds (the second reusing the draft's
// KV cache), and the EAGLE-2 trees of both rounds exactly for three (total_tokens, depth, top_k)
// settings. Targets llama_gqa and stories260K; a draft vocabulary with d2t, a checkpoint with
// its own embeddings, GQA drafts. Also chunked feedback, prefix-cached starts, KV release,
// sequencing errors and malformed checkpoints.
#include <gtest/gtest.h>

#include <filesystem>
#include <random>
#include <set>

#include "engine/backend/draft_frontier.h"
#include "engine/spec/eagle_proposer.h"
#include "engine/spec/proposer_factory.h"
#include "engine/verify/tree_layout.h"
#include "tests/common/token_maps.h"
#include "tests/unit/proposer_test_util.h"

namespace arbor {
namespace {

using test::expect_error;
using test::spec_fixture;

struct Fixture {
  std::string name;
  nlohmann::json ref;
  std::string target_name;
  const ModelWeights* target;
  EagleVersion version;
};

Fixture load(const std::string& name) {
  Fixture f{name, test::spec_reference(name), "", nullptr, EagleVersion::kEagle1};
  f.target_name = f.ref["target"].get<std::string>();
  f.target = &test::target_weights(f.target_name);
  f.version = name.rfind("eagle3", 0) == 0 ? EagleVersion::kEagle3 : EagleVersion::kEagle1;
  return f;
}

// One round's feedback, holding the data the spans point into.
struct Round {
  std::vector<int32_t> tokens;
  std::vector<float> hidden;
  std::vector<std::vector<float>> captured;
  int32_t start = 0;
  int32_t next_token = -1;
  TargetFeedback feedback(RequestId request) const {
    TargetFeedback fb;
    fb.request = request;
    fb.start = start;
    fb.tokens = tokens;
    fb.hidden = hidden;
    for (const auto& c : captured) fb.captured.emplace_back(c);
    fb.next_token = next_token;
    return fb;
  }
};

Round round_of(const nlohmann::json& r) {
  Round out;
  out.tokens = r["tokens"].get<std::vector<int32_t>>();
  out.start = r["start"].get<int32_t>();
  out.next_token = r["next_token"].get<int32_t>();
  if (r.contains("hidden")) out.hidden = test::flat_rows(r["hidden"]);
  if (r.contains("captured"))
    for (const auto& layer : r["captured"]) out.captured.push_back(test::flat_rows(layer));
  return out;
}

EagleOptions options_of(const nlohmann::json& t) {
  EagleOptions o;
  o.tree = {t["total_tokens"].get<int32_t>(), t["depth"].get<int32_t>(), t["top_k"].get<int32_t>()};
  o.draft_kv = {256, 16, false};
  o.num_threads = 1;
  return o;
}

std::unique_ptr<EagleProposer> make(const Fixture& f, const EagleOptions& o) {
  return std::make_unique<EagleProposer>(load_eagle_checkpoint(spec_fixture(f.name), f.version),
                                         *f.target, o);
}

class EagleReference : public ::testing::TestWithParam<std::string> {};

// The ways propose_batch may grow trees: depth by depth on the host (0), grown on the backend and
// picked by the host's grower from the downloaded top-k (1), grown and picked on the backend (2:
// the tree's tokens and parents left in backend memory, the CPU backend's host memory here).
constexpr int kWays[] = {0, 1, 2};
const char* way_name(int way) {
  return way == 0   ? "grown on the host"
         : way == 1 ? "grown on the backend"
                    : "picked on the backend";
}
void set_way(EagleOptions* o, int way) {
  o->grow_on_backend = way >= 1 ? 1 : 0;
  o->pick_on_backend = way == 2 ? 1 : 0;
}
// The engine's part: a reader of the draft's memory (a CPU backend reads another's), without
// which trees are never picked on the backend.
void read_trees_on_host(Proposer& p) {
  static const std::unique_ptr<Backend> reader = make_cpu_backend(1);
  p.set_tree_reader(reader.get());
}
// A tree with its device tokens and parents read in (CPU backend memory), checked to have had
// them when `picked` (a tree of more than the root).
DraftTree resolved(DraftTree tree, bool picked) {
  if (picked && tree.size() > 1) {
    EXPECT_EQ(tree.device.parent_index.size(), static_cast<size_t>(tree.size()));
    EXPECT_EQ(tree.device.index.size(), static_cast<size_t>(tree.size()));
  }
  const auto* ids = static_cast<const int32_t*>(tree.device.ids.data);
  for (size_t i = 0; i < tree.device.index.size(); ++i)
    if (tree.device.index[i] >= 0) tree.token[i] = ids[tree.device.index[i]];
  for (size_t i = 0; i < tree.device.parent_index.size(); ++i)
    if (tree.device.parent_index[i] >= 0) tree.parent[i] = ids[tree.device.parent_index[i]];
  tree.device = DeviceTokens{};
  return tree;
}

// Picked trees `got` (of the requests `asked`) equal the host's `want`, each more than a root.
void expect_same_trees(const std::vector<DraftTree>& got, const std::vector<DraftTree>& want,
                       const std::vector<std::pair<RequestId, TreeBudget>>& asked) {
  ASSERT_EQ(got.size(), asked.size());
  ASSERT_EQ(want.size(), asked.size());
  for (size_t i = 0; i < asked.size(); ++i) {
    SCOPED_TRACE("request " + std::to_string(asked[i].first));
    const DraftTree a = resolved(got[i], true), w = resolved(want[i], true);
    ASSERT_GT(w.size(), 1);
    EXPECT_EQ(a.token, w.token);
    EXPECT_EQ(a.parent, w.parent);
  }
}

TEST_P(EagleReference, DraftLogitsOfEveryCommittedRowMatchPyTorch) {
  const Fixture f = load(GetParam());
  auto p = make(f, options_of(f.ref["rounds"][0]["trees"][0]));
  EagleDraftModel& draft = p->draft();
  const SeqId seq = draft.create_sequence();
  for (const auto& r : f.ref["rounds"]) {
    const Round rd = round_of(r);
    // Rows (feature_t, token_{t+1}) for the round's positions.
    std::vector<int32_t> next(rd.tokens.begin() + 1, rd.tokens.end());
    next.push_back(rd.next_token);
    std::vector<float> features;
    const size_t n = rd.tokens.size();
    const int64_t h = f.target->config.hidden_size;
    for (size_t i = 0; i < n; ++i) {
      if (rd.captured.empty()) {
        features.insert(features.end(), rd.hidden.begin() + i * h, rd.hidden.begin() + (i + 1) * h);
      } else {
        for (const auto& layer : rd.captured)
          features.insert(features.end(), layer.begin() + i * h, layer.begin() + (i + 1) * h);
      }
    }
    const std::vector<float> out = draft.append(seq, next, features, rd.start);
    const std::vector<float> logits = draft.logits(out, static_cast<int64_t>(n));
    const std::vector<float> ref = test::flat_rows(r["draft_logits"]);
    ASSERT_EQ(logits.size(), ref.size());
    const size_t v = static_cast<size_t>(draft.draft_vocab());
    for (size_t i = 0; i < n; ++i)
      EXPECT_LE(test::rel_error(logits.data() + i * v, ref.data() + i * v, v), 1e-4)
          << "round starting at " << rd.start << ", row " << i;
  }
  draft.free_sequence(seq);
}

TEST_P(EagleReference, TargetFeaturesMatchTransformers) {
  // What the runner hands the proposer (our forward: final-norm hidden or the residual stream at
  // the inputs of capture_layers()) is what the reference fed its draft.
  const Fixture f = load(GetParam());
  auto p = make(f, options_of(f.ref["rounds"][0]["trees"][0]));
  EXPECT_EQ(p->needs_hidden(), f.version == EagleVersion::kEagle1);
  EXPECT_EQ(p->capture_layers(), f.ref["capture_layers"].get<std::vector<int32_t>>());
  const Round rd = round_of(f.ref["rounds"][0]);
  const test::TargetRun run = test::run_target(f.target_name, rd.tokens, p->capture_layers());
  if (f.version == EagleVersion::kEagle1) {
    EXPECT_LE(test::rel_error(run.hidden.data(), rd.hidden.data(), rd.hidden.size()), 1e-4);
  } else {
    ASSERT_EQ(run.captured.size(), rd.captured.size());
    for (size_t c = 0; c < rd.captured.size(); ++c)
      EXPECT_LE(
          test::rel_error(run.captured[c].data(), rd.captured[c].data(), rd.captured[c].size()),
          1e-4)
          << "capture layer " << p->capture_layers()[c];
  }
}

TEST_P(EagleReference, DynamicTreesOfTwoRoundsMatchTopKGenerate) {
  const Fixture f = load(GetParam());
  const auto& rounds = f.ref["rounds"];
  for (size_t s = 0; s < rounds[0]["trees"].size(); ++s) {
    auto p = make(f, options_of(rounds[0]["trees"][s]));
    const Round r0 = round_of(rounds[0]);
    p->begin(11, r0.tokens);
    for (size_t ri = 0; ri < rounds.size(); ++ri) {
      const Round rd = round_of(rounds[ri]);
      p->observe(rd.feedback(11));
      const nlohmann::json& t = rounds[ri]["trees"][s];
      const DraftTree tree = p->propose(11, TreeBudget{64, 8});
      test::expect_tree(tree, t["tokens"].get<std::vector<int32_t>>(),
                        t["parents"].get<std::vector<int32_t>>(),
                        "setting " + std::to_string(s) + " round " + std::to_string(ri));
      validate_draft_tree(tree, f.target->config.vocab_size, TreeBudget{64, 8});
    }
    p->end(11);
  }
}

// propose_batch grows several requests' trees with one draft forward per step for all of them:
// request A (after round 0), request B (after rounds 0 and 1, so other positions and features)
// and a root-only budget in one call give each request the official tree of its own round.
// Both ways: depth by depth on the host, and grown on the backend (Backend::draft_frontier_*,
// each frontier chosen where the logits are, key paths instead of forked sequences).
TEST_P(EagleReference, BatchedProposalsEqualTheOfficialTreeOfEachRequest) {
  const Fixture f = load(GetParam());
  const auto& rounds = f.ref["rounds"];
  ASSERT_GE(rounds.size(), 2u);
  for (int way : kWays)
    for (size_t s = 0; s < rounds[0]["trees"].size(); ++s) {
      SCOPED_TRACE(way_name(way));
      EagleOptions o = options_of(rounds[0]["trees"][s]);
      set_way(&o, way);
      auto p = make(f, o);
      read_trees_on_host(*p);
      const Round r0 = round_of(rounds[0]), r1 = round_of(rounds[1]);
      for (RequestId id : {21, 22, 23}) {
        p->begin(id, r0.tokens);
        p->observe(r0.feedback(id));
      }
      p->observe(r1.feedback(22));
      std::vector<DraftTree> trees = p->propose_batch(
          {{21, TreeBudget{64, 8}}, {23, TreeBudget{1, 8}}, {22, TreeBudget{64, 8}}});
      for (DraftTree& t : trees) t = resolved(std::move(t), way == 2);
      ASSERT_EQ(trees.size(), 3u);
      for (const auto& [tree, round] : {std::pair{trees[0], 0}, {trees[2], 1}}) {
        const nlohmann::json& t = rounds[round]["trees"][s];
        test::expect_tree(
            tree, t["tokens"].get<std::vector<int32_t>>(), t["parents"].get<std::vector<int32_t>>(),
            "batched, setting " + std::to_string(s) + " round " + std::to_string(round));
      }
      EXPECT_EQ(trees[1].size(), 1);
      for (RequestId id : {21, 22, 23}) p->end(id);
    }
}

TEST_P(EagleReference, TreeBudgetBoundsNodesAndDepth) {
  // Budget {8 nodes, depth 2} on the default settings is the official tree of total_tokens 8,
  // depth 1 (one draft step after the first), the fixture's third setting.
  const Fixture f = load(GetParam());
  const nlohmann::json& small = f.ref["rounds"][0]["trees"][2];
  ASSERT_EQ(small["total_tokens"], 8);
  ASSERT_EQ(small["depth"], 1);
  EagleOptions o = options_of(f.ref["rounds"][0]["trees"][0]);
  o.tree.top_k = small["top_k"].get<int32_t>();
  auto p = make(f, o);
  const Round r0 = round_of(f.ref["rounds"][0]);
  p->begin(2, r0.tokens);
  p->observe(r0.feedback(2));
  test::expect_tree(p->propose(2, TreeBudget{8, 2}), small["tokens"].get<std::vector<int32_t>>(),
                    small["parents"].get<std::vector<int32_t>>(), "budget 8/2");
  EXPECT_EQ(p->propose(2, TreeBudget{1, 8}).size(), 1);
  EXPECT_EQ(p->propose(2, TreeBudget{64, 0}).size(), 1);
  const DraftTree one_level = p->propose(2, TreeBudget{64, 1});
  EXPECT_EQ(one_level.size(), 1 + o.tree.top_k);
  for (int32_t i = 1; i < one_level.size(); ++i) EXPECT_EQ(one_level.parent[i], 0);
}

TEST_P(EagleReference, ChunkedFeedbackGivesTheSameTree) {
  // Prefill in two chunks, the first without its next token (-1) or with it: same tree.
  const Fixture f = load(GetParam());
  const nlohmann::json& t = f.ref["rounds"][0]["trees"][1];
  const Round r0 = round_of(f.ref["rounds"][0]);
  const size_t split = 4, n = r0.tokens.size();
  const int64_t h = f.target->config.hidden_size;
  // Modes: 0 = first chunk without its next token, 1 = with it, 2 = without it and then an empty
  // feedback that only gives it.
  for (int mode : {0, 1, 2}) {
    const bool known_next = mode == 1;
    auto p = make(f, options_of(t));
    p->begin(5, r0.tokens);
    Round a = r0, b = r0;
    a.tokens.assign(r0.tokens.begin(), r0.tokens.begin() + split);
    a.next_token = known_next ? r0.tokens[split] : -1;
    b.tokens.assign(r0.tokens.begin() + split, r0.tokens.end());
    b.start = static_cast<int32_t>(split);
    auto cut = [&](const std::vector<float>& rows, size_t from, size_t to) {
      return std::vector<float>(rows.begin() + from * h, rows.begin() + to * h);
    };
    if (!r0.hidden.empty()) {
      a.hidden = cut(r0.hidden, 0, split);
      b.hidden = cut(r0.hidden, split, n);
    }
    for (size_t c = 0; c < r0.captured.size(); ++c) {
      a.captured[c] = cut(r0.captured[c], 0, split);
      b.captured[c] = cut(r0.captured[c], split, n);
    }
    p->observe(a.feedback(5));
    if (!known_next)
      expect_error([&] { p->propose(5, {}); }, ErrorCode::kInvalidArgument, {"next_token"});
    if (mode == 2) {
      Round empty = b;
      empty.tokens.clear();
      empty.hidden.clear();
      for (auto& c : empty.captured) c.clear();
      empty.next_token = r0.tokens[split];
      p->observe(empty.feedback(5));
    }
    p->observe(b.feedback(5));
    test::expect_tree(p->propose(5, TreeBudget{64, 8}), t["tokens"].get<std::vector<int32_t>>(),
                      t["parents"].get<std::vector<int32_t>>(),
                      "chunked feedback, mode " + std::to_string(mode));
  }
}

// Trees are left in the draft's memory only for a reader that can read it there
// (Proposer::set_tree_reader): without one, or when the engine declines (nullptr), the host's
// grower picks them from the downloaded log, with every token and parent on the host.
TEST(EagleProposer, TreesArePickedOnTheBackendOnlyForAReaderOfItsMemory) {
  const Fixture f = load("eagle_stories260K");
  const Round r0 = round_of(f.ref["rounds"][0]);
  for (int reader : {0, 1, 2}) {
    EagleOptions o = options_of(f.ref["rounds"][0]["trees"][0]);
    set_way(&o, 2);
    auto p = make(f, o);
    if (reader == 1) read_trees_on_host(*p);
    if (reader == 2) p->set_tree_reader(nullptr);
    p->begin(1, r0.tokens);
    p->observe(r0.feedback(1));
    const DraftTree t = p->propose_batch({{1, TreeBudget{64, 8}}})[0];
    ASSERT_GT(t.size(), 1);
    EXPECT_EQ(t.device.parent_index.empty(), reader != 1) << "reader " << reader;
    EXPECT_EQ(p->last_draft_device_ms(), -1.0) << "the CPU backend's ops ran as they were called";
    p->end(1);
  }
}

INSTANTIATE_TEST_SUITE_P(Drafts, EagleReference,
                         ::testing::Values("eagle_llama_gqa", "eagle_stories260K",
                                           "eagle3_llama_gqa", "eagle3_stories260K"),
                         [](const auto& info) { return info.param; });

TEST(EagleProposer, ProposeReleasesItsDraftBlocksAndEndFreesTheRest) {
  const Fixture f = load("eagle_stories260K");
  auto p = make(f, options_of(f.ref["rounds"][0]["trees"][0]));
  const KvCacheManager& kv = p->draft().kv();
  const int32_t all_free = kv.num_free_blocks();
  const Round r0 = round_of(f.ref["rounds"][0]);
  p->begin(1, r0.tokens);
  p->observe(r0.feedback(1));
  // The observed rows wait for the next propose (a step that does not speculate runs no draft).
  EXPECT_EQ(kv.num_free_blocks(), all_free);
  EXPECT_EQ(p->draft().length(0), 0);
  EXPECT_EQ(p->propose(1, TreeBudget{64, 8}).size(), 60);
  // The committed rows ran and hold their blocks; the tree's forks gave theirs back.
  const int32_t rows = p->draft().length(0);
  EXPECT_GT(rows, 0);
  EXPECT_EQ(kv.num_free_blocks(), all_free - (rows + kv.block_size() - 1) / kv.block_size());
  EXPECT_EQ(kv.num_sequences(), 1);
  kv.check_invariants();
  p->end(1);
  EXPECT_EQ(kv.num_free_blocks(), all_free);
  EXPECT_EQ(kv.num_sequences(), 0);
}

// 40 committed rows of one made-up context (42 tokens, a hidden state per row), as a target's
// feedback: rows [first, first + n) for `request`.
struct SyntheticRows {
  explicit SyntheticRows(int64_t hidden_size) : h(hidden_size) {
    for (int i = 0; i < 42; ++i) tokens.push_back(3 + (i * 7) % 200);
    hidden.resize(static_cast<size_t>(40 * h));
    for (int i = 0; i < 40; ++i)
      for (int64_t j = 0; j < h; ++j)
        hidden[i * h + j] = 0.01f * static_cast<float>((i * 31 + j) % 97 - 48);
  }
  std::span<const int32_t> prompt() const { return std::span<const int32_t>(tokens.data(), 1); }
  TargetFeedback feedback(RequestId request, int32_t first, int32_t n) const {
    TargetFeedback fb;
    fb.request = request;
    fb.start = first;
    fb.tokens = std::span<const int32_t>(&tokens[first], n);
    fb.hidden = std::span<const float>(hidden).subspan(first * h, n * h);
    fb.next_token = tokens[first + n];
    return fb;
  }
  int64_t h;
  std::vector<int32_t> tokens;
  std::vector<float> hidden;
};

// Steps that do not speculate (the adaptive policy declining) run no draft forward: observed rows
// wait until the request is proposed for, or until 32 have gathered; then all but the last run
// (no head, no wait), the last waiting for the proposal. The tree is the one a proposer that
// ran all 40 rows at the proposal drafts.
TEST(EagleProposer, ObservedRowsWaitForProposeOrAFullBacklog) {
  const Fixture f = load("eagle_stories260K");
  const SyntheticRows rows(f.target->config.hidden_size);
  auto p = make(f, options_of(f.ref["rounds"][0]["trees"][0]));
  p->begin(1, rows.prompt());
  for (int i = 0; i < 40; ++i) {
    p->observe(rows.feedback(1, i, 1));
    // Row i pairs feature i with token i + 1; the 32nd row runs the first 31 together.
    EXPECT_EQ(p->draft().length(0), i + 1 < 32 ? 0 : 31) << "after " << i + 1 << " rows";
  }
  const DraftTree tree = p->propose(1, TreeBudget{64, 8});
  EXPECT_EQ(p->draft().length(0), 40);
  EXPECT_GT(tree.size(), 1);
  validate_draft_tree(tree, f.target->config.vocab_size, TreeBudget{64, 8});

  auto all_at_once = make(f, options_of(f.ref["rounds"][0]["trees"][0]));
  all_at_once->begin(1, rows.prompt());
  all_at_once->observe(rows.feedback(1, 0, 40));
  EXPECT_EQ(all_at_once->draft().length(0), 39);  // all but the last row, in one forward
  const DraftTree want = all_at_once->propose(1, TreeBudget{64, 8});
  EXPECT_EQ(tree.token, want.token);
  EXPECT_EQ(tree.parent, want.parent);
}

TEST(EagleProposer, AFullBacklogRunsEveryRequestsBacklogWithIt) {
  // Request 2 starts 10 rows after request 1: when request 1's backlog fills (32 rows), request
  // 2's 22 rows run in the same forward (all but its last), and its tree is the one a proposer
  // that saw its rows at once draws.
  const Fixture f = load("eagle_stories260K");
  const SyntheticRows rows(f.target->config.hidden_size);
  auto p = make(f, options_of(f.ref["rounds"][0]["trees"][0]));
  p->begin(1, rows.prompt());
  p->begin(2, rows.prompt());
  for (int i = 0; i < 32; ++i) {
    std::vector<TargetFeedback> step = {rows.feedback(1, i, 1)};
    if (i >= 10) step.push_back(rows.feedback(2, i - 10, 1));
    p->observe_batch(step);
  }
  EXPECT_EQ(p->draft().length(0), 31);  // request 1: its full backlog but the last row
  EXPECT_EQ(p->draft().length(1), 21);  // request 2: with it, 22 rows but the last
  const DraftTree tree = p->propose(2, TreeBudget{64, 8});

  auto at_once = make(f, options_of(f.ref["rounds"][0]["trees"][0]));
  at_once->begin(2, rows.prompt());
  at_once->observe(rows.feedback(2, 0, 22));
  const DraftTree want = at_once->propose(2, TreeBudget{64, 8});
  EXPECT_EQ(tree.token, want.token);
  EXPECT_EQ(tree.parent, want.parent);
}

// Verified paths folded in from backend memory before the host has them
// (observe_paths_on_device: each path's rows reserved for its tree's depth + 1, the rows past the
// path repeating its last one as PathRowsOnDevice lays them out; observe_batch commits the
// path's length) give the trees of the host's feedback: request 1's path on the device, request
// 2's rows waiting on the host in the same step (its root runs on the host beside request 1's
// device root), request 3's device rows cancelled by feedback longer than their room (folded in
// on the host instead). The rows past the paths go back to the pool.
TEST(EagleProposer, PathsFoldedInOnTheBackendGiveTheHostsTrees) {
  const Fixture f = load("eagle_stories260K");
  const SyntheticRows rows(f.target->config.hidden_size);
  const int64_t h = rows.h;
  EagleOptions o = options_of(f.ref["rounds"][0]["trees"][0]);
  set_way(&o, 2);
  o.paths_on_device = 1;
  auto p = make(f, o);
  read_trees_on_host(*p);
  ASSERT_TRUE(p->observes_paths_on_device());
  EagleOptions host_o = o;
  host_o.paths_on_device = 0;
  auto want = make(f, host_o);
  read_trees_on_host(*want);
  EXPECT_FALSE(want->observes_paths_on_device());
  for (Proposer* q : {static_cast<Proposer*>(p.get()), static_cast<Proposer*>(want.get())})
    for (RequestId r : {1, 2, 3}) {
      q->begin(r, rows.prompt());
      q->observe(rows.feedback(r, 0, 10));
      // Requests 1 and 3 run their backlogs (nothing waits on the host); request 2's rows wait.
      if (r != 2) q->propose_batch({{r, TreeBudget{64, 8}}});
    }
  // This step's paths: 3 rows each from position 10 (the verify's rows), room for 5.
  Backend& b = p->draft().backend();
  const int32_t room = 5;
  Tensor features = b.persistent(3 * room, h);
  Tensor next_f = b.persistent(3 * room, 1);
  std::vector<float> host_rows(static_cast<size_t>(3 * room * h));
  std::vector<int32_t> host_next(static_cast<size_t>(3 * room));
  for (int32_t item = 0; item < 3; ++item)
    for (int32_t d = 0; d < room; ++d) {
      const int32_t j = 10 + std::min(d, 2);  // the path's rows, then its last one again
      std::copy_n(rows.hidden.begin() + j * h, h, host_rows.begin() + (item * room + d) * h);
      host_next[static_cast<size_t>(item * room + d)] = rows.tokens[static_cast<size_t>(j + 1)];
    }
  b.upload(host_rows.data(), features);
  b.upload(reinterpret_cast<const float*>(host_next.data()), next_f);
  PathRowsOnDevice view;
  view.rows = features;
  view.next = Tensor{next_f.data, DType::kI32, 3 * room, 1};
  view.offset = {0, room, 2 * room, 3 * room};
  const KvCacheManager& kv = p->draft().kv();
  // Each sequence's committed and reserved rows.
  const auto lengths = [](const KvCacheManager& k) {
    std::vector<std::pair<int32_t, int32_t>> out;
    for (SeqId q : k.sequence_ids()) out.emplace_back(k.committed_len(q), k.reserved_len(q));
    return out;
  };
  const auto before = lengths(kv);
  ASSERT_EQ(before, lengths(want->draft().kv()));
  const std::vector<Proposer::DevicePath> paths = {{1, 0}, {2, 1}, {3, 2}};
  p->observe_paths_on_device(paths, view);
  int32_t reserved = 0;
  for (const auto& [committed, r] : lengths(kv)) reserved += r;
  EXPECT_EQ(reserved, 2 * room) << "requests 1 and 3 (request 2 has rows waiting on the host)";
  const std::vector<TargetFeedback> step = {rows.feedback(1, 10, 3), rows.feedback(2, 10, 3),
                                            rows.feedback(3, 10, room + 1)};
  p->observe_batch(step);
  want->observe_batch(step);
  // Request 1's 3 rows committed (the host's wait for the next proposal), request 3's
  // reservation cancelled (a path longer than its room: its rows wait on the host), request 2's
  // 13 rows on the host.
  std::vector<std::pair<int32_t, int32_t>> expect = before;
  expect[0].first += 3;
  EXPECT_EQ(lengths(kv), expect);
  kv.check_invariants();
  const std::vector<std::pair<RequestId, TreeBudget>> ask = {
      {1, TreeBudget{64, 8}}, {2, TreeBudget{64, 8}}, {3, TreeBudget{64, 8}}};
  expect_same_trees(p->propose_batch(ask), want->propose_batch(ask), ask);
  EXPECT_EQ(lengths(kv), lengths(want->draft().kv()));
  for (RequestId r : {1, 2, 3}) p->end(r);
  EXPECT_EQ(kv.num_sequences(), 0);
  EXPECT_EQ(kv.num_free_blocks(), kv.num_blocks());
}

// The next trees grown before the host learns the paths' lengths (grow_before_wait: each tree
// set up as if its whole reserved path were real, then moved back on the backend by the rows past
// the path, PathRowsOnDevice::len) are the trees the host's feedback gives: paths of 3 and 1 of
// 5 reserved rows (the second tree moved back 4 rows, its slots left past them), taken by the
// next proposal under the same budgets; a proposal under other budgets grows its own, the same
// as the host's. Every row goes back to the pool.
TEST(EagleProposer, TreesGrownBeforeTheWaitAreTheHostsNextTrees) {
  const Fixture f = load("eagle_stories260K");
  const SyntheticRows rows(f.target->config.hidden_size);
  const int64_t h = rows.h;
  EagleOptions o = options_of(f.ref["rounds"][0]["trees"][0]);
  set_way(&o, 2);
  o.paths_on_device = 1;
  o.grow_before_wait = 1;
  auto p = make(f, o);
  read_trees_on_host(*p);
  EagleOptions host_o = o;
  host_o.paths_on_device = 0;
  host_o.grow_before_wait = 0;
  auto want = make(f, host_o);
  read_trees_on_host(*want);
  const TreeBudget budget{64, 8};
  for (Proposer* q : {static_cast<Proposer*>(p.get()), static_cast<Proposer*>(want.get())})
    for (RequestId r : {1, 2}) {
      q->begin(r, rows.prompt());
      q->observe(rows.feedback(r, 0, 10));
    }
  const std::vector<std::pair<RequestId, TreeBudget>> ask = {{1, budget}, {2, budget}};
  p->propose_batch(ask);  // the trees these paths were verified in
  want->propose_batch(ask);
  Backend& b = p->draft().backend();
  const int32_t room = 5;
  const std::vector<int32_t> len = {3, 1};
  // A step's paths, request i's from position start[i]; the rows past each path repeat its last.
  const auto step = [&](const std::vector<int32_t>& start,
                        const std::vector<std::pair<RequestId, TreeBudget>>& next) {
    Tensor features = b.persistent(2 * room, h);
    Tensor next_f = b.persistent(2 * room, 1);
    Tensor len_f = b.persistent(2, 1);
    std::vector<float> host_rows(static_cast<size_t>(2 * room * h));
    std::vector<int32_t> host_next(static_cast<size_t>(2 * room));
    for (int32_t item = 0; item < 2; ++item)
      for (int32_t d = 0; d < room; ++d) {
        const auto i = static_cast<size_t>(item);
        const int32_t j = start[i] + std::min(d, len[i] - 1);
        std::copy_n(rows.hidden.begin() + j * h, h, host_rows.begin() + (item * room + d) * h);
        host_next[static_cast<size_t>(item * room + d)] = rows.tokens[static_cast<size_t>(j + 1)];
      }
    b.upload(host_rows.data(), features);
    b.upload(reinterpret_cast<const float*>(host_next.data()), next_f);
    b.upload(reinterpret_cast<const float*>(len.data()), len_f);
    PathRowsOnDevice view;
    view.rows = features;
    view.next = Tensor{next_f.data, DType::kI32, 2 * room, 1};
    view.len = Tensor{len_f.data, DType::kI32, 2, 1};
    view.offset = {0, room, 2 * room};
    const std::vector<Proposer::DevicePath> paths = {{1, 0}, {2, 1}};
    p->observe_paths_on_device(paths, view);
    const std::vector<TargetFeedback> fbs = {rows.feedback(1, start[0], len[0]),
                                             rows.feedback(2, start[1], len[1])};
    p->observe_batch(fbs);
    want->observe_batch(fbs);
    expect_same_trees(p->propose_batch(next), want->propose_batch(next), next);
  };
  step({10, 10}, ask);
  EXPECT_EQ(p->trees_grown_before_wait(), 1) << "the same requests and budgets";
  const std::vector<std::pair<RequestId, TreeBudget>> smaller = {{1, TreeBudget{8, 3}},
                                                                 {2, TreeBudget{8, 3}}};
  step({13, 11}, smaller);
  EXPECT_EQ(p->trees_grown_before_wait(), 1) << "other budgets: grown after the wait";
  const KvCacheManager& kv = p->draft().kv();
  for (SeqId q : kv.sequence_ids()) {
    EXPECT_EQ(kv.reserved_len(q), 0);
    EXPECT_EQ(kv.committed_len(q), want->draft().kv().committed_len(q));
  }
  kv.check_invariants();
  for (RequestId r : {1, 2}) p->end(r);
  EXPECT_EQ(kv.num_sequences(), 0);
  EXPECT_EQ(kv.num_free_blocks(), kv.num_blocks());
}

// A draft cache too full for a path's rows (each tree's depth + 1 reserved): the paths are left
// to the host's feedback, which folds them in as rows waiting for the next proposal; nothing stays
// reserved.
TEST(EagleProposer, PathsThatDoNotFitTheDraftCacheGoTheHostsWay) {
  const Fixture f = load("eagle_stories260K");
  const SyntheticRows rows(f.target->config.hidden_size);
  EagleOptions o = options_of(f.ref["rounds"][0]["trees"][0]);
  set_way(&o, 2);
  o.paths_on_device = 1;
  o.draft_kv = {1, 16, false};  // one block of 16 rows
  auto p = make(f, o);
  read_trees_on_host(*p);
  p->begin(1, rows.prompt());
  p->observe(rows.feedback(1, 0, 14));
  const KvCacheManager& kv = p->draft().kv();
  // The proposal runs the 14 rows, then finds no room for the tree's rows.
  EXPECT_THROW(p->propose_batch({{1, TreeBudget{64, 8}}}), Error);
  ASSERT_EQ(kv.committed_len(0), 14);
  Backend& b = p->draft().backend();
  const int32_t room = 8;  // 14 + 8 rows do not fit one block
  Tensor features = b.persistent(room, rows.h);
  Tensor next_f = b.persistent(room, 1);
  PathRowsOnDevice view;
  view.rows = features;
  view.next = Tensor{next_f.data, DType::kI32, room, 1};
  view.offset = {0, room};
  const std::vector<Proposer::DevicePath> paths = {{1, 0}};
  p->observe_paths_on_device(paths, view);
  EXPECT_EQ(kv.reserved_len(0), 0) << "nothing reserved";
  p->observe_batch(std::vector<TargetFeedback>{rows.feedback(1, 14, 2)});
  EXPECT_EQ(kv.committed_len(0), 14) << "the path's rows wait on the host";
  EXPECT_EQ(kv.reserved_len(0), 0);
  kv.check_invariants();
  p->end(1);
  EXPECT_EQ(kv.num_free_blocks(), kv.num_blocks());
}

TEST(EagleProposer, FirstFeedbackMayStartPastACachedPrefix) {
  // With a prefix served from the target's cache, the first feedback starts mid-prompt; the
  // draft then sees the context from there on.
  const Fixture f = load("eagle_llama_gqa");
  auto p = make(f, options_of(f.ref["rounds"][0]["trees"][0]));
  const Round r0 = round_of(f.ref["rounds"][0]);
  const int64_t h = f.target->config.hidden_size;
  Round late = r0;
  late.start = 3;
  late.tokens.assign(r0.tokens.begin() + 3, r0.tokens.end());
  late.hidden.assign(r0.hidden.begin() + 3 * h, r0.hidden.end());
  p->begin(4, r0.tokens);
  p->observe(late.feedback(4));
  const DraftTree tree = p->propose(4, TreeBudget{64, 8});  // runs the observed rows first
  EXPECT_EQ(p->draft().length(0), static_cast<int32_t>(late.tokens.size()));
  EXPECT_EQ(tree.token[0], r0.next_token);
  validate_draft_tree(tree, f.target->config.vocab_size, TreeBudget{64, 8});
}

TEST(EagleProposer, SequencingErrorsNameTheRequest) {
  const Fixture f = load("eagle3_llama_gqa");
  auto p = make(f, options_of(f.ref["rounds"][0]["trees"][1]));
  const Round r0 = round_of(f.ref["rounds"][0]);
  expect_error([&] { p->observe(r0.feedback(9)); }, ErrorCode::kInvalidArgument,
               {"request 9", "not begun"});
  p->begin(9, r0.tokens);
  expect_error([&] { p->propose(9, {}); }, ErrorCode::kInvalidArgument, {"request 9"});
  Round missing = r0;
  missing.captured.pop_back();
  expect_error([&] { p->observe(missing.feedback(9)); }, ErrorCode::kInvalidArgument,
               {"captured holds 2 layers, expected 3"});
  Round late = r0;
  late.start = 12;
  expect_error([&] { p->observe(late.feedback(9)); }, ErrorCode::kInvalidArgument,
               {"starts at position 12"});
  p->observe(r0.feedback(9));
  expect_error([&] { p->observe(r0.feedback(9)); }, ErrorCode::kInvalidArgument,
               {"starts at position 0", "ended at 10"});
  p->end(9);
  expect_error([&] { p->propose(9, {}); }, ErrorCode::kInvalidArgument, {"not begun"});
}

TEST(DynamicTree, EqualScoresKeepTheAncestor) {
  // A certain draft (log p = 0) gives a child the same score as its parent; with one node to
  // keep, the tie goes to the parent (the official topk may pick either and orphan the child).
  const std::vector<float> root = {-3.f, 0.f, -5.f, -9.f};
  auto expand = [](int32_t, const std::vector<FrontierNode>& frontier) {
    std::vector<float> out;
    for (size_t r = 0; r < frontier.size(); ++r) out.insert(out.end(), {0.f, -7.f, -8.f, -9.f});
    return out;
  };
  auto identity = [](int32_t id) { return id; };
  test::expect_tree(grow_dynamic_tree(42, root, {2, 3, 2}, identity, expand), {42, 1}, {-1, 0},
                    "one node");
  // Three nodes: the chain 1 -> 0 -> 0 (all score 0) in candidate order.
  test::expect_tree(grow_dynamic_tree(42, root, {4, 3, 2}, identity, expand), {42, 1, 0, 0},
                    {-1, 0, 1, 2}, "chain");
}

// The trees Backend::draft_frontier_trees picks from a frontier's log (select_draft_trees, the
// rule of the CUDA kernel) are DynamicTreeGrower::tree()'s: random logs with many equal scores
// (log-probabilities from a few values), three trees of different depths and budgets in one
// frontier, with and without a draft-to-target id map.
TEST(DynamicTree, TreesPickedFromTheFrontierLogAreTheGrowersTrees) {
  std::mt19937 rng(7);
  const int32_t k = 3, max_depth = 4, groups = 3;
  const int32_t n = groups * k;
  for (int trial = 0; trial < 20; ++trial) {
    std::uniform_int_distribution<int32_t> id_of(0, 49), level(0, 3);
    const auto value = [&] { return -0.5f * static_cast<float>(level(rng)); };
    std::vector<int32_t> ids(static_cast<size_t>(n));
    std::vector<float> values(static_cast<size_t>(n));
    for (int32_t i = 0; i < n; ++i) {
      ids[static_cast<size_t>(i)] = id_of(rng);
      values[static_cast<size_t>(i)] = value();
    }
    // (Root values need not be sorted here: the grower and the pick read them the same way.)
    HostDraftFrontier f;
    std::vector<int32_t> parents(static_cast<size_t>(n)), positions(static_cast<size_t>(n), 0);
    for (int32_t i = 0; i < n; ++i) parents[static_cast<size_t>(i)] = i / k;
    f.begin(groups, k, max_depth, ids, values, parents, positions,
            std::vector<int64_t>(static_cast<size_t>(n * max_depth), 0), {});
    std::vector<TopKRows> log;
    for (int32_t d = 1; d <= max_depth; ++d) {
      TopKRows rows;
      rows.k = k;
      for (int32_t e = 0; e < n * k; ++e) {
        rows.ids.push_back(id_of(rng));
        rows.values.push_back(value());
      }
      f.expand(d, rows.ids, rows.values);
      log.push_back(rows);
    }
    const std::vector<int32_t> depth = {max_depth, 1, 0};
    const std::vector<int32_t> total = {9, 40, 3};
    std::vector<int32_t> nodes;
    for (int32_t g = 0; g < groups; ++g) nodes.push_back(draft_tree_nodes(k, depth[g], total[g]));
    EXPECT_EQ(nodes, (std::vector<int32_t>{9, 1 + k + k * k, 3}));
    for (bool mapped : {false, true}) {
      std::vector<int64_t> offset;
      if (mapped)
        for (int32_t i = 0; i < 50; ++i) offset.push_back(100 + 2 * i);  // id -> 100 + 3 id
      const auto to_target = [&](int32_t id) {
        return mapped ? static_cast<int32_t>(id + offset[static_cast<size_t>(id)]) : id;
      };
      const int32_t stride = 16;
      std::vector<int32_t> out;
      select_draft_trees(f, depth, nodes, stride, offset, &out);
      for (int32_t g = 0; g < groups; ++g) {
        TopKRows root;
        root.k = k;
        root.ids.assign(ids.begin() + g * k, ids.begin() + (g + 1) * k);
        root.values.assign(values.begin() + g * k, values.begin() + (g + 1) * k);
        DynamicTreeGrower grower(5, root, {total[g], depth[g], k}, to_target);
        for (size_t d = 0; !grower.done(); ++d)
          grower.absorb(log[d].slice(static_cast<size_t>(g * k), static_cast<size_t>((g + 1) * k)));
        const DraftTree want = grower.tree();
        ASSERT_EQ(want.size(), nodes[g]);
        const int32_t* tokens = out.data() + g * 2 * stride;
        std::vector<int32_t> got_tokens = {5}, got_parents = {tokens[stride]};
        for (int32_t i = 1; i < nodes[g]; ++i) {
          got_tokens.push_back(tokens[i]);
          got_parents.push_back(tokens[stride + i]);
        }
        EXPECT_EQ(got_tokens, want.token) << "trial " << trial << " tree " << g;
        EXPECT_EQ(got_parents, want.parent) << "trial " << trial << " tree " << g;
      }
    }
  }
  // Arguments out of range are named.
  HostDraftFrontier f;
  expect_error(
      [&] {
        check_draft_frontier_trees(2, 3, 1, {{1, 2}}, {{4, 4}}, 8);
      },
      ErrorCode::kInvalidArgument, {"tree 1 of 2 expansions (1 logged"});
  expect_error([&] { check_draft_frontier_trees(1, 3, 1, {{1}}, {{14}}, 16); },
               ErrorCode::kInvalidArgument, {"14 nodes"});
}

class EagleCheckpoint : public ::testing::Test {
 protected:
  // Copies fixture `name` into a temp dir with its tensors edited by `edit` and its config by
  // `edit_config`, then loads it.
  void load_edited(const std::string& name, EagleVersion version,
                   const std::function<void(test::StMap&)>& edit,
                   const std::function<void(nlohmann::json&)>& edit_config = {}) {
    test::StMap t = test::read_safetensors(spec_fixture(name) + "/model.safetensors");
    nlohmann::json config = test::read_json(spec_fixture(name) + "/config.json");
    edit(t);
    if (edit_config) edit_config(config);
    test::write_safetensors(dir_.file("model.safetensors"), t);
    test::write_bytes(dir_.file("config.json"), config.dump());
    load_eagle_checkpoint(dir_.path(), version);
  }
  test::TempDir dir_;
};

TEST_F(EagleCheckpoint, MalformedCheckpointsNameTheTensor) {
  const auto e1 = EagleVersion::kEagle1;
  const auto e3 = EagleVersion::kEagle3;
  expect_error([&] { load_edited("eagle_llama_gqa", e1, [](auto& t) { t.erase("fc.weight"); }); },
               ErrorCode::kNotFound, {"fc.weight", "not found"});
  expect_error(
      [&] {
        load_edited("eagle_llama_gqa", e1, [](auto& t) { t["fc.weight"].shape = {128, 64}; });
      },
      ErrorCode::kCorruptData, {"fc.weight", "expected shape [64, 128]", "found [128, 64]"});
  expect_error([&] { load_edited("eagle_llama_gqa", e1, [](auto& t) { t.erase("fc.bias"); }); },
               ErrorCode::kNotFound, {"fc.bias"});
  expect_error(
      [&] {
        load_edited("eagle_stories260K", e1,
                    [](auto& t) { t.erase("layers.0.mlp.down_proj.weight"); });
      },
      ErrorCode::kNotFound, {"layers.0.mlp.down_proj.weight"});
  expect_error(
      [&] {
        load_edited("eagle3_llama_gqa", e3, [](auto& t) {
          t["midlayer.self_attn.q_proj.weight"].shape = {128, 64};
        });
      },
      ErrorCode::kCorruptData, {"midlayer.self_attn.q_proj.weight", "[64, 128]"});
  expect_error(
      [&] { load_edited("eagle3_llama_gqa", e3, [](auto& t) { t["d2t"].i64[5] = 1000; }); },
      ErrorCode::kCorruptData, {"d2t maps draft id 5"});
  expect_error([&] { load_edited("eagle3_llama_gqa", e3, [](auto& t) { t.erase("d2t"); }); },
               ErrorCode::kNotFound, {"d2t"});
  expect_error([&] { load_edited("eagle3_llama_gqa", e1, [](auto&) {}); },
               ErrorCode::kInvalidArgument, {"EAGLE-3 checkpoint"});
  expect_error([&] { load_edited("eagle_llama_gqa", e3, [](auto&) {}); },
               ErrorCode::kInvalidArgument, {"EAGLE-1/2 checkpoint"});
  expect_error(
      [&] {
        load_edited(
            "eagle_llama_gqa", e1, [](auto&) {},
            [](nlohmann::json& c) { c["num_hidden_layers"] = 2; });
      },
      ErrorCode::kUnsupported, {"num_hidden_layers is 2"});
  expect_error(
      [&] {
        load_edited(
            "eagle_llama_gqa", e1, [](auto&) {}, [](nlohmann::json& c) { c.erase("hidden_size"); });
      },
      ErrorCode::kCorruptData, {"hidden_size"});
  test::TempDir empty;
  expect_error([&] { load_eagle_checkpoint(empty.path(), e1); }, ErrorCode::kNotFound,
               {"config.json"});
}

TEST(EagleProposer, DraftForAnotherTargetIsRejected) {
  const EagleWeights w =
      load_eagle_checkpoint(spec_fixture("eagle_llama_gqa"), EagleVersion::kEagle1);
  expect_error([&] { EagleProposer p(w, test::target_weights("stories260K"), EagleOptions{}); },
               ErrorCode::kInvalidArgument, {"[320, 64]", "[512, 64]"});
  EagleOptions bad;
  bad.tree.top_k = 0;
  expect_error([&] { EagleProposer p(w, test::target_weights("llama_gqa"), bad); },
               ErrorCode::kInvalidArgument, {"top_k is 0"});
}

// A token map (load_token_map / restrict_draft_vocab, as SGLang's --speculative-token-map): the
// draft scores only the map's rows of the target's LM head, in the map's order, and proposes
// their target ids.
using test::every_third_descending;

std::unique_ptr<EagleProposer> make_mapped(const Fixture& f, const EagleOptions& o,
                                           const std::vector<int32_t>& ids) {
  EagleWeights w = load_eagle_checkpoint(spec_fixture(f.name), f.version);
  restrict_draft_vocab(&w, ids);
  return std::make_unique<EagleProposer>(w, *f.target, o);
}

class EagleTokenMap : public ::testing::TestWithParam<std::string> {};

TEST_P(EagleTokenMap, DraftLogitsAreThePyTorchLogitsOfTheMappedIds) {
  const Fixture f = load(GetParam());
  const int64_t vocab = f.target->config.vocab_size, h = f.target->config.hidden_size;
  const std::vector<int32_t> ids = every_third_descending(vocab);
  auto p = make_mapped(f, options_of(f.ref["rounds"][0]["trees"][0]), ids);
  EagleDraftModel& draft = p->draft();
  ASSERT_EQ(draft.draft_vocab(), static_cast<int64_t>(ids.size()));
  for (size_t j = 0; j < ids.size(); ++j)
    ASSERT_EQ(draft.to_target(static_cast<int32_t>(j)), ids[j]);
  const Round rd = round_of(f.ref["rounds"][0]);
  std::vector<int32_t> next(rd.tokens.begin() + 1, rd.tokens.end());
  next.push_back(rd.next_token);
  const size_t n = rd.tokens.size();
  const SeqId seq = draft.create_sequence();
  const std::vector<float> out = draft.append(
      seq, next, std::vector<float>(rd.hidden.begin(), rd.hidden.begin() + n * h), rd.start);
  const std::vector<float> logits = draft.logits(out, static_cast<int64_t>(n));
  const std::vector<float> ref = test::flat_rows(f.ref["rounds"][0]["draft_logits"]);
  ASSERT_EQ(logits.size(), n * ids.size());
  for (size_t i = 0; i < n; ++i) {
    std::vector<float> want;
    for (int32_t id : ids) want.push_back(ref[i * static_cast<size_t>(vocab) + id]);
    EXPECT_LE(test::rel_error(logits.data() + i * ids.size(), want.data(), ids.size()), 1e-4)
        << "row " << i;
  }
}

// A map of the whole vocabulary in reverse order changes the draft's ids, not its
// distributions: the official trees of both rounds, grown on the host and on the backend.
TEST_P(EagleTokenMap, AWholeVocabularyInAnotherOrderGivesTheOfficialTrees) {
  const Fixture f = load(GetParam());
  std::vector<int32_t> ids(static_cast<size_t>(f.target->config.vocab_size));
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>(ids.size() - 1 - i);
  const auto& rounds = f.ref["rounds"];
  for (int way : kWays)
    for (size_t s = 0; s < rounds[0]["trees"].size(); ++s) {
      EagleOptions o = options_of(rounds[0]["trees"][s]);
      set_way(&o, way);
      auto p = make_mapped(f, o, ids);
      read_trees_on_host(*p);
      p->begin(4, round_of(rounds[0]).tokens);
      for (size_t ri = 0; ri < rounds.size(); ++ri) {
        p->observe(round_of(rounds[ri]).feedback(4));
        const nlohmann::json& t = rounds[ri]["trees"][s];
        const DraftTree tree = resolved(p->propose_batch({{4, TreeBudget{64, 8}}})[0], way == 2);
        test::expect_tree(tree, t["tokens"].get<std::vector<int32_t>>(),
                          t["parents"].get<std::vector<int32_t>>(),
                          std::string(way_name(way)) + ", setting " + std::to_string(s) +
                              " round " + std::to_string(ri));
      }
      p->end(4);
    }
}

// With a third of the vocabulary every drafted token is one of the map's, and the trees grown
// on the backend (the draft-to-target map applied where the top-k is taken) are the host loop's.
TEST_P(EagleTokenMap, TreesHoldOnlyMappedTokens) {
  const Fixture f = load(GetParam());
  const std::vector<int32_t> ids = every_third_descending(f.target->config.vocab_size);
  const std::set<int32_t> in_map(ids.begin(), ids.end());
  const auto& rounds = f.ref["rounds"];
  std::vector<std::vector<DraftTree>> by_way;
  for (int way : kWays) {
    EagleOptions o = options_of(rounds[0]["trees"][0]);
    set_way(&o, way);
    auto p = make_mapped(f, o, ids);
    read_trees_on_host(*p);
    const Round r0 = round_of(rounds[0]), r1 = round_of(rounds[1]);
    for (RequestId id : {1, 2}) {
      p->begin(id, r0.tokens);
      p->observe(r0.feedback(id));
    }
    p->observe(r1.feedback(2));
    by_way.push_back(p->propose_batch({{1, TreeBudget{64, 8}}, {2, TreeBudget{64, 8}}}));
    for (DraftTree& t : by_way.back()) t = resolved(std::move(t), way == 2);
    for (const DraftTree& tree : by_way.back()) {
      EXPECT_EQ(tree.size(), o.tree.total_tokens);
      validate_draft_tree(tree, f.target->config.vocab_size, TreeBudget{64, 8});
      for (int32_t i = 1; i < tree.size(); ++i)
        EXPECT_TRUE(in_map.count(tree.token[i])) << "node " << i << " token " << tree.token[i];
    }
    for (RequestId id : {1, 2}) p->end(id);
  }
  for (size_t w = 1; w < by_way.size(); ++w)
    for (size_t i = 0; i < 2; ++i) {
      EXPECT_EQ(by_way[0][i].token, by_way[w][i].token) << way_name(kWays[w]) << " request " << i;
      EXPECT_EQ(by_way[0][i].parent, by_way[w][i].parent) << way_name(kWays[w]) << " request " << i;
    }
}

INSTANTIATE_TEST_SUITE_P(Drafts, EagleTokenMap,
                         ::testing::Values("eagle_llama_gqa", "eagle_stories260K"),
                         [](const auto& info) { return info.param; });

TEST(EagleTokenMapFile, MalformedMapsAndMisuseAreNamed) {
  test::TempDir dir;
  auto write = [&](const std::string& name, const std::string& text) {
    test::write_bytes(dir.file(name), text);
    return dir.file(name);
  };
  EXPECT_EQ(load_token_map(write("a.json", "[5, 3, 9]"), 16, 0), (std::vector<int32_t>{5, 3, 9}));
  EXPECT_EQ(
      load_token_map(write("o.json", R"({"token_ids": [7, 1, 2, 4], "coverage": {}})"), 16, 2),
      (std::vector<int32_t>{7, 1}));
  expect_error([&] { load_token_map(dir.file("missing.json"), 16, 0); }, ErrorCode::kNotFound,
               {"missing.json", "not found"});
  expect_error([&] { load_token_map(write("b.json", "{not json"), 16, 0); },
               ErrorCode::kCorruptData, {"b.json", "JSON array"});
  expect_error([&] { load_token_map(write("e.json", "[]"), 16, 0); }, ErrorCode::kCorruptData,
               {"e.json", "non-empty"});
  expect_error([&] { load_token_map(write("r.json", "[1, 16]"), 16, 0); }, ErrorCode::kCorruptData,
               {"r.json", "entry 1 is 16", "[0, 16)"});
  expect_error([&] { load_token_map(write("s.json", "[1, \"x\"]"), 16, 0); },
               ErrorCode::kCorruptData, {"entry 1"});
  expect_error([&] { load_token_map(write("d.json", "[3, 4, 3]"), 16, 0); },
               ErrorCode::kCorruptData, {"d.json", "token id 3 appears twice"});
  expect_error([&] { load_token_map(write("l.json", "[3, 4]"), 16, 3); },
               ErrorCode::kInvalidArgument, {"3 tokens asked for", "holds 2"});

  EagleWeights e3 = load_eagle_checkpoint(spec_fixture("eagle3_llama_gqa"), EagleVersion::kEagle3);
  const std::vector<int32_t> ids = {1, 2};
  expect_error([&] { restrict_draft_vocab(&e3, ids); }, ErrorCode::kInvalidArgument,
               {"EAGLE-3", "own draft vocabulary"});

  // The factory: a token_map.json beside the heads is used unless token_map is "none";
  // draft_vocab takes its first N ids.
  SpecConfig sc;
  sc.method = SpecMethod::kEagle;
  sc.head_path = dir.path();
  EXPECT_EQ(resolve_token_map(sc), "");
  const std::string beside = write("token_map.json", "[1, 2, 3]");
  EXPECT_EQ(resolve_token_map(sc), beside);
  sc.token_map = "none";
  EXPECT_EQ(resolve_token_map(sc), "");
  sc.draft_vocab = 2;
  expect_error([&] { sc.validate(); }, ErrorCode::kInvalidArgument, {"draft_vocab is 2", "none"});
  sc.token_map = "";
  sc.method = SpecMethod::kEagle3;
  expect_error([&] { sc.validate(); }, ErrorCode::kInvalidArgument, {"eagle3"});
  sc.method = SpecMethod::kEagle;
  sc.draft_vocab = -1;
  expect_error([&] { sc.validate(); }, ErrorCode::kInvalidArgument, {"draft_vocab is -1"});
}

// Through make_proposer: the heads' own map, its first N ids, and "none".
TEST(EagleTokenMapFile, TheFactoryAppliesTheMap) {
  const ModelWeights& target = test::target_weights("llama_gqa");
  test::TempDir dir;
  for (const char* f : {"config.json", "model.safetensors"})
    std::filesystem::copy_file(spec_fixture("eagle_llama_gqa") + "/" + f, dir.file(f));
  test::write_bytes(dir.file("token_map.json"), "[9, 4, 7, 1, 30]");
  SpecConfig sc;
  sc.method = SpecMethod::kEagle;
  sc.head_path = dir.path();
  auto vocab_of = [&](const SpecConfig& c) {
    auto p = make_proposer(c, target);
    const auto& draft = static_cast<EagleProposer&>(*p).draft();
    return std::pair{draft.draft_vocab(), draft.to_target(0)};
  };
  EXPECT_EQ(vocab_of(sc), (std::pair<int64_t, int32_t>{5, 9}));
  sc.draft_vocab = 3;
  EXPECT_EQ(vocab_of(sc), (std::pair<int64_t, int32_t>{3, 9}));
  sc.draft_vocab = 0;
  sc.token_map = "none";
  EXPECT_EQ(vocab_of(sc), (std::pair<int64_t, int32_t>{target.config.vocab_size, 0}));
  sc.token_map = dir.file("token_map.json");
  sc.draft_vocab = 6;
  expect_error([&] { make_proposer(sc, target); }, ErrorCode::kInvalidArgument,
               {"6 tokens asked for", "holds 5"});
}

}  // namespace
}  // namespace arbor
