// Test support: Medusa heads with random weights in the layout of SmolLM2's trained heads (one
// ResBlock per head, the base LM head shared), for comparing a backend's heads with the host
// reference (medusa_head_logits) on shapes no fixture has.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <random>
#include <span>
#include <utility>
#include <vector>

#include "engine/core/host_tensor.h"
#include "engine/draft/medusa_device_heads.h"
#include "engine/draft/medusa_heads.h"

namespace arbor::testing {

// Normal(0, scale) tensors from one seeded stream.
class NormalTensors {
 public:
  explicit NormalTensors(uint32_t seed) : rng_(seed) {}
  HostTensor operator()(std::vector<int64_t> shape, float scale) {
    HostTensor t(std::move(shape));
    for (float& v : t.data) v = nd_(rng_) * scale;
    return t;
  }

 private:
  std::mt19937 rng_;
  std::normal_distribution<float> nd_{0.f, 1.f};
};

// `heads` heads of one ResBlock (weights scaled by weight_scale, biases by 0.1) and a shared
// base LM head [vocab, hidden] (scaled by 0.3), drawn in that order.
inline MedusaHeads one_block_medusa_heads(NormalTensors& random, int64_t hidden, int64_t vocab,
                                          int64_t heads, float weight_scale) {
  MedusaHeads out;
  out.source = "synthetic";
  out.hidden_size = hidden;
  out.vocab_size = vocab;
  for (int64_t d = 0; d < heads; ++d) {
    MedusaHead h;
    h.res_weight.push_back(random({hidden, hidden}, weight_scale));
    h.res_bias.push_back(random({hidden}, 0.1f));
    out.heads.push_back(std::move(h));
  }
  out.base_lm_head = random({vocab, hidden}, 0.3f);
  return out;
}

// device.top_k for fresh random hidden rows [rows, hidden] (drawn from `random`) at each row
// count and each k set: a head asked for 0 must get no ids, and every asked head's ids for one
// row go to check(rows, r, d, k, ids of that row (k[d] of them), head d's host logits for row r).
template <typename Check>
void check_device_top_k(MedusaDeviceHeads& device, const MedusaHeads& heads, NormalTensors& random,
                        const std::vector<int64_t>& row_counts,
                        const std::vector<std::vector<int32_t>>& k_sets, Check check) {
  const int64_t hidden_size = heads.hidden_size;
  for (int64_t rows : row_counts) {
    const HostTensor hidden = random({rows, hidden_size}, 1.f);
    for (const std::vector<int32_t>& k : k_sets) {
      const auto got = device.top_k(hidden.data, rows, k);
      ASSERT_EQ(got.size(), k.size());
      for (int64_t r = 0; r < rows; ++r) {
        const auto logits = medusa_head_logits(
            heads, std::span<const float>(hidden.data).subspan(r * hidden_size, hidden_size), 1);
        for (size_t d = 0; d < k.size(); ++d) {
          if (k[d] == 0) {
            EXPECT_TRUE(got[d].empty()) << "head " << d << " was not asked for";
            continue;
          }
          const std::vector<int32_t> ids(got[d].begin() + r * k[d],
                                         got[d].begin() + (r + 1) * k[d]);
          check(rows, r, d, k, ids, logits[d]);
        }
      }
    }
  }
}

}  // namespace arbor::testing
