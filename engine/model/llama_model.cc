#include "engine/model/llama_model.h"

#include "engine/core/error.h"

namespace arbor {

LlamaModel::LlamaModel(Backend& backend, const ModelWeights& w)
    : backend_(backend), config_(w.config) {
  config_.validate("model");
  rope_.head_dim = config_.head_dim;
  rope_.theta = config_.rope_theta;
  rope_.scaling = config_.rope_scaling.type;
  rope_.factor = config_.rope_scaling.factor;
  rope_.low_freq_factor = config_.rope_scaling.low_freq_factor;
  rope_.high_freq_factor = config_.rope_scaling.high_freq_factor;
  rope_.original_max_position = config_.rope_scaling.original_max_position;

  embed_ = backend_.upload_weight(w.embed);
  final_norm_ = backend_.upload_weight(w.final_norm);
  lm_head_ = config_.tie_embeddings ? embed_ : backend_.upload_weight(w.lm_head);
  auto opt = [&](const HostTensor& t) { return t.empty() ? Tensor{} : backend_.upload_weight(t); };
  for (const LayerWeights& lw : w.layers) {
    Layer l;
    l.attn_norm = backend_.upload_weight(lw.attn_norm);
    l.wq = backend_.upload_weight(lw.wq);
    l.wk = backend_.upload_weight(lw.wk);
    l.wv = backend_.upload_weight(lw.wv);
    l.bq = opt(lw.bq);
    l.bk = opt(lw.bk);
    l.bv = opt(lw.bv);
    l.wo = backend_.upload_weight(lw.wo);
    l.ffn_norm = backend_.upload_weight(lw.ffn_norm);
    l.w_gate = backend_.upload_weight(lw.w_gate);
    l.w_up = backend_.upload_weight(lw.w_up);
    l.w_down = backend_.upload_weight(lw.w_down);
    layers_.push_back(l);
  }
}

KvCacheShape LlamaModel::kv_shape(int64_t num_blocks, int64_t block_size) const {
  KvCacheShape s;
  s.num_layers = config_.num_layers;
  s.num_blocks = num_blocks;
  s.block_size = block_size;
  s.num_kv_heads = config_.num_kv_heads;
  s.head_dim = config_.head_dim;
  return s;
}

void LlamaModel::forward(const StepInputs& step, ForwardOutput* out, const ForwardRequest& want) {
  Backend& b = backend_;
  b.set_step(step);
  b.reset_scratch();
  const int64_t n = step.num_tokens();
  const int64_t hidden = config_.hidden_size;
  const int64_t q_width = config_.num_heads * config_.head_dim;
  const int64_t kv_width = config_.num_kv_heads * config_.head_dim;
  const double eps = config_.rms_norm_eps;

  Tensor x = b.scratch(n, hidden);  // [N, hidden] residual stream
  b.embedding(embed_, x);
  Tensor normed = b.scratch(n, hidden);
  Tensor q = b.scratch(n, q_width);
  Tensor k = b.scratch(n, kv_width);
  Tensor v = b.scratch(n, kv_width);
  Tensor attn = b.scratch(n, q_width);
  Tensor proj = b.scratch(n, hidden);
  Tensor gate = b.scratch(n, config_.intermediate_size);
  Tensor up = b.scratch(n, config_.intermediate_size);
  out->captured.assign(want.capture_layers.size(), {});
  auto capture = [&](size_t layer_input) {
    for (size_t c = 0; c < want.capture_layers.size(); ++c) {
      if (want.capture_layers[c] != static_cast<int32_t>(layer_input)) continue;
      out->captured[c].resize(static_cast<size_t>(n * hidden));
      b.download(x, out->captured[c].data());
    }
  };
  for (int32_t c : want.capture_layers)
    if (c < 0 || c > config_.num_layers)
      throw_error(ErrorCode::kInvalidArgument, "capture layer " + std::to_string(c) +
                                                   " outside [0, " +
                                                   std::to_string(config_.num_layers) + "]");
  for (size_t li = 0; li < layers_.size(); ++li) {
    capture(li);
    const Layer& l = layers_[li];
    b.rms_norm(x, l.attn_norm, eps, normed);
    b.linear(normed, l.wq, l.bq, q);
    b.linear(normed, l.wk, l.bk, k);
    b.linear(normed, l.wv, l.bv, v);
    b.rope(q, k, rope_);
    b.write_kv(static_cast<int64_t>(li), k, v);
    b.paged_tree_attention(static_cast<int64_t>(li), q, config_.num_heads, attn);
    b.linear(attn, l.wo, Tensor{}, proj);
    b.add(x, proj, x);
    b.rms_norm(x, l.ffn_norm, eps, normed);
    b.linear(normed, l.w_gate, Tensor{}, gate);
    b.linear(normed, l.w_up, Tensor{}, up);
    b.silu_mul(gate, up, gate);
    b.linear(gate, l.w_down, Tensor{}, proj);
    b.add(x, proj, x);
  }
  capture(layers_.size());
  if (want.final_hidden) {
    Tensor all_normed = b.scratch(n, hidden);
    b.rms_norm(x, final_norm_, eps, all_normed);
    out->hidden.resize(static_cast<size_t>(n * hidden));
    b.download(all_normed, out->hidden.data());
  }
  const int64_t m = static_cast<int64_t>(step.logits_rows.size());
  out->logits.clear();
  out->argmax.clear();
  if (m == 0) return;
  Tensor rows = b.scratch(m, hidden);
  b.gather_logit_rows(x, rows);
  Tensor rows_normed = b.scratch(m, hidden);
  b.rms_norm(rows, final_norm_, eps, rows_normed);
  Tensor logits = b.scratch(m, config_.vocab_size);
  b.linear(rows_normed, lm_head_, Tensor{}, logits);
  if (want.argmax_only) {
    b.argmax_rows(logits, &out->argmax);
    return;
  }
  if (want.sample) {
    b.sample_trees(logits, *want.sample, &out->sampled);
    return;
  }
  out->logits.resize(static_cast<size_t>(m * config_.vocab_size));
  b.download(logits, out->logits.data());
}

}  // namespace arbor
