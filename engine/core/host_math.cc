#include "engine/core/host_math.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace arbor::host_math {

void linear(const float* x, int64_t n, int64_t in_features, const float* w, int64_t out_features,
            const float* bias, float* out) {
  if (n == 0 || out_features == 0) return;
  float beta = 0.f;
  if (bias != nullptr) {
    for (int64_t r = 0; r < n; ++r)
      std::memcpy(out + r * out_features, bias, sizeof(float) * out_features);
    beta = 1.f;
  }
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(n),
              static_cast<int>(out_features), static_cast<int>(in_features), 1.f, x,
              static_cast<int>(in_features), w, static_cast<int>(in_features), beta, out,
              static_cast<int>(out_features));
}

void silu_inplace(float* x, int64_t count) {
  for (int64_t i = 0; i < count; ++i) x[i] = x[i] / (1.f + std::exp(-x[i]));
}

float logsumexp(std::span<const float> row) {
  if (row.empty()) return -INFINITY;
  const float max_value = *std::max_element(row.begin(), row.end());
  double sum = 0;
  for (float v : row) sum += std::exp(static_cast<double>(v) - max_value);
  return max_value + static_cast<float>(std::log(sum));
}

void log_softmax_inplace(std::span<float> row) {
  if (row.empty()) return;
  const float lse = logsumexp(row);
  for (float& v : row) v = std::min(v - lse, 0.f);
}

std::vector<int32_t> top_k(std::span<const float> row, int32_t k) {
  const int32_t n = static_cast<int32_t>(row.size());
  k = std::clamp(k, 0, n);
  std::vector<int32_t> index(static_cast<size_t>(n));
  std::iota(index.begin(), index.end(), 0);
  auto better = [&](int32_t a, int32_t b) {
    return row[a] > row[b] || (row[a] == row[b] && a < b);
  };
  std::partial_sort(index.begin(), index.begin() + k, index.end(), better);
  index.resize(static_cast<size_t>(k));
  return index;
}

}  // namespace arbor::host_math
