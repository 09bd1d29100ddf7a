// Step graphs: which forward steps replay a recording of their device work (CUDA graphs on the
// CUDA backend, Backend::begin_step_capture and friends) instead of launching every op again.
// StepGraphCache holds the recordings keyed by everything that changes a step's launches and
// decides per step: run eagerly (a key not yet seen in enough steps: not steady state), record
// (the key's eager runs have sized every buffer and built every lazily made object), or replay.
// It evicts the least recently used recording beyond a cap and drops them all when the
// backend's memory epoch moves (a buffer a recording points into was reallocated). Pure logic:
// no device, no threads (docs/kernels.md "CUDA graphs").
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <vector>

#include "engine/backend/backend.h"

namespace arbor {

// Every value that changes the launches of a step's op sequence: shapes, the per-request query
// counts and mask words, capacities of the buffers the launches point into, what the step
// returns, and what the backend appends (Backend::prepare_step_graph).
using StepGraphKey = std::vector<int64_t>;

// ARBOR_STEP_GRAPH_TRACE=1 (read once): StepGraphCache prints every lookup, and backends print
// every reallocation that moves their memory epoch (what, size, address) to stderr.
bool step_graph_trace_enabled();

struct StepGraphStats {
  int64_t eager = 0;             // graph-eligible steps run op by op (key not steady yet)
  int64_t captures = 0;          // recordings made (each is launched once right away)
  int64_t replays = 0;           // steps that launched an earlier recording
  int64_t capture_failures = 0;  // recordings the backend refused (the step ran eagerly)
  int64_t evictions = 0;         // recordings dropped for the max_graphs cap
  int64_t invalidations = 0;     // times every recording was dropped (memory epoch moved)
  // Whether the steps since `before` warmed up a shape (ran it eagerly on its way to a
  // recording, or recorded it): one-time work, several times slower than a replay.
  bool warmed_up_since(const StepGraphStats& before) const {
    return eager != before.eager || captures != before.captures;
  }
};

// The smallest value >= n of the form k * 2^e with 2^e = max(1, floor_pow2(n) / steps):
// `steps` buckets per power of two (at most 1/steps of padding). n <= steps: n itself.
int64_t graph_bucket(int64_t n, int64_t steps = 8);

// The request capacity a step's per-request metadata is laid out for (CudaBackend::set_step)
// and that a step graph's key holds instead of the request count: the next power of two, at
// least kGraphMinRequests. The tail of a batch (requests finishing one by one) and a batch that
// loses or gains a request then keep the keys of the full batch, as vLLM pads its batch to a
// captured size. Launches that take the request count by value (attention plans that are not
// batch-invariant) put it in the backend's part of the key; batch-invariant plans count virtual
// requests there, one per tree token.
constexpr int64_t kGraphMinRequests = 8;
int64_t graph_request_capacity(int64_t requests);

// A copy of `step` whose block tables are max_blocks_per_request wide, padded with -1 (a
// capacity in the graph key that changes every 2^e blocks, not every block). Needs width >=
// step.max_blocks_per_request.
StepInputs with_block_table_width(const StepInputs& step, int32_t width);

// The step a recordable step runs as: `step` itself when its block-table width is a power of
// two and at least kGraphMinTableWidth, else its copy in *storage with the width rounded up to
// one (so the graph key, which holds the width, changes only when the longest request's blocks
// double past the minimum). The padding is -1 entries that no kernel reads. The minimum (64
// blocks, 1024 tokens at block size 16; 256 bytes of table per request and step) keeps short
// requests from re-recording every step shape at 16, 32 and 64 blocks as they grow.
constexpr int64_t kGraphMinTableWidth = 64;
const StepInputs& with_graph_table_width(const StepInputs& step, StepInputs* storage);

class StepGraphCache {
 public:
  struct Options {
    int32_t max_graphs = 64;  // live recordings (LRU beyond)
    // Eager runs of a key before it is recorded: the first builds what ops make lazily and
    // grows the scratch arena, which the next step's reset merges, so the second sighting
    // records in an arena that does not move.
    int32_t eager_runs_before_capture = 1;
    size_t max_tracked_keys = 4096;  // sighting counts kept (all forgotten beyond)
  };
  enum class Action { kEager, kCapture, kReplay };
  struct Decision {
    Action action = Action::kEager;
    int64_t graph = -1;                            // kReplay: the recording to launch
    const std::vector<Tensor>* outputs = nullptr;  // kReplay: where it leaves its results
  };
  using Release = std::function<void(int64_t graph)>;

  // `release` frees a recording (Backend::release_step_graph); called on eviction,
  // invalidation, clear() and destruction.
  StepGraphCache(Options options, Release release);
  ~StepGraphCache();
  StepGraphCache(const StepGraphCache&) = delete;
  StepGraphCache& operator=(const StepGraphCache&) = delete;

  // The decision for a step with this key. `epoch` is the backend's step_graph_epoch() after the
  // step's metadata was prepared: when it differs from the last one seen, every recording is
  // dropped first. kCapture must be followed by captured().
  Decision lookup(const StepGraphKey& key, uint64_t epoch);
  // The outcome of a kCapture decision: graph >= 0 with the tensors its results are left in, or
  // graph < 0 (the backend could not record this step; the key is never recorded again).
  void captured(const StepGraphKey& key, int64_t graph, std::vector<Tensor> outputs);
  void clear();  // drops every recording and sighting

  const StepGraphStats& stats() const { return stats_; }
  size_t num_graphs() const { return graphs_.size(); }

 private:
  struct Entry {
    int64_t graph = -1;
    std::vector<Tensor> outputs;
    uint64_t last_used = 0;
  };
  struct Sightings {
    int32_t eager_runs = 0;
    bool failed = false;
  };
  void drop_all_graphs();

  Options options_;
  Release release_;
  std::map<StepGraphKey, Entry> graphs_;
  std::map<StepGraphKey, Sightings> seen_;
  uint64_t epoch_ = 0;
  bool have_epoch_ = false;
  uint64_t tick_ = 0;
  StepGraphStats stats_;
};

// How run_step_graph() ended.
enum class StepGraphRun {
  kReplayed,         // *outputs holds where the step's results are
  kEager,            // the key is not steady yet: run the ops eagerly
  kRecordingFailed,  // an op refused inside the recording or the backend could not record:
                     // rewind scratch (the recording took addresses), then run them eagerly
};

// The step-graph protocol for one step whose metadata is set (Backend::set_step,
// prepare_step_graph) and whose key is `key`: replays the key's recording, after
// `before_replay` (the checks the recorded ops skip), or records `ops` (which return the
// tensors that hold the step's results) and replays the recording.
StepGraphRun run_step_graph(StepGraphCache& cache, Backend& backend, const StepGraphKey& key,
                            const std::function<void()>& before_replay,
                            const std::function<std::vector<Tensor>()>& ops,
                            std::vector<Tensor>* outputs);

}  // namespace arbor
