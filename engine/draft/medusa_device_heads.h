// Medusa heads run on a Backend: every head's ResBlocks and LM head for a batch of hidden rows in
// one device pass, each head's top-k read where its logits are (Backend::top_k_log_softmax), so
// only k token ids per row and head reach the host, never the [rows, vocab] logits. Heads that
// share the base LM head stack their rows: one LM-head GEMM and one top-k pass, one wait for the
// host per call; heads of one ResBlock each also run their ResBlocks as one GEMM. Heads with LM
// heads of their own run one after another. The host path (medusa_head_logits) is the
// reference; on the CPU backend the two agree exactly.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/draft/medusa_heads.h"

namespace arbor {

// Head d's j-th best token for hidden row r is ids[offset[d] + r * row_stride[d] + j] (int32,
// the heads' backend memory), for the k[d] asked of it.
struct MedusaHeadIds {
  Tensor ids;
  std::vector<int64_t> offset, row_stride;  // [k.size()]; unused for heads not run
  int64_t index(size_t head, int64_t row, int64_t rank) const {
    return offset[head] + row * row_stride[head] + rank;
  }
};

class MedusaDeviceHeads {
 public:
  // Uploads every head (and the base LM head where a head has none) to `backend`, which it owns.
  MedusaDeviceHeads(std::unique_ptr<Backend> backend, const MedusaHeads& heads);

  int32_t num_heads() const { return static_cast<int32_t>(heads_.size()); }
  TransferStats transfer_stats() const { return backend_->transfer_stats(); }
  // hidden [rows, hidden_size] host fp32. k[d]: candidates wanted from head d (0: head d is not
  // run; at most heads.size() entries, each <= min(vocab, 1024)). Returns ids[d][row * k[d] + j],
  // head d's j-th best token for row `row`, best first, the lower id first among equal logits.
  std::vector<std::vector<int32_t>> top_k(std::span<const float> hidden, int64_t rows,
                                          std::span<const int32_t> k);
  // The same ids left on the backend (no wait for the device): valid until the next call.
  MedusaHeadIds top_k_ids(std::span<const float> hidden, int64_t rows, std::span<const int32_t> k);
  // top_k_ids of hidden rows already in backend memory: hidden [rows, hidden_size] fp32.
  MedusaHeadIds top_k_ids(const Tensor& hidden, std::span<const int32_t> k);
  Backend& backend() { return *backend_; }

 private:
  struct Head {
    std::vector<Tensor> weight, bias;  // ResBlocks
    Tensor lm_head;
  };
  // top_k() for heads of one ResBlock sharing the base LM head: every head's ResBlock as one
  // GEMM over the stacked weights, every head run (ids only where k asks).
  // The input rows, from the host or (host empty) from backend memory.
  struct Input {
    std::span<const float> host;
    Tensor device;
    int64_t rows = 0;
  };
  MedusaHeadIds run_heads(const Input& input, std::span<const int32_t> k);
  MedusaHeadIds top_k_stacked(const Input& input, std::span<const int32_t> k, int32_t k_max);
  // dst [n x input.rows, hidden] = each input row n times (row r x n + i: row r) when n > 1,
  // else the rows themselves.
  void load(const Input& input, const Tensor& dst, int64_t n = 1);
  // [rows, cols] int32 at element `offset` of the ids buffer, grown (a new persistent
  // allocation: the old one stays with the backend) when too small for `total` elements.
  Tensor ids_slice(int64_t offset, int64_t rows, int64_t cols, int64_t total);

  std::unique_ptr<Backend> backend_;
  int64_t hidden_size_ = 0;
  int64_t vocab_size_ = 0;
  std::vector<Head> heads_;
  Tensor base_lm_head_;
  // Device bf16 [heads x hidden, hidden] and fp32 [heads x hidden], or empty: set for heads of
  // one ResBlock sharing the base LM head (whose Head::weight / bias are then empty).
  Tensor stacked_weight_, stacked_bias_;
  Tensor ids_buffer_;  // top_k_ids' output (persistent, int32 view)
};

}  // namespace arbor
