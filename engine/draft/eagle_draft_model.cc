#include "engine/draft/eagle_draft_model.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "engine/core/error.h"
#include "engine/core/host_math.h"

namespace arbor {

namespace {

// ARBOR_EAGLE_PROFILE=1: host wall time of each phase of the draft's steps, summed over the
// process and printed to stderr at exit (where an expansion step's milliseconds go).
enum Phase { kFork, kCopyKv, kBuild, kSetStep, kUpload, kPrepare, kRun, kTopK, kDownload, kPhases };
struct PhaseClock {
  bool on = false;
  // Atomics: draft models may run on several threads.
  std::array<std::atomic<int64_t>, kPhases> nanos{};
  std::array<std::atomic<int64_t>, kPhases> calls{};
  PhaseClock() {
    const char* e = std::getenv("ARBOR_EAGLE_PROFILE");
    on = e != nullptr && std::string(e) == "1";
  }
  ~PhaseClock() {
    if (!on) return;
    static const char* names[kPhases] = {"fork+reserve",  "copy_kv",      "build step",
                                         "set_step",      "upload",       "prepare graph",
                                         "run ops/graph", "top-k (wait)", "download"};
    for (int i = 0; i < kPhases; ++i) {
      const double ms = static_cast<double>(nanos[i].load()) * 1e-6;
      const long long n = static_cast<long long>(calls[i].load());
      std::fprintf(stderr, "eagle draft phase %-14s %9.3f ms total, %7lld calls, %.1f us/call\n",
                   names[i], ms, n, n > 0 ? ms * 1e3 / static_cast<double>(n) : 0.0);
    }
  }
};
PhaseClock g_phase_clock;
struct PhaseTimer {
  Phase phase;
  std::chrono::steady_clock::time_point t0;
  explicit PhaseTimer(Phase p) : phase(p) {
    if (g_phase_clock.on) t0 = std::chrono::steady_clock::now();
  }
  void next(Phase p) {
    stop();
    phase = p;
    if (g_phase_clock.on) t0 = std::chrono::steady_clock::now();
  }
  void stop() {
    if (!g_phase_clock.on || phase == kPhases) return;
    g_phase_clock.nanos[phase] +=
        std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now() - t0)
            .count();
    g_phase_clock.calls[phase]++;
    phase = kPhases;
  }
  ~PhaseTimer() { stop(); }
};

// Columns [begin, begin + width) of a [rows, cols] matrix (shape-only for a shape-only matrix:
// dummy weights the backend fills).
HostTensor columns(const HostTensor& w, int64_t begin, int64_t width) {
  ARBOR_CHECK(w.shape.size() == 2 && begin + width <= w.shape[1]);
  if (w.data.empty()) {
    HostTensor shaped;
    shaped.shape = {w.shape[0], width};
    return shaped;
  }
  HostTensor out({w.shape[0], width});
  for (int64_t r = 0; r < w.shape[0]; ++r)
    std::memcpy(out.ptr() + r * width, w.ptr() + r * w.shape[1] + begin, sizeof(float) * width);
  return out;
}

}  // namespace

