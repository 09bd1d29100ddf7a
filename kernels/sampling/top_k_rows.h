// The k best entries of each fp32 row with their log-softmax values, on the device (the EAGLE
// draft's tree expansion reads only these, so [rows, vocab] logits stay on the GPU).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace arbor::kernels {

// Per row: lse = max + log(sum exp(x - max)) (the sum in double), v_i = min(x_i - lse, 0) in
// fp32 (host_math::log_softmax_inplace), then the k largest v, best first, the lower index
// first among equal values (host_math::top_k). k <= 16, rows up to 131072 wide and a workspace:
// 8 blocks per row that pick by raw logit (float exponentials summed in double), which differs
// from the above only where two different logits round to the same v (the larger logit comes
// first, and is the one kept at the k-th place); otherwise one block per row, k selection
// passes. NaN logits give unspecified picks.
struct TopKRowsParams {
  const float* x = nullptr;  // [rows, cols] device
  int32_t* ids = nullptr;    // [rows, k] device
  float* values = nullptr;   // [rows, k] device
  int64_t rows = 0;
  int64_t cols = 0;  // < 2^31
  int32_t k = 0;     // 1 .. min(cols, 1024)
  // top_k_workspace_bytes(rows) of device memory, all zero before its first launch (every
  // launch leaves it so); nullptr: the one-block-per-row kernel. Launches sharing a workspace
  // must be ordered (one stream).
  void* workspace = nullptr;
};
size_t top_k_workspace_bytes(int64_t rows);
cudaError_t launch_top_k_log_softmax(const TopKRowsParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
