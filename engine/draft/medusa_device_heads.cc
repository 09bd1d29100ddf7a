#include "engine/draft/medusa_device_heads.h"

#include <algorithm>
#include <string>

#include "engine/core/dtype.h"
#include "engine/core/error.h"

namespace arbor {

MedusaDeviceHeads::MedusaDeviceHeads(std::unique_ptr<Backend> backend, const MedusaHeads& heads)
    : backend_(std::move(backend)), hidden_size_(heads.hidden_size), vocab_size_(heads.vocab_size) {
  ARBOR_CHECK(backend_ != nullptr, "MedusaDeviceHeads needs a backend");
  Backend& b = *backend_;
  const int64_t h = hidden_size_;
  for (const MedusaHead& head : heads.heads) {
    ARBOR_CHECK(head.res_weight.size() == head.res_bias.size(),
                "MedusaDeviceHeads: a head's ResBlock weights and biases differ in number");
    for (size_t l = 0; l < head.res_weight.size(); ++l)
      ARBOR_CHECK(head.res_weight[l].numel() == h * h && head.res_bias[l].numel() == h,
                  "MedusaDeviceHeads: ResBlock " + std::to_string(l) + " is not [" +
                      std::to_string(h) + ", " + std::to_string(h) + "] + [" + std::to_string(h) +
                      "]");
  }
  if (heads.uses_base_lm_head()) base_lm_head_ = b.upload_weight(heads.base_lm_head);
  // One ResBlock per head (Medusa-1's layout) and one shared LM head: every head's linear reads
  // the same hidden row, so the heads' weights stacked [heads x hidden, hidden] make one GEMM,
  // and the heads' own copies are not uploaded.
  bool one_block = !heads.heads.empty();
  for (const MedusaHead& head : heads.heads)
    one_block = one_block && head.res_weight.size() == 1 && head.lm_head.empty();
  if (one_block) {
    const auto n = static_cast<int64_t>(heads.heads.size());
    HostTensor w({n * h, h}), bias({n * h});
    for (int64_t d = 0; d < n; ++d) {
      const MedusaHead& head = heads.heads[static_cast<size_t>(d)];
      std::copy(head.res_weight[0].data.begin(), head.res_weight[0].data.end(),
                w.data.begin() + d * h * h);
      std::copy(head.res_bias[0].data.begin(), head.res_bias[0].data.end(),
                bias.data.begin() + d * h);
    }
    stacked_weight_ = b.upload_weight(w);
    stacked_bias_ = b.upload_weight(bias);
  }
  for (const MedusaHead& head : heads.heads) {
    Head d;
    for (size_t l = 0; l < head.res_weight.size() && !one_block; ++l) {
      d.weight.push_back(b.upload_weight(head.res_weight[l]));
      d.bias.push_back(b.upload_weight(head.res_bias[l]));
    }
    d.lm_head = head.lm_head.empty() ? base_lm_head_ : b.upload_weight(head.lm_head);
    heads_.push_back(std::move(d));
  }
}

Tensor MedusaDeviceHeads::ids_slice(int64_t offset, int64_t rows, int64_t cols, int64_t total) {
  if (ids_buffer_.numel() < total) {
    // Grown to a power of two: a few allocations for the life of the proposer.
    int64_t n = 256;
    while (n < total) n *= 2;
    ids_buffer_ = backend_->persistent(1, n);
    ids_buffer_.dtype = DType::kI32;  // 4-byte elements either way
  }
  Tensor t = ids_buffer_;
  t.data = static_cast<int32_t*>(ids_buffer_.data) + offset;
  t.rows = rows;
  t.cols = cols;
  return t;
}

std::vector<std::vector<int32_t>> MedusaDeviceHeads::top_k(std::span<const float> hidden,
                                                           int64_t rows,
                                                           std::span<const int32_t> k) {
  const MedusaHeadIds on = top_k_ids(hidden, rows, k);
  std::vector<std::vector<int32_t>> ids(k.size());
  std::vector<int64_t> index;
  for (size_t d = 0; d < k.size(); ++d) {
    if (k[d] <= 0) continue;
    const int64_t kd = std::min<int64_t>(k[d], vocab_size_);
    for (int64_t r = 0; r < rows; ++r)
      for (int64_t j = 0; j < kd; ++j) index.push_back(on.index(d, r, j));
  }
  if (index.empty()) return ids;
  std::vector<int32_t> flat;  // one wait for every head's ids
  backend_->download_ids(on.ids, index, &flat);
  size_t at = 0;
  for (size_t d = 0; d < k.size(); ++d) {
    if (k[d] <= 0) continue;
    const size_t n = static_cast<size_t>(rows * std::min<int64_t>(k[d], vocab_size_));
    ids[d].assign(flat.begin() + static_cast<std::ptrdiff_t>(at),
                  flat.begin() + static_cast<std::ptrdiff_t>(at + n));
    at += n;
  }
  return ids;
}

MedusaHeadIds MedusaDeviceHeads::top_k_ids(std::span<const float> hidden, int64_t rows,
                                           std::span<const int32_t> k) {
  ARBOR_CHECK(rows >= 1 && static_cast<int64_t>(hidden.size()) == rows * hidden_size_,
              "MedusaDeviceHeads::top_k: hidden holds " + std::to_string(hidden.size()) +
                  " values, expected " + std::to_string(rows) + " x " +
                  std::to_string(hidden_size_));
  return run_heads(Input{hidden, Tensor{}, rows}, k);
}

MedusaHeadIds MedusaDeviceHeads::top_k_ids(const Tensor& hidden, std::span<const int32_t> k) {
  ARBOR_CHECK(hidden.rows >= 1 && hidden.cols == hidden_size_ && hidden.dtype == DType::kF32,
              "MedusaDeviceHeads::top_k_ids: hidden " + std::to_string(hidden.rows) + " x " +
                  std::to_string(hidden.cols) + ", expected fp32 rows of " +
                  std::to_string(hidden_size_));
  return run_heads(Input{{}, hidden, hidden.rows}, k);
}

void MedusaDeviceHeads::load(const Input& input, const Tensor& dst, int64_t n) {
  Backend& b = *backend_;
  const int64_t rows = input.rows, h = hidden_size_;
  if (input.host.empty()) {
    std::vector<int32_t> index;
    for (int64_t r = 0; r < rows; ++r) index.insert(index.end(), static_cast<size_t>(n), r);
    b.gather_rows(input.device, index, dst);
    return;
  }
  if (n == 1) {
    b.upload(input.host.data(), dst);
    return;
  }
  std::vector<float> repeated(static_cast<size_t>(rows * n * h));
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < n; ++d)
      std::copy_n(input.host.begin() + r * h, h, repeated.begin() + (r * n + d) * h);
  b.upload(repeated.data(), dst);
}

