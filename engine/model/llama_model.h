// The Llama-family forward pass (Llama 2/3, Mistral, Qwen2, SmolLM2) composed from Backend ops
// over one flat batch: embeddings, N decoder layers (RMSNorm, QKV (+bias), RoPE at explicit
// positions, KV write to slots, paged tree attention, O-proj, SwiGLU MLP), final norm, LM head
// for the rows that need logits.
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/rank_threads.h"
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
  // With `sample` and either final_hidden or capture_layers (not both): instead of every row's
  // features in ForwardOutput::hidden / captured, only the accepted paths' in
  // ForwardOutput::sampled.path_rows (Backend::sample_trees_and_path_rows: gathered on the
  // device, back with the ids); a row is the final hidden state, or the capture layers'
  // residual streams side by side ([capture_layers.size() * hidden]).
  bool path_hidden = false;
  // With path_hidden: called with the accepted paths' rows and the tokens after them in backend
  // memory (PathRowsRequest::on_device), before the forward waits for its results where the
  // backend can (Backend::path_rows_on_device), else after them from host copies.
  std::function<void(const PathRowsOnDevice&)> on_path_rows;
  // Otherwise, the flat rows whose features (final hidden states, capture layers) come back,
  // ascending (empty: every row): ForwardOutput::hidden / captured then hold these rows only, in
  // this order, and ForwardOutput::feature_rows repeats the list. Steps that run eagerly gather
  // them on the backend first, so only they cross to the host (prefill steps: the rows of the
  // requests whose drafter reads them); replayed steps bring every row back.
  std::vector<int32_t> feature_rows;
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
  // The flat rows hidden / captured hold, in order, when only some came back
  // (ForwardRequest::feature_rows); empty: all N.
  std::vector<int32_t> feature_rows;
};

class LlamaModel {
 public:
  // Uploads the weights to the backend; `weights` may be released afterwards.
  LlamaModel(Backend& backend, const ModelWeights& weights);
  // Tensor parallelism (docs/tensor_parallel.md): `backend` is rank 0 and `more_ranks` ranks 1..
  // of one group (make_cpu_tp_backends, make_cuda_tp_backends), which the model keeps. Each rank
  // holds its shard (Megatron layout: q/k/v and gate/up by output rows, o and down by input
  // columns with an all-reduce after them, KV heads split or replicated, embedding and LM head by
  // vocabulary with the logits gathered) and runs its ops on its own thread (RankThreads);
  // sampling, the outputs and every draft stay on rank 0. kInvalidArgument naming the dimension
  // when the model does not split that way.
  LlamaModel(Backend& backend, const ModelWeights& weights,
             std::vector<std::unique_ptr<Backend>> more_ranks);
  ~LlamaModel();

  const ModelConfig& config() const { return config_; }
  Backend& backend() { return *ranks_[0].backend; }
  // Ranks of the tensor-parallel group (1: a single backend).
  int tensor_parallel() const { return static_cast<int>(ranks_.size()); }
  // Cache geometry for this model with the given number of blocks: a rank's share of the KV
  // heads.
  KvCacheShape kv_shape(int64_t num_blocks, int64_t block_size) const;
  // Backend::allocate_kv and copy_kv on every rank.
  void allocate_kv(const KvCacheShape& shape);
  void copy_kv(const std::vector<int64_t>& src_slots, const std::vector<int64_t>& dst_slots);

  // Runs one step. The backend's KV cache must already be allocated. Decode / verify steps
  // (every request one token or a tree) replay a recording of their ops once their shape is
  // steady (step graphs: StepGraphCache) where the backend supports it; results are the same.
  void forward(const StepInputs& step, ForwardOutput* out, const ForwardRequest& want = {});

  // Bytes of scratch one step of `tokens` rows with `logits_rows` logits rows allocates on a
  // rank (what run_ops asks Backend::scratch for, the logits copy of a logprobs step included):
  // the activation peak the KV sizing holds back on a backend that frees its scratch every step.
  int64_t activation_bytes(int64_t tokens, int64_t logits_rows, const ForwardRequest& want) const;

  // Step graphs: on by default where the backend has them on (Backend::step_graphs_enabled);
  // turning them off drops every recording. Counters of what forward() did (rank 0's).
  void set_step_graphs(bool enabled);
  bool step_graphs() const { return ranks_[0].graphs != nullptr; }
  StepGraphStats step_graph_stats() const;

