#include "engine/model/llama_model.h"

#include <algorithm>
#include <chrono>

#include "engine/core/error.h"
#include "engine/verify/device_verify.h"

namespace arbor {

LlamaModel::LlamaModel(Backend& backend, const ModelWeights& w) : LlamaModel(backend, w, {}) {}

LlamaModel::LlamaModel(Backend& backend, const ModelWeights& w,
                       std::vector<std::unique_ptr<Backend>> more_ranks)
    : config_(w.config), owned_ranks_(std::move(more_ranks)) {
  config_.validate("model");
  rope_.head_dim = config_.head_dim;
  rope_.theta = config_.rope_theta;
  rope_.scaling = config_.rope_scaling.type;
  rope_.factor = config_.rope_scaling.factor;
  rope_.low_freq_factor = config_.rope_scaling.low_freq_factor;
  rope_.high_freq_factor = config_.rope_scaling.high_freq_factor;
  rope_.original_max_position = config_.rope_scaling.original_max_position;

  std::vector<Backend*> backends{&backend};
  for (auto& b : owned_ranks_) backends.push_back(b.get());
  const int64_t n = static_cast<int64_t>(backends.size());
  for (int64_t r = 0; r < n; ++r) {
    Backend& b = *backends[static_cast<size_t>(r)];
    if (b.tp_size() != n || b.tp_rank() != r)
      throw_error(ErrorCode::kInvalidArgument,
                  "tensor parallelism: backend " + std::to_string(r) + " is rank " +
                      std::to_string(b.tp_rank()) + " of " + std::to_string(b.tp_size()) +
                      ", given as rank " + std::to_string(r) + " of " + std::to_string(n));
  }
  const ModelConfig& c = config_;
  auto refuse = [&](const std::string& what) {
    throw_error(ErrorCode::kInvalidArgument,
                "tensor parallel size " + std::to_string(n) + ": " + what);
  };
  if (c.num_heads % n != 0)
    refuse("num_heads " + std::to_string(c.num_heads) + " is not divisible by " +
           std::to_string(n));
  if (c.num_kv_heads % n != 0 && n % c.num_kv_heads != 0)
    refuse("num_kv_heads " + std::to_string(c.num_kv_heads) +
           " neither divides nor is divisible by " + std::to_string(n));
  if (c.intermediate_size % n != 0)
    refuse("intermediate_size " + std::to_string(c.intermediate_size) + " is not divisible by " +
           std::to_string(n));
  if (c.vocab_size < n) refuse("vocab_size " + std::to_string(c.vocab_size));
  const int64_t vocab_shard = (c.vocab_size + n - 1) / n;
  for (int64_t r = 0; r < n; ++r) {
    Rank rank;
    rank.backend = backends[static_cast<size_t>(r)];
    rank.heads = c.num_heads / n;
    if (c.num_kv_heads >= n) {
      rank.kv_heads = c.num_kv_heads / n;
      rank.kv_first = r * rank.kv_heads;
    } else {  // replicated: the KV head of this rank's query heads
      rank.kv_heads = 1;
      rank.kv_first = r / (n / c.num_kv_heads);
    }
    rank.intermediate = c.intermediate_size / n;
    rank.vocab_first = r * vocab_shard;
    rank.vocab_rows = vocab_shard;
    ranks_.push_back(std::move(rank));
  }
  fused_ = backend.fuse_projections();
  if (n > 1) threads_ = std::make_unique<RankThreads>(backends);
  on_ranks([&](int r) { upload_rank(ranks_[static_cast<size_t>(r)], w); });
  set_step_graphs(true);
}

LlamaModel::~LlamaModel() {
  threads_.reset();
  ranks_.clear();  // recordings before their backends
}

void LlamaModel::on_ranks(const std::function<void(int)>& fn) {
  if (threads_)
    threads_->run(fn);
  else
    fn(0);
}

void LlamaModel::upload_rank(Rank& r, const ModelWeights& w) {
  Backend& b = *r.backend;
  const ModelConfig& c = config_;
  const bool sharded = ranks_.size() > 1;
  const int64_t d = c.head_dim;
  const int64_t q_rows = c.num_heads * d, kv_rows = c.num_kv_heads * d;
  const int64_t q_first = (r.backend->tp_rank() * r.heads) * d, q_count = r.heads * d;
  const int64_t kv_first = r.kv_first * d, kv_count = r.kv_heads * d;
  const int64_t f_first = r.backend->tp_rank() * r.intermediate, f_count = r.intermediate;
  // Whole weights on one backend; on a rank the shard (Backend::upload_weight_shard).
  auto rows = [&](const HostTensor& t, std::vector<std::pair<int64_t, int64_t>> ranges,
                  int64_t pad = 0) {
    if (!sharded) return b.upload_weight(t);
    WeightShard s;
    s.row_ranges = std::move(ranges);
    s.pad_rows = pad;
    return b.upload_weight_shard(t, s);
  };
  auto cols = [&](const HostTensor& t, int64_t first, int64_t count) {
    if (!sharded) return b.upload_weight(t);
    WeightShard s;
    s.col_begin = first;
    s.col_count = count;
    return b.upload_weight_shard(t, s);
  };
  const int64_t vocab_real = std::min(r.vocab_rows, c.vocab_size - r.vocab_first);
  auto vocab = [&](const HostTensor& t) {
    return rows(t, {{r.vocab_first, vocab_real}}, r.vocab_rows - vocab_real);
  };
  auto opt_rows = [&](const HostTensor& t, int64_t first, int64_t count) {
    return t.empty() ? Tensor{} : rows(t, {{first, count}});
  };
  r.embed = vocab(w.embed);
  r.final_norm = b.upload_weight(w.final_norm);
  r.lm_head = c.tie_embeddings ? r.embed : vocab(w.lm_head);
  for (const LayerWeights& lw : w.layers) {
    Layer l;
    // Upload order matters for dummy weights (each upload advances the backend's seed):
    // model_bench mirrors it.
    l.attn_norm = b.upload_weight(lw.attn_norm);
    if (fused_) {
      const std::vector<std::pair<int64_t, int64_t>> qkv = {
          {q_first, q_count},
          {q_rows + kv_first, kv_count},
          {q_rows + kv_rows + kv_first, kv_count}};
      l.wqkv = rows(stack_rows({&lw.wq, &lw.wk, &lw.wv}), qkv);
      if (!lw.bq.empty() || !lw.bk.empty() || !lw.bv.empty())
        l.bqkv = rows(stack_rows({&lw.bq, &lw.bk, &lw.bv}, {q_rows, kv_rows, kv_rows}), qkv);
    } else {
      l.wq = rows(lw.wq, {{q_first, q_count}});
      l.wk = rows(lw.wk, {{kv_first, kv_count}});
      l.wv = rows(lw.wv, {{kv_first, kv_count}});
      l.bq = opt_rows(lw.bq, q_first, q_count);
      l.bk = opt_rows(lw.bk, kv_first, kv_count);
      l.bv = opt_rows(lw.bv, kv_first, kv_count);
    }
    l.wo = cols(lw.wo, q_first, q_count);
    l.ffn_norm = b.upload_weight(lw.ffn_norm);
    if (fused_) {
      l.w_gate_up = rows(stack_rows({&lw.w_gate, &lw.w_up}),
                         {{f_first, f_count}, {c.intermediate_size + f_first, f_count}});
    } else {
      l.w_gate = rows(lw.w_gate, {{f_first, f_count}});
      l.w_up = rows(lw.w_up, {{f_first, f_count}});
    }
    l.w_down = cols(lw.w_down, f_first, f_count);
    r.layers.push_back(l);
  }
}

KvCacheShape LlamaModel::kv_shape(int64_t num_blocks, int64_t block_size) const {
  KvCacheShape s;
  s.num_layers = config_.num_layers;
  s.num_blocks = num_blocks;
  s.block_size = block_size;
  s.num_kv_heads = ranks_[0].kv_heads;
  s.head_dim = config_.head_dim;
  return s;
}

void LlamaModel::allocate_kv(const KvCacheShape& shape) {
  on_ranks([&](int r) { ranks_[static_cast<size_t>(r)].backend->allocate_kv(shape); });
}

void LlamaModel::copy_kv(const std::vector<int64_t>& src_slots,
                         const std::vector<int64_t>& dst_slots) {
  on_ranks([&](int r) { ranks_[static_cast<size_t>(r)].backend->copy_kv(src_slots, dst_slots); });
}

namespace {

// Prefill chunks and steps this large run eagerly: their shapes rarely repeat.
constexpr int32_t kMaxGraphTokens = 1024;

// Decode / verify steps: every request one token or a tree (no prefill chunk), not too many
// tokens.
bool graph_eligible(const StepInputs& step) {
  if (step.num_tokens() > kMaxGraphTokens) return false;
  for (int32_t r = 0; r < step.num_requests(); ++r)
    if (step.qo_indptr[r + 1] - step.qo_indptr[r] > 1 &&
        step.mask_indptr[r + 1] == step.mask_indptr[r])
      return false;
  return step.num_requests() > 0;
}

}  // namespace

void LlamaModel::set_step_graphs(bool enabled) {
  for (Rank& r : ranks_) {
    if (!enabled || !r.backend->step_graphs_enabled()) {
      if (r.graphs && &r == &ranks_[0]) {
        const StepGraphStats& s = r.graphs->stats();
        stats_of_dropped_.eager += s.eager;
        stats_of_dropped_.captures += s.captures;
        stats_of_dropped_.replays += s.replays;
        stats_of_dropped_.capture_failures += s.capture_failures;
        stats_of_dropped_.evictions += s.evictions;
        stats_of_dropped_.invalidations += s.invalidations;
      }
      r.graphs.reset();
      continue;
    }
    if (r.graphs) continue;
    Backend* b = r.backend;
    // The target's recordings cover plain decode and verify steps of every batch size, token
    // count (adaptive trees) and block-table width bucket: at 64 recordings, SmolLM2's
    // spec-bench at batch 64 evicted a dozen of the plain run's recordings each round.
    StepGraphCache::Options options;
    options.max_graphs = 256;
    r.graphs =
        std::make_unique<StepGraphCache>(options, [b](int64_t g) { b->release_step_graph(g); });
  }
}

StepGraphStats LlamaModel::step_graph_stats() const {
  StepGraphStats s = stats_of_dropped_;
  if (ranks_[0].graphs) {
    const StepGraphStats& g = ranks_[0].graphs->stats();
    s.eager += g.eager;
    s.captures += g.captures;
    s.replays += g.replays;
    s.capture_failures += g.capture_failures;
    s.evictions += g.evictions;
    s.invalidations += g.invalidations;
  }
  return s;
}

int64_t LlamaModel::activation_bytes(int64_t n, int64_t m, const ForwardRequest& want) const {
  const Rank& r = ranks_[0];
  const int64_t hidden = config_.hidden_size, inter = r.intermediate;
  const int64_t q_width = r.heads * config_.head_dim;
  const int64_t kv_width = r.kv_heads * config_.head_dim;
  // x, normed, q, k, v, attn, proj, gate, up (run_ops' order), the fused outputs, the final
  // hidden states; then the logits rows, their norm, the logits and the logits copy.
  int64_t floats = n * (3 * hidden + 2 * q_width + 2 * kv_width + 2 * inter);
  if (fused_) floats += n * (q_width + 2 * kv_width + 2 * inter);
  if (want.final_hidden) floats += n * hidden;
  floats += n * hidden * static_cast<int64_t>(want.capture_layers.size());
  floats += m * (2 * hidden + 2 * config_.vocab_size);
  if (ranks_.size() > 1)  // the rank's logits shard and the gathered shards
    floats += m * r.vocab_rows * (1 + static_cast<int64_t>(ranks_.size()));
  return floats * 4;
}

StepGraphKey LlamaModel::graph_key(Rank& rank, const StepInputs& step, const ForwardRequest& want) {
  StepGraphKey key;
  if (!rank.graphs || !graph_eligible(step)) return key;
  const int32_t r_count = step.num_requests();
  // Layout: tag, N, the request capacity (graph_request_capacity(R)), M, block-table width,
  // final_hidden, raw logits copy, the capture layers (count, then each), then the backend's
  // part. How the N tokens split into the R
  // requests (query counts, tree masks), R itself below its capacity, token ids, positions,
  // slots, committed lengths, block ids and mask bits are not in it: the recorded kernels read
  // them from device memory, where they sit at offsets that only N, the capacity, M and the
  // width fix (per-request sections sized to the capacity, the masks last:
  // CudaBackend::set_step), and the backend's part holds what its launches derive from them by
  // value (the attention grid, the (virtual) request count).
  key = {1,
         step.num_tokens(),
         graph_request_capacity(r_count),
         static_cast<int64_t>(step.logits_rows.size()),
         step.max_blocks_per_request,
         want.final_hidden ? 1 : 0,
         want.sample && want.top_logprobs >= 0 ? 1 : 0,
         static_cast<int64_t>(want.capture_layers.size())};
  for (int32_t c : want.capture_layers) key.push_back(c);
  if (!rank.backend->prepare_step_graph(rank.heads, &key)) return {};
  return key;
}

LlamaModel::StepTensors LlamaModel::run_ops(Rank& rank, const StepInputs& step,
                                            const ForwardRequest& want) {
  Backend& b = *rank.backend;
  const bool sharded = ranks_.size() > 1;
  const bool primary = &rank == &ranks_[0];
  const int64_t n = step.num_tokens();
  const int64_t hidden = config_.hidden_size;
  const int64_t q_width = rank.heads * config_.head_dim;
  const int64_t kv_width = rank.kv_heads * config_.head_dim;
  const int64_t inter = rank.intermediate;
  const double eps = config_.rms_norm_eps;

  Tensor x = b.scratch(n, hidden);  // [N, hidden] residual stream
  if (sharded) {                    // each rank looks up its vocabulary rows; the sum is every row
    b.embedding_shard(rank.embed, rank.vocab_first, x);
    b.all_reduce_sum(x);
  } else {
    b.embedding(rank.embed, x);
  }
  Tensor normed = b.scratch(n, hidden);
  Tensor q = b.scratch(n, q_width);
  Tensor k = b.scratch(n, kv_width);
  Tensor v = b.scratch(n, kv_width);
  Tensor attn = b.scratch(n, q_width);
  Tensor proj = b.scratch(n, hidden);
  Tensor gate = b.scratch(n, inter);
  Tensor up = b.scratch(n, inter);
  // Fused projections: one output for q|k|v and one for gate|up; at one token the parts are
  // contiguous views of it, else split_cols copies them out.
  Tensor qkv, gate_up;
  if (fused_) {
    qkv = b.scratch(n, q_width + 2 * kv_width);
    gate_up = b.scratch(n, 2 * inter);
    if (n == 1) {
      auto view = [](const Tensor& t, int64_t col, int64_t cols) {
        return Tensor{static_cast<float*>(t.data) + col, t.dtype, 1, cols};
      };
      q = view(qkv, 0, q_width);
      k = view(qkv, q_width, kv_width);
      v = view(qkv, q_width + kv_width, kv_width);
      gate = view(gate_up, 0, inter);
      up = view(gate_up, inter, inter);
    }
  }
  StepTensors t;
  if (!want.capture_layers.empty() && primary)
    t.captured = b.scratch(n, hidden * static_cast<int64_t>(want.capture_layers.size()));
  auto capture = [&](size_t layer_input) {
    for (size_t c = 0; c < want.capture_layers.size() && primary; ++c)
      if (want.capture_layers[c] == static_cast<int32_t>(layer_input))
        b.copy_cols(x, t.captured, static_cast<int64_t>(c) * hidden);
  };
  for (size_t li = 0; li < rank.layers.size(); ++li) {
    capture(li);
    const Layer& l = rank.layers[li];
    b.rms_norm(x, l.attn_norm, eps, normed);
    if (fused_) {
      b.linear(normed, l.wqkv, l.bqkv, qkv);
      if (n > 1) b.split_cols(qkv, {q, k, v});
    } else {
      b.linear(normed, l.wq, l.bq, q);
      b.linear(normed, l.wk, l.bk, k);
      b.linear(normed, l.wv, l.bv, v);
    }
    b.rope(q, k, rope_);
    b.write_kv(static_cast<int64_t>(li), k, v);
    b.paged_tree_attention(static_cast<int64_t>(li), q, rank.heads, attn);
    b.linear(attn, l.wo, Tensor{}, proj);
    if (sharded) b.all_reduce_sum(proj);  // the ranks' heads' partial sums
    b.add(x, proj, x);
    b.rms_norm(x, l.ffn_norm, eps, normed);
    if (fused_) {
      b.linear(normed, l.w_gate_up, Tensor{}, gate_up);
      if (n > 1) b.split_cols(gate_up, {gate, up});
    } else {
      b.linear(normed, l.w_gate, Tensor{}, gate);
      b.linear(normed, l.w_up, Tensor{}, up);
    }
    b.silu_mul(gate, up, gate);
    b.linear(gate, l.w_down, Tensor{}, proj);
    if (sharded) b.all_reduce_sum(proj);
    b.add(x, proj, x);
  }
  capture(rank.layers.size());
  if (want.final_hidden) {
    t.hidden = b.scratch(n, hidden);
    b.rms_norm(x, rank.final_norm, eps, t.hidden);
  }
  const int64_t m = static_cast<int64_t>(step.logits_rows.size());
  if (m == 0) return t;
  Tensor rows = b.scratch(m, hidden);
  b.gather_logit_rows(x, rows);
  Tensor rows_normed = b.scratch(m, hidden);
  b.rms_norm(rows, rank.final_norm, eps, rows_normed);
  if (sharded) {  // this rank's vocabulary columns, then every rank's side by side
    Tensor local = b.scratch(m, rank.vocab_rows);
    b.linear(rows_normed, rank.lm_head, Tensor{}, local);
    t.logits = b.scratch(m, config_.vocab_size);
    b.all_gather_cols(local, t.logits);
  } else {
    t.logits = b.scratch(m, config_.vocab_size);
    b.linear(rows_normed, rank.lm_head, Tensor{}, t.logits);
  }
  if (want.sample && want.top_logprobs >= 0) {
    t.raw_logits = b.scratch(m, config_.vocab_size);
    b.split_cols(t.logits, {t.raw_logits});
  }
  return t;
}

void LlamaModel::forward(const StepInputs& step, ForwardOutput* out, const ForwardRequest& want) {
  for (int32_t c : want.capture_layers)
    if (c < 0 || c > config_.num_layers)
      throw_error(ErrorCode::kInvalidArgument, "capture layer " + std::to_string(c) +
                                                   " outside [0, " +
                                                   std::to_string(config_.num_layers) + "]");
  // Checked here for every rank (a recorded or vocabulary-sharded embedding does not check).
  for (int32_t id : step.token_ids)
    if (id < 0 || id >= config_.vocab_size)
      throw_error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                   " is outside the vocabulary of " +
                                                   std::to_string(config_.vocab_size));
  out->captured.assign(want.capture_layers.size(), {});
  if (!threads_) return forward_rank(0, step, out, want);
  threads_->run([&](int r) {
    ForwardOutput discarded;
    forward_rank(r, step, r == 0 ? out : &discarded, want);
  });
}

