#include "engine/backend/draft_frontier.h"

#include <algorithm>
#include <numeric>
#include <string>

#include "engine/core/error.h"

namespace arbor {

void check_draft_frontier_begin(int32_t groups, int32_t k, int32_t max_depth,
                                std::span<const int32_t> ids, std::span<const float> values,
                                std::span<const int32_t> parent_rows,
                                std::span<const int32_t> positions, std::span<const int64_t> slots,
                                std::span<const int32_t> root_rows, int32_t kept_k,
                                int32_t kept_rows) {
  const auto n = static_cast<size_t>(std::max(groups, 0)) * static_cast<size_t>(std::max(k, 0));
  if (groups < 1 || k < 1 || k > 32 || max_depth < 1 || max_depth > 32 || ids.size() != n ||
      values.size() != n || parent_rows.size() != n || positions.size() != n ||
      slots.size() != n * static_cast<size_t>(max_depth))
    throw_error(ErrorCode::kInvalidArgument,
                "draft_frontier_begin: " + std::to_string(groups) + " trees of width " +
                    std::to_string(k) + " (1..32), " + std::to_string(max_depth) +
                    " depths (1..32), " + std::to_string(ids.size()) + " ids, " +
                    std::to_string(values.size()) + " values, " +
                    std::to_string(parent_rows.size()) + " parent rows, " +
                    std::to_string(positions.size()) + " positions, " +
                    std::to_string(slots.size()) + " slots");
  if (root_rows.size() > static_cast<size_t>(groups) || (!root_rows.empty() && kept_k != k))
    throw_error(ErrorCode::kInvalidArgument,
                "draft_frontier_begin: " + std::to_string(root_rows.size()) + " device roots for " +
                    std::to_string(groups) + " trees of width " + std::to_string(k) +
                    ", the last draft_frontier_roots kept width " + std::to_string(kept_k));
  for (int32_t r : root_rows)
    if (r < 0 || r >= kept_rows)
      throw_error(ErrorCode::kInvalidArgument, "draft_frontier_begin: root row " +
                                                   std::to_string(r) + " of " +
                                                   std::to_string(kept_rows));
}

void HostDraftFrontier::begin(int32_t g, int32_t kk, int32_t depth,
                              std::span<const int32_t> start_ids, std::span<const float> values,
                              std::span<const int32_t> parent_rows,
                              std::span<const int32_t> first_positions,
                              std::span<const int64_t> all_slots,
                              std::span<const int32_t> root_rows_in) {
  check_draft_frontier_begin(g, kk, depth, start_ids, values, parent_rows, first_positions,
                             all_slots, root_rows_in, root_k,
                             root_k > 0 ? static_cast<int32_t>(root_ids.size()) / root_k : 0);
  const auto n = static_cast<size_t>(g) * static_cast<size_t>(kk);
  groups = g;
  k = kk;
  max_depth = depth;
  ids.assign(start_ids.begin(), start_ids.end());
  scores.assign(values.begin(), values.end());
  for (size_t t = 0; t < root_rows_in.size(); ++t) {  // from the kept root rows
    for (int32_t r = 0; r < kk; ++r) {
      const auto from = static_cast<size_t>(root_rows_in[t] * kk + r);
      ids[t * static_cast<size_t>(kk) + static_cast<size_t>(r)] = root_ids[from];
      scores[t * static_cast<size_t>(kk) + static_cast<size_t>(r)] = root_values[from];
    }
  }
  first_ids = ids;
  first_values = scores;
  root_rows.assign(root_rows_in.begin(), root_rows_in.end());
  parent.assign(parent_rows.begin(), parent_rows.end());
  positions.assign(first_positions.begin(), first_positions.end());
  path_shift.assign(n, 0);
  slots.assign(all_slots.begin(), all_slots.end());
  path.assign(n * static_cast<size_t>(depth), 0);
  for (size_t row = 0; row < n; ++row)
    path[row * static_cast<size_t>(depth)] = static_cast<int32_t>(row % static_cast<size_t>(kk));
  log_ids.clear();
  log_values.clear();
  log_chosen.clear();
}

void HostDraftFrontier::shift(std::span<const int32_t> by) {
  const auto g = static_cast<size_t>(groups);
  const int32_t kept = root_k > 0 ? static_cast<int32_t>(root_ids.size()) / root_k : 0;
  bool ok = by.size() == g && root_rows.size() == g && root_k == k;
  for (size_t t = 0; ok && t < g; ++t)
    ok = by[t] >= 0 && root_rows[t] - by[t] >= 0 && root_rows[t] < kept;
  if (!ok)
    throw_error(ErrorCode::kInvalidArgument, "draft_frontier_shift: " + std::to_string(by.size()) +
                                                 " trees of " + std::to_string(groups) +
                                                 " begun with " + std::to_string(root_rows.size()) +
                                                 " kept roots (each moved within them)");
  for (size_t t = 0; t < g; ++t)
    for (int32_t r = 0; r < k; ++r) {
      const size_t i = t * static_cast<size_t>(k) + static_cast<size_t>(r);
      const auto from = static_cast<size_t>((root_rows[t] - by[t]) * k + r);
      ids[i] = first_ids[i] = root_ids[from];
      scores[i] = first_values[i] = root_values[from];
      positions[i] -= by[t];
      path_shift[i] = by[t];
    }
}

void HostDraftFrontier::check_depth(int32_t depth, const char* op) const {
  if (groups == 0 || depth != depths_logged() + 1 || depth > max_depth)
    throw_error(ErrorCode::kInvalidArgument, std::string(op) + ": depth " + std::to_string(depth) +
                                                 " after " + std::to_string(depths_logged()) +
                                                 " of at most " + std::to_string(max_depth) +
                                                 (groups == 0 ? " (no draft_frontier_begin)" : ""));
}

void HostDraftFrontier::expand(int32_t depth, std::span<const int32_t> top_ids,
                               std::span<const float> top_values) {
  check_depth(depth, "draft_frontier_expand");
  const size_t n = static_cast<size_t>(rows()), kk = static_cast<size_t>(k);
  ARBOR_CHECK(top_ids.size() == n * kk && top_values.size() == n * kk);
  log_ids.insert(log_ids.end(), top_ids.begin(), top_ids.end());
  log_values.insert(log_values.end(), top_values.begin(), top_values.end());
  if (depth == max_depth) return;  // no frontier after the last depth
  std::vector<int32_t> next_ids(n), next_parent(n), next_path(path.size()), chosen(n);
  std::vector<float> next_scores(n);
  std::vector<float> cand(kk * kk);
  std::vector<int32_t> order(kk * kk);
  const auto width = static_cast<size_t>(max_depth);
  for (size_t g = 0; g < static_cast<size_t>(groups); ++g) {
    for (size_t c = 0; c < kk * kk; ++c) {
      const size_t row = g * kk + c / kk;
      cand[c] = scores[row] + top_values[row * kk + c % kk];
    }
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(
        order.begin(), order.begin() + static_cast<int64_t>(kk), order.end(),
        [&](int32_t a, int32_t b) { return cand[a] > cand[b] || (cand[a] == cand[b] && a < b); });
    for (size_t rank = 0; rank < kk; ++rank) {
      const auto c = static_cast<size_t>(order[rank]);
      const size_t row = g * kk + c / kk, out = g * kk + rank;
      next_ids[out] = top_ids[row * kk + c % kk];
      next_scores[out] = cand[c];
      next_parent[out] = static_cast<int32_t>(row);
      chosen[out] = static_cast<int32_t>(c);
      std::copy_n(path.begin() + static_cast<int64_t>(row * width), depth,
                  next_path.begin() + static_cast<int64_t>(out * width));
      next_path[out * width + static_cast<size_t>(depth)] = depth * k + static_cast<int32_t>(rank);
    }
  }
  ids = std::move(next_ids);
  scores = std::move(next_scores);
  parent = std::move(next_parent);
  path = std::move(next_path);
  log_chosen.insert(log_chosen.end(), chosen.begin(), chosen.end());
}

int32_t draft_tree_nodes(int32_t k, int32_t depth, int32_t total_tokens) {
  return static_cast<int32_t>(1 +
                              std::min<int64_t>(total_tokens - 1, draft_tree_candidates(k, depth)));
}

void check_draft_frontier_trees(int32_t groups, int32_t k, int32_t logged,
                                std::span<const int32_t> depth, std::span<const int32_t> nodes,
                                int32_t stride) {
  if (groups < 1 || depth.size() != static_cast<size_t>(groups) ||
      nodes.size() != static_cast<size_t>(groups) || stride < 1)
    throw_error(ErrorCode::kInvalidArgument,
                "draft_frontier_trees: " + std::to_string(depth.size()) + " depths and " +
                    std::to_string(nodes.size()) + " node counts for " + std::to_string(groups) +
                    " trees, stride " + std::to_string(stride));
  for (int32_t g = 0; g < groups; ++g) {
    const int32_t d = depth[static_cast<size_t>(g)], t = nodes[static_cast<size_t>(g)];
    const int64_t candidates = draft_tree_candidates(k, std::max(d, 0));
    if (d < 0 || d > logged || candidates > kMaxDraftTreeCandidates || t < 1 ||
        t > 1 + candidates || t > stride)
      throw_error(ErrorCode::kInvalidArgument,
                  "draft_frontier_trees: tree " + std::to_string(g) + " of " + std::to_string(d) +
                      " expansions (" + std::to_string(logged) + " logged, at most " +
                      std::to_string(kMaxDraftTreeCandidates) + " candidates) and " +
                      std::to_string(t) + " nodes (stride " + std::to_string(stride) + ")");
  }
}

void select_draft_trees(const HostDraftFrontier& f, std::span<const int32_t> depth,
                        std::span<const int32_t> nodes, int32_t stride,
                        std::span<const int64_t> vocab_offset, std::vector<int32_t>* out) {
  check_draft_frontier_trees(f.groups, f.k, f.depths_logged(), depth, nodes, stride);
  const int32_t k = f.k, kk = k * k;
  const auto rows = static_cast<int64_t>(f.rows());
  out->assign(static_cast<size_t>(f.groups) * 2 * static_cast<size_t>(stride), 0);
  std::vector<float> score;
  std::vector<int32_t> parent, id, node;
  for (int32_t g = 0; g < f.groups; ++g) {
    const int32_t d = depth[static_cast<size_t>(g)];
    const int32_t n = k + d * kk;
    score.assign(static_cast<size_t>(n), 0.f);
    parent.assign(static_cast<size_t>(n), -1);
    id.assign(static_cast<size_t>(n), 0);
    for (int32_t c = 0; c < k; ++c) {
      score[static_cast<size_t>(c)] = f.first_values[static_cast<size_t>(g * k + c)];
      id[static_cast<size_t>(c)] = f.first_ids[static_cast<size_t>(g * k + c)];
    }
    for (int32_t s = 1; s <= d; ++s)
      for (int32_t c = 0; c < kk; ++c) {
        const int32_t r = c / k, j = c % k, at = k + (s - 1) * kk + c;
        const int32_t from =
            s == 1
                ? r
                : k + (s - 2) * kk + f.log_chosen[static_cast<size_t>((s - 2) * rows + g * k + r)];
        const auto e = static_cast<size_t>(((s - 1) * rows + g * k + r) * k + j);
        score[static_cast<size_t>(at)] = score[static_cast<size_t>(from)] + f.log_values[e];
        id[static_cast<size_t>(at)] = f.log_ids[e];
        parent[static_cast<size_t>(at)] = from;
      }
    // The nodes - 1 best (higher score, ties to the lower index), numbered in candidate order.
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    const int32_t keep = nodes[static_cast<size_t>(g)] - 1;
    std::partial_sort(order.begin(), order.begin() + keep, order.end(), [&](int32_t a, int32_t b) {
      return score[static_cast<size_t>(a)] > score[static_cast<size_t>(b)] ||
             (score[static_cast<size_t>(a)] == score[static_cast<size_t>(b)] && a < b);
    });
    order.resize(static_cast<size_t>(keep));
    std::sort(order.begin(), order.end());
    node.assign(static_cast<size_t>(n), -1);
    int32_t* tokens = out->data() + static_cast<size_t>(g) * 2 * static_cast<size_t>(stride);
    int32_t* parents = tokens + stride;
    parents[0] = -1;
    for (size_t i = 0; i < order.size(); ++i) {
      const auto c = static_cast<size_t>(order[i]);
      const int32_t at = static_cast<int32_t>(i) + 1;
      node[c] = at;
      const int32_t draft_id = id[c];
      tokens[at] =
          vocab_offset.empty()
              ? draft_id
              : static_cast<int32_t>(draft_id + vocab_offset[static_cast<size_t>(draft_id)]);
      const int32_t from = parent[c];
      parents[at] =
          from < 0 || node[static_cast<size_t>(from)] < 0 ? 0 : node[static_cast<size_t>(from)];
    }
  }
}

}  // namespace arbor
