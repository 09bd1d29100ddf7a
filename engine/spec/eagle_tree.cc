#include "engine/spec/eagle_tree.h"

#include <algorithm>
#include <numeric>

#include "engine/core/error.h"
#include "engine/spec/proposer_math.h"

namespace arbor {

namespace {

struct Candidate {
  float score;     // cumulative log-probability from the root
  int32_t token;   // target id
  int32_t parent;  // candidate index, -1 for the root
};

// Indices into `cands` [begin, end) of the k best scores, best first; ties: lower index first.
std::vector<int32_t> best_of(const std::vector<Candidate>& cands, int32_t begin, int32_t end,
                             int32_t k) {
  std::vector<int32_t> index(static_cast<size_t>(end - begin));
  std::iota(index.begin(), index.end(), begin);
  k = std::min<int32_t>(k, static_cast<int32_t>(index.size()));
  std::partial_sort(index.begin(), index.begin() + k, index.end(), [&](int32_t a, int32_t b) {
    return cands[a].score > cands[b].score || (cands[a].score == cands[b].score && a < b);
  });
  index.resize(static_cast<size_t>(k));
  return index;
}

}  // namespace

namespace {

TopKRows top_k_of(std::span<const float> rows, int64_t vocab, int32_t k) {
  TopKRows out;
  out.k = k;
  const int64_t n = static_cast<int64_t>(rows.size()) / vocab;
  for (int64_t r = 0; r < n; ++r) {
    std::span<const float> row =
        rows.subspan(static_cast<size_t>(r * vocab), static_cast<size_t>(vocab));
    for (int32_t id : spec_math::top_k(row, k)) {
      out.ids.push_back(id);
      out.values.push_back(row[id]);
    }
  }
  return out;
}

}  // namespace

DraftTree grow_dynamic_tree(int32_t root_token, std::span<const float> root_log_probs,
                            const DynamicTreeParams& params,
                            const std::function<int32_t(int32_t)>& to_target,
                            const FrontierExpand& expand) {
  ARBOR_CHECK(params.total_tokens >= 1 && params.depth >= 0 && params.top_k >= 1);
  const int64_t vocab = static_cast<int64_t>(root_log_probs.size());
  ARBOR_CHECK(vocab > 0);
  const int32_t top_k = static_cast<int32_t>(std::min<int64_t>(params.top_k, vocab));
  return grow_dynamic_tree_top_k(root_token, top_k_of(root_log_probs, vocab, top_k), params,
                                 to_target,
                                 [&](int32_t step, const std::vector<FrontierNode>& frontier) {
                                   const std::vector<float> log_probs = expand(step, frontier);
                                   ARBOR_CHECK(static_cast<int64_t>(log_probs.size()) ==
                                               static_cast<int64_t>(frontier.size()) * vocab);
                                   return top_k_of(log_probs, vocab, top_k);
                                 });
}

DraftTree grow_dynamic_tree_top_k(int32_t root_token, const TopKRows& root,
                                  const DynamicTreeParams& params,
                                  const std::function<int32_t(int32_t)>& to_target,
                                  const FrontierExpandTopK& expand) {
  ARBOR_CHECK(params.total_tokens >= 1 && params.depth >= 0 && params.top_k >= 1);
  ARBOR_CHECK(root.k >= 1 && root.k <= params.top_k && root.rows() == 1 &&
              root.values.size() == root.ids.size());
  if (params.total_tokens == 1) return DraftTree::root_only(root_token);
  const int32_t top_k = root.k;

  std::vector<Candidate> cands;  // in the official flat order
  for (int32_t j = 0; j < top_k; ++j)
    cands.push_back(
        {root.values[static_cast<size_t>(j)], to_target(root.ids[static_cast<size_t>(j)]), -1});
  std::vector<int32_t> frontier(cands.size());  // candidate indices, in row order
  std::iota(frontier.begin(), frontier.end(), 0);
  std::vector<int32_t> parent_row(cands.size(), -1);  // frontier row -> parent's previous row

  for (int32_t step = 1; step <= params.depth; ++step) {
    std::vector<FrontierNode> nodes(frontier.size());
    for (size_t r = 0; r < frontier.size(); ++r)
      nodes[r] = {parent_row[r], cands[frontier[r]].token};
    const TopKRows rows = expand(step, nodes);
    ARBOR_CHECK(rows.k == top_k && rows.rows() == static_cast<int32_t>(frontier.size()) &&
                rows.values.size() == rows.ids.size());
    const int32_t group_begin = static_cast<int32_t>(cands.size());
    std::vector<int32_t> row_of_candidate;  // for the next frontier's parent rows
    for (size_t r = 0; r < frontier.size(); ++r) {
      const float base = cands[frontier[r]].score;
      for (int32_t j = 0; j < top_k; ++j) {
        const size_t e = r * static_cast<size_t>(top_k) + static_cast<size_t>(j);
        cands.push_back({base + rows.values[e], to_target(rows.ids[e]), frontier[r]});
        row_of_candidate.push_back(static_cast<int32_t>(r));
      }
    }
    if (step == params.depth) break;
    frontier = best_of(cands, group_begin, static_cast<int32_t>(cands.size()), top_k);
    parent_row.assign(frontier.size(), -1);
    for (size_t r = 0; r < frontier.size(); ++r)
      parent_row[r] = row_of_candidate[frontier[r] - group_begin];
  }

  std::vector<int32_t> chosen =
      best_of(cands, 0, static_cast<int32_t>(cands.size()), params.total_tokens - 1);
  std::sort(chosen.begin(), chosen.end());
  std::vector<int32_t> node_of(cands.size(), -1);
  DraftTree tree = DraftTree::root_only(root_token);
  for (int32_t c : chosen) {
    const int32_t parent = cands[c].parent < 0 ? 0 : node_of[cands[c].parent];
    ARBOR_CHECK(parent >= 0,
                "dynamic tree: candidate " + std::to_string(c) + " was kept without its parent");
    node_of[c] = tree.size();
    tree.parent.push_back(parent);
    tree.token.push_back(cands[c].token);
  }
  return tree;
}

}  // namespace arbor
