// The CPU reference backend: fp32 weights, activations and KV cache in host memory, GEMMs
// through BLAS, everything else in plain loops that are obviously right. Every other backend
// is tested against this one.
#pragma once

#include <condition_variable>
#include <cstdlib>
#include <deque>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/draft_frontier.h"

namespace arbor {

// The collectives of a CPU tensor-parallel group: ranks are threads of one process, and each
// collective meets at a barrier and reads the other ranks' buffers.
class HostCollective {
 public:
  explicit HostCollective(int size);
  int size() const { return size_; }
  // data[n] of every rank = the sum over ranks 0, 1, .. in that order (the same bits on each).
  void all_reduce_sum(int rank, float* data, int64_t n);
  // out[rows, out_cols] = the ranks' local[rows, cols] side by side, cut at out_cols.
  void all_gather_cols(int rank, const float* local, int64_t rows, int64_t cols, float* out,
                       int64_t out_cols);

 private:
  void arrive();  // a reusable barrier of size_ threads
  const int size_;
  std::mutex mu_;
  std::condition_variable cv_;
  int waiting_ = 0;
  uint64_t generation_ = 0;
  std::vector<const float*> buffers_;
};

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads);
  // Rank `rank` of a group sharing `collective`.
  CpuBackend(int num_threads, std::shared_ptr<HostCollective> collective, int rank);
  std::string name() const override { return "cpu"; }
  int tp_rank() const override { return rank_; }
  int tp_size() const override { return collective_ ? collective_->size() : 1; }
  void embedding_shard(const Tensor& table, int64_t first_id, const Tensor& out) override;
  void all_reduce_sum(const Tensor& x) override;
  void all_gather_cols(const Tensor& local, const Tensor& out) override;

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
  // Host memory: MemAvailable (/proc/meminfo), lowered to the cgroup's limit (memory.max -
  // memory.current) inside a container.
  MemoryInfo memory_info() const override;
  void set_step(const StepInputs& step) override;

  void embedding(const Tensor& table, const Tensor& out) override;
  void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out) override;
  void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) override;
  void add(const Tensor& a, const Tensor& b, const Tensor& out) override;
  void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) override;
  void rope(const Tensor& q, const Tensor& k, const RopeParams& p) override;
  void write_kv(int64_t layer, const Tensor& k, const Tensor& v) override;
  void paged_tree_attention(int64_t layer, const Tensor& q, int64_t num_heads,
                            const Tensor& out) override;
  void gather_logit_rows(const Tensor& x, const Tensor& out) override;
  void argmax_rows(const Tensor& logits, std::vector<int32_t>* out) override;
  void split_cols(const Tensor& x, const std::vector<Tensor>& outs) override;
  void copy_cols(const Tensor& x, const Tensor& out, int64_t first_col) override;
  void gather_values(const Tensor& x, const std::vector<int64_t>& index,
                     std::vector<float>* out) override;
  void top_k_log_softmax(const Tensor& logits, int32_t k, std::vector<int32_t>* ids,
                         std::vector<float>* values) override;
  void top_k_ids(const Tensor& logits, int32_t k, const Tensor& ids) override;
  void download_ids(const Tensor& ids, std::span<const int64_t> index,
                    std::vector<int32_t>* out) override;
  // Host memory: any other CPU backend's (tensor-parallel ranks included).
  bool shares_memory_with(const Backend& other) const override { return other.name() == "cpu"; }
  void copy_kv(const std::vector<int64_t>& src_slots,
               const std::vector<int64_t>& dst_slots) override;
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
  bool has_draft_frontier_trees() const override { return true; }
  Tensor draft_frontier_trees(std::span<const int32_t> depth, std::span<const int32_t> nodes,
                              int32_t stride) override;
  void draft_frontier_log(int32_t depths, std::vector<int32_t>* ids, std::vector<float>* values,
                          std::vector<int32_t>* root_ids, std::vector<float>* root_values) override;

  // Direct access for tests: [num_blocks * block_size * num_kv_heads * head_dim] per layer.
  std::span<const float> k_cache(int64_t layer) const { return plane(k_cache_, layer); }
  std::span<const float> v_cache(int64_t layer) const { return plane(v_cache_, layer); }

 private:
  std::deque<std::vector<float>> weights_;  // owned weight storage (stable addresses)
  std::deque<std::vector<float>> scratch_;  // per-step activations
  KvCacheShape kv_shape_;
  // A cache plane from calloc: the pages of blocks never written are never touched, so a cache
  // sized for the memory there is costs resident memory only as it fills.
  struct FreeDeleter {
    void operator()(float* p) const { std::free(p); }
  };
  struct Plane {
    std::unique_ptr<float[], FreeDeleter> p;
    float* data() const { return p.get(); }
  };
  std::vector<Plane> k_cache_, v_cache_;  // [layer][slot * Hkv * D]
  std::span<const float> plane(const std::vector<Plane>& cache, int64_t layer) const {
    return {cache.at(static_cast<size_t>(layer)).data(),
            static_cast<size_t>(kv_shape_.num_blocks * kv_shape_.block_size *
                                kv_shape_.num_kv_heads * kv_shape_.head_dim)};
  }
  StepInputs step_;
  HostDraftFrontier frontier_;
  std::vector<int32_t> trees_;                  // draft_frontier_trees' [G, 2, stride]
  std::vector<int64_t> vocab_offsets_;          // set_draft_vocab_map
  std::shared_ptr<HostCollective> collective_;  // null: no group
  int rank_ = 0;
};

}  // namespace arbor
