#include "engine/spec/eagle_tree.h"

#include <algorithm>
#include <numeric>

#include "engine/core/error.h"
#include "engine/core/host_math.h"

namespace arbor {

namespace {

// Indices into `cands` [begin, end) of the k best scores, best first; ties: lower index first.
using Candidate = DynamicTreeGrower::Candidate;

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
    for (int32_t id : host_math::top_k(row, k)) {
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

DynamicTreeGrower::DynamicTreeGrower(int32_t root_token, const TopKRows& root,
                                     const DynamicTreeParams& params,
                                     const std::function<int32_t(int32_t)>& to_target)
    : root_token_(root_token), params_(params), to_target_(to_target), top_k_(root.k) {
  ARBOR_CHECK(params.total_tokens >= 1 && params.depth >= 0 && params.top_k >= 1);
  ARBOR_CHECK(root.k >= 1 && root.k <= params.top_k && root.rows() == 1 &&
              root.values.size() == root.ids.size());
  if (params.total_tokens == 1) {
    done_ = true;
    return;
  }
  for (int32_t j = 0; j < top_k_; ++j)
    cands_.push_back(
        {root.values[static_cast<size_t>(j)], to_target_(root.ids[static_cast<size_t>(j)]), -1});
  frontier_.resize(cands_.size());
  std::iota(frontier_.begin(), frontier_.end(), 0);
  parent_row_.assign(cands_.size(), -1);
  done_ = params.depth == 0;
}

std::vector<FrontierNode> DynamicTreeGrower::frontier() const {
  std::vector<FrontierNode> nodes(frontier_.size());
  for (size_t r = 0; r < frontier_.size(); ++r)
    nodes[r] = {parent_row_[r], cands_[static_cast<size_t>(frontier_[r])].token};
  return nodes;
}

void DynamicTreeGrower::absorb(const TopKRows& rows) {
  ARBOR_CHECK(!done_ && rows.k == top_k_ && rows.rows() == static_cast<int32_t>(frontier_.size()) &&
              rows.values.size() == rows.ids.size());
  ++step_;
  const int32_t group_begin = static_cast<int32_t>(cands_.size());
  std::vector<int32_t> row_of_candidate;  // for the next frontier's parent rows
  for (size_t r = 0; r < frontier_.size(); ++r) {
    const float base = cands_[static_cast<size_t>(frontier_[r])].score;
    for (int32_t j = 0; j < top_k_; ++j) {
      const size_t e = r * static_cast<size_t>(top_k_) + static_cast<size_t>(j);
      cands_.push_back({base + rows.values[e], to_target_(rows.ids[e]), frontier_[r]});
      row_of_candidate.push_back(static_cast<int32_t>(r));
    }
  }
  if (step_ == params_.depth) {
    done_ = true;
    return;
  }
  frontier_ = best_of(cands_, group_begin, static_cast<int32_t>(cands_.size()), top_k_);
  parent_row_.assign(frontier_.size(), -1);
  for (size_t r = 0; r < frontier_.size(); ++r)
    parent_row_[r] = row_of_candidate[static_cast<size_t>(frontier_[r] - group_begin)];
}

DraftTree DynamicTreeGrower::tree() const {
  ARBOR_CHECK(done_);
  DraftTree tree = DraftTree::root_only(root_token_);
  if (params_.total_tokens == 1) return tree;
  std::vector<int32_t> chosen =
      best_of(cands_, 0, static_cast<int32_t>(cands_.size()), params_.total_tokens - 1);
  std::sort(chosen.begin(), chosen.end());
  std::vector<int32_t> node_of(cands_.size(), -1);
  for (int32_t c : chosen) {
    const Candidate& cand = cands_[static_cast<size_t>(c)];
    const int32_t parent = cand.parent < 0 ? 0 : node_of[static_cast<size_t>(cand.parent)];
    ARBOR_CHECK(parent >= 0,
                "dynamic tree: candidate " + std::to_string(c) + " was kept without its parent");
    node_of[static_cast<size_t>(c)] = tree.size();
    tree.parent.push_back(parent);
    tree.token.push_back(cand.token);
  }
  return tree;
}

DraftTree grow_dynamic_tree_top_k(int32_t root_token, const TopKRows& root,
                                  const DynamicTreeParams& params,
                                  const std::function<int32_t(int32_t)>& to_target,
                                  const FrontierExpandTopK& expand) {
  DynamicTreeGrower g(root_token, root, params, to_target);
  while (!g.done()) g.absorb(expand(g.step() + 1, g.frontier()));
  return g.tree();
}

}  // namespace arbor
