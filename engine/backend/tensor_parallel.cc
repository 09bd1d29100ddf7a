// Tensor parallelism at the backend layer: weight shards and the default collectives (a backend
// without a group). The groups themselves: make_cpu_tp_backends (cpu/), make_cuda_tp_backends
// (cuda/, NCCL).
#include <algorithm>
#include <cstring>
#include <string>

#include "engine/backend/backend.h"
#include "engine/core/error.h"

namespace arbor {

namespace {

[[noreturn]] void bad_shard(const std::vector<int64_t>& full, const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument,
              "weight shard of a " + shape_str(full) + " weight: " + what);
}

}  // namespace

std::vector<int64_t> weight_shard_shape(const std::vector<int64_t>& full, const WeightShard& s) {
  if (full.empty() || full.size() > 2) bad_shard(full, "only vectors and matrices are sharded");
  if (s.col_count >= 0) {
    if (full.size() != 2 || s.col_begin < 0 || s.col_begin + s.col_count > full[1] ||
        !s.row_ranges.empty() || s.pad_rows != 0)
      bad_shard(full, "columns [" + std::to_string(s.col_begin) + ", " +
                          std::to_string(s.col_begin + s.col_count) + ")");
    return {full[0], s.col_count};
  }
  int64_t rows = s.pad_rows;
  for (const auto& [begin, count] : s.row_ranges) {
    if (begin < 0 || count < 0 || begin + count > full[0])
      bad_shard(full,
                "rows [" + std::to_string(begin) + ", " + std::to_string(begin + count) + ")");
    rows += count;
  }
  if (s.pad_rows < 0) bad_shard(full, "negative padding");
  if (full.size() == 1) return {rows};
  return {rows, full[1]};
}

HostTensor slice_weight(const HostTensor& full, const WeightShard& s) {
  HostTensor out;
  out.shape = weight_shard_shape(full.shape, s);
  if (full.data.empty()) return out;  // shape-only: the backend fills it
  const int64_t cols = full.shape.size() == 2 ? full.shape[1] : 1;
  out.data.resize(static_cast<size_t>(HostTensor::numel_of(out.shape)), 0.0f);
  float* dst = out.data.data();
  if (s.col_count >= 0) {
    for (int64_t r = 0; r < full.shape[0]; ++r)
      std::memcpy(dst + r * s.col_count, full.data.data() + r * cols + s.col_begin,
                  sizeof(float) * static_cast<size_t>(s.col_count));
    return out;
  }
  for (const auto& [begin, count] : s.row_ranges) {
    std::memcpy(dst, full.data.data() + begin * cols, sizeof(float) * count * cols);
    dst += count * cols;
  }
  return out;  // padding rows stay zero
}

Tensor Backend::upload_weight_shard(const HostTensor& full, const WeightShard& shard) {
  return upload_weight(slice_weight(full, shard));
}

void Backend::embedding_shard(const Tensor&, int64_t, const Tensor&) {
  throw_error(ErrorCode::kUnsupported, name() + " backend: no vocabulary-sharded embedding");
}

void Backend::all_reduce_sum(const Tensor&) {
  if (tp_size() != 1)
    throw_error(ErrorCode::kUnsupported, name() + " backend: no all-reduce in its group");
}

void Backend::all_gather_cols(const Tensor& local, const Tensor& out) {
  if (tp_size() != 1 || local.rows != out.rows || local.cols != out.cols)
    throw_error(ErrorCode::kUnsupported, name() + " backend: no all-gather in its group");
  split_cols(local, {out});
}

}  // namespace arbor