EagleDraftModel::EagleDraftModel(std::unique_ptr<Backend> backend, const EagleWeights& w,
                                 const HostTensor& target_embed, const HostTensor& target_lm_head,
                                 const KvCacheConfig& kv)
    : backend_(std::move(backend)), config_(w.config), kv_(kv), d2t_(w.d2t) {
  ARBOR_CHECK(backend_ != nullptr);
  const EagleDraftConfig& c = config_;
  const int64_t h = c.hidden_size;
  const std::string who = std::string(eagle_version_name(c.version)) + " draft " + w.source;
  auto mismatch = [&](const std::string& what, const std::vector<int64_t>& want,
                      const std::vector<int64_t>& found) {
    throw_error(ErrorCode::kInvalidArgument, who + ": " + what + " has shape " + shape_str(found) +
                                                 ", the draft expects " + shape_str(want));
  };
  const std::vector<int64_t> embed_shape = {c.vocab_size, h};
  if (w.embed.empty() && target_embed.shape != embed_shape)
    mismatch("the target's embedding", embed_shape, target_embed.shape);
  if (!eagle3() && target_lm_head.shape != embed_shape)
    mismatch("the target's LM head", embed_shape, target_lm_head.shape);

  Backend& b = *backend_;
  rope_.head_dim = c.head_dim;
  rope_.theta = c.rope_theta;
  if (c.rope_linear_factor != 1.0) {
    rope_.scaling = "linear";
    rope_.factor = c.rope_linear_factor;
  }
  KvCacheShape shape;
  shape.num_layers = 1;
  shape.num_blocks = kv.num_blocks;
  shape.block_size = kv.block_size;
  shape.num_kv_heads = c.num_kv_heads;
  shape.head_dim = c.head_dim;
  b.allocate_kv(shape);

  auto opt = [&](const HostTensor& t) { return t.empty() ? Tensor{} : b.upload_weight(t); };
  // A backend that prefers fused projections (as the target's layers use them) gets q|k|v and
  // gate|up each as one matrix: one GEMM instead of three or two.
  fused_ = b.fuse_projections();
  const int64_t q_rows = c.num_heads * c.head_dim, kv_rows = c.num_kv_heads * c.head_dim;
  const auto upload_qkv = [&](const HostTensor& q, const HostTensor& k, const HostTensor& v,
                              Tensor* wq, Tensor* wk, Tensor* wv, Tensor* wqkv) {
    if (fused_) {
      *wqkv = b.upload_weight(stack_rows({&q, &k, &v}));
    } else {
      *wq = b.upload_weight(q);
      *wk = b.upload_weight(k);
      *wv = b.upload_weight(v);
    }
  };
  embed_ = b.upload_weight(w.embed.empty() ? target_embed : w.embed);
  if (eagle3()) {
    fc_ = b.upload_weight(w.fc);
    input_norm_ = b.upload_weight(w.input_norm);
    hidden_norm_ = b.upload_weight(w.hidden_norm);
    upload_qkv(columns(w.wq, 0, h), columns(w.wk, 0, h), columns(w.wv, 0, h), &wq_, &wk_, &wv_,
               &wqkv_);
    upload_qkv(columns(w.wq, h, h), columns(w.wk, h, h), columns(w.wv, h, h), &wq_h_, &wk_h_,
               &wv_h_, &wqkv_h_);
    norm_ = b.upload_weight(w.norm);
    lm_head_ = b.upload_weight(w.lm_head);
  } else {
    fc_emb_ = b.upload_weight(columns(w.fc, 0, h));
    fc_feat_ = b.upload_weight(columns(w.fc, h, h));
    fc_bias_ = opt(w.fc_bias);
    upload_qkv(w.wq, w.wk, w.wv, &wq_, &wk_, &wv_, &wqkv_);
    if (!d2t_.empty()) {
      // A token map (restrict_draft_vocab): only its rows of the target's LM head, in its order.
      HostTensor rows({c.draft_vocab_size, h});
      for (int64_t i = 0; i < c.draft_vocab_size; ++i)
        std::memcpy(rows.ptr() + i * h,
                    target_lm_head.ptr() + to_target(static_cast<int32_t>(i)) * h,
                    sizeof(float) * h);
      lm_head_ = b.upload_weight(rows);
    } else {
      // A tied target hands the same tensor twice: upload it once.
      const bool shared = w.embed.empty() && &target_lm_head == &target_embed;
      lm_head_ = shared ? embed_ : b.upload_weight(target_lm_head);
    }
  }
  if (!fused_) {
    bq_ = opt(w.bq);
    bk_ = opt(w.bk);
    bv_ = opt(w.bv);
  } else if (!w.bq.empty() || !w.bk.empty() || !w.bv.empty()) {
    bqkv_ = b.upload_weight(stack_rows({&w.bq, &w.bk, &w.bv}, {q_rows, kv_rows, kv_rows}));
  }
  wo_ = b.upload_weight(w.wo);
  post_norm_ = b.upload_weight(w.post_norm);
  if (fused_) {
    w_gate_up_ = b.upload_weight(stack_rows({&w.w_gate, &w.w_up}));
  } else {
    w_gate_ = b.upload_weight(w.w_gate);
    w_up_ = b.upload_weight(w.w_up);
  }
  w_down_ = b.upload_weight(w.w_down);
  if (b.step_graphs_enabled()) {
    Backend* bp = backend_.get();
    graphs_ = std::make_unique<StepGraphCache>(StepGraphCache::Options{},
                                               [bp](int64_t g) { bp->release_step_graph(g); });
  }
}

int64_t EagleDraftModel::feature_width() const {
  return eagle3() ? 3 * config_.target_hidden_size : config_.hidden_size;
}

int32_t EagleDraftModel::to_target(int32_t draft_id) const {
  return d2t_.empty() ? draft_id : static_cast<int32_t>(draft_id + d2t_[draft_id]);
}

std::vector<int64_t> EagleDraftModel::reserve(SeqId seq, int32_t num_tokens, SlotCopies* copies) {
  ReservePlan plan;
  if (!kv_.reserve(seq, num_tokens, &plan))
    throw_error(ErrorCode::kResourceExhausted,
                "EAGLE draft KV cache is full (" + std::to_string(kv_.num_blocks()) +
                    " blocks of " + std::to_string(kv_.block_size()) + " tokens, " +
                    std::to_string(kv_.num_free_blocks()) + " free, " + std::to_string(num_tokens) +
                    " tokens wanted): raise the draft KV blocks");
  copies->append(plan.copies);
  return plan.slots;
}

std::vector<float> EagleDraftModel::append(SeqId seq, std::span<const int32_t> tokens,
                                           std::span<const float> features, int32_t position0,
                                           int32_t top_k, TopKRows* last_top) {
  ARBOR_CHECK(static_cast<int64_t>(features.size()) ==
              static_cast<int64_t>(tokens.size()) * feature_width());
  if (tokens.empty()) return {};
  const AppendItem item{seq, tokens, features, position0};
  std::vector<TopKRows> tops;
  std::vector<float> out =
      append_batch(std::span<const AppendItem>(&item, 1), last_top != nullptr ? top_k : 0, &tops);
  if (last_top != nullptr) *last_top = std::move(tops.at(0));
  return out;
}

