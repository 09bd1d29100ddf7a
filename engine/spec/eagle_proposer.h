// The EAGLE proposer (EAGLE-1/2 and EAGLE-3 checkpoints): observe() feeds each committed position's
// (feature_t, token_{t+1}) pair through the draft layer into its own paged KV cache; propose()
// grows EAGLE-2's dynamic tree (eagle_tree.h) from the last committed row's output by running the
// draft over each frontier. Proposals are deterministic top-k (q = one-hot), as in the official
// code. Features: the target's final-norm hidden state (EAGLE-1/2) or its residual stream at the
// inputs of capture_layers() (EAGLE-3).
#pragma once

#include <memory>
#include <unordered_map>

#include "engine/draft/eagle_draft_model.h"
#include "engine/model/model_weights.h"
#include "engine/spec/eagle_tree.h"
#include "engine/spec/feedback_tracker.h"
#include "engine/spec/proposer.h"

namespace arbor {

struct EagleOptions {
  DynamicTreeParams tree;  // total_tokens, depth, top_k (bounded per call by TreeBudget)
  KvCacheConfig draft_kv = {2048, 16, false};  // the draft's own cache (no prefix caching)
  int num_threads = 0;  // BLAS threads of the draft's CPU backend (0 = library default)
  // propose_batch grows the trees on the draft's backend (EagleDraftModel::grow_trees: no host
  // wait between depths) instead of depth by depth on the host: -1 where the backend is a GPU,
  // 0 never, 1 whenever the backend can (the CPU backend too: the tests compare both).
  int grow_on_backend = -1;
  // Trees grown on the backend are also picked there (Backend::draft_frontier_trees): the verify
  // step reads their tokens and shape from the draft's memory, so the draft does not wait for
  // the device (the step's one wait is the verify's). -1 where the backend is a GPU, 0 never
  // (the grower replays the downloaded top-k), 1 whenever the backend can.
  int pick_on_backend = -1;
  // Verified paths run through the draft from the verify step's device results, queued behind
  // it before the host waits (observe_paths_on_device: the host's commit, feedback and plan then
  // overlap the draft's forward), for trees grown on the backend: -1 where the backend is a
  // GPU, 0 never, 1 whenever the backend can.
  int paths_on_device = -1;
  // With the paths on the device and trees picked there, the next step's trees also grow
  // before the host waits (the path's length read on the device: EagleDraftModel::grow_trees
  // with a PathShift), under the budgets of the trees just verified; the next propose_batch
  // takes them where its requests and budgets are the same, else grows its own: -1 where the
  // backend is a GPU, 0 never (the default: on the H200 it measured the same step time, since
  // the device, not the host, is busy between the draft's graphs; docs/speculation.md), 1
  // whenever the backend can.
  int grow_before_wait = 0;
  void validate() const;  // kInvalidArgument naming the field
};

class EagleProposer final : public Proposer {
 public:
  // `target` supplies the embeddings, the LM head (EAGLE-1/2) and the layer count (EAGLE-3
  // capture layers). backend: where the draft runs (nullptr = a private CPU backend).
  EagleProposer(const EagleWeights& weights, const ModelWeights& target,
                const EagleOptions& options, std::unique_ptr<Backend> backend = nullptr);

  std::string name() const override;
  bool needs_hidden() const override { return !draft_.eagle3(); }
  std::vector<int32_t> capture_layers() const override { return capture_layers_; }
  void begin(RequestId request, std::span<const int32_t> prompt) override;
  void observe(const TargetFeedback& feedback) override;
  // Every request's committed rows in one draft forward.
  void observe_batch(std::span<const TargetFeedback> feedbacks) override;
  bool observes_paths_on_device() const override;
  // Each path's rows (its tree's depth + 1, the path's length unknown yet) in one draft forward
  // into reserved draft slots, without a wait; observe_batch commits the path's length of them.
  // Paths of requests with rows waiting on the host (a backlog) are left to observe_batch.
  void observe_paths_on_device(std::span<const DevicePath> paths,
                               const PathRowsOnDevice& rows) override;
  // At most min(total_tokens, budget.max_nodes) nodes and min(depth, budget.max_depth - 1) draft
  // steps after the first (so depth <= budget.max_depth).
  DraftTree propose(RequestId request, const TreeBudget& budget) override;
  // Every request's tree grows in lockstep: one top-k call for the roots, then per expansion
  // step one draft forward and one top-k call over all requests' frontiers.
  std::vector<DraftTree> propose_batch(
      const std::vector<std::pair<RequestId, TreeBudget>>& requests) override;
  void end(RequestId request) override;
  bool fork(RequestId src, RequestId dst) override;

  EagleDraftModel& draft() { return draft_; }
  const EagleDraftModel& draft() const { return draft_; }
  StepGraphStats draft_graph_stats() const override { return draft_.step_graph_stats(); }
  TransferStats draft_transfer_stats() const override { return draft_.transfer_stats(); }
  void set_tree_reader(Backend* reader) override;
  double last_draft_device_ms() override;
  const EagleOptions& options() const { return options_; }
  // propose_batch calls that took the trees grown before the wait (grow_before_wait).
  int64_t trees_grown_before_wait() const { return pregrown_hits_; }

