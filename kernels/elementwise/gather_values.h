// A few 4-byte values gathered at flat indices of a device tensor (token ids a drafter left on
// the device, the logits of the tokens a step emitted for their logprobs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

// out[i] = src[index[i]] where index[i] >= 0 (out[i] kept elsewhere); the elements are copied
// bit for bit, so fp32 values travel as int32.
cudaError_t launch_gather_ids(const int32_t* src, const int64_t* index, int32_t* out, int64_t n,
                              cudaStream_t stream);

}  // namespace arbor::kernels