std::vector<float> EagleDraftModel::append_batch(std::span<const AppendItem> items, int32_t top_k,
                                                 std::vector<TopKRows>* last_tops, bool download) {
  if (last_tops != nullptr) last_tops->clear();
  if (items.empty()) return {};
  SlotCopies copies;
  std::vector<Row> rows;
  std::vector<float> features;
  size_t reserved = 0;  // items whose reservation must be cancelled on failure
  std::vector<float> out;
  try {
    for (const AppendItem& it : items) {
      const auto n = static_cast<int32_t>(it.tokens.size());
      ARBOR_CHECK(n > 0 && static_cast<int64_t>(it.features.size()) == n * feature_width());
      rows.push_back({it.seq, {it.tokens.begin(), it.tokens.end()}, it.position0, {}});
      rows.back().slots = reserve(it.seq, n, &copies);
      ++reserved;
      features.insert(features.end(), it.features.begin(), it.features.end());
    }
    if (!copies.empty()) backend_->copy_kv(copies.src_slots, copies.dst_slots);
    TopKRows top;
    out = forward(rows, features, /*input_is_feature=*/true, top_k > 0 ? Head::kLast : Head::kNone,
                  top_k, last_tops != nullptr ? &top : nullptr, {}, download);
    if (top_k > 0 && last_tops != nullptr)
      for (size_t i = 0; i < items.size(); ++i) last_tops->push_back(top.slice(i, i + 1));
  } catch (...) {
    for (size_t i = 0; i < reserved; ++i)  // cancel the reservations
      kv_.apply(kv_.plan_commit(items[i].seq, {}, {}));
    if (last_tops != nullptr) last_tops->clear();
    throw;
  }
  for (const AppendItem& it : items) kv_.commit_all(it.seq, it.tokens);
  return out;
}

void EagleDraftModel::append_on_device(std::span<const DeviceAppendItem> items,
                                       const Tensor& features, const Tensor& next, int32_t top_k) {
  if (items.empty()) return;
  ARBOR_CHECK(features.dtype == DType::kF32 && features.cols == feature_width() &&
                  next.dtype == DType::kI32 && next.rows == features.rows && top_k > 0,
              "append_on_device: features " + std::to_string(features.rows) + " x " +
                  std::to_string(features.cols) + ", tokens " + std::to_string(next.rows));
  SlotCopies copies;
  std::vector<Row> rows;
  DeviceRows device{features, next, {}};
  size_t reserved = 0;
  extra_slots_.clear();
  try {
    for (const DeviceAppendItem& it : items) {
      ARBOR_CHECK(it.rows > 0 && it.first >= 0 && it.first + it.rows <= features.rows &&
                  it.extra >= 0 && kv_.reserved_len(it.seq) == 0);
      rows.push_back(
          {it.seq, std::vector<int32_t>(static_cast<size_t>(it.rows), 0), it.position0, {}});
      std::vector<int64_t> slots = reserve(it.seq, it.rows + it.extra, &copies);
      ++reserved;
      if (it.extra > 0) extra_slots_[it.seq].assign(slots.begin() + it.rows, slots.end());
      slots.resize(static_cast<size_t>(it.rows));
      rows.back().slots = std::move(slots);
      for (int32_t j = 0; j < it.rows; ++j) device.rows.push_back(it.first + j);
    }
    if (!copies.empty()) backend_->copy_kv(copies.src_slots, copies.dst_slots);
    forward(rows, {}, /*input_is_feature=*/true, Head::kAll, top_k, nullptr, {}, false, &device);
  } catch (...) {
    for (size_t i = 0; i < reserved; ++i) cancel_on_device(items[i].seq);
    extra_slots_.clear();
    throw;
  }
}

void EagleDraftModel::commit_on_device(SeqId seq, std::span<const int32_t> tokens) {
  const auto n = static_cast<int32_t>(tokens.size());
  ARBOR_CHECK(n >= 1 && n <= kv_.reserved_len(seq),
              "commit_on_device: " + std::to_string(n) + " rows of " +
                  std::to_string(kv_.reserved_len(seq)) + " reserved");
  std::vector<int32_t> nodes(static_cast<size_t>(n));
  for (int32_t i = 0; i < n; ++i) nodes[static_cast<size_t>(i)] = i;
  const CommitPlan plan = kv_.plan_commit(seq, nodes, tokens);
  ARBOR_CHECK(plan.copies.empty(), "commit_on_device: a prefix needs no copies");
  kv_.apply(plan);
}

void EagleDraftModel::cancel_on_device(SeqId seq) {
  if (kv_.has_sequence(seq) && kv_.reserved_len(seq) > 0) kv_.apply(kv_.plan_commit(seq, {}, {}));
}

std::vector<float> EagleDraftModel::expand(std::span<const SeqId> parents,
                                           std::span<const int32_t> tokens,
                                           std::span<const float> hidden, int32_t position,
                                           std::vector<SeqId>* children, int32_t top_k,
                                           TopKRows* top) {
  const std::vector<int32_t> positions(parents.size(), position);
  return expand(parents, tokens, hidden, std::span<const int32_t>(positions), children, top_k, top);
}

std::vector<float> EagleDraftModel::expand(std::span<const SeqId> parents,
                                           std::span<const int32_t> tokens,
                                           std::span<const float> hidden,
                                           std::span<const int32_t> positions,
                                           std::vector<SeqId>* children, int32_t top_k,
                                           TopKRows* top) {
  ARBOR_CHECK(static_cast<int64_t>(hidden.size()) ==
              static_cast<int64_t>(parents.size()) * hidden_size());
  return expand_rows(parents, tokens, hidden, {}, positions, children, top_k, top, true);
}

void EagleDraftModel::expand_on_device(std::span<const SeqId> parents,
                                       std::span<const int32_t> tokens,
                                       std::span<const float> hidden,
                                       std::span<const int32_t> last_rows,
                                       std::span<const int32_t> positions,
                                       std::vector<SeqId>* children, int32_t top_k, TopKRows* top) {
  if (!hidden.empty()) {
    ARBOR_CHECK(static_cast<int64_t>(hidden.size()) ==
                static_cast<int64_t>(parents.size()) * hidden_size());
    expand_rows(parents, tokens, hidden, {}, positions, children, top_k, top, false);
    return;
  }
  ARBOR_CHECK(last_rows.size() == parents.size());
  for (int32_t r : last_rows)
    ARBOR_CHECK(r >= 0 && r < last_rows_,
                "expand_on_device: row " + std::to_string(r) + " of " + std::to_string(last_rows_));
  expand_rows(parents, tokens, {}, last_rows, positions, children, top_k, top, false);
}

