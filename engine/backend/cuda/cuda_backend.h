// The CUDA backend: the Backend contract on one NVIDIA GPU. Weights (matrices) and the paged KV
// cache are 16-bit (bf16; fp16 KV optional), vectors (norm weights, biases) stay fp32, and
// activations (every scratch tensor) are fp32, so the residual stream, norms and RoPE keep the
// CPU reference's precision; linear() rounds its input to bf16 for the tensor-core GEMM
// (cuBLAS, fp32 accumulate and output). Kernels live in kernels/; this is the host side: memory,
// per-step metadata upload, argument checks (arbor::Error before any launch), dispatch.
// Only built with -DARBOR_CUDA=ON; nothing here includes CUDA headers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "engine/backend/backend.h"

namespace arbor {

struct CudaBackendOptions {
  int device = 0;                 // CUDA device ordinal
  DType kv_dtype = DType::kBF16;  // KV cache element type: kBF16 or kF16
  // Batch invariance (docs/kernels.md "Batch invariance"): every token row's result is a
  // deterministic function of that row's inputs and its own request's KV, independent of the
  // other rows of the step and of the step's size, so greedy output with speculation equals
  // plain greedy and a request's output does not depend on its batch. linear() runs one fixed
  // GEMM per (out, in) shape for every row count (batch_invariant_gemm), attention uses fixed
  // KV split boundaries and scores each tree node over its prefix + ancestor path exactly as a
  // plain decode of that token would. attention_max_splits and skinny_gemm_max_rows are then
  // ignored. Off: the shape-tuned kernels (cuBLAS heuristics, split-KV from the batch).
  bool batch_invariant = true;
  // Batch-invariant linear: 0 = cuBLASLt with one algorithm per (out, in) chosen once (no
  // split-K) and reused for every row count; 1 = the repo's own MMA kernel
  // (kernels/gemm/batch_invariant_gemm.h, slower); 2 = the chunked kernel
  // (kernels/gemm/chunked_gemm.h: K in fixed 512-wide chunks, all SMs busy at 1-64 rows; shapes
  // whose K is not a multiple of 32 take the cuBLASLt path). The environment variable
  // ARBOR_GEMM = cublas | own | chunked overrides it (any binary: arbor serve, generate, ...).
  int batch_invariant_gemm = 0;
  int attention_max_splits = 0;  // split-KV cap: 0 = chosen from the shape, 1 = never split
  // Batch-invariant attention: keys per KV split (fixed boundaries from key 0), a multiple of
  // 64. Smaller splits spread a short decode over more SMs; larger ones merge less. 0 (auto):
  // 512 for models with 8 or more KV heads, 256 with fewer (a request then gives fewer CTAs
  // per split). Measured on the H200: Llama-3-8B shapes (8 KV heads) 512 is within 3% of 256
  // and better at batch 32; SmolLM2-135M (3 KV heads) 128 keys are 1-4% faster than 256 at
  // batch 1-8 and 3-6% slower at batch 32, 512 the other way round (docs/performance.md,
  // "Plain decode and the attention split size"). The value depends only on the model, never on
  // the batch, so a row's splits (and bits) are the same in every step.
  int32_t invariant_split_keys = 0;
  // Batch-invariant linear (cuBLASLt): time the no-split-K candidates of each (out, in) shape at
  // 1, 16 and 128 rows at first use and keep the best overall (the 1-row time weighs double and
  // breaks near-ties; cuda_backend.cc); off: the heuristic's first.
  bool tune_invariant_gemm = true;
  // Batch-invariant linear (cuBLASLt): launches of at most this many token rows (<= 16) run the
  // chain GEMM (kernels/gemm/chain_gemm.h), which sums every element in cuBLASLt's order, for
  // each (out, in) shape where a check at first use finds it bitwise equal to the chosen
  // cuBLASLt algorithm at 1, 9 and 16 rows and (when tuning) no slower at one row; 0 = never.
  // 8: on the H100 it wins at 1-8 rows in a decode step and loses at 16 (a verify step of 16
  // tree nodes: 7.35 vs 7.25 ms; docs/kernel_notes.md "Chain GEMM"). The environment variable
  // ARBOR_CHAIN_GEMM (0..16) overrides it, and the small-weight limit below.
  int chain_gemm_max_rows = 8;
  // The row limit for weights of at most chain_gemm_small_bytes, where a step is bound by
  // launches, not bytes: the chain GEMM starts under the kernel before it (programmatic launch)
  // and cuBLASLt does not. Such a weight takes max(chain_gemm_max_rows, this), and none when
  // chain_gemm_max_rows is 0. SmolLM2-135M's EAGLE-2 draft (10-row expansions) at batch 1:
  // 0.74x -> 0.83-0.85x of plain end to end, n-gram's 16-node verify steps within the noise
  // (H100; docs/kernel_notes.md "Chain GEMM").
  int chain_gemm_small_max_rows = 16;
  // bf16 bytes of a "small" weight: SmolLM2-135M's are 0.2-3.5 MB, Llama-3-8B's smallest (k or
  // v, unfused) 8 MiB.
  int64_t chain_gemm_small_bytes = int64_t{4} << 20;
  // LlamaModel runs q/k/v as one linear and gate/up as one (concatenated weights, then
  // split_cols; free views at one token): 2 GEMMs fewer per layer and no small k / v GEMMs.
  bool fuse_projections = true;
  int32_t max_tree_nodes = 1024;  // largest masked (tree) request accepted by set_step
  // Tensor-core attention kernel (head_dim 64 and 128): 0 = wgmma where the build and GPU have
  // it (sm_90a), else mma.sync; 1 = mma.sync; 2 = wgmma (kUnsupported where unavailable); 3 =
  // wgmma with 128-row tiles in every shape-tuned plan (tests; 0 and 2 take them where the
  // rows fill them).
  int attention_kernel = 0;
  // Batch-invariant attention: score a tree's nodes in groups that read the shared prefix once
  // (tree groups, docs/kernels.md "Batch invariance") instead of one CTA per node re-reading
  // it. Same values.
  // 0: never; 1: groups only as large as keeps the GPU filled (default); 2: always the largest.
  int attention_tree_groups = 1;
  // linear() with at most this many token rows (and fp32 input) runs the bandwidth-bound skinny
  // GEMM (kernels/gemm: bf16-rounded input, fp32 accumulation, as cuBLAS) instead of bf16
  // rounding + cuBLAS. 0 = always cuBLAS (the default: one summation order for every batch
  // shape, so speculative greedy output stays identical to plain greedy on the GPU; the
  // skinny kernel sums in another order, which flips near-ties between a T = 1 decode and a
  // tree verify). 1-2 is its fast range; at most 8 (docs/kernel_notes.md, section
  // "Skinny GEMM and deferred fusion").
  int skinny_gemm_max_rows = 0;
  // Dummy load format for benchmarks: upload_weight() of a HostTensor that has a shape but no
  // data fills the weight on the device with uniform random values (matrices [out, in]:
  // +-sqrt(3 / in), unit-variance outputs for unit-variance inputs; vectors: 1 +- 0.1, i.e.
  // norm weights), seeded per upload (set_random_weight_seed). No host copy of the weights.
  bool random_weights = false;
  // Step graphs (docs/kernels.md "CUDA graphs"): LlamaModel records a decode / verify step's
  // ops as a CUDA graph once its shape is steady and replays it (one launch instead of ~15 per
  // layer); same kernels, same results. Off: every step launches op by op.
  bool cuda_graphs = true;
  // Kernel launches as programmatic dependents on sm_90+ (kernels/common/pdl_launch.cuh): a
  // kernel's launch overlaps the tail of the one before; same results. Off for A/B runs.
  bool pdl = true;
  // The chunked GEMM's wgmma kernel (kernels/gemm/chunked_gemm.h ChunkedGemmParams::wgmma_mode):
  // 2 where measured faster, 0 never, 1 every supported shape.
  int chunked_gemm_wgmma = 2;
  // Chain GEMM tilings <warps><stages><stage k> for A/B runs (ChainGemmParams::small_tiling and
  // deep_tiling); 0: the measured default.
  int chain_gemm_small_tiling = 0;
  int chain_gemm_deep_tiling = 0;
  // split_cols (fused q|k|v and gate|up) runs inside the op that consumes its outputs (RoPE,
  // SiLU * up) instead of as its own launch; off for A/B runs. Same results.
  bool defer_split = true;
  // Diagnostics: a folder where every step graph recorded is written as Graphviz DOT with its
  // kernel nodes' functions, grid and block sizes, shared memory and edges
  // (cudaGraphDebugDotPrint), named b<backend>_g<graph id>.dot (backends numbered in creation
  // order); empty: none. The environment variable ARBOR_STEP_GRAPH_DOT sets it.
  std::string graph_dot_dir;
};

class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options);
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  std::string name() const override { return "cuda"; }
  Tensor upload_weight(const HostTensor& w) override;
  Tensor scratch(int64_t rows, int64_t cols) override;
  Tensor persistent(int64_t rows, int64_t cols) override;
  void gather_rows(const Tensor& src, std::span<const int32_t> rows, const Tensor& out) override;
  void reset_scratch() override;
  void download(const Tensor& src, float* dst) override;
  void upload(const float* src, const Tensor& dst) override;
  void allocate_kv(const KvCacheShape& shape) override;
  const KvCacheShape& kv_shape() const override { return kv_shape_; }
  int64_t kv_cache_bytes(const KvCacheShape& shape) const override;
  // Device memory (cudaMemGetInfo): the scratch arena keeps the largest step's activations, so
  // after a step the free memory already holds them back.
  MemoryInfo memory_info() const override;
  void set_step(const StepInputs& step) override;
  void top_k_ids(const Tensor& logits, int32_t k, const Tensor& ids) override;
  void download_ids(const Tensor& ids, std::span<const int64_t> index,
                    std::vector<int32_t>* out) override;
  // Another CUDA backend on the same device (one process: unified addressing).
  bool shares_memory_with(const Backend& other) const override;
  // An event recorded on other's stream, waited for on this one.
  void wait_for(Backend& other) override;

  void embedding(const Tensor& table, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) override;
  void split_cols(const Tensor& x, const std::vector<Tensor>& outs) override;
  void copy_cols(const Tensor& x, const Tensor& out, int64_t first_col) override;
  void gather_values(const Tensor& x, const std::vector<int64_t>& index,
                     std::vector<float>* out) override;
  bool fuse_projections() const override;
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void rope(const Tensor& q, const Tensor& k, const RopeParams& p) override;
  void write_kv(int64_t layer, const Tensor& k, const Tensor& v) override;
  void paged_tree_attention(int64_t layer, const Tensor& q, int64_t num_heads,
                            const Tensor& out) override;
  void gather_logit_rows(const Tensor& x, const Tensor& out) override;
  void argmax_rows(const Tensor& logits, std::vector<int32_t>* out) override;
  void top_k_log_softmax(const Tensor& logits, int32_t k, std::vector<int32_t>* ids,
                         std::vector<float>* values) override;
  bool has_sample_trees() const override { return true; }
  bool has_draft_frontier() const override { return true; }
  void set_draft_vocab_map(std::span<const int64_t> offsets) override;
  void draft_frontier_begin(int32_t groups, int32_t k, int32_t max_depth,
                            std::span<const int32_t> ids, std::span<const float> values,
                            std::span<const int32_t> parent_rows,
                            std::span<const int32_t> positions, std::span<const int64_t> slots,
                            std::span<const int32_t> root_rows) override;
  void draft_frontier_roots(const Tensor& logits, int32_t k) override;
  void draft_frontier_load(int32_t depth, const Tensor& source, const Tensor& in) override;
  void draft_frontier_shift(const Tensor& len, std::span<const int32_t> len_index,
                            std::span<const int32_t> rows, const Tensor& root_source,
                            const Tensor& roots) override;
  void draft_frontier_expand(int32_t depth, const Tensor& logits) override;
  void device_interval_begin() override;
  void device_interval_end() override;
  double last_device_interval_ms() override;
  bool has_draft_frontier_trees() const override { return true; }
  Tensor draft_frontier_trees(std::span<const int32_t> depth, std::span<const int32_t> nodes,
                              int32_t stride) override;
  void draft_frontier_log(int32_t depths, std::vector<int32_t>* ids, std::vector<float>* values,
                          std::vector<int32_t>* root_ids, std::vector<float>* root_values) override;
  TransferStats transfer_stats() const override;
  void set_graph_timing(bool on) override;
  bool path_rows_on_device() const override { return true; }
  void sample_trees_and_path_rows(const Tensor& logits, const TreeSampleBatch& batch,
                                  const PathRowsRequest& rows, TreeSampleResult* out) override;
  void sample_trees(const Tensor& logits, const TreeSampleBatch& batch,
                    TreeSampleResult* out) override;
  void copy_kv(const std::vector<int64_t>& src_slots,
               const std::vector<int64_t>& dst_slots) override;

  // Tensor parallelism (make_cuda_tp_backends): collectives over NCCL on the backend's stream
  // (recorded into step graphs like any launch).
  int tp_rank() const override;
  int tp_size() const override;
  Tensor upload_weight_shard(const HostTensor& full, const WeightShard& shard) override;
  void embedding_shard(const Tensor& table, int64_t first_id, const Tensor& out) override;
  void all_reduce_sum(const Tensor& x) override;
  void all_gather_cols(const Tensor& local, const Tensor& out) override;
  void bind_thread() override;

  bool step_graphs_enabled() const override;
  bool prepare_step_graph(int64_t num_q_heads, std::vector<int64_t>* key) override;
  void begin_step_capture() override;
  int64_t end_step_capture() override;
  void abort_step_capture() override;
  void replay_step_graph(int64_t graph) override;
  void release_step_graph(int64_t graph) override;
  uint64_t step_graph_epoch() const override;

  // --- for tests and benchmarks ---------------------------------------------------------------
  // Layer's K and V caches as fp32 [num_blocks * block_size, num_kv_heads * head_dim].
  void download_kv(int64_t layer, std::vector<float>* k, std::vector<float>* v);
  // Sets every KV element of every layer to NaN (tests poison slots nothing should read).
  void poison_kv();
  // Largest KV split count of the last attention launch (1 = no split) and whether it used the
  // tensor-core path.
  int32_t last_attention_splits() const;
  bool last_attention_tensor_core() const;
  bool last_attention_wgmma() const;
  bool last_attention_wide() const;  // 128-row wgmma tiles
  // Work items of the last attention call that were tree groups (attention_tree_groups).
  int last_attention_tree_groups() const;
  // split_cols calls whose outputs RoPE or SiLU * up consumed in place (no split launch).
  int64_t splits_consumed_in_place() const;
  // Batch-invariant linear() calls that ran the chain GEMM (the rest ran cuBLASLt).
  int64_t chain_gemm_launches() const;
  // The cuBLASLt algorithm batch-invariant linear() uses for an (out, in) shape, in words
  // (selected on first use; "" if none yet).
  std::string batch_invariant_gemm_algo(int64_t out_features, int64_t in_features) const;
  std::string tuning_report() const override;
  void synchronize();
  // Launches deferred work now (consecutive skinny linears and a residual add are held back to
  // be fused with the op that follows; every op, download and synchronize() does this first).
  // For callers that record events or capture a graph on stream_handle().
  void flush();
  // Seed of the next random (dummy) weight; each upload advances it by one. Two models built in
  // the same order from the same seed get identical weights.
  void set_random_weight_seed(uint64_t seed);
  // The backend's CUDA stream (cudaStream_t), for benchmarks that time or capture its work.
  void* stream_handle() const;

 private:
  // sample_trees, and with rows the path rows (sample_trees_and_path_rows).
  void sample_trees_impl(const Tensor& logits, const TreeSampleBatch& batch,
                         const PathRowsRequest* rows, TreeSampleResult* out);
  friend std::vector<std::unique_ptr<Backend>> make_cuda_tp_backends(const CudaBackendOptions&,
                                                                     int);
  friend std::unique_ptr<Backend> make_cuda_backend_on_stream_of(const CudaBackendOptions&,
                                                                 Backend&);
  struct State;
  std::unique_ptr<State> s_;
  KvCacheShape kv_shape_;
};

// The factory the server and tests use (declared here, not in backend.h, so builds without
// CUDA never reference it).
std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options = {});
// A backend that launches into `peer`'s stream (a CUDA backend on the same device) instead of
// a stream of its own: an EAGLE draft beside its target, whose work runs in turn with the
// target's anyway. A draft whose step graphs replayed on a second stream made the target's own
// step graphs run ~12% longer on the device for the rest of the process (H200,
// docs/speculation.md); on one stream they do not. Either backend may go first.
std::unique_ptr<Backend> make_cuda_backend_on_stream_of(const CudaBackendOptions& options,
                                                        Backend& peer);
// `size` CUDA backends on GPUs options.device .. options.device + size - 1, one
// tensor-parallel group over NCCL (ncclCommInitAll); size 1 is make_cuda_backend. Errors: a
// build without NCCL (kUnsupported), fewer GPUs than ranks (kInvalidArgument, naming both).
std::vector<std::unique_ptr<Backend>> make_cuda_tp_backends(const CudaBackendOptions& options,
                                                            int size);
// Whether this build has NCCL (tensor parallelism beyond one GPU).
bool cuda_tensor_parallel_available();

}  // namespace arbor
