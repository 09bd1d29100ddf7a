#include "engine/spec/medusa_proposer.h"

#include <algorithm>

#include "engine/core/error.h"
#include "engine/core/host_math.h"

namespace arbor {

MedusaProposer::MedusaProposer(MedusaHeads heads, StaticTree tree, std::unique_ptr<Backend> backend,
                               int paths_on_device)
    : heads_(std::move(heads)),
      tree_(std::move(tree)),
      paths_on_device_(paths_on_device),
      tracker_("medusa", FeedbackShape{heads_.vocab_size, heads_.hidden_size, 0, 0}) {
  if (tree_.max_depth() > heads_.num_heads())
    throw_error(ErrorCode::kInvalidArgument,
                "Medusa: tree '" + tree_.name + "' has depth " + std::to_string(tree_.max_depth()) +
                    " but " + heads_.source + " holds " + std::to_string(heads_.num_heads()) +
                    " heads (one per depth)");
  const std::vector<int32_t> needed = tree_.ranks_needed_per_depth();
  for (size_t d = 0; d < needed.size(); ++d)
    if (needed[d] > heads_.vocab_size)
      throw_error(ErrorCode::kInvalidArgument,
                  "Medusa: tree '" + tree_.name + "' needs " + std::to_string(needed[d]) +
                      " candidates at depth " + std::to_string(d + 1) + ", the vocabulary has " +
                      std::to_string(heads_.vocab_size));
  if (backend != nullptr) device_ = std::make_unique<MedusaDeviceHeads>(std::move(backend), heads_);
}

void MedusaProposer::begin(RequestId request, std::span<const int32_t> prompt) {
  tracker_.begin(request, prompt);
  last_hidden_[request].clear();
}

void MedusaProposer::observe(const TargetFeedback& feedback) {
  tracker_.observe(feedback);
  const size_t n = feedback.tokens.size();
  // A path whose rows went through the heads on the device: its last row's ids are there.
  // Any other feedback makes an earlier such row stale.
  path_row_.erase(feedback.request);
  if (const auto it = path_rows_.find(feedback.request); it != path_rows_.end()) {
    const auto [first, room] = it->second;
    path_rows_.erase(it);
    if (n >= 1 && static_cast<int32_t>(n) <= room)
      path_row_[feedback.request] = first + static_cast<int32_t>(n) - 1;
  }
  if (n == 0) return;
  const size_t h = static_cast<size_t>(heads_.hidden_size);
  auto last = feedback.hidden.subspan((n - 1) * h, h);
  last_hidden_[feedback.request].assign(last.begin(), last.end());
}

bool MedusaProposer::fork(RequestId src, RequestId dst) {
  tracker_.fork(src, dst);
  auto it = last_hidden_.find(src);
  if (it != last_hidden_.end()) last_hidden_[dst] = it->second;
  return true;
}

const StaticTree& MedusaProposer::tree_for(const TreeBudget& budget) {
  if (budget.max_nodes >= tree_.size() && budget.max_depth >= tree_.max_depth()) return tree_;
  const auto key = std::make_pair(budget.max_nodes, budget.max_depth);
  auto it = cut_trees_.find(key);
  if (it != cut_trees_.end()) return it->second;
  // The first nodes in the order the choices were listed (Medusa's lists rank them by expected
  // gain): every parent is listed before its children, so a prefix of the (depth-filtered) list
  // is a tree.
  TreeChoices kept;
  for (int32_t i : tree_.listed) {
    if (static_cast<int32_t>(kept.size()) + 1 >= budget.max_nodes) break;
    if (tree_.depth[static_cast<size_t>(i)] <= budget.max_depth)
      kept.push_back(tree_.path[static_cast<size_t>(i)]);
  }
  TreeChoicesLimits limits;
  limits.top_k = std::max<int32_t>(1, static_cast<int32_t>(heads_.vocab_size));
  limits.max_nodes = std::max(budget.max_nodes, 1);
  limits.max_depth = std::max(budget.max_depth, 1);
  StaticTree cut = build_static_tree(kept,
                                     tree_.name + " (cut to " + std::to_string(budget.max_nodes) +
                                         " nodes, depth " + std::to_string(budget.max_depth) + ")",
                                     limits);
  return cut_trees_.emplace(key, std::move(cut)).first->second;
}

const std::vector<float>& MedusaProposer::hidden_of(RequestId request) const {
  const std::vector<float>& hidden = last_hidden_.at(request);
  if (hidden.empty())
    throw_error(ErrorCode::kInvalidArgument, "medusa proposer: propose for request " +
                                                 std::to_string(request) +
                                                 " before any feedback carried a hidden state");
  return hidden;
}

std::vector<std::vector<int32_t>> MedusaProposer::head_top_k(std::span<const float> hidden,
                                                             int64_t rows,
                                                             const std::vector<int32_t>& k) {
  if (device_ != nullptr) return device_->top_k(hidden, rows, k);
  // On the host, one row at a time (the reference path, as before batching).
  const size_t h = static_cast<size_t>(heads_.hidden_size);
  std::vector<std::vector<int32_t>> ids(k.size());
  for (int64_t r = 0; r < rows; ++r) {
    const std::vector<std::vector<float>> logits =
        medusa_head_logits(heads_, hidden.subspan(static_cast<size_t>(r) * h, h), 1);
    for (size_t d = 0; d < k.size(); ++d) {
      if (k[d] <= 0) continue;
      const std::vector<int32_t> top = host_math::top_k(logits[d], k[d]);
      ids[d].insert(ids[d].end(), top.begin(), top.end());
    }
  }
  return ids;
}

std::vector<DraftTree> MedusaProposer::propose_batch(
    const std::vector<std::pair<RequestId, TreeBudget>>& requests) {
  // One row per request with a tree; head d runs for the most candidates any tree needs at
  // depth d + 1 (a top-k list's first entries are the smaller top-k).
  struct Pending {
    const StaticTree* tree;
    int32_t root;
    std::vector<int32_t> needed;
  };
  std::vector<Pending> rows;
  std::vector<size_t> row_of(requests.size(), SIZE_MAX);
  std::vector<float> hidden;
  std::vector<int32_t> k;
  std::vector<DraftTree> out(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    const auto& [request, budget] = requests[i];
    tracker_.check_budget(request, budget);
    const int32_t root = tracker_.root(request);
    const std::vector<float>& h = hidden_of(request);
    const StaticTree& tree = tree_for(budget);
    if (tree.size() == 1) {
      out[i] = DraftTree::root_only(root);
      continue;
    }
    Pending p{&tree, root, tree.ranks_needed_per_depth()};
    if (k.size() < p.needed.size()) k.resize(p.needed.size(), 0);
    for (size_t d = 0; d < p.needed.size(); ++d) k[d] = std::max(k[d], p.needed[d]);
    row_of[i] = rows.size();
    rows.push_back(std::move(p));
    hidden.insert(hidden.end(), h.begin(), h.end());
  }
  // Every tree's row through the heads on the device already (observe_paths_on_device): those
  // ids, else one pass over the host's rows.
  std::vector<int32_t> device_row(requests.size(), -1);
  bool from_paths = tokens_on_device_ && !rows.empty();
  for (size_t i = 0; i < requests.size() && from_paths; ++i) {
    if (row_of[i] == SIZE_MAX) continue;
    const auto it = path_row_.find(requests[i].first);
    from_paths = it != path_row_.end();
    if (from_paths) device_row[i] = it->second;
  }
  path_row_.clear();
  path_rows_.clear();
  if (rows.empty()) return out;
  if (tokens_on_device_) {
    // Node i's token stays where the heads' top-k wrote it: rank[i] of head depth[i] - 1.
    const MedusaHeadIds on =
        from_paths ? path_ids_ : device_->top_k_ids(hidden, static_cast<int64_t>(rows.size()), k);
    for (size_t i = 0; i < requests.size(); ++i) {
      if (row_of[i] == SIZE_MAX) continue;
      const Pending& p = rows[row_of[i]];
      const StaticTree& tree = *p.tree;
      DraftTree& t = out[i];
      t.parent = tree.parent;
      t.token.assign(static_cast<size_t>(tree.size()), p.root);
      t.device.owner = &device_->backend();
      t.device.ids = on.ids;
      t.device.index.assign(static_cast<size_t>(tree.size()), -1);
      for (int32_t n = 1; n < tree.size(); ++n)
        t.device.index[static_cast<size_t>(n)] =
            on.index(static_cast<size_t>(tree.depth[n] - 1),
                     from_paths ? device_row[i] : static_cast<int64_t>(row_of[i]), tree.rank[n]);
    }
    return out;
  }
  const std::vector<std::vector<int32_t>> ids =
      head_top_k(hidden, static_cast<int64_t>(rows.size()), k);
  for (size_t i = 0; i < requests.size(); ++i) {
    if (row_of[i] == SIZE_MAX) continue;
    const size_t r = row_of[i];
    const Pending& p = rows[r];
    std::vector<std::vector<int32_t>> topk(p.needed.size());
    for (size_t d = 0; d < p.needed.size(); ++d) {
      const auto first = ids[d].begin() + static_cast<std::ptrdiff_t>(r * k[d]);
      topk[d].assign(first, first + p.needed[d]);
    }
    out[i] = instantiate(*p.tree, p.root, topk);
  }
  return out;
}

DraftTree MedusaProposer::propose(RequestId request, const TreeBudget& budget) {
  return propose_batch({{request, budget}})[0];
}

void MedusaProposer::set_tree_reader(Backend* reader) {
  tokens_on_device_ =
      device_ != nullptr && reader != nullptr && reader->shares_memory_with(device_->backend());
  reader_ = tokens_on_device_ ? reader : nullptr;
}

bool MedusaProposer::observes_paths_on_device() const {
  return tokens_on_device_ &&
         (paths_on_device_ == 1 || (paths_on_device_ == -1 && device_->backend().name() != "cpu"));
}

void MedusaProposer::observe_paths_on_device(std::span<const DevicePath> paths,
                                             const PathRowsOnDevice& rows) {
  path_rows_.clear();
  path_row_.clear();
  if (paths.empty() || rows.offset.empty() || rows.offset.back() < 1 ||
      rows.rows.cols != heads_.hidden_size)
    return;
  // Every row of the step's paths (the full tree's candidates per head: a cut tree reads the
  // first of them), on the device behind the target's step.
  device_->backend().wait_for(*reader_);
  path_ids_ = device_->top_k_ids(rows.rows, tree_.ranks_needed_per_depth());
  reader_->wait_for(device_->backend());
  for (const DevicePath& p : paths) {
    if (p.item < 0 || static_cast<size_t>(p.item) + 1 >= rows.offset.size()) continue;
    const int32_t first = rows.offset[static_cast<size_t>(p.item)];
    path_rows_[p.request] = {first, rows.offset[static_cast<size_t>(p.item) + 1] - first};
  }
}

void MedusaProposer::end(RequestId request) {
  tracker_.end(request);
  last_hidden_.erase(request);
  path_rows_.erase(request);
  path_row_.erase(request);
}

}  // namespace arbor
