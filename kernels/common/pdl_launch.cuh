// Kernel launches as programmatic dependents (PDL, sm_90+): a kernel launched this way may be
// scheduled while the kernel before it in the stream still runs; every one of its threads
// calls grid_dependency_wait() (device_utils.cuh; pdl_wait_then_trigger() below) before its
// first access to memory the kernels before may touch, and before exiting, so results and
// ordering are unchanged and only the launch gap between the two is hidden. Such kernels are
// correct with or without the attribute (the wait is then a no-op). set_pdl_allowed(false)
// turns it off.
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "kernels/common/device_utils.cuh"
#include "kernels/common/pdl.h"

namespace arbor::kernels {

template <typename... KernelArgs, typename... Args>
cudaError_t launch_pdl(void (*kernel)(KernelArgs...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t config = {};
  config.gridDim = grid;
  config.blockDim = block;
  config.dynamicSmemBytes = smem;
  config.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  config.attrs = attr;
  config.numAttrs = 1;
  const cudaError_t e = cudaLaunchKernelEx(&config, kernel, std::forward<Args>(args)...);
  return e != cudaSuccess ? e : cudaGetLastError();
}

// In a kernel: wait for the previous kernel's completion (and its memory), then let the next
// kernel be scheduled.
__device__ __forceinline__ void pdl_wait_then_trigger() {
  grid_dependency_wait();
  trigger_dependent_launch();
}

}  // namespace arbor::kernels
