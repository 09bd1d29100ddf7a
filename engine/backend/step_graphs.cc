#include "engine/backend/step_graphs.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <utility>

#include "engine/core/error.h"

namespace arbor {

void Backend::begin_step_capture() {
  throw_error(ErrorCode::kUnsupported, "the " + name() + " backend cannot record step graphs");
}

void Backend::replay_step_graph(int64_t graph) {
  throw_error(ErrorCode::kUnsupported,
              "the " + name() + " backend has no step graph " + std::to_string(graph));
}

int64_t graph_bucket(int64_t n, int64_t steps) {
  ARBOR_CHECK(steps >= 1, "graph_bucket: steps " + std::to_string(steps));
  if (n <= steps) return n;
  int64_t pow2 = 1;
  while (pow2 <= n / 2) pow2 *= 2;  // floor_pow2(n)
  const int64_t unit = std::max<int64_t>(1, pow2 / steps);
  return (n + unit - 1) / unit * unit;
}

int64_t graph_request_capacity(int64_t requests) {
  return std::max(kGraphMinRequests, graph_bucket(requests, 1));
}

const StepInputs& with_graph_table_width(const StepInputs& step, StepInputs* storage) {
  const auto width = static_cast<int32_t>(
      std::max<int64_t>(kGraphMinTableWidth, graph_bucket(step.max_blocks_per_request, 1)));
  if (width == step.max_blocks_per_request) return step;
  *storage = with_block_table_width(step, width);
  return *storage;
}

StepInputs with_block_table_width(const StepInputs& step, int32_t width) {
  ARBOR_CHECK(width >= step.max_blocks_per_request,
              "block table width " + std::to_string(width) + " < " +
                  std::to_string(step.max_blocks_per_request));
  StepInputs s = step;
  if (width == step.max_blocks_per_request) return s;
  const size_t old_width = static_cast<size_t>(step.max_blocks_per_request);
  const size_t r_count = static_cast<size_t>(step.num_requests());
  s.block_tables.assign(r_count * static_cast<size_t>(width), -1);
  for (size_t r = 0; r < r_count; ++r)
    for (size_t b = 0; b < old_width; ++b)
      s.block_tables[r * width + b] = step.block_tables[r * old_width + b];
  s.max_blocks_per_request = width;
  return s;
}

StepGraphCache::StepGraphCache(Options options, Release release)
    : options_(options), release_(std::move(release)) {
  ARBOR_CHECK(options_.max_graphs >= 1 && options_.eager_runs_before_capture >= 1);
}

StepGraphCache::~StepGraphCache() {
  drop_all_graphs();
}

void StepGraphCache::drop_all_graphs() {
  for (auto& [key, e] : graphs_) release_(e.graph);
  graphs_.clear();
}

void StepGraphCache::clear() {
  drop_all_graphs();
  seen_.clear();
}

bool step_graph_trace_enabled() {
  static const bool on = [] {
    const char* e = std::getenv("ARBOR_STEP_GRAPH_TRACE");
    return e != nullptr && std::string(e) == "1";
  }();
  return on;
}

namespace {
// One stderr line per lookup (action, sightings, key), to see which key fields keep a workload
// from replaying.
bool trace_lookups() {
  return step_graph_trace_enabled();
}
void trace(const char* action, const StepGraphKey& key, int32_t eager_runs) {
  if (!trace_lookups()) return;
  std::string line = std::string("step graph ") + action + " (eager runs before " +
                     std::to_string(eager_runs) + "):";
  for (const int64_t v : key) line += " " + std::to_string(v);
  std::fprintf(stderr, "%s\n", line.c_str());
}
}  // namespace

StepGraphCache::Decision StepGraphCache::lookup(const StepGraphKey& key, uint64_t epoch) {
  if (have_epoch_ && epoch != epoch_ && !graphs_.empty()) {
    drop_all_graphs();
    stats_.invalidations++;
    if (trace_lookups()) std::fprintf(stderr, "step graph invalidate (memory epoch moved)\n");
  }
  epoch_ = epoch;
  have_epoch_ = true;
  Decision d;
  auto it = graphs_.find(key);
  if (it != graphs_.end()) {
    it->second.last_used = ++tick_;
    d.action = Action::kReplay;
    d.graph = it->second.graph;
    d.outputs = &it->second.outputs;
    stats_.replays++;
    trace("replay", key, -1);
    return d;
  }
  if (seen_.size() >= options_.max_tracked_keys && seen_.find(key) == seen_.end()) seen_.clear();
  Sightings& s = seen_[key];
  if (!s.failed && s.eager_runs >= options_.eager_runs_before_capture) {
    d.action = Action::kCapture;
    trace("capture", key, s.eager_runs);
    return d;
  }
  trace(s.failed ? "eager (failed before)" : "eager", key, s.eager_runs);
  s.eager_runs++;
  stats_.eager++;
  return d;
}

void StepGraphCache::captured(const StepGraphKey& key, int64_t graph, std::vector<Tensor> outputs) {
  if (graph < 0) {
    seen_[key].failed = true;
    stats_.capture_failures++;
    stats_.eager++;
    return;
  }
  stats_.captures++;
  while (static_cast<int64_t>(graphs_.size()) >= options_.max_graphs) {
    auto lru = graphs_.begin();
    for (auto it = graphs_.begin(); it != graphs_.end(); ++it)
      if (it->second.last_used < lru->second.last_used) lru = it;
    release_(lru->second.graph);
    graphs_.erase(lru);
    stats_.evictions++;
  }
  auto [it, inserted] = graphs_.insert_or_assign(key, Entry{graph, std::move(outputs), ++tick_});
  (void)it;
  (void)inserted;
}

StepGraphRun run_step_graph(StepGraphCache& cache, Backend& backend, const StepGraphKey& key,
                            const std::function<void()>& before_replay,
                            const std::function<std::vector<Tensor>()>& ops,
                            std::vector<Tensor>* outputs) {
  const StepGraphCache::Decision d = cache.lookup(key, backend.step_graph_epoch());
  if (d.action == StepGraphCache::Action::kReplay) {
    before_replay();
    backend.replay_step_graph(d.graph);
    *outputs = *d.outputs;
    return StepGraphRun::kReplayed;
  }
  if (d.action != StepGraphCache::Action::kCapture) return StepGraphRun::kEager;
  int64_t graph = -1;
  std::vector<Tensor> recorded;
  backend.begin_step_capture();
  try {
    recorded = ops();
    graph = backend.end_step_capture();
  } catch (const std::exception&) {
    backend.abort_step_capture();  // an op refused inside the recording
  }
  cache.captured(key, graph, recorded);
  if (graph < 0) return StepGraphRun::kRecordingFailed;
  backend.replay_step_graph(graph);  // the recording ran nothing
  *outputs = std::move(recorded);
  return StepGraphRun::kReplayed;
}

}  // namespace arbor
