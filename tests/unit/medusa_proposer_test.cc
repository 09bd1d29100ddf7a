// Medusa heads and proposer against the PyTorch reference (scripts/spec_heads_reference.py, the
// official medusa_model.py ResBlock heads and generate_candidates): head logits to 1e-4, the
// per-head top-10 and whole static trees (mc_sim_7b_63 and a small list) exactly, for heads with
// their own LM heads (llama_gqa) and heads sharing the base LM head (stories260K). Also budget
// cuts, sequencing errors and malformed checkpoints.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/core/host_math.h"
#include "engine/draft/medusa_device_heads.h"
#include "engine/spec/medusa_proposer.h"
#include "engine/spec/tree_choices.h"
#include "engine/verify/tree_layout.h"
#include "tests/common/synthetic_medusa.h"
#include "tests/unit/proposer_test_util.h"

namespace arbor {
namespace {

using test::expect_error;
using test::spec_fixture;

struct Fixture {
  nlohmann::json ref;
  const ModelWeights* target;
  std::string dir;
};

Fixture load(const std::string& name) {
  Fixture f{test::spec_reference(name), nullptr, spec_fixture(name)};
  f.target = &test::target_weights(f.ref["target"].get<std::string>());
  return f;
}

StaticTree tree_of(const nlohmann::json& t) {
  return build_static_tree(t["choices"].get<TreeChoices>(), t["name"].get<std::string>());
}

// Feeds the fixture prompt (our own target forward for the hidden states) and returns the
// proposer ready to propose.
void observe_prompt(MedusaProposer& p, const Fixture& f, RequestId request) {
  const std::vector<int32_t> tokens = f.ref["tokens"].get<std::vector<int32_t>>();
  const test::TargetRun run = test::run_target(f.ref["target"].get<std::string>(), tokens);
  p.begin(request, tokens);
  TargetFeedback fb;
  fb.request = request;
  fb.start = 0;
  fb.tokens = tokens;
  fb.hidden = run.hidden;
  fb.next_token = f.ref["root"].get<int32_t>();
  p.observe(fb);
}

class MedusaReference : public ::testing::TestWithParam<std::string> {};

TEST_P(MedusaReference, HeadLogitsMatchPyTorch) {
  const Fixture f = load(GetParam());
  const MedusaHeads heads = load_medusa_heads(f.dir, f.target->output_weight());
  const std::vector<float> hidden = f.ref["hidden"].get<std::vector<float>>();
  const auto logits = medusa_head_logits(heads, hidden, 1);
  ASSERT_EQ(logits.size(), f.ref["head_logits"].size());
  for (size_t i = 0; i < logits.size(); ++i) {
    const std::vector<float> ref = f.ref["head_logits"][i].get<std::vector<float>>();
    ASSERT_EQ(logits[i].size(), ref.size());
    EXPECT_LE(test::rel_error(logits[i].data(), ref.data(), ref.size()), 1e-4) << "head " << i;
  }
}

TEST_P(MedusaReference, TargetHiddenMatchesTransformers) {
  // The hidden state the runner hands the proposer (our forward) is the one the reference used.
  const Fixture f = load(GetParam());
  const std::vector<int32_t> tokens = f.ref["tokens"].get<std::vector<int32_t>>();
  const test::TargetRun run = test::run_target(f.ref["target"].get<std::string>(), tokens);
  const std::vector<float> ref = f.ref["hidden"].get<std::vector<float>>();
  EXPECT_LE(
      test::rel_error(run.hidden.data() + run.hidden.size() - ref.size(), ref.data(), ref.size()),
      1e-4);
}

TEST_P(MedusaReference, TreesMatchMedusaCandidates) {
  const Fixture f = load(GetParam());
  for (const auto& t : f.ref["trees"]) {
    MedusaProposer p(load_medusa_heads(f.dir, f.target->output_weight()), tree_of(t));
    observe_prompt(p, f, 7);
    const DraftTree tree = p.propose(7, TreeBudget{64, 8});
    test::expect_tree(tree, t["tokens"].get<std::vector<int32_t>>(),
                      t["parents"].get<std::vector<int32_t>>(), t["name"].get<std::string>());
    validate_draft_tree(tree, f.target->config.vocab_size, TreeBudget{64, 8});
  }
}

// The heads on a backend (here the CPU backend, fp32 like the host path): the same trees as the
// PyTorch reference, one request at a time and several in one batched pass with different
// budgets (each equal to the host proposer's tree for that budget).
TEST_P(MedusaReference, HeadsOnABackendGiveTheSameTrees) {
  const Fixture f = load(GetParam());
  for (const auto& t : f.ref["trees"]) {
    MedusaProposer dev(load_medusa_heads(f.dir, f.target->output_weight()), tree_of(t),
                       std::make_unique<CpuBackend>(1));
    MedusaProposer host(load_medusa_heads(f.dir, f.target->output_weight()), tree_of(t));
    for (RequestId r : {3, 4, 5}) {
      observe_prompt(dev, f, r);
      observe_prompt(host, f, r);
    }
    const DraftTree tree = dev.propose(3, TreeBudget{64, 8});
    test::expect_tree(tree, t["tokens"].get<std::vector<int32_t>>(),
                      t["parents"].get<std::vector<int32_t>>(), t["name"].get<std::string>());
    const std::vector<std::pair<RequestId, TreeBudget>> batch = {
        {3, TreeBudget{64, 8}}, {4, TreeBudget{1, 8}}, {5, TreeBudget{7, 2}}};
    const std::vector<DraftTree> trees = dev.propose_batch(batch);
    ASSERT_EQ(trees.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      const DraftTree want = host.propose(batch[i].first, batch[i].second);
      test::expect_tree(trees[i], want.token, want.parent,
                        t["name"].get<std::string>() + " batch item " + std::to_string(i));
    }
    EXPECT_EQ(trees[1].size(), 1);  // a 1-node budget: the root alone
    // With a reader that shares the heads' memory the tokens stay there (DraftTree::device):
    // read there, they are the same trees, and no tree has its tokens on the host.
    MedusaProposer left(load_medusa_heads(f.dir, f.target->output_weight()), tree_of(t),
                        std::make_unique<CpuBackend>(1));
    CpuBackend reader(1);
    left.set_tree_reader(&reader);
    for (RequestId r : {3, 4, 5}) observe_prompt(left, f, r);
    const std::vector<DraftTree> on = left.propose_batch(batch);
    ASSERT_EQ(on.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) {
      DraftTree resolved = on[i];
      if (on[i].size() > 1) {
        ASSERT_EQ(on[i].device.index.size(), static_cast<size_t>(on[i].size()));
        EXPECT_EQ(on[i].device.index[0], -1);
        std::vector<int64_t> index(on[i].device.index.begin() + 1, on[i].device.index.end());
        std::vector<int32_t> ids;
        reader.download_ids(on[i].device.ids, index, &ids);
        std::copy(ids.begin(), ids.end(), resolved.token.begin() + 1);
        for (size_t n = 1; n < on[i].token.size(); ++n)
          EXPECT_EQ(on[i].token[n], on[i].token[0]) << "placeholder";
      } else {
        EXPECT_TRUE(on[i].device.empty());
      }
      test::expect_tree(
          resolved, trees[i].token, trees[i].parent,
          t["name"].get<std::string>() + " left on the device, item " + std::to_string(i));
    }
    // A request without a hidden state yet is rejected by name, as on the host.
    dev.begin(9, std::vector<int32_t>{1, 2});
    expect_error(
        [&] {
          dev.propose_batch({{3, TreeBudget{4, 2}}, {9, TreeBudget{4, 2}}});
        },
        ErrorCode::kInvalidArgument, {"request 9"});
  }
}

INSTANTIATE_TEST_SUITE_P(Heads, MedusaReference,
                         ::testing::Values("medusa_llama_gqa", "medusa_stories260K"),
                         [](const auto& info) { return info.param; });

// Heads of one ResBlock sharing the base LM head (SmolLM2's trained heads have this layout) run
// their ResBlocks as one stacked GEMM on a backend: each head's top-k equals the host
// reference's (medusa_head_logits, checked against PyTorch above) for one and several hidden
// rows, with every head asked, a prefix of them, and a head skipped in the middle. (The other
// layouts, two ResBlocks and own LM heads, are HeadsOnABackendGiveTheSameTrees' fixtures.)
TEST(MedusaDeviceHeads, OneBlockHeadsSharingTheLmHeadMatchTheHost) {
  constexpr int64_t kHidden = 64, kVocab = 300, kHeads = 4;
  testing::NormalTensors random(5);
  const MedusaHeads heads = testing::one_block_medusa_heads(random, kHidden, kVocab, kHeads, 0.2f);
  MedusaDeviceHeads device(std::make_unique<CpuBackend>(1), heads);
  testing::check_device_top_k(
      device, heads, random, {1, 3}, {{10, 5, 3, 2}, {7, 4}, {3, 0, 2, 1}},
      [](int64_t rows, int64_t r, size_t d, const std::vector<int32_t>& k,
         const std::vector<int32_t>& ids, const std::vector<float>& logits) {
        EXPECT_EQ(ids, host_math::top_k(logits, k[d]))
            << "rows " << rows << ", head " << d << ", row " << r << ", " << k.size()
            << " heads run";
      });
}

TEST(MedusaProposer, BudgetCutsTheStaticTreeToItsFirstListedNodes) {
  const Fixture f = load("medusa_llama_gqa");
  const nlohmann::json& t = f.ref["trees"][0];  // mc_sim_7b_63
  ASSERT_EQ(t["name"], "mc_sim_7b_63");
  MedusaProposer p(load_medusa_heads(f.dir, f.target->output_weight()), tree_of(t));
  observe_prompt(p, f, 1);
  const std::vector<int32_t> tokens = t["tokens"].get<std::vector<int32_t>>();
  // The reference's node i > 0 is Medusa's sorted choice i - 1.
  const TreeChoices listed = t["choices"].get<TreeChoices>();
  TreeChoices sorted = listed;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  std::map<std::vector<int32_t>, int32_t> node_of = {{{}, 0}};
  for (size_t i = 0; i < sorted.size(); ++i) node_of[sorted[i]] = static_cast<int32_t>(i + 1);
  for (const TreeBudget budget : {TreeBudget{10, 2}, TreeBudget{64, 1}, TreeBudget{5, 8},
                                  TreeBudget{8, 8}, TreeBudget{1, 8}, TreeBudget{64, 0}}) {
    // Expected by definition: the list's first paths of depth <= max_depth, at most max_nodes
    // nodes with the root, in Medusa order, with the reference tree's tokens.
    TreeChoices kept;
    for (const auto& path : listed) {
      if (static_cast<int32_t>(kept.size()) + 1 >= budget.max_nodes) break;
      if (static_cast<int32_t>(path.size()) <= budget.max_depth) kept.push_back(path);
    }
    std::sort(kept.begin(), kept.end(), [](const auto& a, const auto& b) {
      return a.size() != b.size() ? a.size() < b.size() : a < b;
    });
    std::map<std::vector<int32_t>, int32_t> index = {{{}, 0}};
    std::vector<int32_t> want_tokens = {tokens[0]}, want_parents = {-1};
    for (const auto& path : kept) {
      index[path] = static_cast<int32_t>(want_tokens.size());
      want_tokens.push_back(tokens[static_cast<size_t>(node_of.at(path))]);
      want_parents.push_back(index.at(std::vector<int32_t>(path.begin(), path.end() - 1)));
    }
    const DraftTree tree = p.propose(1, budget);
    test::expect_tree(
        tree, want_tokens, want_parents,
        "budget " + std::to_string(budget.max_nodes) + "/" + std::to_string(budget.max_depth));
  }
  // An 8-node cut of mc_sim_7b_63 keeps its best-ranked paths, not its first depth-1 nodes.
  EXPECT_EQ(p.propose(1, TreeBudget{8, 8}).size(), 8);
  int32_t deeper = 0;
  const DraftTree eight = p.propose(1, TreeBudget{8, 8});
  for (int32_t parent : eight.parent) deeper += parent > 0;
  EXPECT_EQ(deeper, 4);  // [0,0] [0,1] [0,0,0] [1,0] of [0] [0,0] [1] [0,1] [2] [0,0,0] [1,0]
}

TEST(MedusaProposer, SequencingErrorsNameTheRequest) {
  const Fixture f = load("medusa_llama_gqa");
  MedusaProposer p(load_medusa_heads(f.dir, f.target->output_weight()),
                   resolve_static_tree("mc_sim_7b_63"));
  EXPECT_TRUE(p.needs_hidden());
  expect_error([&] { p.propose(3, {}); }, ErrorCode::kInvalidArgument, {"request 3", "not begun"});
  const std::vector<int32_t> prompt = {1, 5, 9, 11};
  p.begin(3, prompt);
  expect_error([&] { p.begin(3, prompt); }, ErrorCode::kInvalidArgument, {"already open"});
  expect_error([&] { p.propose(3, {}); }, ErrorCode::kInvalidArgument, {"request 3", "next_token"});
  std::vector<float> hidden(4 * 64, 0.5f);
  TargetFeedback fb{3, 0, prompt, hidden, {}, 17};
  std::vector<float> short_hidden(3 * 64, 0.5f);
  TargetFeedback bad = fb;
  bad.hidden = short_hidden;
  expect_error([&] { p.observe(bad); }, ErrorCode::kInvalidArgument,
               {"hidden holds 192 values", "4 rows x 64"});
  p.observe(fb);
  EXPECT_EQ(p.propose(3, {}).token[0], 17);
  // Non-contiguous feedback, and a feedback whose first token is not the previous root.
  const std::vector<int32_t> next = {17, 20};
  std::vector<float> h2(2 * 64, 0.1f);
  expect_error(
      [&] {
        p.observe({3, 5, next, h2, {}, 4});
      },
      ErrorCode::kInvalidArgument, {"starts at position 5", "ended at 4"});
  const std::vector<int32_t> wrong = {18, 20};
  expect_error(
      [&] {
        p.observe({3, 4, wrong, h2, {}, 4});
      },
      ErrorCode::kInvalidArgument, {"is 18", "next_token was 17"});
  p.observe({3, 4, next, h2, {}, 4});
  EXPECT_EQ(p.propose(3, {}).token[0], 4);
  expect_error(
      [&] {
        p.propose(3, TreeBudget{0, 4});
      },
      ErrorCode::kInvalidArgument, {"max_nodes 0"});
  p.end(3);
  expect_error([&] { p.end(3); }, ErrorCode::kInvalidArgument, {"request 3", "not begun"});
}

TEST(MedusaProposer, TreeDeeperThanTheHeadsIsRejected) {
  const Fixture f = load("medusa_stories260K");  // 3 heads
  expect_error(
      [&] {
        MedusaProposer p(load_medusa_heads(f.dir, f.target->output_weight()),
                         resolve_static_tree("mc_sim_7b_63"));
      },
      ErrorCode::kInvalidArgument, {"mc_sim_7b_63", "depth 4", "3 heads"});
}

class MedusaCheckpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    tensors_ =
        test::read_safetensors(spec_fixture("medusa_llama_gqa") + "/medusa_lm_head.safetensors");
    base_ = test::target_weights("llama_gqa").output_weight();
  }
  void expect_rejected(const test::StMap& tensors, ErrorCode code,
                       const std::vector<std::string>& needles) {
    test::TempDir dir;
    test::write_safetensors(dir.file("medusa_lm_head.safetensors"), tensors);
    expect_error([&] { load_medusa_heads(dir.path(), base_); }, code, needles);
  }
  test::StMap tensors_;
  HostTensor base_;
};

