#include "engine/spec/eagle_proposer.h"

#include <algorithm>

#include "engine/backend/draft_frontier.h"
#include "engine/core/error.h"

namespace arbor {

namespace {

std::unique_ptr<Backend> or_cpu(std::unique_ptr<Backend> backend, int threads) {
  return backend ? std::move(backend) : make_cpu_backend(threads);
}

const EagleOptions& validated(const EagleOptions& options) {
  options.validate();
  return options;
}

FeedbackShape feedback_shape(const EagleWeights& w, int32_t num_captured) {
  const EagleDraftConfig& c = w.config;
  if (c.version == EagleVersion::kEagle3)
    return {c.vocab_size, 0, num_captured, c.target_hidden_size};
  return {c.vocab_size, c.hidden_size, 0, 0};
}

std::vector<int32_t> capture_layers_for(const EagleWeights& w, const ModelWeights& target) {
  if (w.config.version != EagleVersion::kEagle3) return {};
  std::vector<int32_t> layers = w.config.capture_layers.empty()
                                    ? eagle3_capture_layers(target.config.num_layers)
                                    : w.config.capture_layers;
  for (int32_t l : layers)
    if (l < 0 || l > target.config.num_layers)
      throw_error(ErrorCode::kInvalidArgument,
                  "EAGLE-3 draft " + w.source + ": capture layer " + std::to_string(l) +
                      " is outside [0, " + std::to_string(target.config.num_layers) +
                      "] for a target of " + std::to_string(target.config.num_layers) + " layers");
  return layers;
}

}  // namespace

void EagleOptions::validate() const {
  auto bad = [](const std::string& field, int64_t v, const std::string& need) {
    throw_error(ErrorCode::kInvalidArgument,
                "EAGLE option " + field + " is " + std::to_string(v) + ", " + need);
  };
  if (tree.total_tokens < 1) bad("total_tokens", tree.total_tokens, "need >= 1");
  if (tree.depth < 0) bad("depth", tree.depth, "need >= 0");
  if (tree.top_k < 1) bad("top_k", tree.top_k, "need >= 1");
  if (grow_on_backend < -1 || grow_on_backend > 1)
    bad("grow_on_backend", grow_on_backend, "need -1, 0 or 1");
  if (pick_on_backend < -1 || pick_on_backend > 1)
    bad("pick_on_backend", pick_on_backend, "need -1, 0 or 1");
  if (paths_on_device < -1 || paths_on_device > 1)
    bad("paths_on_device", paths_on_device, "need -1, 0 or 1");
  if (grow_before_wait < -1 || grow_before_wait > 1)
    bad("grow_before_wait", grow_before_wait, "need -1, 0 or 1");
  if (draft_kv.num_blocks < 1) bad("draft_kv.num_blocks", draft_kv.num_blocks, "need >= 1");
  if (draft_kv.block_size < 1) bad("draft_kv.block_size", draft_kv.block_size, "need >= 1");
  if (draft_kv.enable_prefix_caching)
    bad("draft_kv.enable_prefix_caching", 1, "must be off (draft K/V depend on features)");
}

EagleProposer::EagleProposer(const EagleWeights& weights, const ModelWeights& target,
                             const EagleOptions& options, std::unique_ptr<Backend> backend)
    : options_(validated(options)),
      draft_(or_cpu(std::move(backend), options_.num_threads), weights, target.embed,
             target.output_weight(), options_.draft_kv),
      capture_layers_(capture_layers_for(weights, target)),
      tracker_(weights.config.version == EagleVersion::kEagle3 ? "eagle3" : "eagle",
               feedback_shape(weights, static_cast<int32_t>(capture_layers_.size()))) {
  const EagleDraftConfig& c = weights.config;
  if (c.vocab_size != target.config.vocab_size)
    throw_error(ErrorCode::kInvalidArgument,
                std::string(eagle_version_name(c.version)) + " draft " + weights.source +
                    ": vocab_size " + std::to_string(c.vocab_size) + ", the target has " +
                    std::to_string(target.config.vocab_size));
  if (c.target_hidden_size != target.config.hidden_size)
    throw_error(ErrorCode::kInvalidArgument,
                std::string(eagle_version_name(c.version)) + " draft " + weights.source +
                    ": reads features of width " + std::to_string(c.target_hidden_size) +
                    ", the target's hidden size is " + std::to_string(target.config.hidden_size));
}

std::string EagleProposer::name() const {
  return draft_.eagle3() ? "eagle3" : "eagle";
}

void EagleProposer::begin(RequestId request, std::span<const int32_t> prompt) {
  tracker_.begin(request, prompt);
  requests_[request] = RequestState{};
}

bool EagleProposer::stage(const TargetFeedback& f, Staged* out) {
  tracker_.observe(f);
  RequestState& s = requests_.at(f.request);
  const int64_t width = draft_.feature_width();
  const size_t n = f.tokens.size();
  if (s.seq < 0) {
    s.seq = draft_.create_sequence();
    s.first_position = f.start;
  }
  // Rows (feature_t, token_{t+1}): position t pairs with the token at t + 1 (tokens[i + 1], then
  // next_token); a feature whose next token is not known yet waits in pending_feature.
  auto token_after = [&](size_t i) { return i + 1 < n ? f.tokens[i + 1] : f.next_token; };
  out->state = &s;
  out->features.clear();
  out->tokens.clear();
  out->position = f.start;
  if (!s.pending_feature.empty()) {
    const int32_t t = n > 0 ? f.tokens[0] : f.next_token;
    if (t >= 0) {
      out->features = std::move(s.pending_feature);
      s.pending_feature.clear();
      out->tokens.push_back(t);
      out->position = f.start - 1;
    }
  }
  auto feature_row = [&](size_t i, std::vector<float>* dst) {
    if (!draft_.eagle3()) {
      auto row = f.hidden.subspan(i * width, width);
      dst->insert(dst->end(), row.begin(), row.end());
      return;
    }
    // concat(low, mid, high): the capture layers side by side (the tracker checked the count)
    const size_t th = static_cast<size_t>(width) / f.captured.size();
    for (const std::span<const float>& layer : f.captured) {
      auto row = layer.subspan(i * th, th);
      dst->insert(dst->end(), row.begin(), row.end());
    }
  };
  for (size_t i = 0; i < n; ++i) {
    const int32_t next = token_after(i);
    if (next < 0) {
      s.pending_feature.clear();
      feature_row(i, &s.pending_feature);
      break;
    }
    feature_row(i, &out->features);
    out->tokens.push_back(next);
  }
  if (out->tokens.empty()) return false;
  const int32_t expected =
      s.first_position + draft_.length(s.seq) + static_cast<int32_t>(s.backlog_tokens.size());
  ARBOR_CHECK(out->position == expected, "draft row position " + std::to_string(out->position) +
                                             ", expected " + std::to_string(expected));
  return true;
}

void EagleProposer::observe(const TargetFeedback& f) {
  observe_batch(std::span<const TargetFeedback>(&f, 1));
}

void EagleProposer::observe_batch(std::span<const TargetFeedback> feedbacks) {
  // The rows wait in each request's backlog; the draft runs them when the request is next
  // proposed for (in the same forward as every other request proposed for then), or once the
  // backlog is full. A step the scheduler does not speculate in (the adaptive policy declining,
  // requests that opted out) thus costs no draft forward.
  std::vector<RequestState*> full;
  Staged st;
  for (const TargetFeedback& f : feedbacks) {
    const auto found = requests_.find(f.request);
    if (found != requests_.end() && found->second.device_rows > 0 &&
        settle_device_path(found->second, f))
      continue;
    pregrown_.valid = false;  // (grown for roots this feedback does not end at)
    if (!stage(f, &st)) continue;
    RequestState& s = *st.state;
    if (s.backlog_tokens.empty()) s.backlog_position = st.position;
    s.backlog_tokens.insert(s.backlog_tokens.end(), st.tokens.begin(), st.tokens.end());
    s.backlog_features.insert(s.backlog_features.end(), st.features.begin(), st.features.end());
    s.last_output.clear();  // stale until the backlog runs
    if (s.backlog_tokens.size() >= kMaxBacklogRows) full.push_back(&s);
  }
  // When one backlog is full, every request's runs with it: the forward's cost is mostly per
  // launch (a one-layer draft), so one forward of every backlog costs about what one of a few
  // does, and requests that fill at different steps no longer each pay their own.
  if (full.empty()) return;
  std::vector<std::pair<RequestId, RequestState*>> all;  // in request order (deterministic)
  for (auto& [id, st] : requests_)
    if (st.backlog_tokens.size() >= 2) all.emplace_back(id, &st);
  std::sort(all.begin(), all.end());
  std::vector<RequestState*> states;
  for (const auto& [id, st] : all) states.push_back(st);
  run_backlog_prefixes(states);
}

bool EagleProposer::observes_paths_on_device() const {
  const bool gpu = draft_.backend_name() != "cpu";
  const auto on = [gpu](int option) { return option == 1 || (option == -1 && gpu); };
  return tree_reader_ && draft_.grows_on_backend() && on(options_.grow_on_backend) &&
         on(options_.paths_on_device);
}

void EagleProposer::observe_paths_on_device(std::span<const DevicePath> paths,
                                            const PathRowsOnDevice& rows) {
  drop_device_paths();
  pregrown_.valid = false;
  if (rows.rows.cols != draft_.feature_width() || rows.next.rows != rows.rows.rows) return;
  std::vector<EagleDraftModel::DeviceAppendItem> items;
  std::vector<RequestId> ids;
  std::vector<int32_t> len_index;
  for (const DevicePath& p : paths) {
    const auto it = requests_.find(p.request);
    if (it == requests_.end() || p.item < 0 ||
        static_cast<size_t>(p.item) + 1 >= rows.offset.size())
      continue;
    RequestState& s = it->second;
    // Rows waiting on the host come first: this path then joins them there (observe_batch).
    if (s.seq < 0 || !s.backlog_tokens.empty() || !s.pending_feature.empty()) continue;
    const int32_t first = rows.offset[static_cast<size_t>(p.item)];
    const int32_t n = rows.offset[static_cast<size_t>(p.item) + 1] - first;
    if (n < 1) continue;
    items.push_back({s.seq, s.first_position + draft_.length(s.seq), first, n});
    ids.push_back(p.request);
    len_index.push_back(p.item);
  }
  if (items.empty()) return;
  // A forward too large for a step graph would launch op by op: the host's way is cheaper then
  // (it runs the paths' own rows, not each tree's depth + 1).
  int64_t total = 0;
  for (const auto& it : items) total += it.rows;
  if (draft_.records_steps() && total > EagleDraftModel::kMaxGraphFeatureRows) return;
  // The rows are the reader's (the target's) results; on another stream, the draft reads them
  // after its work, and the target's later steps (which rewrite them) wait for the draft.
  draft_.backend().wait_for(*reader_);
  // The next trees too (grow_before_wait): they need `extra` slots after each path's rows.
  int32_t depths = 0;
  bool pregrow = grows_before_wait() && last_picked_.size() == ids.size() && rows.len.rows > 0;
  for (size_t i = 0; pregrow && i < ids.size(); ++i) {
    const auto& [id, params] = last_picked_[i];
    pregrow = id == ids[i];
    depths = std::max(depths, params.depth);
  }
  depths = std::max(depths, 1);  // (a tree of the root's children alone reads one depth)
  const int32_t extra = depths * top_k();
  bool appended = false;
  for (int attempt = pregrow ? 0 : 1; attempt < 2 && !appended; ++attempt) {
    for (auto& it : items) it.extra = attempt == 0 ? extra : 0;
    try {
      draft_.append_on_device(items, rows.rows, rows.next, top_k());
      appended = true;
    } catch (const Error& e) {
      // The draft's cache is full: observe_batch folds the paths in on the host (and reports
      // it), after a try without the next trees' slots.
      if (e.code() != ErrorCode::kResourceExhausted) throw;
    }
  }
  if (!appended) return;
  int32_t at = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    RequestState& s = requests_.at(ids[i]);
    s.device_rows = items[i].rows;
    s.device_first = at;
    s.device_position = items[i].position0;
    at += items[i].rows;
  }
  if (items.front().extra > 0) grow_before_wait(ids, items, rows, len_index, depths);
  reader_->wait_for(draft_.backend());
  device_paths_ = std::move(ids);
}

