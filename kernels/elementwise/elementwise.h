// Elementwise and row-gather kernels of the Llama forward: residual add, SwiGLU, dtype
// conversion, bias add, and row gathers (embedding lookup, logits rows). Tensors are
// contiguous; element types are given per tensor, math is fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/kernel_types.h"

namespace arbor::kernels {

// out[i] = a[i] + b[i]; out may alias a or b.
struct AddParams {
  const void* a = nullptr;
  const void* b = nullptr;
  void* out = nullptr;
  ElemType a_type = ElemType::kF32, b_type = ElemType::kF32, out_type = ElemType::kF32;
  int64_t n = 0;
};
cudaError_t launch_add(const AddParams& p, cudaStream_t stream);

// out[i] = silu(gate[i]) * up[i] = gate / (1 + exp(-gate)) * up; out may alias gate or up.
struct SiluMulParams {
  const void* gate = nullptr;
  const void* up = nullptr;
  void* out = nullptr;
  ElemType gate_type = ElemType::kF32, up_type = ElemType::kF32, out_type = ElemType::kF32;
  int64_t n = 0;
  void* out_bf16 = nullptr;  // optional bf16 copy of out (the next linear's GEMM input)
  // Optional strided inputs (a fused gate | up projection's output not split first): element i
  // of gate / up is at (i / cols) * in_stride + i % cols; in_stride 0: contiguous. gate_copy /
  // up_copy (fp32, contiguous, optional) receive the inputs unchanged, as a split would.
  int64_t in_stride = 0;
  int64_t cols = 0;
  float* gate_copy = nullptr;
  float* up_copy = nullptr;
};
cudaError_t launch_silu_mul(const SiluMulParams& p, cudaStream_t stream);

// dst[i] = convert(src[i])
struct ConvertParams {
  const void* src = nullptr;
  void* dst = nullptr;
  ElemType src_type = ElemType::kF32, dst_type = ElemType::kBF16;
  int64_t n = 0;
};
cudaError_t launch_convert(const ConvertParams& p, cudaStream_t stream);

// out[r, c] += bias[c]
struct AddBiasParams {
  void* out = nullptr;          // [rows, cols] out_type
  const float* bias = nullptr;  // [cols] fp32
  ElemType out_type = ElemType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
};
cudaError_t launch_add_bias(const AddBiasParams& p, cudaStream_t stream);

// dst[m, :] = src[index[m], :]; indices must lie in [0, src_rows) (checked by the caller).
struct GatherRowsParams {
  const void* src = nullptr;       // [src_rows, cols] src_type
  void* dst = nullptr;             // [num_rows, cols] dst_type
  const int32_t* index = nullptr;  // [num_rows] device
  ElemType src_type = ElemType::kF32, dst_type = ElemType::kF32;
  int64_t num_rows = 0;
  int64_t cols = 0;
  // Row index[m] - index_offset of src; with src_rows >= 0, rows outside [0, src_rows) give
  // zeros (a vocabulary shard of the embedding under tensor parallelism).
  int64_t index_offset = 0;
  int64_t src_rows = -1;
};
cudaError_t launch_gather_rows(const GatherRowsParams& p, cudaStream_t stream);

// dst[i] = offset + scale * u_i with u_i uniform in [-1, 1), a hash of (seed, i): random
// weights made on the device (the benchmarks' dummy load format), reproducible per seed.
struct FillRandomParams {
  void* dst = nullptr;  // [n] dst_type
  ElemType dst_type = ElemType::kBF16;
  int64_t n = 0;
  uint64_t seed = 0;
  float scale = 1.f;
  float offset = 0.f;
  // Element i takes the value of element index_base + (i / cols) * src_stride + i % cols of the
  // random tensor (cols 0: index_base + i): a tensor-parallel shard (rows or columns of the
  // unsharded weight) gets the values the unsharded weight holds there.
  int64_t index_base = 0;
  int64_t cols = 0;
  int64_t src_stride = 0;
};
cudaError_t launch_fill_random(const FillRandomParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