std::vector<float> EagleDraftModel::expand_rows(
    std::span<const SeqId> parents, std::span<const int32_t> tokens, std::span<const float> hidden,
    std::span<const int32_t> last_rows, std::span<const int32_t> positions,
    std::vector<SeqId>* children, int32_t top_k, TopKRows* top, bool download) {
  const size_t count = parents.size();
  ARBOR_CHECK(tokens.size() == count && positions.size() == count);
  children->clear();
  std::vector<Row> rows;
  SlotCopies copies;
  try {
    PhaseTimer timer(kFork);
    for (size_t i = 0; i < count; ++i) {
      const SeqId child = kv_.fork(parents[i]);
      children->push_back(child);
      rows.push_back({child, {tokens[i]}, positions[i], reserve(child, 1, &copies)});
    }
    timer.next(kCopyKv);
    if (!copies.empty()) backend_->copy_kv(copies.src_slots, copies.dst_slots);
    timer.stop();
    std::vector<float> out =
        forward(rows, hidden, /*input_is_feature=*/false, top != nullptr ? Head::kAll : Head::kNone,
                top_k, top, last_rows, download);
    for (const Row& r : rows) kv_.commit_all(r.seq, r.tokens);
    return out;
  } catch (...) {
    for (SeqId child : *children) kv_.free_sequence(child);
    children->clear();
    throw;
  }
}

