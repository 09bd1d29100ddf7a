// Tree layout and DraftTree validation: positions, masks, children and leaf paths of random trees
// against a brute-force walk up the parent links, and every malformed-tree case rejected with a
// message naming the node and the value.
#include "engine/verify/tree_layout.h"

#include <gtest/gtest.h>

#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/verify/tree_mask.h"
#include "tests/unit/loader_test_util.h"

namespace arbor {
namespace {

std::vector<int32_t> random_parents(std::mt19937& gen, int32_t t) {
  std::vector<int32_t> parent = {-1};
  for (int32_t i = 1; i < t; ++i) {
    // Mostly deep chains with some branching, so depths and leaf counts vary.
    std::uniform_int_distribution<int32_t> near(std::max(0, i - 3), i - 1);
    std::uniform_int_distribution<int32_t> any(0, i - 1);
    parent.push_back(gen() % 3 ? near(gen) : any(gen));
  }
  return parent;
}

bool is_ancestor_or_self(const std::vector<int32_t>& parent, int32_t a, int32_t i) {
  for (int32_t n = i; n >= 0; n = parent[n])
    if (n == a) return true;
  return false;
}

TEST(TreeLayout, RandomTreesMatchBruteForce) {
  std::mt19937 gen(5);
  for (int32_t t : {1, 2, 5, 31, 32, 33, 64, 70, 130}) {
    const std::vector<int32_t> parent = random_parents(gen, t);
    const int32_t committed = static_cast<int32_t>(gen() % 1000);
    const TreeLayout layout = layout_tree(parent, committed);
    ASSERT_EQ(layout.size(), t);
    const int32_t words = mask_words(t);
    ASSERT_EQ(layout.mask.size(), static_cast<size_t>(t * words));
    std::vector<int32_t> leaves;
    for (int32_t i = 0; i < t; ++i) {
      int32_t depth = 0;
      for (int32_t n = i; n > 0; n = parent[n]) ++depth;
      EXPECT_EQ(layout.depth[i], depth);
      EXPECT_EQ(layout.position[i], committed + depth);
      for (int32_t j = 0; j < words * 32; ++j) {
        const bool bit = (layout.mask[i * words + j / 32] >> (j % 32)) & 1u;
        EXPECT_EQ(bit, j < t && is_ancestor_or_self(parent, j, i)) << "t " << t << " row " << i;
      }
      std::vector<int32_t> children;
      for (int32_t c = 0; c < t; ++c)
        if (c > 0 && parent[c] == i) children.push_back(c);
      EXPECT_EQ(std::vector<int32_t>(layout.child.begin() + layout.child_offset[i],
                                     layout.child.begin() + layout.child_offset[i + 1]),
                children);
      if (children.empty()) leaves.push_back(i);
    }
    ASSERT_EQ(layout.leaf_paths.size(), leaves.size());
    for (size_t l = 0; l < leaves.size(); ++l) {
      const std::vector<int32_t>& path = layout.leaf_paths[l];
      EXPECT_EQ(path.front(), 0);
      EXPECT_EQ(path.back(), leaves[l]);
      EXPECT_EQ(static_cast<int32_t>(path.size()), layout.depth[leaves[l]] + 1);
      for (size_t k = 1; k < path.size(); ++k) EXPECT_EQ(parent[path[k]], path[k - 1]);
    }
  }
}

void expect_invalid(const DraftTree& tree, int64_t vocab, const std::vector<std::string>& needles,
                    const TreeBudget* budget = nullptr) {
  try {
    if (budget)
      validate_draft_tree(tree, vocab, *budget);
    else
      validate_draft_tree(tree, vocab);
    ADD_FAILURE() << "tree accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << e.what();
    for (const std::string& needle : needles)
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
          << "message lacks '" << needle << "': " << e.what();
  }
}

DraftTree sampled_tree() {
  // Root's children sampled from q row 0, node 1's from q row 1; node 2 deterministic.
  DraftTree tree{{-1, 0, 0, 1, 2}, {3, 1, 2, 0, 1}, {0, 1, -1, -1, -1}, {}};
  tree.q = {0.1f, 0.4f, 0.5f, 0.0f,   // row 0
            0.7f, 0.1f, 0.1f, 0.1f};  // row 1
  return tree;
}

TEST(TreeLayout, ValidationAcceptsWellFormedTrees) {
  EXPECT_NO_THROW(validate_draft_tree(DraftTree::root_only(7), 8));
  EXPECT_NO_THROW(validate_draft_tree(sampled_tree(), 4));
  const TreeBudget budget{5, 2};
  EXPECT_NO_THROW(validate_draft_tree(sampled_tree(), 4, budget));
}

TEST(TreeLayout, ValidationNamesTheOffendingNode) {
  expect_invalid(DraftTree{{-1, 0, 3, 1}, {0, 1, 2, 3}, {}, {}}, 8, {"node 2", "parent 3"});
  expect_invalid(DraftTree{{0, 0}, {0, 1}, {}, {}}, 8, {"node 0", "parent 0"});
  expect_invalid(DraftTree{{-1, 0}, {0, 1, 2}, {}, {}}, 8, {"2 parents", "3 tokens"});
  expect_invalid(DraftTree{{}, {}, {}, {}}, 8, {"no nodes"});
  expect_invalid(DraftTree{{-1, 0, 0}, {0, 8, 1}, {}, {}}, 8, {"node 1", "token 8", "[0, 8)"});
  expect_invalid(DraftTree{{-1, 0}, {0, -2}, {}, {}}, 8, {"node 1", "token -2"});

  DraftTree t = sampled_tree();
  t.q_row.pop_back();
  expect_invalid(t, 4, {"q_row has 4 entries", "5 nodes"});
  t = sampled_tree();
  t.q_row[2] = 2;
  expect_invalid(t, 4, {"node 2", "q_row 2", "2 rows"});
  t = sampled_tree();
  t.q_row[2] = -3;
  expect_invalid(t, 4, {"node 2", "q_row -3"});
  t = sampled_tree();
  t.q.pop_back();
  expect_invalid(t, 4, {"7 values", "vocab 4"});
  t = sampled_tree();
  t.q[1] = 0.5f;
  expect_invalid(t, 4, {"q row 0", "sums to 1.1"});
  t = sampled_tree();
  t.q[5] = -0.1f;
  t.q[4] = 0.9f;
  expect_invalid(t, 4, {"q row 1", "q[1]"});
  t = sampled_tree();
  t.q[0] = std::numeric_limits<float>::quiet_NaN();
  expect_invalid(t, 4, {"q row 0", "q[0]"});
  t = sampled_tree();
  t.token[2] = 3;  // q row 0 gives token 3 no mass: it cannot have been sampled
  expect_invalid(t, 4, {"node 2", "token 3", "q row 0", "probability is 0"});
  t = DraftTree::root_only(1);
  t.q = {1.0f, 0.0f};
  expect_invalid(t, 2, {"q_row is empty"});

  const TreeBudget small{4, 8};
  expect_invalid(sampled_tree(), 4, {"5 nodes", "max_nodes is 4"}, &small);
  const TreeBudget shallow{64, 1};
  expect_invalid(sampled_tree(), 4, {"node 3", "depth 2", "max_depth is 1"}, &shallow);
}

TEST(TreeLayout, RejectsBadInputsToLayout) {
  EXPECT_THROW(layout_tree({-1, 0}, -1), Error);
  EXPECT_THROW(layout_tree({-1, 2, 0}, 0), Error);
  EXPECT_EQ(tree_path_to({-1, 0, 0, 2, 3}, 4), (std::vector<int32_t>{0, 2, 3, 4}));
  EXPECT_EQ(tree_path_to({-1}, 0), (std::vector<int32_t>{0}));
}

// A verify step whose trees' parents are left in backend memory (StepInputs::
// parent_source_index; here host memory, the CPU backend's) laid out from placeholders:
// resolve_sources rebuilds each tree's positions and ancestor-mask rows from the real parents
// (and the host-laid rows' parents from their masks), giving the host's layout of the real
// trees, for random trees of 2-70 nodes (one and three mask words a row) beside a causal chunk.
TEST(TreeLayout, TreesWithParentsOnTheBackendAreLaidOutAsOnTheHost) {
  std::mt19937 gen(3);
  for (int trial = 0; trial < 30; ++trial) {
    const int32_t t = 2 + static_cast<int32_t>(gen() % 69);
    const std::vector<int32_t> real = random_parents(gen, t);
    // Trailing host nodes (the engine's padding: children of the root) after `device` nodes.
    const int32_t device = std::max<int32_t>(2, t - static_cast<int32_t>(gen() % 4));
    const int32_t committed = 17, chunk = 3;
    auto layout = [&](const std::vector<int32_t>& parent) {
      StepInputs s;
      s.qo_indptr = {0, chunk, chunk + t};
      s.committed_len = {5, committed};
      s.mask_indptr = {0, 0};
      for (int32_t i = 0; i < chunk; ++i) s.positions.push_back(5 + i);
      const std::vector<int32_t> depth = tree_depths(parent);
      for (int32_t i = 0; i < t; ++i) s.positions.push_back(committed + depth[i]);
      const std::vector<uint32_t> mask = pack_ancestor_mask(parent);
      s.tree_mask.insert(s.tree_mask.end(), mask.begin(), mask.end());
      s.mask_indptr.push_back(static_cast<int32_t>(s.tree_mask.size()));
      s.token_ids.assign(static_cast<size_t>(chunk + t), 1);
      return s;
    };
    std::vector<int32_t> want_parent = real;
    for (int32_t i = device; i < t; ++i) want_parent[i] = 0;
    const StepInputs want = layout(want_parent);
    // Placeholder: a chain (any tree no shallower will do), the device nodes' parents in a
    // buffer with other values around them.
    std::vector<int32_t> placeholder(static_cast<size_t>(t));
    for (int32_t i = 0; i < t; ++i) placeholder[i] = i < device ? i - 1 : 0;
    StepInputs got = layout(placeholder);
    std::vector<int32_t> source(static_cast<size_t>(2 * t + 5), 99);
    got.parent_source_index.assign(static_cast<size_t>(chunk + t), -1);
    for (int32_t i = 1; i < device; ++i) {
      source[static_cast<size_t>(5 + 2 * i)] = real[i];
      got.parent_source_index[static_cast<size_t>(chunk + i)] = 5 + 2 * i;
    }
    got.token_source = Tensor{source.data(), DType::kI32, static_cast<int64_t>(source.size()), 1};
    got.resolve_sources();
    EXPECT_EQ(got.positions, want.positions) << "trial " << trial << ", " << t << " nodes";
    EXPECT_EQ(got.tree_mask, want.tree_mask) << "trial " << trial << ", " << t << " nodes";
  }
  // A parent index outside the source, or without one, is named by the step's validation.
  StepInputs s;
  s.token_ids = {1, 1};
  s.positions = {3, 4};
  s.slot_mapping = {0, 1};
  s.qo_indptr = {0, 2};
  s.committed_len = {3};
  s.block_tables = {0};
  s.max_blocks_per_request = 1;
  s.tree_mask = {1u, 3u};
  s.mask_indptr = {0, 2};
  s.logits_rows = {0, 1};
  const KvCacheShape kv{1, 4, 16, 1, 8};
  EXPECT_NO_THROW(s.validate(kv));
  s.parent_source_index = {-1, 0};
  test::expect_error([&] { s.validate(kv); }, ErrorCode::kInvalidArgument,
                     {"parent_source_index without an int32 token_source"});
  std::vector<int32_t> one = {0};
  s.token_source = Tensor{one.data(), DType::kI32, 1, 1};
  s.parent_source_index = {-1, 1};
  test::expect_error([&] { s.validate(kv); }, ErrorCode::kInvalidArgument,
                     {"parent_source_index[1] = 1 is outside [-1, 1)"});
}

}  // namespace
}  // namespace arbor
