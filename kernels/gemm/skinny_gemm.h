// Skinny GEMM for decode-sized batches: out[N, O] = x[N, K] @ w[O, K]^T with N <= 8 token rows.
// At such N a linear layer is one pass over its weights, so the kernel is written for memory
// bandwidth: bf16 weights streamed once with 16-byte loads (several in flight per lane), fp32
// activations read from L1 and rounded to bf16 (the same function as the cuBLAS path of
// linear(), fp32 accumulation), a warp-shuffle reduction. Up to three weight matrices that read
// the same x (Q, K, V; gate, up) run in one launch as segments.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

constexpr int kSkinnyGemmMaxRows = 8;
constexpr int kSkinnyGemmMaxSegments = 3;

struct SkinnyGemmSegment {
  const void* w = nullptr;      // [out_features, in_features] device bf16, 16-byte aligned rows
  const float* bias = nullptr;  // [out_features] device fp32, or nullptr
  float* out = nullptr;         // [rows, out_features] device fp32
  int64_t out_features = 0;     // O of this segment
};

struct SkinnyGemmParams {
  const float* x = nullptr;  // [rows, in_features] device fp32, 16-byte aligned
  int32_t rows = 0;          // token rows N, 1..kSkinnyGemmMaxRows
  int64_t in_features = 0;   // K, a multiple of 8
  SkinnyGemmSegment seg[kSkinnyGemmMaxSegments];
  int32_t num_segments = 1;
  int32_t seg_block_begin[kSkinnyGemmMaxSegments + 1] = {};  // filled by launch_skinny_gemm
};

// True when the shape can take this kernel (rows in 1..8, K a multiple of 8, aligned pointers).
bool skinny_gemm_supported(const SkinnyGemmParams& p);
cudaError_t launch_skinny_gemm(const SkinnyGemmParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
