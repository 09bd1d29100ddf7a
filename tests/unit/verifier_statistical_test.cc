// Losslessness of rejection-sampling verification, by sampling: speculative decoding of the toy
// model (propose -> verify -> emit, repeated until three tokens) with the request's seeded Rng,
// 200000 runs per configuration, and a chi-square test of the joint distribution of the first
// three tokens against plain decoding's exact joint (products of Sampler::probs).
// False-alarm rate: each configuration's check fires with probability 1e-6 for a correct
// verifier (5e-6 for the five), fixed once the seeds are chosen, so the test is deterministic.
// Power: a verifier that skips the residual update, and one that updates p as for one-hot
// proposals after a real-q rejection, exceed the same threshold.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "engine/sampling/sampler.h"
#include "engine/spec/tree_choices.h"
#include "engine/verify/verifier.h"
#include "tests/unit/verifier_test_util.h"

namespace arbor {
namespace {

using namespace arbor::testing;  // NOLINT

// Regularised upper incomplete gamma Q(a, x) (series below a + 1, Lentz continued fraction
// above; Numerical Recipes 6.2).
double gamma_q(double a, double x) {
  if (x <= 0.0) return 1.0;
  const double log_prefix = -x + a * std::log(x) - std::lgamma(a);
  if (x < a + 1.0) {
    double term = 1.0 / a, sum = term, ap = a;
    for (int n = 0; n < 10000 && std::abs(term) > std::abs(sum) * 1e-16; ++n) {
      ap += 1.0;
      term *= x / ap;
      sum += term;
    }
    return 1.0 - sum * std::exp(log_prefix);
  }
  const double tiny = 1e-300;
  double b = x + 1.0 - a, c = 1.0 / tiny, d = 1.0 / b, h = d;
  for (int i = 1; i < 10000; ++i) {
    const double an = -i * (i - a);
    b += 2.0;
    d = an * d + b;
    if (std::abs(d) < tiny) d = tiny;
    c = b + an / c;
    if (std::abs(c) < tiny) c = tiny;
    d = 1.0 / d;
    const double delta = d * c;
    h *= delta;
    if (std::abs(delta - 1.0) < 1e-16) break;
  }
  return std::exp(log_prefix) * h;
}

// x with P(chi2_df > x) = alpha, by bisection.
double chi2_upper_quantile(int df, double alpha) {
  double lo = 0.0, hi = df + 100.0 * std::sqrt(double(df)) + 100.0;
  for (int i = 0; i < 200; ++i) {
    const double mid = 0.5 * (lo + hi);
    (gamma_q(0.5 * df, 0.5 * mid) > alpha ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

TEST(VerifierStatistical, ChiSquareQuantilesMatchMpmath) {
  // mpmath: bisection on gammainc(df/2, x/2, inf, regularized=True) = 1e-6.
  EXPECT_NEAR(chi2_upper_quantile(10, 1e-6), 46.86304685, 1e-5);
  EXPECT_NEAR(chi2_upper_quantile(63, 1e-6), 131.3697021, 1e-5);
  EXPECT_NEAR(chi2_upper_quantile(124, 1e-6), 213.7149681, 1e-5);
}

constexpr int kSamples = 200000;
constexpr size_t kTokens = 3;
constexpr double kFalseAlarm = 1e-6;

struct ChiSquare {
  double statistic = 0.0;
  int df = 0;
  int64_t impossible = 0;  // samples of sequences plain decoding never produces
};

ChiSquare run(const SpecSetup& s, const VerifyFn& verifier, uint64_t seed) {
  const Sampler sampler(s.params);
  const Joint want = target_joint(s, kTokens);
  std::map<std::vector<int32_t>, int64_t> count;
  Rng rng(seed);
  RngRandomness randomness(rng);
  for (int i = 0; i < kSamples; ++i) {
    std::vector<int32_t> emitted;
    while (emitted.size() < kTokens) {
      const std::vector<int32_t> step =
          spec_step(s, sampler, concat(s.output, emitted), randomness, verifier);
      emitted.insert(emitted.end(), step.begin(), step.end());
    }
    emitted.resize(kTokens);
    ++count[emitted];
  }
  ChiSquare out;
  for (const auto& [seq, n] : count)
    if (!want.count(seq)) out.impossible += n;
  int cells = 0;
  for (const auto& [seq, p] : want) {
    const double expected = kSamples * p;
    const double observed = count.count(seq) ? double(count.at(seq)) : 0.0;
    out.statistic += (observed - expected) * (observed - expected) / expected;
    ++cells;
  }
  out.df = cells - 1;
  return out;
}

void expect_lossless(const SpecSetup& s, uint64_t seed, const std::string& what) {
  const ChiSquare c = run(s, production_verifier(), seed);
  std::printf("%s: chi2 %.1f, df %d, threshold %.1f\n", what.c_str(), c.statistic, c.df,
              chi2_upper_quantile(c.df, kFalseAlarm));
  EXPECT_EQ(c.impossible, 0) << what;
  EXPECT_GE(c.df, 30) << what << ": too few cells for a meaningful test";
  EXPECT_LT(c.statistic, chi2_upper_quantile(c.df, kFalseAlarm)) << what << ", df " << c.df;
}

ToyModel target4() {
  return ToyModel{4, 1.2f, 31};
}
ToyModel draft4() {
  return ToyModel{4, 1.2f, 32};
}

SpecSetup static_setup() {
  SamplingParams params;
  return {target4(),
          params,
          {1, 3},
          {},
          static_proposer(parse_tree_choices("[[0],[1],[2],[0,0],[0,1],[1,0],[0,0,0]]", "t"),
                          draft4())};
}

SpecSetup sampled_setup() {
  SamplingParams params;
  params.temperature = 0.9f;
  return {target4(), params, {2}, {}, sampled_proposer(draft4(), 3, 3, 2, true)};
}

TEST(VerifierStatistical, StaticTree) {
  expect_lossless(static_setup(), 1, "static tree");
}

TEST(VerifierStatistical, SampledProposals) {
  expect_lossless(sampled_setup(), 2, "sampled proposals");
}

TEST(VerifierStatistical, DuplicateSiblings) {
  SamplingParams params;
  params.temperature = 1.1f;
  expect_lossless({target4(), params, {0, 0}, {}, duplicate_proposer(target4())}, 3,
                  "duplicate siblings");
}

TEST(VerifierStatistical, PenaltiesAndFilters) {
  SamplingParams params;
  params.temperature = 0.8f;
  params.repetition_penalty = 1.4f;
  params.frequency_penalty = 0.2f;
  params.top_p = 0.95f;
  expect_lossless({ToyModel{4, 1.0f, 9},
                   params,
                   {1, 2},
                   {3, 3},
                   sampled_proposer(ToyModel{4, 1.0f, 10}, 4, 2, 2, true)},
                  4, "penalties and top-p");
}

TEST(VerifierStatistical, LogitBias) {
  SamplingParams params;
  params.temperature = 0.9f;
  params.repetition_penalty = 1.3f;
  params.logit_bias = {{0, -1.0f}, {1, 2.0f}, {3, -3.0f}};
  expect_lossless({ToyModel{4, 1.0f, 11},
                   params,
                   {2, 1},
                   {0},
                   sampled_proposer(ToyModel{4, 1.0f, 12}, 4, 2, 2, true)},
                  7, "logit bias and repetition penalty");
}

TEST(VerifierStatistical, WrongVerifiersAreDetected) {
  const ChiSquare no_residual = run(static_setup(), buggy_verifier(Bug::kNoResidualUpdate), 5);
  std::printf("no residual update: chi2 %.1f, df %d\n", no_residual.statistic, no_residual.df);
  EXPECT_GT(no_residual.statistic, chi2_upper_quantile(no_residual.df, kFalseAlarm));
  const ChiSquare one_hot_residual = run(sampled_setup(), buggy_verifier(Bug::kOneHotResidual), 6);
  std::printf("one-hot residual after a real-q rejection: chi2 %.1f, df %d\n",
              one_hot_residual.statistic, one_hot_residual.df);
  EXPECT_GT(one_hot_residual.statistic, chi2_upper_quantile(one_hot_residual.df, kFalseAlarm));
}

}  // namespace
}  // namespace arbor