bool EagleProposer::grows_before_wait() const {
  const bool gpu = draft_.backend_name() != "cpu";
  const auto on = [gpu](int option) { return option == 1 || (option == -1 && gpu); };
  return on(options_.grow_before_wait) && on(options_.pick_on_backend) &&
         draft_.picks_trees_on_backend() && repeat_rate_ >= 0.5;
}

void EagleProposer::grow_before_wait(const std::vector<RequestId>& ids,
                                     const std::vector<EagleDraftModel::DeviceAppendItem>& items,
                                     const PathRowsOnDevice& rows,
                                     const std::vector<int32_t>& len_index, int32_t depths) {
  EagleDraftModel::PathShift shift{rows.len, len_index, {}};
  std::vector<EagleDraftModel::GrowItem> grow;
  Pregrown next;
  const int32_t k = top_k();
  for (size_t i = 0; i < items.size(); ++i) {
    const DynamicTreeParams& p = last_picked_[i].second;
    const RequestState& s = requests_.at(ids[i]);
    // As if the whole reserved path were real: its last row the root (moved back on the device).
    const int32_t last = s.device_first + items[i].rows - 1;
    grow.push_back({items[i].seq, items[i].position0 + items[i].rows, nullptr, {}, last, last});
    shift.rows.push_back(items[i].rows);
    next.params.push_back(p);
    next.trees.depth.push_back(p.depth);
    next.trees.nodes.push_back(draft_tree_nodes(k, p.depth, p.total_tokens));
    next.trees.stride = std::max(next.trees.stride, next.trees.nodes.back());
  }
  std::vector<TopKRows> roots;
  draft_.backend().device_interval_begin();
  draft_.grow_trees(grow, k, depths, &roots, &next.trees,
                    /*roots_from_device_append=*/true, &shift);
  draft_.backend().device_interval_end();
  next.ids = ids;
  next.valid = true;
  pregrown_ = std::move(next);
}

