// The CPU reference backend: fp32 weights, activations and KV cache in host memory, GEMMs
// through BLAS, everything else in plain loops that are obviously right. Every other backend
// is tested against this one.
#pragma once

#include <cstdlib>
#include <deque>
#include <memory>
#include <span>
#include <vector>

#include "engine/backend/backend.h"

namespace arbor {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int num_threads);
  std::string name() const override { return "cpu"; }

  Tensor upload_weight(const HostTensor& w) override;
  Tensor scratch(int64_t rows, int64_t cols) override;
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
  void gather_values(const Tensor& x, const std::vector<int64_t>& index,
                     std::vector<float>* out) override;
  void top_k_log_softmax(const Tensor& logits, int32_t k, std::vector<int32_t>* ids,
                         std::vector<float>* values) override;
  void copy_kv(const std::vector<int64_t>& src_slots,
               const std::vector<int64_t>& dst_slots) override;

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
};

}  // namespace arbor
