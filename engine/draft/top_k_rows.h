// A draft model's output as the tree builders read it: each row's best k entries of the
// log-softmax over the draft vocabulary, computed where the logits are.
#pragma once

#include <cstdint>
#include <vector>

namespace arbor {

// ids [rows, k] best first (ties: lower id first, host_math::top_k's order) and their
// log-probabilities.
struct TopKRows {
  int32_t k = 0;
  std::vector<int32_t> ids;   // [rows, k]
  std::vector<float> values;  // [rows, k]
  int32_t rows() const { return k ? static_cast<int32_t>(ids.size()) / k : 0; }
  // Rows [begin, end).
  TopKRows slice(size_t begin, size_t end) const {
    const auto kk = static_cast<size_t>(k);
    return {k,
            {ids.begin() + begin * kk, ids.begin() + end * kk},
            {values.begin() + begin * kk, values.begin() + end * kk}};
  }
};

}  // namespace arbor
