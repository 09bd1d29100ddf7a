#include "engine/spec/eagle_proposer.h"

#include <algorithm>

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

void EagleProposer::observe(const TargetFeedback& f) {
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
  std::vector<float> features;
  std::vector<int32_t> tokens;
  int32_t first_row_position = f.start;
  if (!s.pending_feature.empty()) {
    const int32_t t = n > 0 ? f.tokens[0] : f.next_token;
    if (t >= 0) {
      features = std::move(s.pending_feature);
      s.pending_feature.clear();
      tokens.push_back(t);
      first_row_position = f.start - 1;
    }
  }
  auto feature_row = [&](size_t i, std::vector<float>* out) {
    if (!draft_.eagle3()) {
      auto row = f.hidden.subspan(i * width, width);
      out->insert(out->end(), row.begin(), row.end());
      return;
    }
    const size_t th = static_cast<size_t>(width / 3);  // concat(low, mid, high)
    for (const std::span<const float>& layer : f.captured) {
      auto row = layer.subspan(i * th, th);
      out->insert(out->end(), row.begin(), row.end());
    }
  };
  for (size_t i = 0; i < n; ++i) {
    const int32_t next = token_after(i);
    if (next < 0) {
      s.pending_feature.clear();
      feature_row(i, &s.pending_feature);
      break;
    }
    feature_row(i, &features);
    tokens.push_back(next);
  }
  if (tokens.empty()) return;
  const int32_t expected = s.first_position + draft_.length(s.seq);
  ARBOR_CHECK(first_row_position == expected, "draft row position " +
                                                  std::to_string(first_row_position) +
                                                  ", expected " + std::to_string(expected));
  const std::vector<float> out = draft_.append(s.seq, tokens, features, first_row_position);
  const int64_t h = draft_.hidden_size();
  s.last_output.assign(out.end() - h, out.end());
}

DraftTree EagleProposer::propose(RequestId request, const TreeBudget& budget) {
  tracker_.check_budget(request, budget);
  const int32_t root = tracker_.root(request);
  RequestState& s = requests_.at(request);
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
  const int32_t top_k = static_cast<int32_t>(std::min<int64_t>(params.top_k, draft_.draft_vocab()));
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
    std::vector<float> out = draft_.expand(parents, tokens, hidden, position + step - 1, &children);
    // The previous step's forks are no longer needed: their children hold references to the
    // shared blocks.
    for (SeqId q : temporary) draft_.free_sequence(q);
    temporary = children;
    prev_seqs = std::move(children);
    prev_out = out;
    return draft_.top_log_probs(out, static_cast<int64_t>(frontier.size()), top_k);
  };
  const TopKRows root_top = draft_.top_log_probs(s.last_output, 1, top_k);
  return grow_dynamic_tree_top_k(
      root, root_top, params, [this](int32_t id) { return draft_.to_target(id); }, expand);
}

bool EagleProposer::fork(RequestId src, RequestId dst) {
  tracker_.fork(src, dst);
  RequestState s = requests_.at(src);
  if (s.seq >= 0) s.seq = draft_.fork(s.seq);
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
