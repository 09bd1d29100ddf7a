// ggml tensor types as stored in GGUF files: type ids, block geometry, and fp32 dequantization
// of the storage formats (F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q2_K .. Q6_K) following
// ggml-quants.c. Q8_1 and Q8_K are activation-only formats and are not handled.
#pragma once

#include <cstdint>
#include <string>

namespace arbor {

// ggml tensor type ids as stored in GGUF (ggml.h enum ggml_type).
enum GgmlType : uint32_t {
  kGgmlF32 = 0,
  kGgmlF16 = 1,
  kGgmlQ4_0 = 2,
  kGgmlQ4_1 = 3,
  kGgmlQ5_0 = 6,
  kGgmlQ5_1 = 7,
  kGgmlQ8_0 = 8,
  kGgmlQ8_1 = 9,
  kGgmlQ2_K = 10,
  kGgmlQ3_K = 11,
  kGgmlQ4_K = 12,
  kGgmlQ5_K = 13,
  kGgmlQ6_K = 14,
  kGgmlQ8_K = 15,
  kGgmlI8 = 24,
  kGgmlI16 = 25,
  kGgmlI32 = 26,
  kGgmlI64 = 27,
  kGgmlF64 = 28,
  kGgmlBF16 = 30,
};

// Name of a ggml type ("Q4_1"), or "type<N>" for ids this code does not know.
std::string ggml_type_name(uint32_t ggml_type);

// True for the types ggml_dequantize handles.
bool ggml_can_dequantize(uint32_t ggml_type);

// Dequantizes `count` consecutive elements of `ggml_type` stored at `src` into `dst`.
// `count` must be a multiple of the type's block size. Throws kUnsupported for other types.
void ggml_dequantize(uint32_t ggml_type, const uint8_t* src, int64_t count, float* dst);

// Block size in elements and bytes per block of a ggml type (known also for the integer and F64
// types, which cannot be dequantized); false for unknown ids and Q8_1/Q8_K.
bool ggml_type_block(uint32_t ggml_type, int64_t* block_elems, int64_t* block_bytes);

}  // namespace arbor
