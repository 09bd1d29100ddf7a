// Unpacks a fused projection's fp32 output [N, w0 + w1 (+ w2)] into separate row-major tensors
// (q | k | v, gate | up).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

struct SplitColsParams {
  const float* x = nullptr;  // [rows, sum of widths]
  float* out[3] = {nullptr, nullptr, nullptr};
  int64_t width[3] = {0, 0, 0};  // 0 for unused outputs
  int64_t rows = 0;
};
cudaError_t launch_split_cols(const SplitColsParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
