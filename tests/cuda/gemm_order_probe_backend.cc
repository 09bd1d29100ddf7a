// gemm_order_probe's host part: the backend's batch-invariant linear (its headers are C++20,
// the probe's kernels compile as CUDA C++17).
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/core/host_tensor.h"

namespace arbor {

// y [M, O] = x [M, K] w [O, K]^T through CudaBackend::linear with batch_invariant_gemm = gemm;
// *algo: the cuBLASLt algorithm it chose (gemm 0).
std::vector<float> probe_backend_linear(int gemm, const std::vector<float>& x,
                                        const std::vector<float>& w, int M, int K, int O,
                                        std::string* algo) {
  CudaBackendOptions o;
  o.batch_invariant = true;
  o.batch_invariant_gemm = gemm;
  CudaBackend b(o);
  HostTensor wh({O, K});
  wh.data = w;
  const Tensor wt = b.upload_weight(wh);
  b.reset_scratch();
  Tensor xs = b.scratch(M, K), ys = b.scratch(M, O);
  b.upload(x.data(), xs);
  b.linear(xs, wt, Tensor{}, ys);
  std::vector<float> y(static_cast<size_t>(M) * static_cast<size_t>(O));
  b.download(ys, y.data());
  if (algo != nullptr) *algo = b.batch_invariant_gemm_algo(O, K);
  return y;
}

}  // namespace arbor
