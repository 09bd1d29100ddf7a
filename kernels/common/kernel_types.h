// Element types shared by the kernels' POD parameter structs. Plain C++ (no CUDA headers), so
// host code that fills the structs needs nothing from the CUDA toolkit to describe a launch.
#pragma once

#include <cstdint>

namespace arbor::kernels {

// Element type of a tensor a kernel reads or writes.
enum class ElemType : int32_t { kF32 = 0, kBF16 = 1, kF16 = 2 };

inline const char* elem_type_name(ElemType t) {
  switch (t) {
    case ElemType::kF32:
      return "f32";
    case ElemType::kBF16:
      return "bf16";
    case ElemType::kF16:
      return "f16";
  }
  return "?";
}

inline int elem_size(ElemType t) {
  return t == ElemType::kF32 ? 4 : 2;
}

}  // namespace arbor::kernels
