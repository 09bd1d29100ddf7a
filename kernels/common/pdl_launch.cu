// pdl_enabled(): the caller's switch, the device's compute capability and a probe of this
// build's device code (determined once).
#include <atomic>

#include "kernels/common/pdl_launch.cuh"

namespace arbor::kernels {

namespace {

// 1 where this build's device code has the griddepcontrol instructions (compiled for sm_90 or
// later): a build whose kernels run from sm_80 PTX on a Hopper GPU has the waits compiled out
// and must not launch with the attribute.
__global__ void pdl_probe_kernel(int* out) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  *out = 1;
#else
  *out = 0;
#endif
}

std::atomic<bool> g_allowed{true};

}  // namespace

void set_pdl_allowed(bool allowed) {
  g_allowed.store(allowed, std::memory_order_relaxed);
}

bool pdl_enabled() {
  static const bool supported = [] {
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess ||
        major < 9)
      return false;
    int* flag = nullptr;
    if (cudaMalloc(&flag, sizeof(int)) != cudaSuccess) return false;
    int host = 0;
    pdl_probe_kernel<<<1, 1>>>(flag);
    const bool ok = cudaGetLastError() == cudaSuccess &&
                    cudaMemcpy(&host, flag, sizeof(int), cudaMemcpyDeviceToHost) == cudaSuccess;
    cudaFree(flag);
    return ok && host == 1;
  }();
  return supported && g_allowed.load(std::memory_order_relaxed);
}

}  // namespace arbor::kernels