std::vector<float> EagleDraftModel::forward(const std::vector<Row>& rows,
                                            std::span<const float> input, bool input_is_feature,
                                            Head head_rows_of, int32_t top_k, TopKRows* top,
                                            std::span<const int32_t> input_rows, bool download,
                                            const DeviceRows* device) {
  PhaseTimer timer(kBuild);
  StepInputs step;
  step.qo_indptr.push_back(0);
  step.mask_indptr.push_back(0);
  int64_t real_rows = 0;
  for (const Row& r : rows) real_rows += static_cast<int64_t>(r.tokens.size());
  // Committed rows (features in) run as one-token requests, each over its sequence's earlier
  // rows (written by the same step's write_kv before the attention reads them): the same keys
  // as a causal chunk, and in batch-invariant attention the same bits, but a step a graph can
  // record. Up to kMaxGraphFeatureRows rows, padded to a power of two with rows on a slot of
  // their own whose outputs nothing reads, and the head's rows (the requests' last rows) padded
  // the same way with copies of the last one: a batch's row and request counts change from step
  // to step, and every pair would be a recording of its own.
  const bool pad = input_is_feature && graphs_ != nullptr && real_rows <= kMaxGraphFeatureRows;
  const int64_t padded_rows = pad ? graph_bucket(real_rows, 1) : real_rows;
  if (pad && padded_rows > real_rows && pad_seq_ < 0) {
    SlotCopies none;
    const SeqId seq = kv_.create_sequence().seq;
    pad_slot_ = reserve(seq, 1, &none).at(0);
    pad_seq_ = seq;
  }
  int32_t max_blocks = 0;
  for (const Row& r : rows)
    max_blocks = std::max<int32_t>(max_blocks, static_cast<int32_t>(kv_.block_table(r.seq).size()));
  if (padded_rows > real_rows)
    max_blocks =
        std::max<int32_t>(max_blocks, static_cast<int32_t>(kv_.block_table(pad_seq_).size()));
  step.max_blocks_per_request = max_blocks;
  const auto end_request = [&](SeqId seq, int32_t committed) {
    step.qo_indptr.push_back(step.num_tokens());
    step.mask_indptr.push_back(0);
    step.committed_len.push_back(committed);
    kv_.append_block_table(seq, max_blocks, &step.block_tables);
  };
  for (const Row& r : rows) {
    const int32_t committed = kv_.committed_len(r.seq);
    for (size_t t = 0; t < r.tokens.size(); ++t) {
      step.token_ids.push_back(r.tokens[t]);
      step.positions.push_back(r.position0 + static_cast<int32_t>(t));
      step.slot_mapping.push_back(r.slots[t]);
      if (input_is_feature) end_request(r.seq, committed + static_cast<int32_t>(t));
    }
    if (!input_is_feature) end_request(r.seq, committed);
    if (head_rows_of == Head::kLast) step.logits_rows.push_back(step.num_tokens() - 1);
  }
  if (device != nullptr) {  // the ids are read from the device (padding rows keep their 0)
    ARBOR_CHECK(static_cast<int64_t>(device->rows.size()) == real_rows);
    step.token_source = device->tokens;
    step.token_source_index.assign(device->rows.begin(), device->rows.end());
  }
  for (int64_t i = real_rows; i < padded_rows; ++i) {
    if (device != nullptr) step.token_source_index.push_back(-1);
    step.token_ids.push_back(0);
    step.positions.push_back(0);
    step.slot_mapping.push_back(pad_slot_);
    end_request(pad_seq_, 0);
  }
  if (pad && head_rows_of == Head::kLast)
    step.logits_rows.resize(
        static_cast<size_t>(graph_bucket(static_cast<int64_t>(step.logits_rows.size()), 1)),
        step.logits_rows.back());

  Backend& b = *backend_;
  const EagleDraftConfig& c = config_;
  const int64_t n = step.num_tokens();
  const bool from_last = !input_rows.empty();
  ARBOR_CHECK(!from_last || (static_cast<int64_t>(input_rows.size()) == n && !input_is_feature));
  const int64_t in_width =
      from_last           ? c.hidden_size
      : device != nullptr ? device->features.cols
                          : static_cast<int64_t>(input.size()) / std::max<int64_t>(real_rows, 1);
  ARBOR_CHECK(from_last || device != nullptr ||
              in_width * real_rows == static_cast<int64_t>(input.size()));
  // Device rows: the padding rows read row 0 of the source (finite, never read back).
  std::vector<int32_t> device_rows;
  if (device != nullptr) {
    device_rows = device->rows;
    device_rows.resize(static_cast<size_t>(n), device->rows.empty() ? 0 : device->rows[0]);
  }
  // The input: uploaded (zeros for the padding rows), or gathered from the previous forward's
  // outputs on the device.
  std::vector<float> padded_input;
  if (!from_last && device == nullptr && n > real_rows) {
    padded_input.assign(static_cast<size_t>(n * in_width), 0.0f);
    std::copy(input.begin(), input.end(), padded_input.begin());
    input = padded_input;
  }
  const auto fill_input = [&](const Tensor& in) {
    if (from_last)
      b.gather_rows(Tensor{last_out_.data, DType::kF32, last_rows_, c.hidden_size}, input_rows, in);
    else if (device != nullptr)
      b.gather_rows(device->features, device_rows, in);
    else
      b.upload(input.data(), in);
  };
  // Expansion steps (every row one token, earlier outputs as input) replay a recording of the
  // layer once their shape is steady, as the target's steps do (LlamaModel::forward): the key
  // holds the row count and the block-table width (rounded up to a power of two); the ids,
  // positions, slots and context lengths are read from device memory.
  const bool graph_ok = graphs_ != nullptr && (!input_is_feature || pad);
  StepInputs padded;
  const StepInputs& chosen = graph_ok ? with_graph_table_width(step, &padded) : step;
  timer.next(kSetStep);
  b.set_step(chosen);
  b.reset_scratch();
  timer.next(kUpload);
  // The input is uploaded before the recorded ops, into the step's first scratch tensor.
  Tensor in = b.scratch(n, in_width);
  fill_input(in);
  timer.next(kPrepare);
  // The LM head over every row or over each Row's last (the step's logits rows), in the same
  // step (recorded with the layer).
  // A head without `top` keeps its top-k on the backend (Backend::draft_frontier_roots).
  ARBOR_CHECK(head_rows_of == Head::kNone || top_k > 0);
  const int64_t head_rows = head_rows_of == Head::kAll ? n
                            : head_rows_of == Head::kLast
                                ? static_cast<int64_t>(step.logits_rows.size())
                                : 0;
  const auto ops = [&] {
    std::vector<Tensor> outs = {layer(in, n, input_is_feature)};
    if (head_rows_of == Head::kAll) {
      outs.push_back(head(outs[0]));
    } else if (head_rows_of == Head::kLast) {
      Tensor last = b.scratch(head_rows, outs[0].cols);
      b.gather_logit_rows(outs[0], last);
      outs.push_back(head(last));
    }
    return outs;
  };
  std::vector<Tensor> outs;
  bool done = false;
  if (graph_ok) {
    // The head's kind and the input's kind too: a feedback forward and an expansion of the
    // same row and head counts record different ops.
    StepGraphKey key = {2,
                        n,
                        in_width,
                        chosen.max_blocks_per_request,
                        head_rows,
                        static_cast<int64_t>(head_rows_of),
                        input_is_feature ? 1 : 0};
    const bool prepared = b.prepare_step_graph(c.num_heads, &key);
    timer.next(kRun);
    if (prepared) {
      const auto check_ids = [&] {  // the recorded embedding does not check them
        for (int32_t id : step.token_ids)
          if (id < 0 || id >= embed_.rows)
            throw_error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                         " is outside the draft vocabulary of " +
                                                         std::to_string(embed_.rows));
      };
      const StepGraphRun run = run_step_graph(*graphs_, b, key, check_ids, ops, &outs);
      if (run == StepGraphRun::kReplayed) {
        done = true;
      } else if (run == StepGraphRun::kRecordingFailed) {
        b.reset_scratch();  // rewinds (the recording took addresses)
        in = b.scratch(n, in_width);
        fill_input(in);
      }
    }
  }
  if (timer.phase != kRun) timer.next(kRun);  // the graph path is in kRun already
  if (!done) outs = ops();
  // The outputs stay on the device for the next expansion step (expand_from_last): copied out
  // of the scratch arena, which the next step reuses.
  const Tensor& x = outs[0];
  Tensor& keep = device != nullptr ? device_out_ : last_out_;
  if (n > keep.rows) keep = b.persistent(std::max<int64_t>(n, 2 * keep.rows), x.cols);
  (device != nullptr ? device_rows_ : last_rows_) = n;
  b.split_cols(x, {Tensor{keep.data, DType::kF32, n, x.cols}});
  timer.next(kTopK);
  if (head_rows > 0 && top != nullptr) {
    top->k = top_k;
    b.top_k_log_softmax(outs[1], top_k, &top->ids, &top->values);  // the step's one wait
  } else if (head_rows > 0) {
    b.draft_frontier_roots(outs[1], top_k);
  }
  timer.next(kDownload);
  std::vector<float> out;
  if (!download) return out;
  out.resize(static_cast<size_t>(n * c.hidden_size));
  b.download(x, out.data());
  out.resize(static_cast<size_t>(real_rows * c.hidden_size));  // the padding rows' go
  return out;
}

