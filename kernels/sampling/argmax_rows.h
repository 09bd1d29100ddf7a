// Row-wise argmax of fp32 logits on the device (greedy decoding without downloading the
// logits): the host then copies back one int32 per row instead of a vocabulary-wide row.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

// out[m] = index of the largest value of row m, the lowest index among equal values (exactly
// std::max_element, as engine/sampling's argmax()); -1 where that argmax rejects the row: a NaN
// or +inf in it, or every value -inf. One block per row.
struct ArgmaxRowsParams {
  const float* logits = nullptr;  // [num_rows, cols] device, fp32, row-major
  int32_t* out = nullptr;         // [num_rows] device
  int64_t num_rows = 0;
  int64_t cols = 0;  // < 2^31
};
cudaError_t launch_argmax_rows(const ArgmaxRowsParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
