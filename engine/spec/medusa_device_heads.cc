#include "engine/spec/medusa_device_heads.h"

#include <algorithm>
#include <string>

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
  Tensor in = b.scratch(rows, h);
  b.upload(hidden.data(), in);
  Tensor ones;  // silu(y) = silu_mul(y, 1)
  std::vector<std::vector<int32_t>> ids(k.size());
  std::vector<float> values;
  for (size_t d = 0; d < k.size(); ++d) {
    if (k[d] <= 0) continue;
    const Head& head = heads_[d];
    Tensor x = in;
    for (size_t l = 0; l < head.weight.size(); ++l) {
      if (ones.data == nullptr) {
        ones = b.scratch(rows, h);
        const std::vector<float> one(static_cast<size_t>(rows * h), 1.0f);
        b.upload(one.data(), ones);
      }
      Tensor y = b.scratch(rows, h), next = b.scratch(rows, h);
      b.linear(x, head.weight[l], head.bias[l], y);  // x + SiLU(W x + b)
      b.silu_mul(y, ones, y);
      b.add(x, y, next);
      x = next;
    }
    Tensor logits = b.scratch(rows, vocab_size_);
    b.linear(x, head.lm_head, Tensor{}, logits);
    b.top_k_log_softmax(logits, std::min<int32_t>(k[d], static_cast<int32_t>(vocab_size_)), &ids[d],
                        &values);
  }
  return ids;
}

}  // namespace arbor
