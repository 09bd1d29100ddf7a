// The n-gram (prompt lookup) proposer on handcrafted sequences whose expected trees are written
// by hand from the definition: the longest suffix n (max_ngram down to min_ngram) with an earlier
// occurrence wins; continuations of all its occurrences (most recent first, at most
// max_occurrences) form a trie; nodes rank by occurrence count, then recency, then depth; the best
// nodes within the budget are kept in rank order.
#include <gtest/gtest.h>

#include "engine/spec/ngram_proposer.h"
#include "engine/verify/tree_layout.h"
#include "tests/unit/loader_test_util.h"

namespace arbor {
namespace {

using test::expect_error;

NgramOptions opts(int32_t min_n, int32_t max_n, int32_t depth, int32_t nodes = 64) {
  NgramOptions o;
  o.min_ngram = min_n;
  o.max_ngram = max_n;
  o.max_depth = depth;
  o.max_nodes = nodes;
  return o;
}

void expect_tree(const DraftTree& t, const std::vector<int32_t>& tokens,
                 const std::vector<int32_t>& parents) {
  EXPECT_EQ(t.token, tokens);
  EXPECT_EQ(t.parent, parents);
  EXPECT_TRUE(t.q_row.empty());
}

DraftTree run(const std::vector<int32_t>& s, const NgramOptions& o, TreeBudget b = {64, 8}) {
  return NgramProposer::propose_for(s, o, b);
}

TEST(NgramProposer, NoEarlierOccurrenceGivesTheRootAlone) {
  expect_tree(run({1, 2, 3, 4, 5}, opts(1, 4, 8)), {5}, {-1});
  expect_tree(run({7}, opts(1, 4, 8)), {7}, {-1});
}

TEST(NgramProposer, SingleOccurrenceProposesItsContinuationAsAChain) {
  // Suffix [6, 7] (n = 2; no 3- or 4-gram repeats) occurred at position 1, followed by 8 9 1 6 7
  // (up to the end of the sequence).
  expect_tree(run({5, 6, 7, 8, 9, 1, 6, 7}, opts(1, 4, 8)), {7, 8, 9, 1, 6, 7},
              {-1, 0, 1, 2, 3, 4});
  // max_depth cuts the chain.
  expect_tree(run({5, 6, 7, 8, 9, 1, 6, 7}, opts(1, 4, 2)), {7, 8, 9}, {-1, 0, 1});
}

TEST(NgramProposer, DifferentContinuationsBranchMostRecentFirst) {
  // Suffix [1, 2] occurs at 4 (then 5 6 1) and at 0 (then 3 4 1): counts tie, the occurrence at
  // 4 is more recent, so its whole path ranks first.
  const std::vector<int32_t> s = {1, 2, 3, 4, 1, 2, 5, 6, 1, 2};
  expect_tree(run(s, opts(1, 4, 3)), {2, 5, 6, 1, 3, 4, 1}, {-1, 0, 1, 2, 0, 4, 5});
  // max_nodes 5 keeps the four best nodes.
  expect_tree(run(s, opts(1, 4, 3, 5)), {2, 5, 6, 1, 3}, {-1, 0, 1, 2, 0});
  // The budget bounds too.
  expect_tree(run(s, opts(1, 4, 3), TreeBudget{3, 8}), {2, 5, 6}, {-1, 0, 1});
  expect_tree(run(s, opts(1, 4, 3), TreeBudget{64, 1}), {2, 5, 3}, {-1, 0, 0});
  expect_tree(run(s, opts(1, 4, 3), TreeBudget{64, 0}), {2}, {-1});
}

TEST(NgramProposer, FrequencyRanksBeforeRecency) {
  // Suffix [7, 8]: at 0 -> 1 2, at 4 -> 1 3, at 8 -> 4 5 (most recent). Token 1 follows twice.
  const std::vector<int32_t> s = {7, 8, 1, 2, 7, 8, 1, 3, 7, 8, 4, 5, 7, 8};
  // Ranking: 1 (count 2, last 4); then count 1 by recency: 4 (last 8, depth 1), 5 (last 8,
  // depth 2), 3 (last 4), 2 (last 0).
  expect_tree(run(s, opts(1, 4, 2)), {8, 1, 4, 5, 3, 2}, {-1, 0, 0, 2, 1, 1});
}

TEST(NgramProposer, LongestMatchingSuffixWins) {
  // 3-gram [4, 5, 6] occurred once (then 9); the 1-gram [6] occurred more often (then 1, 1, 9)
  // but the longer match is used.
  const std::vector<int32_t> s = {6, 1, 6, 1, 4, 5, 6, 9, 2, 5, 6, 4, 5, 6};
  expect_tree(run(s, opts(1, 4, 1)), {6, 9}, {-1, 0});
  // With max_ngram 1 the 1-gram occurrences are used: [6] at 10 -> 4, at 6 -> 9, at 2 -> 1, at
  // 0 -> 1: token 1 twice first, then 4 (more recent than 9).
  expect_tree(run(s, opts(1, 1, 1)), {6, 1, 4, 9}, {-1, 0, 0, 0});
  // min_ngram above every match: nothing.
  expect_tree(run({1, 2, 3, 1, 9, 3}, opts(2, 4, 4)), {3}, {-1});
}

TEST(NgramProposer, OccurrencesOverlappingTheSuffixCount) {
  // A run of one token: [5, 5, 5] (n = 3) occurs at 0 followed by the last 5.
  expect_tree(run({5, 5, 5, 5}, opts(1, 4, 8)), {5, 5}, {-1, 0});
}

TEST(NgramProposer, MaxOccurrencesKeepsTheMostRecent) {
  // [3] occurs at 0 (-> 1), 2 (-> 2), 4 (-> 0); with max_occurrences 1 only the last counts.
  NgramOptions o = opts(1, 1, 1);
  o.max_occurrences = 1;
  expect_tree(run({3, 1, 3, 2, 3, 0, 3}, o), {3, 0}, {-1, 0});
}

TEST(NgramProposer, FollowsTheRequestThroughObserve) {
  NgramProposer p(opts(1, 4, 4), 100);
  EXPECT_FALSE(p.needs_hidden());
  const std::vector<int32_t> prompt = {10, 11, 12, 13, 10, 11};
  p.begin(1, prompt);
  // Prefill in two chunks, the root (sampled) = 12.
  const std::vector<int32_t> a = {10, 11, 12}, b = {13, 10, 11};
  p.observe({1, 0, a, {}, {}, 13});
  EXPECT_EQ(p.propose(1, {}).token[0], 13);  // mid-prefill: the sequence ends at position 3
  p.observe({1, 3, b, {}, {}, 12});
  // [10, 11, 12] occurred at 0 -> 13 10 11 12.
  expect_tree(p.propose(1, {64, 8}), {12, 13, 10, 11, 12}, {-1, 0, 1, 2, 3});
  // Verify accepted 13 10, bonus 77: the sequence is now ... 12 13 10 77.
  const std::vector<int32_t> accepted = {12, 13, 10};
  p.observe({1, 6, accepted, {}, {}, 77});
  expect_tree(p.propose(1, {64, 8}), {77}, {-1});
  const DraftTree t = p.propose(1, {64, 8});
  validate_draft_tree(t, 100, TreeBudget{64, 8});
  p.end(1);
}

TEST(NgramProposer, ErrorsNameTheFieldOrRequest) {
  expect_error([] { NgramProposer p(opts(0, 4, 4), 10); }, ErrorCode::kInvalidArgument,
               {"min_ngram is 0"});
  expect_error([] { NgramProposer p(opts(3, 2, 4), 10); }, ErrorCode::kInvalidArgument,
               {"max_ngram is 2", "min_ngram (3)"});
  expect_error([] { NgramProposer p(opts(1, 2, 0), 10); }, ErrorCode::kInvalidArgument,
               {"max_depth is 0"});
  NgramProposer p(opts(1, 4, 4), 10);
  const std::vector<int32_t> prompt = {1, 2, 3};
  p.begin(4, prompt);
  const std::vector<int32_t> wrong = {1, 5};
  expect_error(
      [&] {
        p.observe({4, 0, wrong, {}, {}, 3});
      },
      ErrorCode::kInvalidArgument, {"position 1 is 5", "prompt has 2"});
  const std::vector<int32_t> out_of_vocab = {1, 2, 3, 12};
  expect_error(
      [&] {
        p.observe({4, 0, out_of_vocab, {}, {}, 3});
      },
      ErrorCode::kInvalidArgument, {"token 12", "vocabulary of 10"});
  expect_error([&] { p.propose(4, {}); }, ErrorCode::kInvalidArgument, {"request 4"});
  expect_error([&] { p.propose(5, {}); }, ErrorCode::kInvalidArgument, {"request 5"});
  expect_error(
      [&] {
        p.observe({4, 0, prompt, {}, {}, 10});
      },
      ErrorCode::kInvalidArgument, {"next_token 10"});
}

}  // namespace
}  // namespace arbor