bool EagleProposer::settle_device_path(RequestState& s, const TargetFeedback& f) {
  const int32_t reserved = s.device_rows;
  s.device_rows = 0;
  const auto len = static_cast<int32_t>(f.tokens.size());
  // The rows hold (feature of path node d, the token after it): f's tokens are the path's.
  if (f.start == s.device_position && len >= 1 && len <= reserved && f.next_token >= 0 &&
      s.backlog_tokens.empty() && s.pending_feature.empty()) {
    tracker_.observe(f);
    std::vector<int32_t> after(f.tokens.begin() + 1, f.tokens.end());
    after.push_back(f.next_token);
    draft_.commit_on_device(s.seq, after);
    s.device_root = s.device_first + len - 1;
    s.last_output.clear();
    s.last_top = TopKRows{};
    return true;
  }
  draft_.cancel_on_device(s.seq);
  return false;
}

void EagleProposer::drop_device_paths() {
  for (RequestId id : device_paths_) {
    const auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    RequestState& s = it->second;
    if (s.device_rows > 0) draft_.cancel_on_device(s.seq);
    s.device_rows = 0;
    s.device_root = -1;
  }
  device_paths_.clear();
}

void EagleProposer::run_backlog_prefixes(const std::vector<RequestState*>& states) {
  std::vector<EagleDraftModel::AppendItem> items;
  std::vector<RequestState*> ran;
  const auto width = static_cast<size_t>(draft_.feature_width());
  for (RequestState* s : states) {
    const size_t n = s->backlog_tokens.size();
    if (n < 2) continue;
    items.push_back({s->seq, std::span<const int32_t>(s->backlog_tokens).first(n - 1),
                     std::span<const float>(s->backlog_features).first((n - 1) * width),
                     s->backlog_position});
    ran.push_back(s);
  }
  if (items.empty()) return;
  draft_.append_batch(items, /*top_k=*/0, /*last_tops=*/nullptr, /*download=*/false);
  for (RequestState* s : ran) {
    const size_t n = s->backlog_tokens.size();
    s->backlog_tokens.erase(s->backlog_tokens.begin(), s->backlog_tokens.end() - 1);
    s->backlog_features.erase(s->backlog_features.begin(),
                              s->backlog_features.end() - static_cast<std::ptrdiff_t>(width));
    s->backlog_position += static_cast<int32_t>(n - 1);
  }
}

