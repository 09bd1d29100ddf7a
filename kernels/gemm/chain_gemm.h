// Chain GEMM: out[N, O] = x[N, K] @ w[O, K]^T for 1..16 token rows, bf16 inputs, fp32
// accumulation and output, with every output element summed exactly as the backend's
// invariant cuBLASLt algorithm sums it: one fp32 accumulator starting at 0, one m16n8k16 MMA
// per 16 consecutive k, in ascending k (tests/cuda/gemm_order_probe.cu shows that this is the
// cuBLASLt order; inside a step the slot order does not matter). So it can take the decode-size
// launches of a cuBLASLt-backed linear without changing a bit, and the backend checks that
// bitwise per shape before it does (CudaBackend::State::lt_algo).
//
// Why: a warp owns 8 weight rows (the MMA's n) and all (<= 16) tokens (its m), so even one token
// row gives O / 8 independent chains (512 for a 4096-row matrix, about one per SM scheduler);
// a CTA of 4 warps streams its 32 rows' weights and the tokens through a 4-stage cp.async ring
// in shared memory; a dependent m16n8k16 step takes ~24 cycles on the H100, less than its
// weights take to arrive. Its weights are requested before the programmatic-launch wait, so in
// a decode step they stream while the previous kernel ends: batch-1 decode 155-158 -> 161
// tok/s (H100; docs/kernel_notes.md "Chain GEMM"); alone it is about as fast as cuBLASLt.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

constexpr int kChainGemmMaxRows = 16;

struct ChainGemmParams {
  const void* x = nullptr;   // [rows, in_features] device bf16, 16-byte aligned
  const void* w = nullptr;   // [out_features, in_features] device bf16, 16-byte aligned
  float* out = nullptr;      // [rows, out_features] device fp32
  int64_t rows = 0;          // N, 1..kChainGemmMaxRows
  int64_t in_features = 0;   // K, a multiple of 16
  int64_t out_features = 0;  // O
  // Tilings <warps><stages><stage k> (e.g. 44128; A/B runs, CudaBackendOptions) for matrices of
  // at most 8192 rows: small_tiling where in_features <= 4096, deep_tiling above (the down
  // projection). 0: the measured default (44256 for both).
  int small_tiling = 0;
  int deep_tiling = 0;
};

bool chain_gemm_supported(const ChainGemmParams& p);
cudaError_t launch_chain_gemm(const ChainGemmParams& p, cudaStream_t stream);

namespace detail {
// A given tiling (benchmarks): warps per CTA (8 weight rows each), ring stages, k per stage;
// cudaErrorInvalidValue for one that is not instantiated.
cudaError_t launch_chain_gemm_config(const ChainGemmParams& p, int warps, int stages, int stage_k,
                                     cudaStream_t stream);
}  // namespace detail

}  // namespace arbor::kernels