 private:
  struct RequestState {
    SeqId seq = -1;                      // committed draft rows (-1 until the first feedback)
    int32_t first_position = 0;          // position of the sequence's logical index 0
    std::vector<float> pending_feature;  // feature of the last position while its next token is
                                         // unknown (next_token == -1)
    std::vector<float> last_output;      // [hidden] draft output of the last committed row
    // Within propose_batch on the backend: the output of the last committed row is row
    // device_row of the draft's last forward and its top-k row device_top_row of the kept roots
    // (neither downloaded: grow_trees reads them there; last_output stays empty and last_top
    // comes back with the trees); else -1.
    int32_t device_row = -1;
    int32_t device_top_row = -1;  // with device_row: its top-k's row (draft_frontier_roots)
    TopKRows last_top;            // its top_k() best draft entries (from observe())
    // Rows observed but not yet run through the draft (see observe_batch): the draft forward
    // of committed rows is deferred to the next propose() for the request, or until
    // kMaxBacklogRows have gathered (then all but the last run, without a wait, with every
    // other request's backlog in the same forward), so steps that do not speculate cost no
    // draft forward.
    std::vector<int32_t> backlog_tokens;
    std::vector<float> backlog_features;
    int32_t backlog_position = 0;
    // observe_paths_on_device's rows of this request: device_rows rows reserved from RoPE
    // position device_position (0: none in flight), rows device_first.. of that forward; once
    // observe_batch commits the path's, device_root is its last row there (the next tree's
    // root, valid until the next propose_batch or observe_paths_on_device), else -1.
    int32_t device_rows = 0;
    int32_t device_first = 0;
    int32_t device_position = 0;
    int32_t device_root = -1;
  };
  // Ends what observe_paths_on_device left: reservations not committed are cancelled, roots not
  // used are dropped.
  void drop_device_paths();
  // observe_paths_on_device's trees for the next step (grow_before_wait): grown for `ids` under
  // `params` (in that order), picked into `trees`.
  struct Pregrown {
    bool valid = false;
    std::vector<RequestId> ids;
    std::vector<DynamicTreeParams> params;
    EagleDraftModel::DeviceTrees trees;
  };
  // The trees of the last propose_batch picked on the backend: each request and its parameters
  // (what grow_before_wait grows the next ones under).
  std::vector<std::pair<RequestId, DynamicTreeParams>> last_picked_;
  Pregrown pregrown_;
  // How often a step's picked requests and budgets were the last step's (a moving average):
  // trees grown before the wait only pay while it stays high.
  double repeat_rate_ = 1.0;
  int64_t pregrown_hits_ = 0;  // steps whose trees grew before the wait (tests read it)
  bool grows_before_wait() const;
  // Grows the next trees, `depths` deep, for the rows observe_paths_on_device just reserved
  // (items, of `ids`) under last_picked_'s parameters.
  void grow_before_wait(const std::vector<RequestId>& ids,
                        const std::vector<EagleDraftModel::DeviceAppendItem>& items,
                        const PathRowsOnDevice& rows, const std::vector<int32_t>& len_index,
                        int32_t depths);
  // observe_batch's part for a request with device rows in flight: true when f is the path
  // they hold (then committed), false when they were cancelled (f is folded in as usual).
  bool settle_device_path(RequestState& s, const TargetFeedback& f);
  // Rows a request's backlog may hold before they run anyway (bounds the host memory a request
  // that never speculates keeps, and the size of a catch-up forward).
  static constexpr size_t kMaxBacklogRows = 32;
  // Runs the backlogs of `states` through the draft in one forward: their last rows' outputs
  // and top-k become last_output / last_top.
  // outputs_on_device: leave the outputs on the draft's backend (device_row) instead.
  void flush_backlogs(const std::vector<RequestState*>& states, bool outputs_on_device = false);
  // Runs every row but the last of each of `states`' backlogs into the draft's KV in one
  // forward: no head, nothing copied back, so no wait for the device. The last row stays, to
  // run with the request's next proposal, which needs its output and top-k.
  void run_backlog_prefixes(const std::vector<RequestState*>& states);
  // Children per node read from the draft (the tree's top_k, at most the draft vocabulary).
  int32_t top_k() const;
  // One feedback's new draft rows, before they run.
  struct Staged {
    RequestState* state = nullptr;
    std::vector<int32_t> tokens;  // token_{t+1} per row
    std::vector<float> features;  // [rows, feature_width()]
    int32_t position = 0;         // position of the first row
  };
  // Folds f into the tracker and the request's pending feature; false when no row is ready.
  bool stage(const TargetFeedback& f, Staged* out);

  EagleOptions options_;
  EagleDraftModel draft_;
  std::vector<int32_t> capture_layers_;
  FeedbackTracker tracker_;
  std::unordered_map<RequestId, RequestState> requests_;
  // set_tree_reader found a reader of the draft's memory: trees may be picked there.
  bool tree_reader_ = false;
  Backend* reader_ = nullptr;            // that reader (the target's backend), when it can
  bool timed_draft_ = false;             // the last propose_batch's draft was timed on the device
  std::vector<RequestId> device_paths_;  // requests observe_paths_on_device ran rows of
};

}  // namespace arbor