MedusaHeadIds MedusaDeviceHeads::run_heads(const Input& input, std::span<const int32_t> k) {
  const int64_t rows = input.rows;
  ARBOR_CHECK(k.size() <= heads_.size(), "MedusaDeviceHeads::top_k: " + std::to_string(k.size()) +
                                             " heads asked, " + std::to_string(heads_.size()) +
                                             " loaded");
  // The heads that run, in order, and the most candidates any of them is asked for.
  std::vector<size_t> run;
  int32_t k_max = 0;
  for (size_t d = 0; d < k.size(); ++d) {
    if (k[d] <= 0) continue;
    run.push_back(d);
    k_max = std::max(k_max, std::min<int32_t>(k[d], static_cast<int32_t>(vocab_size_)));
  }
  MedusaHeadIds out;
  out.offset.assign(k.size(), 0);
  out.row_stride.assign(k.size(), 0);
  if (run.empty()) return out;
  // Stacked heads run all of them whatever k asks, so a head's candidates never depend on
  // which other heads (deeper trees in the same batch) run beside it.
  if (stacked_weight_.data != nullptr) return top_k_stacked(input, k, k_max);
  Backend& b = *backend_;
  b.reset_scratch();
  const int64_t h = hidden_size_, n = static_cast<int64_t>(run.size());
  Tensor in = b.scratch(rows, h);  // [rows, hidden] device fp32
  load(input, in);
  Tensor ones;  // [rows, hidden] device fp32 of 1: silu(y) = silu_mul(y, 1)
  // Head `head`'s ResBlocks over `in` into `out` ([rows, hidden] device fp32).
  const auto res_blocks = [&](const Head& head, const Tensor& out) {
    if (head.weight.empty()) {
      load(input, out);
      return;
    }
    if (ones.data == nullptr) {
      ones = b.scratch(rows, h);
      const std::vector<float> one(static_cast<size_t>(rows * h), 1.0f);
      b.upload(one.data(), ones);
    }
    Tensor x = in;
    for (size_t l = 0; l < head.weight.size(); ++l) {
      Tensor y = b.scratch(rows, h);
      const Tensor next = l + 1 == head.weight.size() ? out : b.scratch(rows, h);
      b.linear(x, head.weight[l], head.bias[l], y);  // x + SiLU(W x + b)
      b.silu_mul(y, ones, y);
      b.add(x, y, next);
      x = next;
    }
  };
  bool one_lm_head = true;
  for (size_t d : run)
    one_lm_head = one_lm_head && heads_[d].lm_head.data == heads_[run[0]].lm_head.data;
  // Heads that share one LM head: their rows stacked [heads x rows, hidden] (head run[i]'s rows
  // from i x rows on; 256-byte aligned slices), one LM-head GEMM and one top-k pass.
  if (one_lm_head && (rows * h) % 64 == 0) {
    Tensor stacked = b.scratch(n * rows, h);
    for (int64_t i = 0; i < n; ++i) {
      Tensor slice = stacked;
      slice.data = static_cast<uint8_t*>(stacked.data) +
                   static_cast<size_t>(i * rows * h) * dtype_size(stacked.dtype);
      slice.rows = rows;
      res_blocks(heads_[run[static_cast<size_t>(i)]], slice);
    }
    Tensor logits = b.scratch(n * rows, vocab_size_);  // [heads x rows, vocab] device fp32
    b.linear(stacked, heads_[run[0]].lm_head, Tensor{}, logits);
    out.ids = ids_slice(0, n * rows, k_max, n * rows * k_max);
    b.top_k_ids(logits, k_max, out.ids);
    for (int64_t i = 0; i < n; ++i) {
      const size_t d = run[static_cast<size_t>(i)];
      out.offset[d] = i * rows * k_max;
      out.row_stride[d] = k_max;
    }
    return out;
  }
  // Heads with LM heads of their own: one GEMM and one top-k pass each, into consecutive
  // slices of the ids buffer.
  int64_t total = 0;
  for (size_t d : run) total += rows * std::min<int64_t>(k[d], vocab_size_);
  int64_t at = 0;
  for (size_t d : run) {
    const int64_t kd = std::min<int64_t>(k[d], vocab_size_);
    Tensor x = b.scratch(rows, h), logits = b.scratch(rows, vocab_size_);
    res_blocks(heads_[d], x);
    b.linear(x, heads_[d].lm_head, Tensor{}, logits);
    const Tensor ids = ids_slice(at, rows, kd, total);
    b.top_k_ids(logits, static_cast<int32_t>(kd), ids);
    out.offset[d] = at;
    out.row_stride[d] = kd;
    at += rows * kd;
  }
  out.ids = ids_buffer_;
  return out;
}

