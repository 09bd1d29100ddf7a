// Chunked batch-invariant GEMM (CudaBackendOptions::batch_invariant_gemm = 2):
// out[N, O] = x[N, K] @ w[O, K]^T, bf16 inputs, fp32 accumulation and output.
//
// Every output element is the same fixed sequence of operations whatever N is: K is cut into
// chunks of kChunkedGemmChunk (the last one may be shorter); inside a chunk an fp32 accumulator
// starts at 0 and takes one m16n8k16 MMA per 16 k, in ascending k, with the weights as the A
// operand; the chunk sums are added to a zero total in chunk order. Three kernels compute that
// sequence, bitwise alike (tests/cuda/cuda_batch_invariance_test.cc; why they can:
// tests/cuda/gemm_order_probe.cu):
//   * N <= kChunkedGemmSmallRows: a CTA owns 16 weight rows; its 5-8 warps run the chunks in
//     parallel (weights streamed with 16-byte loads straight into MMA fragments) and keep every
//     chunk sum in shared memory, so even one token keeps every SM streaming;
//   * more rows, narrow outputs: 32 weight rows x 32 or 64 tokens per CTA, chunks in rounds of
//     8 warps, per-thread running totals;
//   * more rows on sm_90a (detail::launch_chunked_gemm_wgmma, K % 64 == 0): one warpgroup per
//     64 weight rows x 128 tokens, wgmma over cp.async-staged tiles.
// K must be a multiple of 32 and x / w 16-byte aligned (chunked_gemm_supported).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

constexpr int kChunkedGemmChunk = 512;
constexpr int kChunkedGemmSmallRows = 16;

struct ChunkedGemmParams {
  const void* x = nullptr;   // [rows, in_features] device bf16
  const void* w = nullptr;   // [out_features, in_features] device bf16
  float* out = nullptr;      // [rows, out_features] device fp32
  int64_t rows = 0;          // N
  int64_t in_features = 0;   // K, a multiple of 32
  int64_t out_features = 0;  // O
  // The wgmma kernel (Hopper) above 16 rows: 2 where it measured faster (default), 0 never,
  // 1 for every shape it supports (benchmarks; the results are the same bits).
  int wgmma_mode = 2;
};

bool chunked_gemm_supported(const ChunkedGemmParams& p);
cudaError_t launch_chunked_gemm(const ChunkedGemmParams& p, cudaStream_t stream);

namespace detail {
// The wgmma path (sm_90a, K % 64 == 0): 64 weight rows x 128 tokens per CTA, same bits.
bool chunked_gemm_wgmma_supported(const ChunkedGemmParams& p);
cudaError_t launch_chunked_gemm_wgmma(const ChunkedGemmParams& p, cudaStream_t stream);
}  // namespace detail

}  // namespace arbor::kernels