void EagleProposer::flush_backlogs(const std::vector<RequestState*>& states,
                                   bool outputs_on_device) {
  std::vector<EagleDraftModel::AppendItem> items;
  std::vector<RequestState*> ran;
  for (RequestState* s : states) {
    if (s->backlog_tokens.empty()) continue;
    items.push_back({s->seq, s->backlog_tokens, s->backlog_features, s->backlog_position});
    ran.push_back(s);
  }
  if (items.empty()) return;
  // Every request's rows in one draft forward; each one's last row's top-k (the next tree's
  // root children) comes from the same device step.
  std::vector<TopKRows> tops;
  const std::vector<float> out =
      draft_.append_batch(items, top_k(), outputs_on_device ? nullptr : &tops, !outputs_on_device);
  const int64_t h = draft_.hidden_size();
  int64_t row = 0;
  for (size_t i = 0; i < items.size(); ++i) {
    row += static_cast<int64_t>(items[i].tokens.size());
    if (outputs_on_device) {
      ran[i]->last_output.clear();
      ran[i]->last_top = TopKRows{};
      ran[i]->device_row = static_cast<int32_t>(row - 1);
      ran[i]->device_top_row = static_cast<int32_t>(i);
    } else {
      ran[i]->last_output.assign(out.begin() + (row - 1) * h, out.begin() + row * h);
      ran[i]->last_top = std::move(tops[i]);
    }
    ran[i]->backlog_tokens.clear();
    ran[i]->backlog_features.clear();
  }
}

