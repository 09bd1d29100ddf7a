// Static speculation trees from Medusa-style `choices` lists: each entry is a path of top-k ranks
// below the root ([1, 0] = "rank 0 of head 2 after rank 1 of head 1"). Parses and validates
// lists (JSON text, config files, built-in names) and fills a tree's tokens from per-depth top-k
// candidate lists, as Medusa's generate_candidates does.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "engine/verify/draft_tree.h"

namespace arbor {

using TreeChoices = std::vector<std::vector<int32_t>>;  // [num_paths][depth] ranks

// Limits a choices list is checked against.
struct TreeChoicesLimits {
  int32_t top_k = 10;  // ranks must be in [0, top_k): candidates each head provides (Medusa TOPK)
  int32_t max_nodes = 64;  // nodes including the root
  int32_t max_depth = 16;  // longest path (edges below the root)
};

// A validated static tree. Node order is Medusa's (generate_medusa_buffers): the root, then the
// paths sorted by (length, ranks), so parents precede children, depths are non-decreasing and a
// node's children appear in rank order. Node i > 0 is Medusa's sorted choice i - 1.
struct StaticTree {
  std::string name;                        // where it came from, for messages and logs
  std::vector<std::vector<int32_t>> path;  // [T] ranks from the root; path[0] empty (the root)
  std::vector<int32_t> parent;             // [T] parent[0] = -1
  std::vector<int32_t> depth;              // [T] path length
  std::vector<int32_t> rank;               // [T] last rank of the path (-1 for the root)
  // [T - 1] the non-root nodes in the order the choices list gave their paths. Medusa's lists
  // (mc_sim_7b_63, scripts/medusa_tree_from_stats.py) are in order of expected gain, parents
  // first, so a tree cut to a budget keeps a prefix of this order (MedusaProposer::tree_for).
  std::vector<int32_t> listed;

  int32_t size() const { return static_cast<int32_t>(parent.size()); }
  int32_t max_depth() const;
  // [max_depth()] entry d: 1 + the largest rank used at depth d + 1 (candidates needed there).
  std::vector<int32_t> ranks_needed_per_depth() const;
};

// Validates `choices` in the order given: no empty path, no negative or >= top_k rank, no
// duplicate, every proper prefix listed earlier (a child may not precede its parent), at most
// max_nodes - 1 paths and max_depth ranks per path. Throws kInvalidArgument naming the bad path
// ("tree 'x': path [0,3] is listed before its parent [0]"). `name` names the list in messages.
StaticTree build_static_tree(const TreeChoices& choices, const std::string& name,
                             const TreeChoicesLimits& limits = {});

// JSON text: a list of paths ("[[0],[0,0],[1]]"), or an object whose "choices" member is one.
StaticTree parse_tree_choices(std::string_view json_text, const std::string& name,
                              const TreeChoicesLimits& limits = {});

// A JSON file holding what parse_tree_choices accepts. kNotFound if it cannot be read.
StaticTree load_tree_choices_file(const std::string& path, const TreeChoicesLimits& limits = {});

// Built-in lists: "mc_sim_7b_63" (Medusa's default: 63 paths, depth 4), "chain-N" (N rank-0
// nodes in a line), "product-K1-K2-..." (the Cartesian tree: every rank < K1 at depth 1, each
// followed by every rank < K2 at depth 2, ...; Medusa-1's top-k per head). kInvalidArgument
// listing the known names for anything else.
TreeChoices named_tree_choices(const std::string& name);

// A name as above, else inline JSON (text starting with '[' or '{'), else a JSON file path.
StaticTree resolve_static_tree(const std::string& spec, const TreeChoicesLimits& limits = {});

// Fills the static tree with tokens: root_token at node 0 and, for a node with path p,
// topk_per_depth[len(p) - 1][p.back()] (Medusa: the token depends only on the depth and the last
// rank). topk_per_depth: [>= max_depth()][>= ranks needed at that depth] token ids, best first.
// The result is deterministic (q_row empty: q = one-hot per child). kInvalidArgument when a list
// is missing or too short.
DraftTree instantiate(const StaticTree& tree, int32_t root_token,
                      const std::vector<std::vector<int32_t>>& topk_per_depth);

}  // namespace arbor