TEST_F(MedusaCheckpoint, CountsHeadsFromTensorNames) {
  test::TempDir dir;
  test::write_safetensors(dir.file("medusa_lm_head.safetensors"), tensors_);
  const MedusaHeads heads = load_medusa_heads(dir.file("medusa_lm_head.safetensors"), base_);
  EXPECT_EQ(heads.num_heads(), 4);
  EXPECT_FALSE(heads.uses_base_lm_head());
  // Dropping a head's LM head makes it use the base one (Medusa-2 style).
  test::StMap t = tensors_;
  t.erase("3.1.weight");
  test::write_safetensors(dir.file("medusa_lm_head.safetensors"), t);
  const MedusaHeads shared = load_medusa_heads(dir.path(), base_);
  EXPECT_TRUE(shared.heads[3].lm_head.empty());
  EXPECT_TRUE(shared.uses_base_lm_head());
}

TEST_F(MedusaCheckpoint, MalformedCheckpointsNameTheTensor) {
  test::StMap gap = tensors_;
  for (const char* n : {"1.0.linear.weight", "1.0.linear.bias", "1.1.weight"}) gap.erase(n);
  expect_rejected(gap, ErrorCode::kCorruptData, {"head 1 is missing"});
  test::StMap shape = tensors_;
  shape["2.0.linear.weight"].shape = {32, 128};
  expect_rejected(shape, ErrorCode::kCorruptData,
                  {"2.0.linear.weight", "expected shape [64, 64]", "found [32, 128]"});
  test::StMap lm = tensors_;
  lm["0.1.weight"].shape = {64, 320};
  expect_rejected(lm, ErrorCode::kCorruptData, {"0.1.weight", "[320, 64]"});
  test::StMap no_bias = tensors_;
  no_bias.erase("0.0.linear.bias");
  expect_rejected(no_bias, ErrorCode::kCorruptData, {"0.0.linear.bias", "missing"});
  test::StMap unknown = tensors_;
  unknown["0.0.norm.weight"] = tensors_["0.0.linear.bias"];
  expect_rejected(unknown, ErrorCode::kCorruptData, {"unexpected tensor 0.0.norm.weight"});
  test::TempDir empty;
  expect_error([&] { load_medusa_heads(empty.path(), base_); }, ErrorCode::kNotFound,
               {"medusa_lm_head.safetensors", "not found"});
}

}  // namespace
}  // namespace arbor
