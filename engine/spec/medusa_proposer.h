// The Medusa proposer: the heads read the target's final-norm hidden state at the last committed
// position; head d's top-k candidates fill depth d + 1 of a static tree (Medusa's
// generate_candidates: the node with path [r1..rd] gets rank rd of head d), rooted at the
// target's own next token. Proposals are deterministic (q = one-hot).
#pragma once

#include <map>
#include <memory>
#include <unordered_map>
#include <utility>

#include "engine/draft/medusa_device_heads.h"
#include "engine/draft/medusa_heads.h"
#include "engine/spec/feedback_tracker.h"
#include "engine/spec/proposer.h"
#include "engine/spec/tree_choices.h"

namespace arbor {

class MedusaProposer final : public Proposer {
 public:
  // kInvalidArgument when the tree is deeper than the number of heads or needs more candidates
  // at some depth than the vocabulary holds.
  // backend: where the heads run (their top-k computed there, Backend::top_k_log_softmax, one
  // pass for every request of a step); nullptr = on the host (medusa_head_logits).
  // paths_on_device: the heads run on a verify step's accepted paths from its device results,
  // before its wait (observe_paths_on_device), for trees left on the device: -1 where the
  // backend is a GPU, 0 never, 1 whenever it can.
  MedusaProposer(MedusaHeads heads, StaticTree tree, std::unique_ptr<Backend> backend = nullptr,
                 int paths_on_device = -1);

  std::string name() const override { return "medusa"; }
  bool needs_hidden() const override { return true; }
  void begin(RequestId request, std::span<const int32_t> prompt) override;
  void observe(const TargetFeedback& feedback) override;
  // The static tree cut to the budget: its first nodes in the order its choices list gave them
  // (StaticTree::listed) of depth <= max_depth, at most max_nodes in all, in Medusa order.
  DraftTree propose(RequestId request, const TreeBudget& budget) override;
  // Every request's tree; with a backend, all their heads in one device pass.
  std::vector<DraftTree> propose_batch(
      const std::vector<std::pair<RequestId, TreeBudget>>& requests) override;
  void end(RequestId request) override;
  bool fork(RequestId src, RequestId dst) override;
  // With device heads on a backend `reader` shares memory with, proposals leave their tokens
  // there (DraftTree::device): the heads' top-k ids are not waited for.
  void set_tree_reader(Backend* reader) override;
  bool observes_paths_on_device() const override;
  // Every row of the paths (each tree's depth + 1) through the heads in one device pass, without
  // a wait; observe() then picks each path's last row, whose ids the next proposal reads there.
  void observe_paths_on_device(std::span<const DevicePath> paths,
                               const PathRowsOnDevice& rows) override;

  const MedusaHeads& heads() const { return heads_; }
  const StaticTree& tree() const { return tree_; }

  TransferStats draft_transfer_stats() const override {
    return device_ ? device_->transfer_stats() : TransferStats{};
  }

 private:
  const StaticTree& tree_for(const TreeBudget& budget);

  // The hidden state a proposal reads (kInvalidArgument before any feedback carried one).
  const std::vector<float>& hidden_of(RequestId request) const;
  // ids[d][row * k[d] + j]: head d's j-th best token for each row of hidden [rows, hidden]
  // (MedusaDeviceHeads::top_k's layout), on the device or on the host.
  std::vector<std::vector<int32_t>> head_top_k(std::span<const float> hidden, int64_t rows,
                                               const std::vector<int32_t>& k);

  MedusaHeads heads_;
  StaticTree tree_;
  std::unique_ptr<MedusaDeviceHeads> device_;  // null: heads on the host
  bool tokens_on_device_ = false;              // set_tree_reader found a reader
  Backend* reader_ = nullptr;                  // that reader (the target's backend)
  int paths_on_device_ = -1;
  // observe_paths_on_device's heads: their ids on the device and each path's rows there
  // (request -> first row, rows); observe() turns them into the row its proposal reads.
  MedusaHeadIds path_ids_;
  std::unordered_map<RequestId, std::pair<int32_t, int32_t>> path_rows_;
  std::unordered_map<RequestId, int32_t> path_row_;  // request -> its last path row there
  FeedbackTracker tracker_;
  std::unordered_map<RequestId, std::vector<float>> last_hidden_;  // [hidden] per request
  std::map<std::pair<int32_t, int32_t>, StaticTree> cut_trees_;    // (max_nodes, max_depth)
};

}  // namespace arbor
