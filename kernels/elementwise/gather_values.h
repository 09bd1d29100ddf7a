// out[i] = x[index[i]] for flat indices into an fp32 device tensor (a few values read back,
// e.g. the logits of the tokens a step emitted, for their logprobs).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

cudaError_t launch_gather_values(const float* x, const int64_t* index, float* out, int64_t n,
                                 cudaStream_t stream);

// out[i] = src[index[i]] where index[i] >= 0 (out[i] kept elsewhere): token ids left on the
// device by a drafter, copied into a step's metadata or a sampling batch.
cudaError_t launch_gather_ids(const int32_t* src, const int64_t* index, int32_t* out, int64_t n,
                              cudaStream_t stream);

}  // namespace arbor::kernels
