// The state of Backend::draft_frontier_* in host memory: the CPU backend's implementation, and
// the rule the CUDA kernels (kernels/sampling/draft_frontier.cu) follow bit for bit.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace arbor {

// Backend::draft_frontier_begin's arguments against each other and the kept roots (the last
// draft_frontier_roots: rows of width kept_k): kInvalidArgument naming the bad size or row.
void check_draft_frontier_begin(int32_t groups, int32_t k, int32_t max_depth,
                                std::span<const int32_t> ids, std::span<const float> values,
                                std::span<const int32_t> parent_rows,
                                std::span<const int32_t> positions, std::span<const int64_t> slots,
                                std::span<const int32_t> root_rows, int32_t kept_k,
                                int32_t kept_rows);

struct HostDraftFrontier {
  int32_t groups = 0, k = 0, max_depth = 0;
  std::vector<int32_t> ids;        // [G * k] draft ids
  std::vector<float> scores;       // [G * k] cumulative log-probabilities
  std::vector<int32_t> parent;     // [G * k] row of the next load's source
  std::vector<int32_t> path;       // [G * k, max_depth] key offsets, ancestors first
  std::vector<int32_t> positions;  // [G * k] RoPE positions at depth 1
  // [G * k] added to each row's key path offsets (shift(): the tree's slots lie that many
  // logical keys past its moved-back key_path_base)
  std::vector<int32_t> path_shift;
  std::vector<int64_t> slots;       // [max_depth, G * k] K/V slots
  std::vector<int32_t> log_ids;     // [depths][G * k][k]
  std::vector<float> log_values;    // same
  std::vector<int32_t> log_chosen;  // [depths - 1][G * k] the candidate (r * k + j) of each rank
  std::vector<int32_t> first_ids;   // [G * k] the first frontier (the roots' top-k)
  std::vector<float> first_values;
  std::vector<int32_t> root_rows;  // begin's (the kept roots the first frontier read)
  int32_t root_k = 0;              // draft_frontier_roots: [R, root_k] ids and values
  std::vector<int32_t> root_ids;
  std::vector<float> root_values;

  // Backend::draft_frontier_begin (kInvalidArgument naming the bad size).
  void begin(int32_t groups, int32_t k, int32_t max_depth, std::span<const int32_t> ids,
             std::span<const float> values, std::span<const int32_t> parent_rows,
             std::span<const int32_t> positions, std::span<const int64_t> slots,
             std::span<const int32_t> root_rows);
  // Backend::draft_frontier_shift's part in the frontier: tree g's depth-1 positions move back
  // by by[g], its key path offsets move forward by by[g] (its slots stay where they are) and
  // its first frontier is re-read from kept root row root_rows[g] - by[g].
  void shift(std::span<const int32_t> by);
  // Checks a load of depth d (1-based) is in order (kInvalidArgument otherwise).
  void check_depth(int32_t depth, const char* op) const;
  // Depth d's top-k rows [G * k][k] (ids, log-probabilities): logged, and the next frontier
  // chosen (Backend::draft_frontier_expand).
  void expand(int32_t depth, std::span<const int32_t> top_ids, std::span<const float> top_values);
  int32_t rows() const { return groups * k; }
  int32_t depths_logged() const {
    return rows() > 0 ? static_cast<int32_t>(log_ids.size()) / (rows() * k) : 0;
  }
};

// Most candidates (k + depth * k * k) of one tree draft_frontier_trees picks from (the CUDA
// kernel's shared memory; kernels/sampling/device_tree.h).
inline constexpr int32_t kMaxDraftTreeCandidates = 2048;

// The candidates a tree grown `depth` expansions deep from top-k rows of width k chooses from:
// the root's k children, then k * k per expansion.
inline int64_t draft_tree_candidates(int32_t k, int32_t depth) {
  return k + static_cast<int64_t>(depth) * k * k;
}

// The nodes of a tree grown `depth` expansions deep from top-k rows of width k with a budget of
// total_tokens: 1 + min(total_tokens - 1, k + depth * k * k) (DynamicTreeGrower::tree()'s).
int32_t draft_tree_nodes(int32_t k, int32_t depth, int32_t total_tokens);

// Backend::draft_frontier_trees' arguments against a frontier of `groups` trees of width k with
// `logged` depths: kInvalidArgument naming the bad size, depth or node count.
void check_draft_frontier_trees(int32_t groups, int32_t k, int32_t logged,
                                std::span<const int32_t> depth, std::span<const int32_t> nodes,
                                int32_t stride);

// Backend::draft_frontier_trees on the host: every group's final tree from the frontier's log,
// out [G, 2, stride] (kernels/sampling/device_tree.h's draft_tree_select, bit for bit; the
// candidates and choice of DynamicTreeGrower::tree()). vocab_offset: set_draft_vocab_map's.
void select_draft_trees(const HostDraftFrontier& f, std::span<const int32_t> depth,
                        std::span<const int32_t> nodes, int32_t stride,
                        std::span<const int64_t> vocab_offset, std::vector<int32_t>* out);

}  // namespace arbor
