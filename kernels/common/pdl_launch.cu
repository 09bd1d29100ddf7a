// pdl_enabled(): the device's compute capability and the ARBOR_PDL switch, read once.
#include <cstdlib>

#include "kernels/common/pdl_launch.cuh"

namespace arbor::kernels {

bool pdl_enabled() {
  static const bool enabled = [] {
    const char* env = std::getenv("ARBOR_PDL");
    if (env != nullptr && std::atoi(env) == 0) return false;
    int device = 0, major = 0;
    if (cudaGetDevice(&device) != cudaSuccess ||
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      return false;
    return major >= 9;
  }();
  return enabled;
}

}  // namespace arbor::kernels