int32_t EagleProposer::top_k() const {
  return static_cast<int32_t>(std::min<int64_t>(options_.tree.top_k, draft_.draft_vocab()));
}

DraftTree EagleProposer::propose(RequestId request, const TreeBudget& budget) {
  tracker_.check_budget(request, budget);
  const int32_t root = tracker_.root(request);
  RequestState& s = requests_.at(request);
  flush_backlogs({&s});
  const DynamicTreeParams& p = options_.tree;
  DynamicTreeParams params;
  params.total_tokens = std::min(p.total_tokens, budget.max_nodes);
  params.depth = std::min(p.depth, budget.max_depth - 1);
  params.top_k = p.top_k;
  if (s.last_output.empty() || params.total_tokens <= 1 || budget.max_depth < 1)
    return DraftTree::root_only(root);

  // The nodes of the previous expansion step: their sequences and outputs (the root's level is
  // the request's committed sequence and its last output).
  std::vector<SeqId> prev_seqs = {s.seq};
  std::vector<float> prev_out = s.last_output;
  std::vector<SeqId> temporary;  // the forks of the last expansion step, freed at the end
  struct Release {
    EagleDraftModel& draft;
    std::vector<SeqId>& seqs;
    ~Release() {
      for (SeqId q : seqs) draft.free_sequence(q);
    }
  } release{draft_, temporary};

  const int64_t h = draft_.hidden_size();
  const int32_t position = s.first_position + draft_.length(s.seq);
  // Only each row's best top_k draft entries are read (computed on the draft's backend).
  const int32_t top_k = this->top_k();
  auto expand = [&](int32_t step, const std::vector<FrontierNode>& frontier) {
    std::vector<SeqId> parents;
    std::vector<int32_t> tokens;
    std::vector<float> hidden;
    for (const FrontierNode& node : frontier) {
      const size_t row = node.parent_row < 0 ? 0 : static_cast<size_t>(node.parent_row);
      parents.push_back(prev_seqs.at(row));
      tokens.push_back(node.token);
      hidden.insert(hidden.end(), prev_out.begin() + row * h, prev_out.begin() + (row + 1) * h);
    }
    std::vector<SeqId> children;
    TopKRows top;
    std::vector<float> out =
        draft_.expand(parents, tokens, hidden, position + step - 1, &children, top_k, &top);
    // The previous step's forks are no longer needed: their children hold references to the
    // shared blocks.
    for (SeqId q : temporary) draft_.free_sequence(q);
    temporary = children;
    prev_seqs = std::move(children);
    prev_out = std::move(out);
    return top;
  };
  ARBOR_CHECK(s.last_top.k == top_k);  // observe() leaves it with last_output
  return grow_dynamic_tree_top_k(
      root, s.last_top, params, [this](int32_t id) { return draft_.to_target(id); }, expand);
}