std::vector<TopKRows> EagleDraftModel::grow_trees(std::span<const GrowItem> items, int32_t k,
                                                  int32_t depths, std::vector<TopKRows>* root_tops,
                                                  DeviceTrees* device,
                                                  bool roots_from_device_append,
                                                  const PathShift* shift) {
  Backend& b = *backend_;
  const int64_t h = hidden_size();
  const auto g_count = static_cast<int32_t>(items.size());
  const int32_t n = g_count * k;  // rows per depth
  std::vector<TopKRows> log;
  root_tops->clear();
  if (items.empty() || depths < 1) return log;
  ARBOR_CHECK(k >= 1 && k <= draft_vocab());
  ARBOR_CHECK(shift == nullptr ||
                  (device != nullptr && roots_from_device_append &&
                   shift->len_index.size() == items.size() && shift->rows.size() == items.size()),
              "grow_trees: a shifted grow picks on the backend from every item's append rows");
  // Every item's tree rows: depths * k slots after its committed rows, released at the end
  // (shifted: the extra slots of its append's reservation, left to it).
  std::vector<std::vector<int64_t>> slots;
  std::vector<int32_t> committed;
  size_t reserved = 0;
  const auto cancel = [&] {
    if (shift == nullptr)
      for (size_t i = 0; i < reserved; ++i) kv_.apply(kv_.plan_commit(items[i].seq, {}, {}));
    reserved = 0;
  };
  const Tensor root_source = roots_from_device_append
                                 ? Tensor{device_out_.data, DType::kF32, device_rows_, h}
                                 : Tensor{last_out_.data, DType::kF32, last_rows_, h};
  try {
    PhaseTimer timer(kFork);
    SlotCopies copies;
    int32_t on_device = 0;  // items whose roots are rows of the last forward's outputs (first)
    for (const GrowItem& it : items) {
      if (it.root_row >= 0) {
        ARBOR_CHECK(
            on_device == static_cast<int32_t>(committed.size()) && it.root_row < root_source.rows,
            "grow_trees: root row " + std::to_string(it.root_row) + " of " +
                std::to_string(root_source.rows) + " after host roots");
        ++on_device;
      } else {
        ARBOR_CHECK(it.root != nullptr && it.root->k == k && it.root->rows() == 1 &&
                    static_cast<int64_t>(it.root_output.size()) == h);
      }
      if (shift != nullptr) {
        const auto extra = extra_slots_.find(it.seq);
        ARBOR_CHECK(
            it.root_row >= 0 && extra != extra_slots_.end() &&
                static_cast<int64_t>(extra->second.size()) >= static_cast<int64_t>(depths) * k,
            "grow_trees: no extra slots reserved for a shifted tree");
        committed.push_back(kv_.committed_len(it.seq) + shift->rows[committed.size()]);
        slots.emplace_back(extra->second.begin(), extra->second.begin() + depths * k);
      } else {
        committed.push_back(kv_.committed_len(it.seq));
        slots.push_back(reserve(it.seq, depths * k, &copies));
      }
      ++reserved;
    }
    timer.next(kCopyKv);
    if (!copies.empty()) b.copy_kv(copies.src_slots, copies.dst_slots);
    timer.next(kUpload);
    if (g_count > root_out_.rows)
      root_out_ = b.persistent(std::max(g_count, 2 * static_cast<int32_t>(root_out_.rows)), h);
    const Tensor roots{root_out_.data, DType::kF32, g_count, h};
    std::vector<float> root_rows;
    std::vector<int32_t> ids, parents, device_rows, device_tops;
    std::vector<float> values;
    for (int32_t g = 0; g < g_count; ++g) {
      const GrowItem& it = items[static_cast<size_t>(g)];
      if (it.root_row >= 0) {
        device_rows.push_back(it.root_row);
        device_tops.push_back(it.root_top_row);
        ids.insert(ids.end(), static_cast<size_t>(k), 0);  // from the backend's kept top-k
        values.insert(values.end(), static_cast<size_t>(k), 0.f);
      } else {
        root_rows.insert(root_rows.end(), it.root_output.begin(), it.root_output.end());
        ids.insert(ids.end(), it.root->ids.begin(), it.root->ids.end());
        values.insert(values.end(), it.root->values.begin(), it.root->values.end());
      }
      parents.insert(parents.end(), static_cast<size_t>(k), g);
    }
    if (on_device > 0 && shift == nullptr)  // (shifted: draft_frontier_shift gathers them)
      b.gather_rows(root_source, device_rows, Tensor{root_out_.data, DType::kF32, on_device, h});
    if (on_device < g_count)
      b.upload(root_rows.data(), Tensor{static_cast<float*>(root_out_.data) + on_device * h,
                                        DType::kF32, g_count - on_device, h});
    if (!d2t_.empty() && !vocab_map_set_) {
      b.set_draft_vocab_map(d2t_);
      vocab_map_set_ = true;
    }
    // One step for every depth: row g * k + r is its own causal request over item g's committed
    // rows and, through a key path of up to `depths` entries, its ancestors' tree slots. The
    // host sets it up once, for the last depth (its attention plan covers every depth's keys);
    // each depth's load then writes the rows' ids, positions, slots, lengths and paths on the
    // device, so all depths run back to back (one step graph once the shape is steady).
    std::vector<int32_t> positions;
    std::vector<int64_t> all_slots(static_cast<size_t>(depths) * static_cast<size_t>(n));
    StepInputs step;
    step.qo_indptr.push_back(0);
    step.mask_indptr.push_back(0);
    step.key_path_indptr.push_back(0);
    int32_t max_blocks = 0;
    for (const GrowItem& it : items)
      max_blocks =
          std::max<int32_t>(max_blocks, static_cast<int32_t>(kv_.block_table(it.seq).size()));
    step.max_blocks_per_request = max_blocks;
    step.key_path_span = depths * k;
    for (int32_t g = 0; g < g_count; ++g) {
      const GrowItem& it = items[static_cast<size_t>(g)];
      const std::vector<int64_t>& tree_slots = slots[static_cast<size_t>(g)];
      const int32_t c = committed[static_cast<size_t>(g)];
      for (int32_t r = 0; r < k; ++r) {
        const int32_t row = g * k + r;
        for (int32_t d = 0; d < depths; ++d)
          all_slots[static_cast<size_t>(d) * static_cast<size_t>(n) + static_cast<size_t>(row)] =
              tree_slots[static_cast<size_t>(d * k + r)];
        positions.push_back(it.position);
        step.token_ids.push_back(0);  // the loads write these five
        step.positions.push_back(it.position + depths - 1);
        step.slot_mapping.push_back(tree_slots[static_cast<size_t>((depths - 1) * k + r)]);
        step.committed_len.push_back(c + depths - 1);
        step.qo_indptr.push_back(step.num_tokens());
        step.mask_indptr.push_back(0);
        kv_.append_block_table(it.seq, max_blocks, &step.block_tables);
        step.key_path_base.push_back(c);
        step.key_path.insert(step.key_path.end(), static_cast<size_t>(depths), 0);
        step.key_path_indptr.push_back(static_cast<int32_t>(step.key_path.size()));
      }
    }
    b.draft_frontier_begin(g_count, k, depths, ids, values, parents, positions, all_slots,
                           device_tops);
    StepInputs padded;
    const StepInputs& chosen = graphs_ != nullptr ? with_graph_table_width(step, &padded) : step;
    timer.next(kSetStep);
    b.set_step(chosen);
    if (shift != nullptr)
      b.draft_frontier_shift(shift->len, shift->len_index, shift->rows, root_source, roots);
    b.reset_scratch();
    timer.next(kPrepare);
    const auto ops = [&] {
      Tensor source = roots;
      for (int32_t d = 1; d <= depths; ++d) {
        Tensor in = b.scratch(n, h);
        b.draft_frontier_load(d, source, in);
        source = layer(in, n, /*input_is_feature=*/false);
        b.draft_frontier_expand(d, head(source));
      }
      return std::vector<Tensor>{source};
    };
    std::vector<Tensor> outs;
    bool done = false;
    if (graphs_ != nullptr) {
      StepGraphKey key = {3, n, h, chosen.max_blocks_per_request, depths, k};
      const bool prepared = b.prepare_step_graph(config_.num_heads, &key);
      timer.next(kRun);
      if (prepared) {
        const StepGraphRun run = run_step_graph(
            *graphs_, b, key, [] {}, ops, &outs);
        if (run == StepGraphRun::kReplayed) done = true;
        if (run == StepGraphRun::kRecordingFailed) {  // rewind what the recording took
          b.reset_scratch();
          b.draft_frontier_begin(g_count, k, depths, ids, values, parents, positions, all_slots,
                                 device_tops);
          if (shift != nullptr) {
            b.set_step(chosen);  // the step's key_path_base again, then moved back
            b.draft_frontier_shift(shift->len, shift->len_index, shift->rows, root_source, roots);
          }
        }
      }
    }
    if (timer.phase != kRun) timer.next(kRun);
    if (!done) outs = ops();
    timer.next(kDownload);
    if (device != nullptr) {  // the trees stay where they grew (no wait)
      device->out = b.draft_frontier_trees(device->depth, device->nodes, device->stride);
      cancel();
      return log;
    }
    std::vector<int32_t> all_ids, root_ids;
    std::vector<float> all_values, root_values;
    b.draft_frontier_log(depths, &all_ids, &all_values, &root_ids,
                         &root_values);  // the draft's one wait
    for (int32_t g = 0; g < g_count; ++g) {
      const auto at = static_cast<int64_t>(g) * k;
      root_tops->push_back({k,
                            {root_ids.begin() + at, root_ids.begin() + at + k},
                            {root_values.begin() + at, root_values.begin() + at + k}});
    }

    const size_t per_depth = static_cast<size_t>(n) * static_cast<size_t>(k);
    for (int32_t d = 0; d < depths; ++d) {
      const auto at = static_cast<int64_t>(per_depth * static_cast<size_t>(d));
      log.push_back(
          {k,
           {all_ids.begin() + at, all_ids.begin() + at + static_cast<int64_t>(per_depth)},
           {all_values.begin() + at, all_values.begin() + at + static_cast<int64_t>(per_depth)}});
    }
  } catch (...) {
    cancel();
    throw;
  }
  cancel();
  return log;
}

