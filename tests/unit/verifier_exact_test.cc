// Losslessness of rejection-sampling verification, computed exactly: every decision of a
// speculative step (the proposer's draws and the verifier's accept / reject / bonus draws) is
// enumerated with its probability (testing::Enumerator), and the resulting distribution of the
// first one, two and three emitted tokens must equal plain decoding's (products of
// Sampler::probs along the sequence, penalties and filters included) to 1e-9. Trees: chains,
// branching static trees, mc_sim_7b_63, duplicate siblings, i.i.d. sampled proposals with a real
// q (zeros in q and in p), mixed sampled / deterministic nodes, a root-only tree, requests
// with penalties over a non-empty output, and a logit bias (alone, with penalties, with top-k).
// Deliberately wrong verifiers (no residual update; sampled proposals treated as one-hot;
// penalties that ignore the path; a target that ignores the logit bias) must be caught by the
// same comparison.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "engine/sampling/sampler.h"
#include "engine/spec/tree_choices.h"
#include "engine/verify/tree_layout.h"
#include "engine/verify/verifier.h"
#include "tests/unit/verifier_test_util.h"

namespace arbor {
namespace {

using namespace arbor::testing;  // NOLINT

SamplingParams plain(float temperature) {
  SamplingParams p;
  p.temperature = temperature;
  return p;
}

// Checks k = 1..max_k and returns the number of enumerated runs for k = max_k.
int64_t expect_exact(const SpecSetup& s, size_t max_k, const std::string& what,
                     double tolerance = 1e-9) {
  int64_t runs = 0;
  for (size_t k = 1; k <= max_k; ++k) {
    const Joint want = target_joint(s, k);
    const Joint got = exact_step_joint(s, k, production_verifier(), &runs);
    EXPECT_LT(max_abs_difference(got, want), tolerance) << what << ", first " << k << " tokens";
  }
  return runs;
}

ToyModel target5() {
  return ToyModel{5, 1.5f, 101};
}
ToyModel draft5() {
  return ToyModel{5, 1.5f, 202};
}  // an unrelated model: real rejections

TEST(VerifierExact, ChainOfDeterministicProposals) {
  const SpecSetup s{target5(),
                    plain(1.0f),
                    {3, 1, 4},
                    {},
                    static_proposer(resolve_static_tree("chain-3"), draft5())};
  expect_exact(s, 3, "chain-3");
}

TEST(VerifierExact, BranchingStaticTreeWithFilters) {
  SamplingParams params = plain(0.8f);
  params.top_p = 0.9f;
  const SpecSetup s{
      target5(),
      params,
      {2, 2},
      {0, 4},
      static_proposer(parse_tree_choices("[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0]]", "branching"),
                      draft5())};
  expect_exact(s, 3, "branching tree, top-p");
}

TEST(VerifierExact, McSim7b63) {
  const ToyModel target{12, 2.0f, 5};
  const SpecSetup s{target,
                    plain(1.0f),
                    {7, 3},
                    {},
                    static_proposer(resolve_static_tree("mc_sim_7b_63"), ToyModel{12, 2.0f, 6})};
  const int64_t runs = expect_exact(s, 2, "mc_sim_7b_63");
  EXPECT_GT(runs, 100);
}

TEST(VerifierExact, DuplicateSiblings) {
  const SpecSetup s{target5(), plain(1.0f), {1, 0}, {}, duplicate_proposer(draft5())};
  expect_exact(s, 3, "duplicate siblings");
  // The target itself as the draft: duplicates of likely tokens, deep acceptance.
  const SpecSetup same{target5(), plain(1.0f), {1, 0}, {}, duplicate_proposer(target5())};
  expect_exact(same, 3, "duplicate siblings, draft = target");
}

TEST(VerifierExact, SampledProposalsWithRealQ) {
  // q keeps the draft's top 3 of 5 tokens; the target keeps its top 4 (top_k): both have zeros.
  SamplingParams params = plain(1.0f);
  params.top_k = 4;
  const SpecSetup s{target5(), params, {4}, {}, sampled_proposer(draft5(), 3, 3, 2, false)};
  expect_exact(s, 2, "sampled, i.i.d. children");
  // q = the target's own p up to fp32 rounding: acceptance is ~1 and a rejection (probability
  // ~1e-7) leaves a residual of rounding noise, so the match is only as exact as fp32.
  const SpecSetup self{
      target5(), plain(1.0f), {4}, {}, sampled_proposer(target5(), 5, 2, 2, false)};
  expect_exact(self, 2, "sampled from the target itself", 1e-6);
}

TEST(VerifierExact, MixedSampledAndDeterministicNodes) {
  const SpecSetup s{
      target5(), plain(0.7f), {0, 1, 2}, {3}, sampled_proposer(draft5(), 4, 2, 1, true)};
  expect_exact(s, 3, "mixed");
}

TEST(VerifierExact, RootOnlyTreeIsPlainSampling) {
  const SpecSetup s{target5(),
                    plain(1.0f),
                    {2},
                    {},
                    [](const std::vector<int32_t>& committed, VerifyRandomness&) {
                      return DraftTree::root_only(committed.back());
                    }};
  expect_exact(s, 2, "root only");
}

// Penalties see the prompt, the output and the path: the second and third tokens' targets depend
// on the tokens accepted before them in the same step.
TEST(VerifierExact, PenaltiesAlongThePathMatchPlainDecoding) {
  SamplingParams params = plain(0.9f);
  params.repetition_penalty = 1.6f;
  params.presence_penalty = 0.5f;
  params.frequency_penalty = 0.3f;
  params.top_k = 4;
  const SpecSetup fixed{
      target5(),
      params,
      {1, 2, 1},
      {2, 2, 0},
      static_proposer(parse_tree_choices("[[0],[1],[0,0],[0,1],[0,0,0]]", "t"), target5())};
  expect_exact(fixed, 3, "penalties, static tree");
  const SpecSetup sampled{
      target5(), params, {1, 2, 1}, {2, 2, 0}, sampled_proposer(draft5(), 4, 2, 2, true)};
  expect_exact(sampled, 3, "penalties, sampled tree");
}

// The logit bias is part of the target p at every node (the proposals know nothing of it): a
// bias that promotes a token the draft never ranks first, bans another, and meets the penalties
// on the path.
TEST(VerifierExact, LogitBiasMatchesPlainDecoding) {
  SamplingParams params = plain(1.0f);
  params.logit_bias = {{0, 1.2f}, {2, -100.0f}, {4, -0.8f}};
  const SpecSetup chain{
      target5(), params, {3, 1}, {}, static_proposer(resolve_static_tree("chain-3"), draft5())};
  expect_exact(chain, 3, "logit bias, chain");
  const SpecSetup sampled{
      target5(), params, {3, 1}, {0}, sampled_proposer(draft5(), 4, 3, 2, true)};
  expect_exact(sampled, 3, "logit bias, sampled tree");
  params.temperature = 0.8f;
  params.top_k = 3;
  params.repetition_penalty = 1.5f;
  params.presence_penalty = 0.4f;
  params.frequency_penalty = 0.2f;
  const SpecSetup penalised{
      target5(),
      params,
      {1, 2, 1},
      {0, 0, 4},
      static_proposer(parse_tree_choices("[[0],[1],[0,0],[0,1],[0,0,0]]", "t"), target5())};
  expect_exact(penalised, 3, "logit bias, penalties and top-k");
  // The bias reshaped p: plain decoding's joint differs from the unbiased one.
  SpecSetup unbiased = penalised;
  unbiased.params.logit_bias.clear();
  EXPECT_GT(max_abs_difference(target_joint(penalised, 2), target_joint(unbiased, 2)), 0.01);
}

TEST(VerifierExact, WrongVerifiersAreCaught) {
  auto error = [](const SpecSetup& s, Bug bug) {
    return max_abs_difference(exact_step_joint(s, 2, buggy_verifier(bug)), target_joint(s, 2));
  };
  const SpecSetup one_hot{
      target5(),
      plain(1.0f),
      {2, 2},
      {},
      static_proposer(parse_tree_choices("[[0],[1],[2],[0,0]]", "t"), draft5())};
  EXPECT_GT(error(one_hot, Bug::kNoResidualUpdate), 0.01);
  const SpecSetup sampled{
      target5(), plain(1.0f), {4}, {}, sampled_proposer(draft5(), 3, 3, 2, false)};
  EXPECT_GT(error(sampled, Bug::kNoResidualUpdate), 0.01);
  EXPECT_GT(error(sampled, Bug::kOneHotResidual), 0.01);
  SamplingParams penalised = plain(1.0f);
  penalised.repetition_penalty = 2.0f;
  const SpecSetup path{
      target5(), penalised, {1}, {}, static_proposer(resolve_static_tree("chain-2"), target5())};
  EXPECT_GT(error(path, Bug::kPathlessPenalty), 1e-3);
  SamplingParams biased = plain(1.0f);
  biased.logit_bias = {{0, 1.2f}, {2, -100.0f}};
  const SpecSetup bias{
      target5(), biased, {3}, {}, static_proposer(resolve_static_tree("chain-2"), draft5())};
  EXPECT_GT(error(bias, Bug::kBiaslessTarget), 0.01);
}

// Not a bug: the one-hot rule is lossless for any proposal that does not look at the verifier's
// randomness, so sampled children may also be verified as if deterministic (q_row = -1); the
// real-q rule only changes how often they are accepted.
TEST(VerifierExact, SampledChildrenVerifiedAsOneHotStayLossless) {
  const ProposeFn sampled = sampled_proposer(draft5(), 3, 3, 2, true);
  const SpecSetup s{target5(),
                    plain(1.0f),
                    {4},
                    {},
                    [sampled](const std::vector<int32_t>& committed, VerifyRandomness& r) {
                      DraftTree tree = sampled(committed, r);
                      tree.q_row.clear();
                      tree.q.clear();
                      return tree;
                    }};
  expect_exact(s, 2, "sampled children verified as one-hot");
}

}  // namespace
}  // namespace arbor