std::vector<DraftTree> EagleProposer::propose_batch(
    const std::vector<std::pair<RequestId, TreeBudget>>& requests) {
  std::vector<DraftTree> trees(requests.size());
  // Per growing request: its grower, the previous expansion's sequences and outputs, and the
  // position of its first draft row.
  struct Growing {
    size_t index;
    DynamicTreeGrower grower;
    std::vector<SeqId> prev_seqs;
    std::vector<float> prev_out;  // the root's output (host), for the first expansion
    std::vector<SeqId> temporary;
    int32_t position;
    // Where the previous expansion's rows of this request start among that forward's outputs
    // (kept on the draft's backend); -1 before the first expansion.
    int32_t prev_first = -1;
  };
  std::vector<Growing> growing;
  struct Release {
    EagleDraftModel& draft;
    std::vector<Growing>& growing;
    ~Release() {
      for (Growing& g : growing)
        for (SeqId q : g.temporary) draft.free_sequence(q);
    }
  } release{draft_, growing};
  const int32_t top_k = this->top_k();
  const int64_t h = draft_.hidden_size();
  auto to_target = [this](int32_t id) { return draft_.to_target(id); };

  std::vector<DynamicTreeParams> params(requests.size());
  growing.reserve(requests.size());
  const bool on_backend = draft_.grows_on_backend() &&
                          (options_.grow_on_backend == 1 ||
                           (options_.grow_on_backend == -1 && draft_.backend_name() != "cpu"));
  // The rows observed since each request's last draft, all in one forward; grown on the
  // backend, their outputs stay there as the trees' roots (no wait for them).
  std::vector<RequestState*> states;
  for (const auto& [request, budget] : requests)
    if (budget.max_nodes > 1) states.push_back(&requests_.at(request));
  struct ClearDeviceRows {  // on every exit: device rows are valid within this call only
    EagleProposer& proposer;
    std::vector<RequestState*>& states;
    ~ClearDeviceRows() {
      for (RequestState* s : states) s->device_row = -1;
      proposer.drop_device_paths();
    }
  } clear_device_rows{*this, states};
  // Trees may be picked on the draft's backend (the engine reads them there): the draft then
  // returns before the device runs it, so its device time is measured there.
  const bool may_pick = on_backend && tree_reader_ && draft_.picks_trees_on_backend() &&
                        (options_.pick_on_backend == 1 ||
                         (options_.pick_on_backend == -1 && draft_.backend_name() != "cpu"));
  timed_draft_ = false;
  // Trees grown before the wait timed their own interval (grow_before_wait).
  const bool pregrown = pregrown_.valid;
  pregrown_.valid = false;
  if (may_pick && !pregrown) draft_.backend().device_interval_begin();
  // Roots from observe_paths_on_device's forward (its outputs and top-k on the backend); the
  // others' backlogs run now, their outputs brought to the host when such roots are in use
  // (a forward keeping them there would replace those roots' top-k).
  std::vector<RequestState*> flush;
  bool device_roots = false;
  for (RequestState* s : states) {
    if (on_backend && s->device_root >= 0 && s->backlog_tokens.empty()) {
      s->device_row = s->device_root;
      s->device_top_row = s->device_root;
      device_roots = true;
    } else {
      flush.push_back(s);
    }
  }
  flush_backlogs(flush, on_backend && !device_roots);
  // Request i's budget checked, its tree parameters set and its tree root-only for now; true
  // when a tree may grow from its root (whose output is on the host or, on the backend, there).
  const auto may_grow = [&](size_t i) {
    const auto& [request, budget] = requests[i];
    tracker_.check_budget(request, budget);
    const RequestState& s = requests_.at(request);
    params[i].total_tokens = std::min(options_.tree.total_tokens, budget.max_nodes);
    params[i].depth = std::min(options_.tree.depth, budget.max_depth - 1);
    params[i].top_k = options_.tree.top_k;
    trees[i] = DraftTree::root_only(tracker_.root(request));
    return (!s.last_output.empty() || s.device_row >= 0) && params[i].total_tokens > 1 &&
           budget.max_depth >= 1;
  };
  if (on_backend) {
    // Every depth on the draft's backend, then growers replay the same choices from the
    // downloaded top-k rows (the device picks each frontier by the grower's rule). Roots still
    // on the device (this call's backlog forward: their outputs and top-k) come first
    // (grow_trees' order); the others' outputs and top-k are on the host.
    struct Candidate {
      size_t index;
      RequestState* state;
    };
    std::vector<Candidate> cands;
    std::vector<EagleDraftModel::GrowItem> items;
    int32_t depths = 0;
    for (bool device_roots : {true, false})
      for (size_t i = 0; i < requests.size(); ++i) {
        RequestState& s = requests_.at(requests[i].first);
        if ((s.device_row >= 0) != device_roots || !may_grow(i)) continue;
        ARBOR_CHECK(s.device_row >= 0 || s.last_top.k == top_k);
        cands.push_back({i, &s});
        items.push_back({s.seq, s.first_position + draft_.length(s.seq),
                         s.device_row >= 0 ? nullptr : &s.last_top, s.last_output, s.device_row,
                         s.device_top_row});
        depths = std::max(depths, params[i].depth);
      }
    if (items.empty()) return trees;
    std::vector<TopKRows> roots;
    // Picked on the backend too: each tree's tokens and parents stay there (no wait).
    EagleDraftModel::DeviceTrees picked;
    bool pick = may_pick;
    for (const Candidate& c : cands) {
      const DynamicTreeParams& p = params[c.index];
      pick = pick && draft_tree_candidates(top_k, p.depth) <= kMaxDraftTreeCandidates;
      picked.depth.push_back(p.depth);
      picked.nodes.push_back(draft_tree_nodes(top_k, p.depth, p.total_tokens));
      picked.stride = std::max(picked.stride, picked.nodes.back());
    }
    // The same requests under the same budgets as the last step's: the trees grown before the
    // wait (observe_paths_on_device) are these.
    std::vector<std::pair<RequestId, DynamicTreeParams>> now;
    for (const Candidate& c : cands) now.push_back({requests[c.index].first, params[c.index]});
    const bool repeated = pick && now == last_picked_;
    bool hit = pick && pregrown && pregrown_.ids.size() == now.size();
    for (size_t i = 0; hit && i < now.size(); ++i)
      hit = cands[i].state->device_row >= 0 && pregrown_.ids[i] == now[i].first &&
            pregrown_.params[i] == now[i].second;
    if (pick) {
      repeat_rate_ = 0.75 * repeat_rate_ + (repeated ? 0.25 : 0.0);
      last_picked_ = std::move(now);
    } else {
      last_picked_.clear();
    }
    // (At least one depth: a tree of the root's children alone still reads the roots' top-k.)
    std::vector<TopKRows> log;
    if (hit) {
      picked.out = pregrown_.trees.out;
      ++pregrown_hits_;
    } else {
      log = draft_.grow_trees(items, top_k, std::max(depths, 1), &roots, pick ? &picked : nullptr,
                              device_roots);
    }
    if (pick) {
      for (size_t i = 0; i < cands.size(); ++i) {
        DraftTree& t = trees[cands[i].index];
        const int32_t nodes = picked.nodes[i];
        const int64_t base = static_cast<int64_t>(i) * 2 * picked.stride;
        t.token.assign(static_cast<size_t>(nodes), t.token[0]);
        // The placeholder shape: a chain down to the deepest a node may lie (depth + 1), the
        // rest there too, so that no node is deeper than its placeholder (node i is at most i
        // deep), which the verify step's layout and attention plan are sized from.
        const int32_t deepest = picked.depth[i] + 1;
        t.parent.resize(static_cast<size_t>(nodes));
        for (int32_t n = 0; n < nodes; ++n)
          t.parent[static_cast<size_t>(n)] = n <= deepest ? n - 1 : deepest - 1;
        t.device.owner = &draft_.backend();
        t.device.ids = picked.out;
        t.device.index.assign(static_cast<size_t>(nodes), -1);
        t.device.parent_index.assign(static_cast<size_t>(nodes), -1);
        for (int32_t n = 1; n < nodes; ++n) {
          t.device.index[static_cast<size_t>(n)] = base + n;
          t.device.parent_index[static_cast<size_t>(n)] = base + picked.stride + n;
        }
      }
      if (!pregrown) draft_.backend().device_interval_end();
      timed_draft_ = !pregrown || hit;
      return trees;
    }
    const auto k = static_cast<size_t>(top_k);
    for (size_t i = 0; i < cands.size(); ++i) {
      RequestState& s = *cands[i].state;
      if (s.device_row >= 0) s.last_top = roots[i];
      const size_t index = cands[i].index;
      DynamicTreeGrower grower(trees[index].token[0], roots[i], params[index], to_target);
      for (size_t d = 0; !grower.done(); ++d) grower.absorb(log.at(d).slice(i * k, (i + 1) * k));
      trees[index] = grower.tree();
    }
    // The roots' outputs stay on the device (no wait for them): a request proposed for again
    // before any new rows (none in steady state: every verify step feeds rows back) gets a
    // root-only tree that once.
    return trees;
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (!may_grow(i)) continue;
    const RequestState& s = requests_.at(requests[i].first);
    // The root's children: the top-k of its row, from observe()'s step.
    ARBOR_CHECK(s.last_top.k == top_k);
    growing.push_back({i,
                       DynamicTreeGrower(trees[i].token[0], s.last_top, params[i], to_target),
                       {s.seq},
                       s.last_output,
                       {},
                       s.first_position + draft_.length(s.seq)});
  }
  if (growing.empty()) return trees;
  while (true) {
    std::vector<SeqId> parents;
    std::vector<int32_t> tokens, positions, last_rows;
    std::vector<float> hidden;
    std::vector<std::pair<size_t, size_t>> span_of;  // growing index -> [first row, rows)
    for (size_t gi = 0; gi < growing.size(); ++gi) {
      Growing& g = growing[gi];
      if (g.grower.done()) continue;
      const std::vector<FrontierNode> frontier = g.grower.frontier();
      span_of.push_back({gi, parents.size()});
      for (const FrontierNode& node : frontier) {
        const size_t row = node.parent_row < 0 ? 0 : static_cast<size_t>(node.parent_row);
        parents.push_back(g.prev_seqs.at(row));
        tokens.push_back(node.token);
        positions.push_back(g.position + g.grower.step());
        // The first expansion reads the roots' outputs from the host (each from its request's
        // last draft forward); the later ones the previous expansion's, on the device.
        if (g.prev_first < 0)
          hidden.insert(hidden.end(), g.prev_out.begin() + static_cast<int64_t>(row) * h,
                        g.prev_out.begin() + static_cast<int64_t>(row + 1) * h);
        else
          last_rows.push_back(g.prev_first + static_cast<int32_t>(row));
      }
    }
    if (parents.empty()) break;
    ARBOR_CHECK(hidden.empty() || last_rows.empty(), "expansions of different depths");
    std::vector<SeqId> children;
    TopKRows top;
    draft_.expand_on_device(parents, tokens, hidden, last_rows, positions, &children, top_k, &top);
    for (size_t k = 0; k < span_of.size(); ++k) {
      Growing& g = growing[span_of[k].first];
      const size_t begin = span_of[k].second;
      const size_t end = k + 1 < span_of.size() ? span_of[k + 1].second : parents.size();
      // The previous step's forks are no longer needed: their children hold references.
      for (SeqId q : g.temporary) draft_.free_sequence(q);
      g.temporary.assign(children.begin() + begin, children.begin() + end);
      g.prev_seqs = g.temporary;
      g.prev_first = static_cast<int32_t>(begin);
      g.grower.absorb(top.slice(begin, end));
    }
  }
  for (Growing& g : growing) trees[g.index] = g.grower.tree();
  return trees;
}

void EagleProposer::set_tree_reader(Backend* reader) {
  tree_reader_ = reader != nullptr && reader->shares_memory_with(draft_.backend());
  reader_ = tree_reader_ ? reader : nullptr;
}

double EagleProposer::last_draft_device_ms() {
  return timed_draft_ ? draft_.backend().last_device_interval_ms() : -1.0;
}

bool EagleProposer::fork(RequestId src, RequestId dst) {
  tracker_.fork(src, dst);
  RequestState s = requests_.at(src);
  if (s.seq >= 0) s.seq = draft_.fork(s.seq);
  s.device_rows = 0;  // (no device rows in flight at a prompt's end; none shared)
  s.device_root = -1;
  requests_[dst] = std::move(s);
  return true;
}

void EagleProposer::end(RequestId request) {
  tracker_.end(request);
  auto it = requests_.find(request);
  if (it != requests_.end()) {
    if (it->second.seq >= 0) draft_.free_sequence(it->second.seq);
    requests_.erase(it);
  }
}

}  // namespace arbor