Tensor EagleDraftModel::layer(const Tensor& in, int64_t n, bool input_is_feature) {
  Backend& b = *backend_;
  const EagleDraftConfig& c = config_;
  const int64_t h = c.hidden_size;
  const int64_t q_width = c.num_heads * c.head_dim;
  const int64_t kv_width = c.num_kv_heads * c.head_dim;
  const double eps = c.rms_norm_eps;
  const int64_t in_width = in.cols;

  Tensor emb = b.scratch(n, h);  // [N, h] token embeddings
  b.embedding(embed_, emb);
  Tensor x;  // [N, h] residual stream
  Tensor tmp = b.scratch(n, h);
  Tensor q = b.scratch(n, q_width), k = b.scratch(n, kv_width), v = b.scratch(n, kv_width);
  // q|k|v from one input (fused: one GEMM, then split), added onto `acc` when acc is set.
  Tensor qkv = fused_ ? b.scratch(n, q_width + 2 * kv_width) : Tensor{};
  const auto project_qkv = [&](const Tensor& in_x, const Tensor& wq, const Tensor& wk,
                               const Tensor& wv, const Tensor& wqkv, bool bias, bool accumulate) {
    if (fused_) {
      if (!accumulate) {
        b.linear(in_x, wqkv, bias ? bqkv_ : Tensor{}, qkv);
      } else {
        Tensor part = b.scratch(n, q_width + 2 * kv_width);
        b.linear(in_x, wqkv, Tensor{}, part);
        b.add(qkv, part, qkv);
      }
      return;
    }
    const Tensor parts[3] = {q, k, v}, weights[3] = {wq, wk, wv}, biases[3] = {bq_, bk_, bv_};
    for (int i = 0; i < 3; ++i) {
      if (!accumulate) {
        b.linear(in_x, weights[i], bias ? biases[i] : Tensor{}, parts[i]);
      } else {
        Tensor part = b.scratch(n, parts[i].cols);
        b.linear(in_x, weights[i], Tensor{}, part);
        b.add(parts[i], part, parts[i]);
      }
    }
  };
  if (!eagle3()) {
    // x = fc(concat(emb, feature)) = fc_emb emb + fc_feat feature (+ bias); no input_layernorm.
    ARBOR_CHECK(in_width == h);
    x = b.scratch(n, h);
    b.linear(emb, fc_emb_, fc_bias_, x);
    b.linear(in, fc_feat_, Tensor{}, tmp);
    b.add(x, tmp, x);
    project_qkv(x, wq_, wk_, wv_, wqkv_, true, false);
  } else {
    if (input_is_feature) {
      ARBOR_CHECK(in_width == 3 * c.target_hidden_size);
      x = b.scratch(n, h);
      b.linear(in, fc_, Tensor{}, x);
    } else {
      ARBOR_CHECK(in_width == h);  // earlier layer outputs enter without fc (cnets.py)
      x = in;                      // the step's own copy: updated in place below
    }
    // q/k/v read concat(input_layernorm(emb), hidden_norm(x)): split into two products.
    Tensor e = b.scratch(n, h), g = b.scratch(n, h);
    b.rms_norm(emb, input_norm_, eps, e);
    b.rms_norm(x, hidden_norm_, eps, g);
    project_qkv(e, wq_, wk_, wv_, wqkv_, true, false);
    project_qkv(g, wq_h_, wk_h_, wv_h_, wqkv_h_, false, true);
  }
  if (fused_) b.split_cols(qkv, {q, k, v});
  Tensor attn = b.scratch(n, q_width);
  b.rope(q, k, rope_);
  b.write_kv(0, k, v);
  b.paged_tree_attention(0, q, c.num_heads, attn);
  b.linear(attn, wo_, Tensor{}, tmp);
  b.add(x, tmp, x);
  Tensor normed = b.scratch(n, h);
  Tensor gate = b.scratch(n, c.intermediate_size), up = b.scratch(n, c.intermediate_size);
  b.rms_norm(x, post_norm_, eps, normed);
  if (fused_) {
    Tensor gate_up = b.scratch(n, 2 * c.intermediate_size);
    b.linear(normed, w_gate_up_, Tensor{}, gate_up);
    b.split_cols(gate_up, {gate, up});
  } else {
    b.linear(normed, w_gate_, Tensor{}, gate);
    b.linear(normed, w_up_, Tensor{}, up);
  }
  b.silu_mul(gate, up, gate);
  b.linear(gate, w_down_, Tensor{}, tmp);
  b.add(x, tmp, x);
  return x;
}

