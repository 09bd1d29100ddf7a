// A non-owning 2-D view of backend memory (backend.h, tree_sampling.h).
#pragma once

#include <cstdint>

#include "engine/core/dtype.h"

namespace arbor {

// [rows, cols] row-major. Activations are [num_tokens, features]; weights are [out_features,
// in_features].
struct Tensor {
  void* data = nullptr;
  DType dtype = DType::kF32;
  int64_t rows = 0;
  int64_t cols = 0;
  int64_t numel() const { return rows * cols; }
};

}  // namespace arbor
