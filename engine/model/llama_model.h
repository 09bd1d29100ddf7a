// The Llama-family forward pass (Llama 2/3, Mistral, Qwen2, SmolLM2) composed from Backend ops
// over one flat batch: embeddings, N decoder layers (RMSNorm, QKV (+bias), RoPE at explicit
// positions, KV write to slots, paged tree attention, O-proj, SwiGLU MLP), final norm, LM head
// for the rows that need logits.
#pragma once

#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/step_graphs.h"
#include "engine/model/model_weights.h"

namespace arbor {

// What a step should return besides the logits of step.logits_rows.
struct ForwardRequest {
  bool final_hidden = false;            // final-norm hidden state of every row (Medusa, EAGLE)
  std::vector<int32_t> capture_layers;  // residual stream at the input of these layers, every
                                        // row (EAGLE-3's low/mid/high features); L = after all
  // Greedy-only steps: return the argmax id of each logits row (computed on the backend) in
  // ForwardOutput::argmax and no logits, so [M, vocab] never crosses to the host.
  bool argmax_only = false;
  // Sample / verify on the backend (Backend::sample_trees) with this batch, whose logits rows
  // index step.logits_rows; ForwardOutput::sampled gets the result and no logits are returned.
  // Not with argmax_only.
  const TreeSampleBatch* sample = nullptr;
  // With `sample`: >= 0 also returns logprobs without the logits: the max(k, 1) best raw
  // log-softmax entries of every logits row (ForwardOutput::top_*) and the raw log-probability
  // of every token the items emit (ForwardOutput::emitted_logprobs).
  int32_t top_logprobs = -1;
  // With `sample` and final_hidden: instead of every row's hidden state in
  // ForwardOutput::hidden, only the accepted paths' in ForwardOutput::sampled.path_rows
  // (Backend::sample_trees_and_path_rows: gathered on the device, back with the ids).
  bool path_hidden = false;
};

struct ForwardOutput {
  std::vector<float>
      logits;  // [M, vocab] host fp32, rows = step.logits_rows (empty if argmax_only)
  // [M] with argmax_only (else empty): Backend::argmax_rows of the logits rows, the lowest id
  // among ties, -1 for a row with a NaN or +inf or only -inf.
  std::vector<int32_t> argmax;
  TreeSampleResult sampled;  // with ForwardRequest::sample
  // With ForwardRequest::top_logprobs >= 0: [M, top_k] ids and raw log-softmax values per
  // logits row (best first), and per sampled item the log-probabilities of its emitted tokens
  // (accepted path tokens, then the bonus token) at emitted_indptr[i] .. emitted_indptr[i + 1].
  int32_t top_k = 0;
  std::vector<int32_t> top_ids;
  std::vector<float> top_values;
  std::vector<float> emitted_logprobs;
  std::vector<int32_t> emitted_indptr;
  std::vector<float> hidden;  // [N, hidden] final-norm hidden states of all rows (if requested)
  std::vector<std::vector<float>> captured;  // per capture_layers entry: [N, hidden]
};

class LlamaModel {
 public:
  // Uploads the weights to the backend; `weights` may be released afterwards.
  LlamaModel(Backend& backend, const ModelWeights& weights);

  const ModelConfig& config() const { return config_; }
  Backend& backend() { return backend_; }
  // Cache geometry for this model with the given number of blocks.
  KvCacheShape kv_shape(int64_t num_blocks, int64_t block_size) const;

  // Runs one step. The backend's KV cache must already be allocated. Decode / verify steps
  // (every request one token or a tree) replay a recording of their ops once their shape is
  // steady (step graphs: StepGraphCache) where the backend supports it; results are the same.
  void forward(const StepInputs& step, ForwardOutput* out, const ForwardRequest& want = {});

  // Bytes of scratch one step of `tokens` rows with `logits_rows` logits rows allocates (what
  // run_ops asks Backend::scratch for, the logits copy of a logprobs step included): the
  // activation peak the KV sizing holds back on a backend that frees its scratch every step.
  int64_t activation_bytes(int64_t tokens, int64_t logits_rows, const ForwardRequest& want) const;

  // Step graphs: on by default where the backend has them on (Backend::step_graphs_enabled);
  // turning them off drops every recording. Counters of what forward() did.
  void set_step_graphs(bool enabled);
  bool step_graphs() const { return graphs_ != nullptr; }
  StepGraphStats step_graph_stats() const;

 private:
  bool fused_ = false;  // Backend::fuse_projections() at construction
  struct Layer {
    Tensor attn_norm, wq, wk, wv, bq, bk, bv, wo, ffn_norm, w_gate, w_up, w_down;
    // Backend::fuse_projections(): [q; k; v] and [gate; up] concatenated by rows instead.
    Tensor wqkv, bqkv, w_gate_up;
  };
  // The scratch tensors a step's op sequence leaves its results in.
  struct StepTensors {
    Tensor hidden;  // [N, hidden] final-norm hidden states (want.final_hidden), else empty
    Tensor logits;  // [M, vocab] fp32 logits of step.logits_rows
    // [M, vocab] copy of the logits (want.sample with top_logprobs >= 0: sample_trees then
    // processes `logits` in place, the logprobs read this). Part of the step (and its graph),
    // so it never overlaps scratch the step holds.
    Tensor raw_logits;
  };
  // The device op sequence of a step (no host copies except the capture_layers downloads,
  // which only eager steps have), after set_step() and reset_scratch().
  StepTensors run_ops(const StepInputs& step, const ForwardRequest& want, ForwardOutput* out);
  // The graph key of a decode / verify step (with the backend's part appended), or empty when
  // the step runs eagerly (prefill chunks, features of layers, graphs off or unsupported).
  StepGraphKey graph_key(const StepInputs& step, const ForwardRequest& want);
  Backend& backend_;
  ModelConfig config_;
  RopeParams rope_;
  Tensor embed_, final_norm_, lm_head_;
  std::vector<Layer> layers_;
  std::unique_ptr<StepGraphCache> graphs_;  // null: step graphs off
  StepGraphStats stats_of_dropped_;         // counters of caches dropped by set_step_graphs
};

}  // namespace arbor
