#include <algorithm>
#include <cstdio>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/core/dtype.h"
#include "engine/core/error.h"

namespace arbor {

std::string format_bytes(int64_t bytes) {
  static const char* const kUnits[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while ((v >= 1024.0 || v <= -1024.0) && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  if (u == 0)
    std::snprintf(buf, sizeof buf, "%lld B", static_cast<long long>(bytes));
  else
    std::snprintf(buf, sizeof buf, "%.1f %s", v, kUnits[u]);
  return buf;
}

void check_kv_cache_shape(const KvCacheShape& shape) {
  if (shape.num_layers > 0 && shape.num_blocks > 0 && shape.block_size > 0 &&
      shape.num_kv_heads > 0 && shape.head_dim > 0)
    return;
  throw_error(
      ErrorCode::kInvalidArgument,
      "allocate_kv: every dimension must be positive (layers " + std::to_string(shape.num_layers) +
          ", blocks " + std::to_string(shape.num_blocks) + ", block_size " +
          std::to_string(shape.block_size) + ", kv heads " + std::to_string(shape.num_kv_heads) +
          ", head_dim " + std::to_string(shape.head_dim) + ")");
}

void check_kv_cache_fits(const KvCacheShape& shape, int64_t bytes, int64_t available,
                         const MemoryInfo& memory) {
  if (bytes <= available) return;
  throw_error(ErrorCode::kResourceExhausted,
              "a KV cache of " + std::to_string(shape.num_blocks) + " blocks of " +
                  std::to_string(shape.block_size) + " tokens needs " + format_bytes(bytes) +
                  ", but " + format_bytes(available) + " of " + memory.where + " memory is free (" +
                  format_bytes(memory.total_bytes) +
                  " in all); lower kv_blocks, or leave it unset (0) to size the cache from the "
                  "free memory");
}

}  // namespace arbor

namespace arbor {

Tensor Backend::persistent(int64_t, int64_t) {
  throw_error(ErrorCode::kUnsupported, name() + " backend: no persistent buffers");
}

void Backend::top_k_ids(const Tensor&, int32_t, const Tensor&) {
  throw_error(ErrorCode::kUnsupported, name() + " backend: no top_k_ids");
}

void Backend::download_ids(const Tensor&, std::span<const int64_t>, std::vector<int32_t>*) {
  throw_error(ErrorCode::kUnsupported, name() + " backend: no download_ids");
}

void Backend::gather_rows(const Tensor& src, std::span<const int32_t> rows, const Tensor& out) {
  ARBOR_CHECK(out.rows == static_cast<int64_t>(rows.size()) && out.cols == src.cols,
              "gather_rows: shapes");
  std::vector<float> host(static_cast<size_t>(src.numel())), picked;
  download(src, host.data());
  picked.reserve(static_cast<size_t>(out.numel()));
  for (int32_t r : rows) {
    ARBOR_CHECK(r >= 0 && r < src.rows, "gather_rows: row " + std::to_string(r));
    picked.insert(picked.end(), host.begin() + static_cast<int64_t>(r) * src.cols,
                  host.begin() + static_cast<int64_t>(r + 1) * src.cols);
  }
  upload(picked.data(), out);
}

void Backend::copy_cols(const Tensor& x, const Tensor& out, int64_t first_col) {
  check_copy_cols(x, out, first_col);
  std::vector<float> src(static_cast<size_t>(x.numel())), dst(static_cast<size_t>(out.numel()));
  download(x, src.data());
  download(out, dst.data());
  for (int64_t r = 0; r < x.rows; ++r)
    std::copy_n(src.begin() + r * x.cols, x.cols, dst.begin() + r * out.cols + first_col);
  upload(dst.data(), out);
}

void check_copy_cols(const Tensor& x, const Tensor& out, int64_t first_col) {
  if (x.dtype != DType::kF32 || out.dtype != DType::kF32 || x.rows != out.rows || first_col < 0 ||
      first_col + x.cols > out.cols)
    throw_error(ErrorCode::kInvalidArgument,
                "copy_cols: x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) + "] " +
                    dtype_name(x.dtype) + " into columns from " + std::to_string(first_col) +
                    " of [" + std::to_string(out.rows) + ", " + std::to_string(out.cols) + "] " +
                    dtype_name(out.dtype));
}

namespace {

[[noreturn]] void no_draft_frontier(const Backend& b, const char* op) {
  throw_error(ErrorCode::kUnsupported,
              b.name() + " backend: " + op + " (no draft trees grown on the backend)");
}

}  // namespace

void Backend::set_draft_vocab_map(std::span<const int64_t>) {
  no_draft_frontier(*this, "set_draft_vocab_map");
}
void Backend::draft_frontier_roots(const Tensor&, int32_t) {
  no_draft_frontier(*this, "draft_frontier_roots");
}
void Backend::draft_frontier_begin(int32_t, int32_t, int32_t, std::span<const int32_t>,
                                   std::span<const float>, std::span<const int32_t>,
                                   std::span<const int32_t>, std::span<const int64_t>,
                                   std::span<const int32_t>) {
  no_draft_frontier(*this, "draft_frontier_begin");
}
void Backend::draft_frontier_load(int32_t, const Tensor&, const Tensor&) {
  no_draft_frontier(*this, "draft_frontier_load");
}
void Backend::draft_frontier_shift(const Tensor&, std::span<const int32_t>,
                                   std::span<const int32_t>, const Tensor&, const Tensor&) {
  no_draft_frontier(*this, "draft_frontier_shift");
}
void Backend::draft_frontier_expand(int32_t, const Tensor&) {
  no_draft_frontier(*this, "draft_frontier_expand");
}
void Backend::draft_frontier_log(int32_t, std::vector<int32_t>*, std::vector<float>*,
                                 std::vector<int32_t>*, std::vector<float>*) {
  no_draft_frontier(*this, "draft_frontier_log");
}

Tensor Backend::draft_frontier_trees(std::span<const int32_t>, std::span<const int32_t>, int32_t) {
  no_draft_frontier(*this, "draft_frontier_trees");
  return {};
}

}  // namespace arbor
