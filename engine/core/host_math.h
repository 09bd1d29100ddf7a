// Host fp32 math shared by the proposers: row-batched linear layers through BLAS, SiLU, RMSNorm,
// log-softmax and top-k selection. Kept as a few free functions so that a device path can
// replace them without touching the proposers' logic.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace arbor::host_math {

// out[n, out_features] = x[n, in_features] @ w[out_features, in_features]^T (+ bias[out_features]
// when bias is non-null).
void linear(const float* x, int64_t n, int64_t in_features, const float* w, int64_t out_features,
            const float* bias, float* out);

// x = x * sigmoid(x), elementwise over count values.
void silu_inplace(float* x, int64_t count);

// log(sum(exp(row))), computed in double for the sum (-inf for an empty row).
float logsumexp(std::span<const float> row);
// row = row - logsumexp(row) (every entry <= 0 afterwards).
void log_softmax_inplace(std::span<float> row);

// Indices of the k largest entries, largest first; equal values keep the lower index first.
// k is clamped to row.size().
std::vector<int32_t> top_k(std::span<const float> row, int32_t k);

}  // namespace arbor::host_math
