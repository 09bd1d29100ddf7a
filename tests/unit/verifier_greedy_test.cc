// Greedy verification against a brute-force reference: plain greedy decoding (Sampler::
// sample_token, penalties included) of the toy model gives the token sequence; the verifier must
// accept the deepest tree node whose path spells a prefix of it (lowest index among equals) and
// emit exactly the greedy tokens. Random trees with duplicate siblings, both greedy entry points
// (kGreedy, and kRejection / kTypical with a greedy sampler, which must not touch the RNG), a
// logit bias (alone and with penalties), and argument errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "engine/core/error.h"
#include "engine/sampling/sampler.h"
#include "engine/verify/verifier.h"
#include "tests/unit/verifier_test_util.h"

namespace arbor {
namespace {

using testing::path_tokens;
using testing::ToyModel;
using testing::tree_logits;

// Plain greedy decoding, `n` tokens after prompt + output: each the most likely token of
// Sampler::probs (lowest id among ties), which for a greedy sampler is its argmax token.
std::vector<int32_t> greedy_decode(const ToyModel& model, const Sampler& sampler,
                                   const std::vector<int32_t>& prompt, std::vector<int32_t> output,
                                   int32_t n) {
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < n; ++i) {
    std::vector<int32_t> context = prompt;
    context.insert(context.end(), output.begin(), output.end());
    const std::vector<float> p = sampler.probs(model.logits(context), prompt, output);
    const int32_t next = static_cast<int32_t>(std::max_element(p.begin(), p.end()) - p.begin());
    if (sampler.params().greedy()) {
      Rng unused(0);
      EXPECT_EQ(next, sampler.sample_token(model.logits(context), prompt, output, unused));
    }
    tokens.push_back(next);
    output.push_back(next);
  }
  return tokens;
}

// A random tree over `vocab` tokens whose children copy the greedy continuation with
// probability `hit` (so paths match for a while), duplicates allowed.
DraftTree random_tree(std::mt19937& gen, int32_t size, int32_t vocab, int32_t root,
                      const std::vector<int32_t>& greedy, double hit) {
  DraftTree tree = DraftTree::root_only(root);
  std::vector<int32_t> depth = {0};
  for (int32_t i = 1; i < size; ++i) {
    const int32_t p = std::uniform_int_distribution<int32_t>(std::max(0, i - 4), i - 1)(gen);
    const int32_t d = depth[p] + 1;
    const bool copy = std::uniform_real_distribution<double>(0, 1)(gen) < hit &&
                      d <= static_cast<int32_t>(greedy.size());
    tree.parent.push_back(p);
    tree.token.push_back(copy ? greedy[d - 1] : static_cast<int32_t>(gen() % vocab));
    depth.push_back(d);
  }
  return tree;
}

// Over the toy model's 6 tokens: one banned, two promoted by about the logits' spread.
const std::vector<std::pair<int32_t, float>> kGreedyBias = {{1, 1.5f}, {3, -100.0f}, {4, 2.0f}};

struct Case {
  std::string name;
  SamplingParams params;
  VerifyMode mode;
};

std::vector<Case> greedy_cases() {
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams penalised = greedy;
  penalised.repetition_penalty = 1.8f;
  penalised.frequency_penalty = 0.4f;
  penalised.presence_penalty = 0.3f;
  SamplingParams warm;  // kGreedy with a sampling config: argmax of p
  warm.temperature = 0.8f;
  warm.top_k = 3;
  warm.repetition_penalty = 1.3f;
  SamplingParams biased = greedy;
  biased.logit_bias = kGreedyBias;
  SamplingParams biased_penalised = penalised;
  biased_penalised.logit_bias = kGreedyBias;
  return {{"greedy", greedy, VerifyMode::kGreedy},
          {"greedy sampler, rejection mode", greedy, VerifyMode::kRejection},
          {"greedy sampler, typical mode", greedy, VerifyMode::kTypical},
          {"penalised greedy", penalised, VerifyMode::kRejection},
          {"argmax of a sampling config", warm, VerifyMode::kGreedy},
          {"biased greedy", biased, VerifyMode::kRejection},
          {"biased greedy, greedy mode", biased, VerifyMode::kGreedy},
          {"biased penalised greedy", biased_penalised, VerifyMode::kRejection}};
}

TEST(VerifierGreedy, MatchesBruteForceOnRandomTrees) {
  std::mt19937 gen(11);
  const ToyModel model{6, 2.0f, 77};
  int64_t total_accepted = 0, trees = 0;
  for (const Case& c : greedy_cases()) {
    const Sampler sampler(c.params);
    for (int32_t trial = 0; trial < 300; ++trial) {
      const std::vector<int32_t> prompt = {int32_t(gen() % 6), int32_t(gen() % 6), 2};
      std::vector<int32_t> output;
      for (uint32_t k = gen() % 4; k > 0; --k) output.push_back(int32_t(gen() % 6));
      const int32_t root = output.empty() ? prompt.back() : output.back();
      std::vector<int32_t> committed = prompt;
      committed.insert(committed.end(), output.begin(), output.end());
      const std::vector<int32_t> greedy = greedy_decode(model, sampler, prompt, output, 45);
      const int32_t size = 1 + static_cast<int32_t>(gen() % 40);
      const DraftTree tree = random_tree(gen, size, 6, root, greedy, 0.6);
      const std::vector<float> logits = tree_logits(model, tree, committed);

      // Brute force: deepest node whose path is a prefix of the greedy tokens.
      int32_t best = 0, best_depth = 0;
      for (int32_t i = 1; i < tree.size(); ++i) {
        const std::vector<int32_t> tokens = path_tokens(tree, i);
        if (!std::equal(tokens.begin(), tokens.end(), greedy.begin())) continue;
        if (static_cast<int32_t>(tokens.size()) > best_depth) {
          best = i;
          best_depth = static_cast<int32_t>(tokens.size());
        }
      }
      Rng rng(trial);
      const Rng before = rng;
      const VerifyResult r =
          verify(tree, logits, 6, sampler, prompt, output, rng, {c.mode, 0.09f, 0.3f});
      ASSERT_EQ(r.accepted_nodes.back(), best) << c.name << " trial " << trial;
      ASSERT_EQ(r.num_accepted(), best_depth);
      const std::vector<int32_t> want(greedy.begin(), greedy.begin() + best_depth + 1);
      ASSERT_EQ(r.emitted_tokens(), want) << c.name << " trial " << trial;
      ASSERT_EQ(r.children_tried.size(), r.accepted_nodes.size());
      Rng copy = before;
      EXPECT_EQ(rng.next_u64(), copy.next_u64()) << "greedy verification consumed randomness";
      total_accepted += best_depth;
      ++trees;
    }
  }
  EXPECT_GT(total_accepted, 2 * trees);  // the trees really exercised deep acceptance
}

// The bias cases above test something: greedy decoding with the bias is another sequence, and
// never emits the banned token.
TEST(VerifierGreedy, TheLogitBiasChangesGreedyDecoding) {
  const ToyModel model{6, 2.0f, 77};
  SamplingParams greedy;
  greedy.temperature = 0.0f;
  SamplingParams biased = greedy;
  biased.logit_bias = kGreedyBias;
  const std::vector<int32_t> prompt = {0, 5, 2};
  const std::vector<int32_t> plain = greedy_decode(model, Sampler(greedy), prompt, {}, 45);
  const std::vector<int32_t> with_bias = greedy_decode(model, Sampler(biased), prompt, {}, 45);
  EXPECT_NE(plain, with_bias);
  EXPECT_EQ(std::count(with_bias.begin(), with_bias.end(), 3), 0);
  EXPECT_GT(std::count(plain.begin(), plain.end(), 3), 0) << "banning 3 should matter";
}

// Duplicate siblings: the second copy holds the deeper match; a first-match walk would stop at
// depth 1.
TEST(VerifierGreedy, DuplicateSiblingsDoNotHideADeeperMatch) {
  SamplingParams params;
  params.temperature = 0.0f;
  const Sampler sampler(params);
  const ToyModel model{5, 2.0f, 3};
  const std::vector<int32_t> prompt = {1, 4};
  const std::vector<int32_t> g = greedy_decode(model, sampler, prompt, {}, 3);
  const DraftTree tree{{-1, 0, 0, 2, 3}, {4, g[0], g[0], g[1], g[2]}, {}, {}};
  Rng rng(1);
  const VerifyResult r =
      verify(tree, tree_logits(model, tree, prompt), 5, sampler, prompt, {}, rng);
  EXPECT_EQ(r.accepted_nodes, (std::vector<int32_t>{0, 2, 3, 4}));
  EXPECT_EQ(r.children_tried, (std::vector<int32_t>{2, 1, 1, 0}));
}

TEST(VerifierGreedy, RejectsInconsistentArguments) {
  SamplingParams params;
  params.temperature = 0.0f;
  const Sampler sampler(params);
  Rng rng(1);
  const DraftTree tree{{-1, 0}, {3, 1}, {}, {}};
  const std::vector<float> logits(2 * 4, 0.0f);
  const std::vector<int32_t> prompt = {0, 3};
  EXPECT_NO_THROW(verify(tree, logits, 4, sampler, prompt, {}, rng));
  auto message = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message([&] {
              verify(tree, std::vector<float>(7), 4, sampler, prompt, {}, rng);
            }).find("7 values"),
            std::string::npos);
  const std::vector<int32_t> other = {2};
  EXPECT_NE(message([&] {
              verify(tree, logits, 4, sampler, prompt, other, rng);
            }).find("end with 2 but the tree's root token is 3"),
            std::string::npos);
  const DraftTree bad{{-1, 0}, {3, 9}, {}, {}};
  EXPECT_NE(message([&] { verify(bad, logits, 4, sampler, prompt, {}, rng); }).find("token 9"),
            std::string::npos);
}

