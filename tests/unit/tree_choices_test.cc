// Static trees from Medusa choices lists: mc_sim_7b_63 against Medusa's own buffers (a
// transcription of generate_medusa_buffers in scripts/make_verifier_fixtures.py: node order,
// token indices, positions, attention mask, retrieve paths), the built-in names, parsing from
// text and files, and malformed lists rejected with messages that name the bad path.
#include "engine/spec/tree_choices.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/verify/tree_layout.h"
#include "engine/verify/tree_mask.h"

namespace arbor {
namespace {

nlohmann::json load_reference() {
  const std::string path = std::string(ARBOR_TEST_DATA_DIR) + "/spec/medusa_reference.json";
  std::ifstream in(path);
  if (!in) throw std::runtime_error("missing fixture " + path);
  return nlohmann::json::parse(in);
}

TEST(TreeChoices, McSim7b63HasMedusasShape) {
  const StaticTree tree = resolve_static_tree("mc_sim_7b_63");
  EXPECT_EQ(tree.size(), 64);
  EXPECT_EQ(tree.max_depth(), 4);
  EXPECT_EQ(tree.ranks_needed_per_depth(), (std::vector<int32_t>{10, 10, 10, 2}));
  std::vector<int32_t> per_depth(5, 0);
  for (int32_t d : tree.depth) ++per_depth[d];
  EXPECT_EQ(per_depth, (std::vector<int32_t>{1, 10, 28, 23, 2}));
}

// With per-depth lists topk[d][r] = 1 + 10 d + r and root token 0, a node's token is its index
// into cat([root], topk(head 0), ...): exactly Medusa's tree_indices, if our node order is
// Medusa's. Positions, masks and leaf paths then compare one to one.
TEST(TreeChoices, McSim7b63MatchesMedusaBuffers) {
  const nlohmann::json ref = load_reference();
  const nlohmann::json& buffers = ref["buffers"];
  const StaticTree tree = resolve_static_tree("mc_sim_7b_63");
  std::vector<std::vector<int32_t>> topk(4);
  for (int32_t d = 0; d < 4; ++d)
    for (int32_t r = 0; r < 10; ++r) topk[d].push_back(1 + 10 * d + r);
  const DraftTree draft = instantiate(tree, 0, topk);
  EXPECT_EQ(draft.token, buffers["tree_indices"].get<std::vector<int32_t>>());

  const TreeLayout layout = layout_tree(draft.parent, 100);
  const auto positions = buffers["position_ids"].get<std::vector<int32_t>>();
  ASSERT_EQ(layout.size(), 64);
  for (int32_t i = 0; i < 64; ++i) EXPECT_EQ(layout.position[i], 100 + positions[i]) << i;
  const auto attn = buffers["attn_mask"].get<std::vector<std::vector<int32_t>>>();
  for (int32_t i = 0; i < 64; ++i)
    for (int32_t j = 0; j < 64; ++j) {
      const bool bit = (layout.mask[i * mask_words(64) + j / 32] >> (j % 32)) & 1u;
      EXPECT_EQ(bit, attn[i][j] == 1) << "mask row " << i << " column " << j;
    }
  std::set<std::vector<int32_t>> medusa_paths;
  for (const auto& row : buffers["retrieve_indices"]) {
    std::vector<int32_t> path;
    for (int32_t v : row.get<std::vector<int32_t>>())
      if (v >= 0) path.push_back(v);  // -1: padding
    medusa_paths.insert(path);
  }
  const std::set<std::vector<int32_t>> ours(layout.leaf_paths.begin(), layout.leaf_paths.end());
  EXPECT_EQ(ours, medusa_paths);
  EXPECT_EQ(layout.leaf_paths.size(), medusa_paths.size());
}

TEST(TreeChoices, ChainAndProductNames) {
  const StaticTree chain = resolve_static_tree("chain-4");
  EXPECT_EQ(chain.parent, (std::vector<int32_t>{-1, 0, 1, 2, 3}));
  EXPECT_EQ(chain.rank, (std::vector<int32_t>{-1, 0, 0, 0, 0}));
  const StaticTree product = resolve_static_tree("product-3-2");
  EXPECT_EQ(product.size(), 1 + 3 + 6);
  EXPECT_EQ(product.parent, (std::vector<int32_t>{-1, 0, 0, 0, 1, 1, 2, 2, 3, 3}));
  EXPECT_EQ(product.rank, (std::vector<int32_t>{-1, 0, 1, 2, 0, 1, 0, 1, 0, 1}));
  // Too big for the default limits (1 + 8 + 64 nodes).
  EXPECT_THROW(resolve_static_tree("product-8-8"), Error);
  EXPECT_EQ(resolve_static_tree("product-8-8", {10, 73, 16}).size(), 73);
}

TEST(TreeChoices, SortsIntoMedusaOrderWhateverTheListOrder) {
  const StaticTree tree = parse_tree_choices("[[1],[0],[1,1],[0,2],[1,0]]", "t");
  std::vector<std::vector<int32_t>> paths(tree.path.begin() + 1, tree.path.end());
  EXPECT_EQ(paths, (std::vector<std::vector<int32_t>>{{0}, {1}, {0, 2}, {1, 0}, {1, 1}}));
  EXPECT_EQ(tree.parent, (std::vector<int32_t>{-1, 0, 0, 1, 2, 2}));
  EXPECT_EQ(tree.depth, (std::vector<int32_t>{0, 1, 1, 2, 2, 2}));
  const DraftTree draft = instantiate(tree, 42, {{7, 8}, {20, 21, 22}});
  EXPECT_EQ(draft.token, (std::vector<int32_t>{42, 7, 8, 22, 20, 21}));
  EXPECT_TRUE(draft.q_row.empty());
}

void expect_rejected(const std::string& text, const std::vector<std::string>& needles,
                     const TreeChoicesLimits& limits = {}) {
  try {
    parse_tree_choices(text, "cfg", limits);
    ADD_FAILURE() << text << " was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message for " << text << " lacks '" << needle << "': " << e.what();
  }
}

TEST(TreeChoices, MalformedListsNameTheBadPath) {
  expect_rejected("[[0,0],[0]]", {"'cfg'", "[0,0]", "before its parent [0]", "entry 1"});
  expect_rejected("[[0],[1,0]]", {"[1,0]", "no parent", "[1] is not listed"});
  expect_rejected("[[0],[10]]", {"[10]", "rank 10", "top_k = 10"});
  expect_rejected("[[0],[0,-1]]", {"[0,-1]", "rank -1"});
  expect_rejected("[[0],[1],[0]]", {"[0] (entry 2)", "duplicates entry 0"});
  expect_rejected("[[0],[]]", {"entry 1", "empty path"});
  expect_rejected("[[0],[0,0],[0,0,0]]", {"[0,0,0]", "depth 3", "max_depth is 2"}, {10, 64, 2});
  expect_rejected("[[0],[0.5]]", {"non-integer", "0.5"});
  expect_rejected("[[0],3]", {"entry 1", "not a list"});
  expect_rejected("[[0],", {"not valid JSON"});
  expect_rejected("{\"paths\":[[0]]}", {"\"choices\""});
  expect_rejected("[[0],[1],[2]]", {"3 paths", "4 nodes", "max_nodes is 3"}, {10, 3, 16});
  // 63 paths + root = 64 nodes: one over a 63-node budget.
  try {
    resolve_static_tree("mc_sim_7b_63", {10, 63, 16});
    ADD_FAILURE() << "mc_sim_7b_63 fit in 63 nodes";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("64 nodes"), std::string::npos) << e.what();
  }
  // Ranks beyond what the heads provide.
  expect_rejected("[[0],[5]]", {"[5]", "rank 5", "top_k = 4"}, {4, 64, 16});
}

TEST(TreeChoices, ParsesObjectsFilesAndInlineText) {
  EXPECT_EQ(parse_tree_choices("{\"choices\": [[0], [0, 0]]}", "obj").size(), 3);
  EXPECT_EQ(resolve_static_tree("  [[0],[1]]").size(), 3);
  const std::string path = ::testing::TempDir() + "/tree_choices_test.json";
  {
    std::ofstream out(path);
    out << "[[0], [1], [0, 0]]\n";
  }
  const StaticTree from_file = resolve_static_tree(path);
  EXPECT_EQ(from_file.size(), 4);
  EXPECT_EQ(from_file.name, path);
  std::remove(path.c_str());
  try {
    resolve_static_tree("/nonexistent/tree.json");
    ADD_FAILURE() << "missing file accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("/nonexistent/tree.json"), std::string::npos);
  }
  EXPECT_THROW(load_tree_choices_file("/nonexistent/tree.json"), Error);
  try {
    named_tree_choices("mc_sim_7b_64");
    ADD_FAILURE() << "unknown name accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("mc_sim_7b_63"), std::string::npos) << e.what();
  }
  EXPECT_THROW(named_tree_choices("chain-0"), Error);
  EXPECT_THROW(named_tree_choices("chain-x"), Error);
}

TEST(TreeChoices, InstantiateChecksTheCandidateLists) {
  const StaticTree tree = resolve_static_tree("mc_sim_7b_63");
  std::vector<std::vector<int32_t>> topk(4, std::vector<int32_t>(10, 1));
  EXPECT_NO_THROW(instantiate(tree, 0, topk));
  topk[3].resize(1);  // depth 4 uses ranks 0 and 1
  try {
    instantiate(tree, 0, topk);
    ADD_FAILURE() << "short list accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("rank 1 at depth 4"), std::string::npos) << e.what();
  }
  topk.resize(3);
  EXPECT_THROW(instantiate(tree, 0, topk), Error);
}

}  // namespace
}  // namespace arbor
