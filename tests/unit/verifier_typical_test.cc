// Typical acceptance (Medusa, opt-in, not lossless) against a transcription of Medusa's
// evaluate_posterior typical branch (scripts/make_verifier_fixtures.py ->
// tests/data/spec/medusa_reference.json): on mc_sim_7b_63 with random top-10 lists and logits,
// the accepted path, its tokens and the next root token (fast mode: argmax) must equal Medusa's.
// Also the threshold parameters: with delta = 0 every path passes and the deepest most likely
// one wins.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/sampling/sampler.h"
#include "engine/spec/tree_choices.h"
#include "engine/verify/tree_layout.h"
#include "engine/verify/verifier.h"
#include "tests/unit/verifier_test_util.h"

namespace arbor {
namespace {

nlohmann::json load_reference() {
  const std::string path = std::string(ARBOR_TEST_DATA_DIR) + "/spec/medusa_reference.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing fixture " + path);
  return nlohmann::json::parse(in);
}

TEST(VerifierTypical, MatchesMedusaEvaluatePosterior) {
  const nlohmann::json ref = load_reference();
  const int64_t vocab = ref["vocab"].get<int64_t>();
  const StaticTree tree = resolve_static_tree("mc_sim_7b_63");
  const VerifyOptions options{VerifyMode::kTypical, ref["posterior_threshold"].get<float>(),
                              ref["posterior_alpha"].get<float>()};
  ASSERT_FLOAT_EQ(options.typical_epsilon, VerifyOptions{}.typical_epsilon);  // the defaults
  ASSERT_FLOAT_EQ(options.typical_delta, VerifyOptions{}.typical_delta);
  ASSERT_GE(ref["typical"].size(), 10u);
  std::vector<int32_t> lengths_seen(5, 0);
  int case_index = 0;
  for (const nlohmann::json& c : ref["typical"]) {
    const int32_t root = c["root_token"].get<int32_t>();
    const DraftTree draft =
        instantiate(tree, root, c["topk"].get<std::vector<std::vector<int32_t>>>());
    std::vector<float> logits;
    for (const auto& row : c["logits"])
      for (const auto& v : row) logits.push_back(static_cast<float>(v.get<double>()));
    SamplingParams params;
    params.temperature = c["temperature"].get<float>();
    const Sampler sampler(params);
    Rng rng(1);
    const std::vector<int32_t> prompt = {5, root};
    const VerifyResult r = verify(draft, logits, vocab, sampler, prompt, {}, rng, options);
    const std::string what = "case " + std::to_string(case_index++);
    EXPECT_EQ(r.num_accepted(), c["accept_length"].get<int32_t>()) << what;
    EXPECT_EQ(r.accepted_nodes, c["accepted_nodes"].get<std::vector<int32_t>>()) << what;
    EXPECT_EQ(r.accepted_tokens, c["accepted_tokens"].get<std::vector<int32_t>>()) << what;
    EXPECT_EQ(r.bonus_token, c["bonus_token"].get<int32_t>()) << what;
    ++lengths_seen[c["accept_length"].get<int32_t>()];
  }
  for (int32_t len = 0; len <= 4; ++len)
    EXPECT_GT(lengths_seen[len], 0) << "no fixture case accepts " << len << " tokens";
}

// delta = 0: the threshold is 0, every node with p > 0 passes, so the walk accepts the deepest
// node, the most likely path among the deepest (brute force over all nodes).
TEST(VerifierTypical, ZeroThresholdAcceptsTheDeepestMostLikelyPath) {
  const testing::ToyModel model{6, 2.0f, 41};
  SamplingParams params;
  params.temperature = 0.9f;
  params.repetition_penalty = 1.3f;  // p along the path sees the path, as in the other modes
  const Sampler sampler(params);
  const StaticTree tree = parse_tree_choices("[[0],[1],[2],[0,0],[1,0],[1,1],[2,0]]", "t");
  const std::vector<int32_t> prompt = {1, 2, 3};
  for (uint64_t seed = 0; seed < 20; ++seed) {
    const testing::ToyModel draft{6, 2.0f, 100 + seed};
    const DraftTree d =
        instantiate(tree, 3, {testing::ranked(draft, prompt), testing::ranked(draft, {9, 9})});
    const std::vector<float> logits = testing::tree_logits(model, d, prompt);
    int32_t best = -1;
    double best_ll = -1e300;
    for (int32_t i = 4; i < d.size(); ++i) {  // the depth-2 nodes
      double ll = 0.0;
      const std::vector<int32_t> path = tree_path_to(d.parent, i);
      std::vector<int32_t> history;
      for (size_t k = 1; k < path.size(); ++k) {
        const std::vector<float> p = sampler.probs(
            std::span<const float>(logits).subspan(path[k - 1] * 6, 6), prompt, history);
        ll += std::log(double(p[d.token[path[k]]]));
        history.push_back(d.token[path[k]]);
      }
      if (ll > best_ll) best = i, best_ll = ll;
    }
    Rng rng(1);
    const VerifyResult r =
        verify(d, logits, 6, sampler, prompt, {}, rng, {VerifyMode::kTypical, 0.09f, 0.0f});
    EXPECT_EQ(r.accepted_nodes.back(), best) << "seed " << seed;
  }
}

TEST(VerifierTypical, RejectsNegativeThresholds) {
  SamplingParams params;
  const Sampler sampler(params);
  Rng rng(1);
  const std::vector<int32_t> prompt = {0};
  const std::vector<float> logits(3, 0.0f);
  EXPECT_THROW(verify(DraftTree::root_only(0), logits, 3, sampler, prompt, {}, rng,
                      {VerifyMode::kTypical, -0.1f, 0.3f}),
               Error);
}

}  // namespace
}  // namespace arbor
