// Chunked batch-invariant GEMM (CudaBackendOptions::batch_invariant_gemm = 2):
// out[N, O] = x[N, K] @ w[O, K]^T, bf16 inputs, fp32 accumulation and output.
//
// Every output element is the same fixed sequence of operations whatever N is: K is cut into
// chunks of kChunkedGemmChunk (the last one may be shorter); inside a chunk an fp32 accumulator
// starts at 0 and takes one m16n8k16 MMA per 16 k, in ascending k, with the weights as the A
// operand; the chunk sums are added to a zero total in chunk order. Two kernels compute that
// sequence, both running the chunks of a weight tile in parallel on the 8 warps of a CTA
// (weights streamed from global memory with 16-byte loads straight into MMA fragments, the
// chunk sums added in order through shared memory), so even one token keeps every SM
// streaming: for N <= kChunkedGemmSmallRows a CTA owns 16 weight rows and keeps every chunk
// sum; for larger N it owns 32 weight rows x 32 or 64 tokens (each activation load serves two
// row tiles) and adds the chunk sums round by round (8 chunks a round) into per-thread totals.
// Both give bitwise the same rows
// (tests/cuda/cuda_batch_invariance_test.cc). K must be a multiple of 32 and x / w 16-byte
// aligned (chunked_gemm_supported).
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
};

bool chunked_gemm_supported(const ChunkedGemmParams& p);
cudaError_t launch_chunked_gemm(const ChunkedGemmParams& p, cudaStream_t stream);

namespace detail {
// The wgmma path (sm_90a, K % 64 == 0): 64 weight rows x 128 tokens per CTA, same bits.
bool chunked_gemm_wgmma_supported(const ChunkedGemmParams& p);
cudaError_t launch_chunked_gemm_wgmma(const ChunkedGemmParams& p, cudaStream_t stream);
}  // namespace detail

}  // namespace arbor::kernels