void LlamaModel::forward_rank(int rank_index, const StepInputs& step_in, ForwardOutput* out,
                              const ForwardRequest& want) {
  Rank& rank = ranks_[static_cast<size_t>(rank_index)];
  Backend& b = *rank.backend;
  // Decode / verify steps get a power-of-two block-table width (with_graph_table_width). (Four
  // buckets per power of two, as before, made SmolLM2's n-gram verify steps at batch 1 see ~100
  // keys over 16 prompts: a fifth of the steps ran eagerly.)
  using Clock = std::chrono::steady_clock;
  const Clock::time_point t_start = Clock::now();
  StepInputs padded;
  const StepInputs& step =
      rank.graphs && graph_eligible(step_in) ? with_graph_table_width(step_in, &padded) : step_in;
  b.set_step(step);
  b.reset_scratch();  // before the key: a scratch arena merged here moves the memory epoch
  const Clock::time_point t_set = Clock::now();

  StepTensors t;
  bool done = false;
  const StepGraphKey key = graph_key(rank, step, want);
  const Clock::time_point t_key = Clock::now();
  if (!key.empty()) {
    std::vector<Tensor> outs;
    const auto ops = [&] {
      t = run_ops(rank, step, want);
      return std::vector<Tensor>{t.hidden, t.logits, t.raw_logits, t.captured};
    };
    if (run_step_graph(
            *rank.graphs, b, key, [] {}, ops, &outs) == StepGraphRun::kReplayed) {
      t.hidden = outs[0];
      t.logits = outs[1];
      t.raw_logits = outs[2];
      t.captured = outs[3];
      done = true;
    }
  }
  if (!done) {
    b.reset_scratch();  // rewinds (a failed recording took addresses)
    t = run_ops(rank, step, want);
  }
  if (rank_index != 0) return;  // the outputs are rank 0's
  // Rank 0's phases, the last one recorded on every return below.
  struct Finish {
    ForwardTimings& t;
    Clock::time_point start, set, keyed, launched;
    bool replayed;
    ~Finish() {
      const auto secs = [](Clock::time_point a, Clock::time_point b) {
        return std::chrono::duration<double>(b - a).count();
      };
      const Clock::time_point end = Clock::now();
      t.steps++;
      t.set_step_s += secs(start, set);
      t.launch_s += secs(set, launched);
      t.finish_s += secs(launched, end);
      if (replayed) {
        t.replayed_steps++;
        t.replayed_launch_s += secs(set, launched);
        t.replayed_finish_s += secs(launched, end);
        t.replayed_key_s += secs(set, keyed);
      }
    }
  } finish{timings_, t_start, t_set, t_key, Clock::now(), done};

  // The proposer's feature rows: the final hidden states or the capture layers' streams.
  const bool captures = !want.capture_layers.empty();
  const bool path_hidden =
      want.path_hidden && want.final_hidden != captures && want.sample != nullptr;
  const Tensor& features = captures ? t.captured : t.hidden;
  out->hidden.clear();
  out->feature_rows.clear();
  // Some rows only: gathered into scratch after the step's own, so only in steps that ran
  // eagerly (a replayed step's tensors are not below the arena's mark).
  const bool some_rows = !path_hidden && !done && !want.feature_rows.empty() &&
                         static_cast<int64_t>(want.feature_rows.size()) < step.num_tokens();
  if (some_rows) out->feature_rows = want.feature_rows;
  auto fetch = [&](const Tensor& src, std::vector<float>* dst) {
    Tensor rows = src;
    if (some_rows) {
      rows = b.scratch(static_cast<int64_t>(want.feature_rows.size()), src.cols);
      b.gather_rows(src, want.feature_rows, rows);
    }
    dst->resize(static_cast<size_t>(rows.numel()));
    b.download(rows, dst->data());
  };
  if (want.final_hidden && !path_hidden) fetch(t.hidden, &out->hidden);
  if (captures && !path_hidden) {  // one download, split by layer
    std::vector<float> all;
    fetch(t.captured, &all);
    const int64_t hidden = config_.hidden_size;
    const int64_t n = static_cast<int64_t>(all.size()) / t.captured.cols;
    for (size_t c = 0; c < want.capture_layers.size(); ++c) {
      std::vector<float>& dst = out->captured[c];
      dst.resize(static_cast<size_t>(n * hidden));
      for (int64_t r = 0; r < n; ++r)
        std::copy_n(all.begin() + r * t.captured.cols + static_cast<int64_t>(c) * hidden, hidden,
                    dst.begin() + r * hidden);
    }
  }
  const int64_t m = static_cast<int64_t>(step.logits_rows.size());
  out->logits.clear();
  out->argmax.clear();
  if (m == 0) return;
  if (want.argmax_only) {
    b.argmax_rows(t.logits, &out->argmax);
    return;
  }
  if (want.sample) {
    out->top_k = 0;
    out->top_ids.clear();
    out->top_values.clear();
    out->emitted_logprobs.clear();
    out->emitted_indptr.clear();
    const Tensor& raw = t.raw_logits;  // the copy run_ops kept (top_logprobs >= 0)
    if (want.top_logprobs >= 0) {
      out->top_k = std::max<int32_t>(1, want.top_logprobs);
      b.top_k_log_softmax(t.logits, out->top_k, &out->top_ids, &out->top_values);
    }
    // Node g's hidden row: the flat row of its logits row.
    PathRowsRequest rows;
    if (path_hidden) {
      rows.source = features;
      for (int32_t r : want.sample->logits_row) rows.node_row.push_back(step.logits_rows[r]);
      if (b.path_rows_on_device()) rows.on_device = want.on_path_rows;
    }
    if (b.has_sample_trees()) {
      if (path_hidden)
        b.sample_trees_and_path_rows(t.logits, *want.sample, rows, &out->sampled);
      else
        b.sample_trees(t.logits, *want.sample, &out->sampled);
    } else {  // the host reference on the downloaded logits (the CPU backend)
      std::vector<float> host(static_cast<size_t>(t.logits.numel()));
      b.download(t.logits, host.data());
      const TreeSampleBatch* batch = want.sample;
      TreeSampleBatch resolved;  // tokens (and tree parents) left on the backend, brought here
      if (!batch->token_source_index.empty() || !batch->parent_source_index.empty()) {
        resolved = *batch;
        std::vector<int32_t> ids;
        for (auto [index, into] : {std::pair{&resolved.token_source_index, &resolved.token},
                                   {&resolved.parent_source_index, &resolved.parent}}) {
          if (index->empty()) continue;
          b.download_ids(resolved.token_source, *index, &ids);
          for (size_t g = 0; g < ids.size(); ++g)
            if ((*index)[g] >= 0) (*into)[g] = ids[g];
          index->clear();
        }
        resolved.token_source = Tensor{};
        batch = &resolved;
      }
      sample_trees_on_host(host, t.logits.cols, *batch, &out->sampled);
      if (path_hidden) {
        std::vector<float> hidden(static_cast<size_t>(features.numel()));
        b.download(features, hidden.data());
        gather_path_rows_on_host(hidden.data(), features.cols, *want.sample, rows.node_row,
                                 &out->sampled);
      }
    }
    if (path_hidden && want.on_path_rows && !rows.on_device) {
      // The rows and tokens in backend memory from the host's results.
      PathRowsOnDevice view;
      std::vector<float> padded;
      std::vector<int32_t> next;
      pad_path_rows_on_host(*want.sample, out->sampled, features.cols, &view.offset, &padded,
                            &next);
      const int64_t n = std::max<int64_t>(view.offset.back(), 1);
      if (path_rows_.rows < n || path_rows_.cols != features.cols) {
        path_rows_ = b.persistent(std::max(n, 2 * path_rows_.rows), features.cols);
        path_next_ = b.persistent(path_rows_.rows, 1);
      }
      view.rows = Tensor{path_rows_.data, DType::kF32, view.offset.back(), features.cols};
      view.next = Tensor{path_next_.data, DType::kI32, view.offset.back(), 1};
      const TreeSampleResult& sampled = out->sampled;
      std::vector<int32_t> len;
      for (size_t i = 0; i + 1 < sampled.path_indptr.size(); ++i)
        len.push_back(sampled.path_indptr[i + 1] - sampled.path_indptr[i]);
      if (path_len_.rows < static_cast<int64_t>(len.size()))
        path_len_ = b.persistent(std::max<int64_t>(static_cast<int64_t>(len.size()), 8), 1);
      view.len = Tensor{path_len_.data, DType::kI32, static_cast<int64_t>(len.size()), 1};
      if (!len.empty())
        b.upload(reinterpret_cast<const float*>(len.data()),
                 Tensor{path_len_.data, DType::kF32, static_cast<int64_t>(len.size()), 1});
      if (view.offset.back() > 0) {
        b.upload(padded.data(), view.rows);
        // (int32 bits through the fp32 upload: a 4-byte copy)
        b.upload(reinterpret_cast<const float*>(next.data()),
                 Tensor{path_next_.data, DType::kF32, view.offset.back(), 1});
      }
      want.on_path_rows(view);
    }
    if (want.top_logprobs >= 0) {
      // Emitted token d of item i is predicted by the row of path node d (the bonus token by
      // the last): log p = raw logit - log-sum-exp of the row (from its best entry).
      const TreeSampleBatch& batch = *want.sample;
      const TreeSampleResult& r = out->sampled;
      std::vector<int64_t> index, best_index;
      std::vector<int32_t> rows;
      out->emitted_indptr.push_back(0);
      for (int32_t i = 0; i < batch.num_items(); ++i) {
        const int32_t first = batch.node_indptr[i];
        const int32_t p0 = r.path_indptr[i], p1 = r.path_indptr[i + 1];
        if (r.status[i] == 0) {
          for (int32_t d = p0; d < p1; ++d) {
            const int32_t row = batch.logits_row[first + r.path_nodes[d]];
            const int32_t token =
                d + 1 < p1 ? r.path_tokens[static_cast<size_t>(d + 1)] : r.bonus[i];
            index.push_back(static_cast<int64_t>(row) * config_.vocab_size + token);
            best_index.push_back(static_cast<int64_t>(row) * config_.vocab_size +
                                 out->top_ids[static_cast<size_t>(row) * out->top_k]);
            rows.push_back(row);
          }
        }
        out->emitted_indptr.push_back(static_cast<int32_t>(index.size()));
      }
      std::vector<float> values, best;
      b.gather_values(raw, index, &values);
      b.gather_values(raw, best_index, &best);
      for (size_t j = 0; j < values.size(); ++j) {
        const float lse = best[j] - out->top_values[static_cast<size_t>(rows[j]) * out->top_k];
        out->emitted_logprobs.push_back(values[j] - lse);
      }
    }
    return;
  }
  out->logits.resize(static_cast<size_t>(m * config_.vocab_size));
  b.download(t.logits, out->logits.data());
}

}  // namespace arbor
