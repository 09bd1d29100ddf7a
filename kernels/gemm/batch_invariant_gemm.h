// Batch-invariant GEMM: out[N, O] = x[N, K] @ w[O, K]^T (bf16 inputs, fp32 accumulate and
// output) where every output element is one fixed chain of m16n8k16 MMAs over K in order, so a
// token row's result does not depend on N or on which other rows share the launch (no split-K,
// one tile shape for every N). The backend's second batch-invariant linear (the first is
// cuBLASLt with one fixed algorithm per (O, K)); simple register-fragment loads, not tuned.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

struct BatchInvariantGemmParams {
  const void* x = nullptr;   // [rows, in_features] device bf16, 4-byte aligned
  const void* w = nullptr;   // [out_features, in_features] device bf16, 4-byte aligned
  float* out = nullptr;      // [rows, out_features] device fp32
  int64_t rows = 0;          // N
  int64_t in_features = 0;   // K, even
  int64_t out_features = 0;  // O
};

cudaError_t launch_batch_invariant_gemm(const BatchInvariantGemmParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
