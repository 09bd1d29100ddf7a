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
  std::vector<int64_t> slots;      // [max_depth, G * k] K/V slots
  std::vector<int32_t> log_ids;    // [depths][G * k][k]
  std::vector<float> log_values;   // same
  std::vector<int32_t> first_ids;  // [G * k] the first frontier (the roots' top-k)
  std::vector<float> first_values;
  int32_t root_k = 0;  // draft_frontier_roots: [R, root_k] ids and values
  std::vector<int32_t> root_ids;
  std::vector<float> root_values;

  // Backend::draft_frontier_begin (kInvalidArgument naming the bad size).
  void begin(int32_t groups, int32_t k, int32_t max_depth, std::span<const int32_t> ids,
             std::span<const float> values, std::span<const int32_t> parent_rows,
             std::span<const int32_t> positions, std::span<const int64_t> slots,
             std::span<const int32_t> root_rows);
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

}  // namespace arbor
