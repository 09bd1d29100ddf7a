#include "engine/spec/medusa_device_heads.h"

#include <algorithm>
#include <string>

#include "engine/core/dtype.h"
#include "engine/core/error.h"

namespace arbor {

MedusaDeviceHeads::MedusaDeviceHeads(std::unique_ptr<Backend> backend, const MedusaHeads& heads)
    : backend_(std::move(backend)), hidden_size_(heads.hidden_size), vocab_size_(heads.vocab_size) {
  ARBOR_CHECK(backend_ != nullptr, "MedusaDeviceHeads needs a backend");
  Backend& b = *backend_;
  if (heads.uses_base_lm_head()) base_lm_head_ = b.upload_weight(heads.base_lm_head);
  for (const MedusaHead& h : heads.heads) {
    Head d;
    for (size_t l = 0; l < h.res_weight.size(); ++l) {
      d.weight.push_back(b.upload_weight(h.res_weight[l]));
      d.bias.push_back(b.upload_weight(h.res_bias[l]));
    }
    d.lm_head = h.lm_head.empty() ? base_lm_head_ : b.upload_weight(h.lm_head);
    heads_.push_back(std::move(d));
  }
  // One ResBlock per head (Medusa-1's layout) and one shared LM head: every head's linear reads
  // the same hidden row, so the heads' weights stacked [heads x hidden, hidden] make one GEMM.
  bool one_block = !heads.heads.empty();
  for (const MedusaHead& h : heads.heads)
    one_block = one_block && h.res_weight.size() == 1 && h.lm_head.empty();
  if (one_block) {
    const auto n = static_cast<int64_t>(heads.heads.size());
    HostTensor w({n * hidden_size_, hidden_size_}), bias({n * hidden_size_});
    for (int64_t d = 0; d < n; ++d) {
      const MedusaHead& h = heads.heads[static_cast<size_t>(d)];
      std::copy(h.res_weight[0].data.begin(), h.res_weight[0].data.end(),
                w.data.begin() + d * hidden_size_ * hidden_size_);
      std::copy(h.res_bias[0].data.begin(), h.res_bias[0].data.end(),
                bias.data.begin() + d * hidden_size_);
    }
    stacked_weight_ = b.upload_weight(w);
    stacked_bias_ = b.upload_weight(bias);
  }
}

std::vector<std::vector<int32_t>> MedusaDeviceHeads::top_k(std::span<const float> hidden,
                                                           int64_t rows,
                                                           std::span<const int32_t> k) {
  ARBOR_CHECK(rows >= 1 && static_cast<int64_t>(hidden.size()) == rows * hidden_size_,
              "MedusaDeviceHeads::top_k: hidden holds " + std::to_string(hidden.size()) +
                  " values, expected " + std::to_string(rows) + " x " +
                  std::to_string(hidden_size_));
  ARBOR_CHECK(k.size() <= heads_.size(), "MedusaDeviceHeads::top_k: " + std::to_string(k.size()) +
                                             " heads asked, " + std::to_string(heads_.size()) +
                                             " loaded");
  Backend& b = *backend_;
  b.reset_scratch();
  const int64_t h = hidden_size_;
  // The heads that run, in order, and the most candidates any of them is asked for.
  std::vector<size_t> run;
  int32_t k_max = 0;
  for (size_t d = 0; d < k.size(); ++d) {
    if (k[d] <= 0) continue;
    run.push_back(d);
    k_max = std::max(k_max, std::min<int32_t>(k[d], static_cast<int32_t>(vocab_size_)));
  }
  std::vector<std::vector<int32_t>> ids(k.size());
  if (run.empty()) return ids;
  const int64_t n = static_cast<int64_t>(run.size());
  // Rows [i * rows, (i + 1) * rows) of a stacked tensor: head run[i]'s rows.
  const auto rows_of = [rows](const Tensor& t, int64_t i) {
    Tensor v = t;
    v.data = static_cast<uint8_t*>(t.data) +
             static_cast<size_t>(i * rows * t.cols) * dtype_size(t.dtype);
    v.rows = rows;
    return v;
  };
  if (stacked_weight_.data != nullptr && n == num_heads()) return top_k_stacked(hidden, rows, k);
  Tensor in = b.scratch(rows, h);
  b.upload(hidden.data(), in);
  // Every head's ResBlock output lands in its rows of `stacked`, so the LM heads run as one
  // GEMM where the heads share the base LM head, and one top-k pass serves every head: one
  // wait for the host per call instead of one per head.
  Tensor stacked = b.scratch(n * rows, h);
  Tensor ones;  // silu(y) = silu_mul(y, 1)
  bool one_lm_head = true;
  for (int64_t i = 0; i < n; ++i) {
    const Head& head = heads_[run[static_cast<size_t>(i)]];
    one_lm_head = one_lm_head && head.lm_head.data == heads_[run[0]].lm_head.data;
    const Tensor out = rows_of(stacked, i);
    if (head.weight.empty()) {
      b.upload(hidden.data(), out);
      continue;
    }
    Tensor x = in;
    for (size_t l = 0; l < head.weight.size(); ++l) {
      if (ones.data == nullptr) {
        ones = b.scratch(rows, h);
        const std::vector<float> one(static_cast<size_t>(rows * h), 1.0f);
        b.upload(one.data(), ones);
      }
      Tensor y = b.scratch(rows, h);
      const Tensor next = l + 1 == head.weight.size() ? out : b.scratch(rows, h);
      b.linear(x, head.weight[l], head.bias[l], y);  // x + SiLU(W x + b)
      b.silu_mul(y, ones, y);
      b.add(x, y, next);
      x = next;
    }
  }
  Tensor logits = b.scratch(n * rows, vocab_size_);
  if (one_lm_head) {
    b.linear(stacked, heads_[run[0]].lm_head, Tensor{}, logits);
  } else {
    for (int64_t i = 0; i < n; ++i)
      b.linear(rows_of(stacked, i), heads_[run[static_cast<size_t>(i)]].lm_head, Tensor{},
               rows_of(logits, i));
  }
  std::vector<int32_t> all;  // [n * rows, k_max]
  std::vector<float> values;
  b.top_k_log_softmax(logits, k_max, &all, &values);
  // A top-k list's first entries are the smaller top-k (best first, lower id first on ties).
  for (int64_t i = 0; i < n; ++i) {
    const size_t d = run[static_cast<size_t>(i)];
    const int64_t kd = std::min<int64_t>(k[d], vocab_size_);
    ids[d].resize(static_cast<size_t>(rows * kd));
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(all.begin() + (i * rows + r) * k_max, kd, ids[d].begin() + r * kd);
  }
  return ids;
}

std::vector<std::vector<int32_t>> MedusaDeviceHeads::top_k_stacked(std::span<const float> hidden,
                                                                   int64_t rows,
                                                                   std::span<const int32_t> k) {
  Backend& b = *backend_;
  const int64_t h = hidden_size_, n = num_heads();
  int32_t k_max = 0;
  for (int32_t kd : k)
    k_max = std::max(k_max, std::min<int32_t>(kd, static_cast<int32_t>(vocab_size_)));
  // Row r * n + d of the [rows x heads, hidden] tensors below is head d's row for hidden row r:
  // the stacked GEMM's output [rows, heads x hidden] read with that shape.
  Tensor in = b.scratch(rows, h), x = b.scratch(rows * n, h);
  b.upload(hidden.data(), in);
  std::vector<float> repeated(static_cast<size_t>(rows * n * h)), one(repeated.size(), 1.0f);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t d = 0; d < n; ++d)
      std::copy_n(hidden.begin() + r * h, h, repeated.begin() + (r * n + d) * h);
  b.upload(repeated.data(), x);
  Tensor ones = b.scratch(rows * n, h);  // silu(y) = silu_mul(y, 1)
  b.upload(one.data(), ones);
  Tensor y = b.scratch(rows, n * h);
  b.linear(in, stacked_weight_, stacked_bias_, y);  // every head's W x + b
  y.rows = rows * n;
  y.cols = h;
  Tensor res = b.scratch(rows * n, h);
  b.silu_mul(y, ones, y);
  b.add(x, y, res);  // x + SiLU(W x + b)
  Tensor logits = b.scratch(rows * n, vocab_size_);
  b.linear(res, heads_[0].lm_head, Tensor{}, logits);
  std::vector<int32_t> all;  // [rows * n, k_max]
  std::vector<float> values;
  b.top_k_log_softmax(logits, k_max, &all, &values);
  std::vector<std::vector<int32_t>> ids(k.size());
  for (size_t d = 0; d < k.size(); ++d) {
    const int64_t kd = std::min<int64_t>(k[d], vocab_size_);
    ids[d].resize(static_cast<size_t>(rows * kd));
    for (int64_t r = 0; r < rows; ++r)
      std::copy_n(all.begin() + (r * n + static_cast<int64_t>(d)) * k_max, kd,
                  ids[d].begin() + r * kd);
  }
  return ids;
}

}  // namespace arbor
