// Test support: reads the golden fixtures written by scripts/make_golden_fixtures.py
// (Hugging Face transformers logits and greedy tokens) and compares logits rows.
#pragma once

#include <algorithm>
#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

namespace arbor::testing {

inline nlohmann::json read_json(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw std::runtime_error("cannot open fixture " + path);
  return nlohmann::json::parse(f);
}

// max |a - b| / max |b| over one row: the relative error the tolerances are stated in.
inline double row_rel_error(const float* ours, const std::vector<float>& ref) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    max_diff = std::max(max_diff, std::fabs(static_cast<double>(ours[i]) - ref[i]));
    max_ref = std::max(max_ref, std::fabs(static_cast<double>(ref[i])));
  }
  return max_diff / std::max(max_ref, 1e-30);
}

inline int32_t argmax(const float* row, int64_t n) {
  return static_cast<int32_t>(std::max_element(row, row + n) - row);
}

}  // namespace arbor::testing
