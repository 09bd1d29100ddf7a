// The k best entries of each fp32 row with their log-softmax values, on the device (the EAGLE
// draft's tree expansion reads only these, so [rows, vocab] logits stay on the GPU).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

// Per row: lse = max + log(sum exp(x - max)) (the sum in double), v_i = min(x_i - lse, 0) in
// fp32 (spec_math::log_softmax_inplace), then the k largest v, best first, the lower index
// first among equal values (spec_math::top_k). k <= 16: a cluster of 8 blocks per row (float
// exponentials summed in double, per-thread candidate lists); larger k: one block per row, k
// selection passes.
struct TopKRowsParams {
  const float* x = nullptr;  // [rows, cols] device
  int32_t* ids = nullptr;    // [rows, k] device
  float* values = nullptr;   // [rows, k] device
  int64_t rows = 0;
  int64_t cols = 0;  // < 2^31
  int32_t k = 0;     // 1 .. min(cols, 1024)
};
cudaError_t launch_top_k_log_softmax(const TopKRowsParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