TEST(VerifierStats, AccumulatesAcceptanceByDepth) {
  VerifyResult deep;
  deep.accepted_nodes = {0, 1, 4};
  deep.accepted_tokens = {5, 6};
  deep.bonus_token = 7;
  deep.children_tried = {3, 2, 0};  // node 4 is a leaf: depth 3 was never offered
  VerifyResult none;
  none.accepted_nodes = {0};
  none.bonus_token = 1;
  none.children_tried = {3};
  AcceptanceStats stats;
  stats.add(deep, 5);
  stats.add(none, 4);
  EXPECT_EQ(stats.steps, 2);
  EXPECT_EQ(stats.emitted, 4);
  EXPECT_DOUBLE_EQ(stats.mean_emitted_per_step(), 2.0);
  EXPECT_EQ(stats.offered, (std::vector<int64_t>{2, 1}));
  EXPECT_EQ(stats.accepted, (std::vector<int64_t>{1, 1}));
  EXPECT_DOUBLE_EQ(stats.acceptance_rate(1), 0.5);
  EXPECT_DOUBLE_EQ(stats.acceptance_rate(2), 1.0);
  EXPECT_DOUBLE_EQ(stats.acceptance_rate(3), 0.0);
  // Per tree node: the root in both steps, nodes 1 and 4 in one, nodes 2 and 3 in none.
  EXPECT_EQ(stats.on_path, (std::vector<int64_t>{2, 1, 0, 0, 1}));
  EXPECT_EQ(stats.in_tree(), (std::vector<int64_t>{2, 2, 2, 2, 1}));
  AcceptanceStats both;
  both.add(none);
  both.merge(stats);
  EXPECT_EQ(both.steps, 3);
  EXPECT_EQ(both.emitted, 5);
  EXPECT_EQ(both.offered, (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(both.accepted, (std::vector<int64_t>{1, 1}));
  EXPECT_EQ(both.on_path, (std::vector<int64_t>{3, 1, 0, 0, 1}));
  EXPECT_EQ(both.in_tree(), (std::vector<int64_t>{2, 2, 2, 2, 1}));  // none added without a size
  EXPECT_EQ(deep.emitted_tokens(), (std::vector<int32_t>{5, 6, 7}));
}

}  // namespace
}  // namespace arbor