Tensor EagleDraftModel::device_logits(std::span<const float> hidden, int64_t rows) {
  const int64_t h = config_.hidden_size;
  ARBOR_CHECK(static_cast<int64_t>(hidden.size()) == rows * h);
  Backend& b = *backend_;
  b.reset_scratch();
  Tensor x = b.scratch(rows, h);
  b.upload(hidden.data(), x);
  return head(x);
}

Tensor EagleDraftModel::head(const Tensor& x) {
  Backend& b = *backend_;
  Tensor logits = b.scratch(x.rows, draft_vocab());
  if (eagle3()) {
    Tensor normed = b.scratch(x.rows, x.cols);
    b.rms_norm(x, norm_, config_.rms_norm_eps, normed);
    b.linear(normed, lm_head_, Tensor{}, logits);
  } else {
    b.linear(x, lm_head_, Tensor{}, logits);
  }
  return logits;
}

std::vector<float> EagleDraftModel::logits(std::span<const float> hidden, int64_t rows) {
  std::vector<float> out(static_cast<size_t>(rows * draft_vocab()));
  if (rows == 0) return out;
  backend_->download(device_logits(hidden, rows), out.data());
  return out;
}

std::vector<float> EagleDraftModel::log_probs(std::span<const float> hidden, int64_t rows) {
  std::vector<float> out = logits(hidden, rows);
  const size_t v = static_cast<size_t>(draft_vocab());
  for (int64_t r = 0; r < rows; ++r)
    host_math::log_softmax_inplace(std::span<float>(out.data() + r * v, v));
  return out;
}

}  // namespace arbor