  // Host time of forward() on rank 0, by phase, summed over steps: the step's metadata
  // (Backend::set_step: built and uploaded), launching the ops (one replay, or the op sequence
  // of an eager step), and the rest (feature downloads, sampling / verification launches, the
  // result download and the wait for the device, which ends there).
  struct ForwardTimings {
    int64_t steps = 0;
    double set_step_s = 0, launch_s = 0, finish_s = 0;
    // Of those: the steps that replayed a recording, and their launch and finish (the others
    // are prefill and mixed steps, warm-ups and recordings, whose ops launch one by one).
    int64_t replayed_steps = 0;
    double replayed_launch_s = 0, replayed_finish_s = 0;
    // Of a replayed step's launch: its graph key (Backend::prepare_step_graph: the attention
    // plan built and uploaded); the rest is the recording's lookup and cudaGraphLaunch.
    double replayed_key_s = 0;
    ForwardTimings operator-(const ForwardTimings& o) const {
      return {steps - o.steps,
              set_step_s - o.set_step_s,
              launch_s - o.launch_s,
              finish_s - o.finish_s,
              replayed_steps - o.replayed_steps,
              replayed_launch_s - o.replayed_launch_s,
              replayed_finish_s - o.replayed_finish_s,
              replayed_key_s - o.replayed_key_s};
    }
  };
  const ForwardTimings& forward_timings() const { return timings_; }

 private:
  bool fused_ = false;  // Backend::fuse_projections() at construction
  struct Layer {
    Tensor attn_norm, wq, wk, wv, bq, bk, bv, wo, ffn_norm, w_gate, w_up, w_down;
    // Backend::fuse_projections(): [q; k; v] and [gate; up] concatenated by rows instead.
    Tensor wqkv, bqkv, w_gate_up;
  };
  // One rank's backend, shard and step-graph cache. Widths are the rank's: num_heads / N query
  // heads, its KV heads, intermediate / N, ceil(vocab / N) vocabulary rows from vocab_first.
  struct Rank {
    Backend* backend = nullptr;
    int64_t heads = 0, kv_heads = 0, kv_first = 0, intermediate = 0;
    int64_t vocab_first = 0, vocab_rows = 0;
    Tensor embed, final_norm, lm_head;
    std::vector<Layer> layers;
    std::unique_ptr<StepGraphCache> graphs;  // null: step graphs off
  };
  // The scratch tensors a step's op sequence leaves its results in.
  struct StepTensors {
    Tensor hidden;  // [N, hidden] final-norm hidden states (want.final_hidden), else empty
    // [N, C * hidden]: the residual stream at the input of want.capture_layers[c] in columns
    // [c * hidden, (c + 1) * hidden) (C = capture_layers.size() > 0), else empty.
    Tensor captured;
    Tensor logits;  // [M, vocab] fp32 logits of step.logits_rows
    // [M, vocab] copy of the logits (want.sample with top_logprobs >= 0: sample_trees then
    // processes `logits` in place, the logprobs read this). Part of the step (and its graph),
    // so it never overlaps scratch the step holds.
    Tensor raw_logits;
  };
  // Shapes the ranks and uploads each one's shard (on its thread).
  void load(const ModelWeights& w);
  void upload_rank(Rank& r, const ModelWeights& w);
  // Runs fn(rank) on every rank at once (RankThreads), or on this thread for one backend.
  void on_ranks(const std::function<void(int)>& fn);
  // One rank's step: set_step, the ops (recorded or eager), and on rank 0 (`primary`) the
  // outputs. The other ranks return after their ops.
  void forward_rank(int rank, const StepInputs& step, ForwardOutput* out,
                    const ForwardRequest& want);
  // The device op sequence of a step on one rank (no host copies), after set_step() and
  // reset_scratch().
  StepTensors run_ops(Rank& r, const StepInputs& step, const ForwardRequest& want);
  // The graph key of a decode / verify step (with the backend's part appended), or empty when
  // the step runs eagerly (prefill chunks, more than 1024 tokens, graphs off or unsupported).
  StepGraphKey graph_key(Rank& r, const StepInputs& step, const ForwardRequest& want);
  ModelConfig config_;
  RopeParams rope_;
  std::vector<std::unique_ptr<Backend>> owned_ranks_;  // ranks 1..: released last
  std::vector<Rank> ranks_;
  std::unique_ptr<RankThreads> threads_;  // null with one rank
  StepGraphStats stats_of_dropped_;       // counters of rank 0's caches dropped
  ForwardTimings timings_;                // rank 0's
  // ForwardRequest::on_path_rows' rows and tokens on a backend that does not build them
  // (uploaded from the host; grown by doubling).
  Tensor path_rows_, path_next_, path_len_;
};

}  // namespace arbor
