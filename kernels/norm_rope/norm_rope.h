// RMSNorm and RoPE at explicit positions (DESIGN.md "The Backend contract"). Plain launch
// functions over POD params; activations may be fp32, bf16 or fp16, math is fp32.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/kernel_types.h"

namespace arbor::kernels {

// out[r, c] = x[r, c] * rsqrt(mean_c(x[r, :]^2) + eps) * weight[c]
struct RmsNormParams {
  const void* x = nullptr;        // [rows, cols] x_type
  const float* weight = nullptr;  // [cols] fp32
  void* out = nullptr;            // [rows, cols] out_type (may alias x)
  // Optional [rows, cols] bf16 copy of an fp32 `out` (round to nearest): the next linear's
  // GEMM input, so it needs no conversion launch of its own.
  void* out_bf16 = nullptr;
  ElemType x_type = ElemType::kF32;
  ElemType out_type = ElemType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 1e-5f;
};
cudaError_t launch_rms_norm(const RmsNormParams& p, cudaStream_t stream);

// Residual add fused with the RMSNorm that reads its result (one launch instead of two, same
// arithmetic as launch_add then launch_rms_norm, all fp32): sum = a + b; out = rmsnorm(sum).
struct AddRmsNormParams {
  const float* a = nullptr;       // [rows, cols] (may alias sum)
  const float* b = nullptr;       // [rows, cols] (may alias sum)
  float* sum = nullptr;           // [rows, cols] the residual stream after the add
  const float* weight = nullptr;  // [cols]
  float* out = nullptr;           // [rows, cols] (may alias sum)
  void* out_bf16 = nullptr;       // optional [rows, cols] bf16 copy of out (RmsNormParams)
  int64_t rows = 0;
  int64_t cols = 0;
  float eps = 1e-5f;
};
cudaError_t launch_add_rms_norm(const AddRmsNormParams& p, cudaStream_t stream);

// In place, rotate-halves (Hugging Face) RoPE: for every token n, head h and i < head_dim / 2,
// angle = float(positions[n]) * inv_freq[i] (fp32, as transformers computes it) and
// (x[i], x[i + half]) <- (x[i] cos - x[i + half] sin, x[i + half] cos + x[i] sin).
struct RopeParams {
  float* q = nullptr;  // [num_tokens, num_q_heads * head_dim] fp32
  float* k = nullptr;  // [num_tokens, num_k_heads * head_dim] fp32
  // Optional strided inputs (a fused q | k | v projection's output not split first): q and k
  // are read from q_in / k_in (rows in_stride floats apart) and the rotated values written to
  // q / k; v_in is copied to v_out unchanged. nullptr: q and k rotate in place.
  const float* q_in = nullptr;
  const float* k_in = nullptr;
  const float* v_in = nullptr;
  float* v_out = nullptr;
  int64_t in_stride = 0;
  const int32_t* positions = nullptr;  // [num_tokens]
  const float* inv_freq = nullptr;     // [head_dim / 2] (llama3 / linear scaling applied)
  int32_t num_tokens = 0;
  int32_t num_q_heads = 0;
  int32_t num_k_heads = 0;
  int32_t head_dim = 0;
  // Optional, fused KV write (launch_write_kv's semantics, one launch instead of two): the
  // rotated K and V go to their cache slots in the same pass. k_plane == nullptr: no write.
  const void* v = nullptr;         // [num_tokens, num_k_heads * head_dim] v_type
  int64_t v_stride = 0;            // floats between v's rows (0: num_k_heads * head_dim)
  void* k_plane = nullptr;         // [num_slots, num_k_heads * head_dim] cache_type
  void* v_plane = nullptr;         // [num_slots, num_k_heads * head_dim] cache_type
  const int64_t* slots = nullptr;  // [num_tokens] device, validated by the caller
  ElemType v_type = ElemType::kF32;
  ElemType cache_type = ElemType::kBF16;
};
cudaError_t launch_rope(const RopeParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
