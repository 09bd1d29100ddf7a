// The interface every drafter implements (Medusa heads, EAGLE-1/2/3 draft layers, n-gram
// lookup). The runner feeds each request's committed tokens and the target's features as they
// are produced, and asks for a draft tree rooted at the request's newest token.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/step_graphs.h"
#include "engine/verify/draft_tree.h"
#include "engine/verify/tree_budget.h"

namespace arbor {

using RequestId = int64_t;

// What the target produced for one request in one step, for the committed positions
// [start, start + n): tokens[i] is the token at position start + i (the model's input there),
// hidden row i is the target's final-norm hidden state at that position (the one that predicted
// the token at start + i + 1), and captured[c] row i the residual stream at the input of the
// proposer's capture_layers()[c] (EAGLE-3). `next_token` is the token at position start + n:
// the root of the next tree (sampled or the bonus token, K/V not yet computed).
struct TargetFeedback {
  RequestId request = -1;
  int32_t start = 0;                             // first position covered
  std::span<const int32_t> tokens;               // [n]
  std::span<const float> hidden;                 // [n, hidden_size] (empty if !needs_hidden())
  std::vector<std::span<const float>> captured;  // per capture layer: [n, hidden_size]
  int32_t next_token = -1;
};

class Proposer {
 public:
  virtual ~Proposer() = default;
  virtual std::string name() const = 0;
  // Whether feedback must carry final-norm hidden states / captured layer inputs.
  virtual bool needs_hidden() const { return false; }
  virtual std::vector<int32_t> capture_layers() const { return {}; }
  // Whether its trees change size from step to step with what it finds (n-gram matches), so
  // the engine may pad them to a few sizes for step graphs (EngineConfig::pad_trees); false for
  // trees of a fixed shape or size (Medusa's static tree, EAGLE's total_tokens). With adaptive
  // trees the budgets vary and the engine pads any proposer's trees.
  virtual bool varying_tree_sizes() const { return false; }

  // A new request: its prompt (the positions prefill will cover).
  virtual void begin(RequestId request, std::span<const int32_t> prompt) = 0;
  // Newly committed positions (prefill chunks, or a verify step's accepted path). Calls for one
  // request are contiguous: start == previous start + previous n. On preemption the runner
  // calls end() and begin() again and replays.
  virtual void observe(const TargetFeedback& feedback) = 0;
  // observe() for several requests' feedback of one step, in order (one per request). Proposers
  // with a draft model override it to run one draft forward for all of them.
  virtual void observe_batch(std::span<const TargetFeedback> feedbacks) {
    for (const TargetFeedback& f : feedbacks) observe(f);
  }
  // Proposers that fold a verify step's accepted paths in on the device before the host has
  // them: the engine then calls observe_paths_on_device from inside that step, once its paths'
  // rows and tokens are in backend memory (ForwardRequest::on_path_rows; `paths` are the items
  // of requests whose trees it verified, item = their sampling item), and still feeds the same
  // paths through observe / observe_batch after the step, which settles what ran on the device
  // (or, for any path it did not take, folds it in as usual).
  virtual bool observes_paths_on_device() const { return false; }
  struct DevicePath {
    RequestId request = -1;
    int32_t item = -1;
  };
  virtual void observe_paths_on_device(std::span<const DevicePath> paths,
                                       const PathRowsOnDevice& rows) {
    (void)paths;
    (void)rows;
  }
  // Draft tree rooted at the last feedback's next_token (tree.token[0] == that token).
  virtual DraftTree propose(RequestId request, const TreeBudget& budget) = 0;
  // Trees for several requests of one step, in order (each as propose() would return it).
  // Proposers with a draft model override it to run one draft forward per expansion step for
  // all the requests instead of one per request.
  virtual std::vector<DraftTree> propose_batch(
      const std::vector<std::pair<RequestId, TreeBudget>>& requests) {
    std::vector<DraftTree> out;
    out.reserve(requests.size());
    for (const auto& [request, budget] : requests) out.push_back(propose(request, budget));
    return out;
  }
  virtual void end(RequestId request) = 0;
  // n > 1 samples of one prompt: `dst` starts as a copy of `src` (which must have observed its
  // prompt with next_token -1, i.e. before either request's first token is known); each then
  // gets an empty-token observe carrying its own next_token. False when unsupported (the
  // runner then lets `dst` decode without speculation).
  virtual bool fork(RequestId /*src*/, RequestId /*dst*/) { return false; }
  // The backend that reads the trees' tokens (the model's, one rank) or nullptr. A proposer
  // whose draft runs on a backend that reader->shares_memory_with may then leave its trees'
  // tokens there (DraftTree::device) instead of waiting for them. Default: ignored.
  virtual void set_tree_reader(Backend* reader) { (void)reader; }
  // The draft model's step-graph counters (zero for proposers without a recorded draft).
  virtual StepGraphStats draft_graph_stats() const { return {}; }
  // The draft's backend traffic and host waits (Backend::transfer_stats; zero without one).
  virtual TransferStats draft_transfer_stats() const { return {}; }
  // The device time of the last propose_batch's draft when it returned before the device ran
  // it (Backend::device_interval_*; read after a later wait), else -1: its host time was all.
  virtual double last_draft_device_ms() { return -1.0; }
};

}  // namespace arbor