MedusaHeadIds MedusaDeviceHeads::top_k_stacked(const Input& input, std::span<const int32_t> k,
                                               int32_t k_max) {
  Backend& b = *backend_;
  b.reset_scratch();
  const int64_t rows = input.rows, h = hidden_size_, n = num_heads();
  // Row r x heads + d of the [rows x heads, hidden] device fp32 tensors below is head d's row for
  // hidden row r: the stacked GEMM's output [rows, heads x hidden] read with that shape.
  Tensor in = b.scratch(rows, h), x = b.scratch(rows * n, h);
  load(input, in);
  load(input, x, n);
  const std::vector<float> one(static_cast<size_t>(rows * n * h), 1.0f);
  Tensor ones = b.scratch(rows * n, h);  // silu(y) = silu_mul(y, 1)
  b.upload(one.data(), ones);
  Tensor y = b.scratch(rows, n * h);
  b.linear(in, stacked_weight_, stacked_bias_, y);  // every head's W x + b
  Tensor y_rows = y;  // the same memory, one row per (hidden row, head)
  y_rows.rows = rows * n;
  y_rows.cols = h;
  Tensor res = b.scratch(rows * n, h);
  b.silu_mul(y_rows, ones, y_rows);
  b.add(x, y_rows, res);                             // x + SiLU(W x + b)
  Tensor logits = b.scratch(rows * n, vocab_size_);  // [rows x heads, vocab] device fp32
  b.linear(res, heads_[0].lm_head, Tensor{}, logits);
  MedusaHeadIds out;
  out.ids = ids_slice(0, rows * n, k_max, rows * n * k_max);  // [rows x heads, k_max]
  b.top_k_ids(logits, k_max, out.ids);
  out.offset.assign(k.size(), 0);
  out.row_stride.assign(k.size(), n * k_max);
  for (size_t d = 0; d < k.size(); ++d) out.offset[d] = static_cast<int64_t>(d) * k_max;
  return out;
}

}  // namespace arbor
