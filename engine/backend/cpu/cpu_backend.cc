#include "engine/backend/cpu/cpu_backend.h"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>

#include "engine/core/error.h"
#include "engine/core/host_math.h"

namespace arbor {

namespace {

float* f32(const Tensor& t) {
  ARBOR_CHECK(t.dtype == DType::kF32, "cpu backend computes in f32");
  return static_cast<float*>(t.data);
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  ARBOR_CHECK(a.rows == b.rows && a.cols == b.cols,
              std::string(op) + ": shape mismatch [" + std::to_string(a.rows) + ", " +
                  std::to_string(a.cols) + "] vs [" + std::to_string(b.rows) + ", " +
                  std::to_string(b.cols) + "]");
}

}  // namespace

std::unique_ptr<Backend> make_cpu_backend(int num_threads) {
  return std::make_unique<CpuBackend>(num_threads);
}

CpuBackend::CpuBackend(int num_threads) {
  if (num_threads > 0) openblas_set_num_threads(num_threads);
}

CpuBackend::CpuBackend(int num_threads, std::shared_ptr<HostCollective> collective, int rank)
    : CpuBackend(num_threads) {
  collective_ = std::move(collective);
  rank_ = rank;
}

std::vector<std::unique_ptr<Backend>> make_cpu_tp_backends(int size, int num_threads) {
  if (size < 1)
    throw_error(ErrorCode::kInvalidArgument,
                "tensor parallel size " + std::to_string(size) + " (expected >= 1)");
  auto collective = std::make_shared<HostCollective>(size);
  std::vector<std::unique_ptr<Backend>> ranks;
  for (int r = 0; r < size; ++r)
    ranks.push_back(std::make_unique<CpuBackend>(num_threads, collective, r));
  return ranks;
}

HostCollective::HostCollective(int size)
    : size_(size), buffers_(static_cast<size_t>(size), nullptr) {}

void HostCollective::arrive() {
  std::unique_lock<std::mutex> lock(mu_);
  const uint64_t gen = generation_;
  if (++waiting_ == size_) {
    waiting_ = 0;
    ++generation_;
    cv_.notify_all();
    return;
  }
  cv_.wait(lock, [&] { return generation_ != gen; });
}

void HostCollective::all_reduce_sum(int rank, float* data, int64_t n) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_[static_cast<size_t>(rank)] = data;
  }
  arrive();  // every rank's buffer is in place
  std::vector<float> sum(static_cast<size_t>(n), 0.0f);
  for (int r = 0; r < size_; ++r) {
    const float* src = buffers_[static_cast<size_t>(r)];
    for (int64_t i = 0; i < n; ++i) sum[static_cast<size_t>(i)] += src[i];
  }
  arrive();  // every rank has read every buffer
  std::memcpy(data, sum.data(), sizeof(float) * static_cast<size_t>(n));
}

void HostCollective::all_gather_cols(int rank, const float* local, int64_t rows, int64_t cols,
                                     float* out, int64_t out_cols) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_[static_cast<size_t>(rank)] = local;
  }
  arrive();
  for (int r = 0; r < size_; ++r) {
    const int64_t c0 = r * cols, width = std::min(cols, out_cols - c0);
    if (width <= 0) break;
    for (int64_t i = 0; i < rows; ++i)
      std::memcpy(out + i * out_cols + c0, buffers_[static_cast<size_t>(r)] + i * cols,
                  sizeof(float) * static_cast<size_t>(width));
  }
  arrive();
}

void CpuBackend::embedding_shard(const Tensor& table, int64_t first_id, const Tensor& out) {
  const float* tab = f32(table);
  float* o = f32(out);
  ARBOR_CHECK(out.rows == step_.num_tokens() && out.cols == table.cols);
  for (int64_t n = 0; n < out.rows; ++n) {
    const int64_t row = step_.token_ids[n] - first_id;
    if (row < 0 || row >= table.rows)
      std::memset(o + n * out.cols, 0, sizeof(float) * out.cols);
    else
      std::memcpy(o + n * out.cols, tab + row * table.cols, sizeof(float) * out.cols);
  }
}

void CpuBackend::all_reduce_sum(const Tensor& x) {
  if (collective_ && collective_->size() > 1) collective_->all_reduce_sum(rank_, f32(x), x.numel());
}

void CpuBackend::all_gather_cols(const Tensor& local, const Tensor& out) {
  ARBOR_CHECK(local.rows == out.rows && local.cols * tp_size() >= out.cols,
              "all_gather_cols: shapes");
  if (!collective_ || collective_->size() == 1) return Backend::all_gather_cols(local, out);
  collective_->all_gather_cols(rank_, f32(local), local.rows, local.cols, f32(out), out.cols);
}

Tensor CpuBackend::upload_weight(const HostTensor& w) {
  weights_.emplace_back(w.data);
  Tensor t;
  t.data = weights_.back().data();
  t.rows = w.shape.empty() ? 0 : w.shape[0];
  t.cols = w.shape.size() >= 2 ? w.numel() / std::max<int64_t>(t.rows, 1) : 1;
  if (w.shape.size() == 1) {  // vectors are [1, n]
    t.rows = 1;
    t.cols = w.shape[0];
  }
  return t;
}

Tensor CpuBackend::persistent(int64_t rows, int64_t cols) {
  weights_.emplace_back(static_cast<size_t>(rows * cols), 0.0f);
  return Tensor{weights_.back().data(), DType::kF32, rows, cols};
}

void CpuBackend::gather_rows(const Tensor& src, std::span<const int32_t> rows, const Tensor& out) {
  ARBOR_CHECK(out.rows == static_cast<int64_t>(rows.size()) && out.cols == src.cols,
              "gather_rows: shapes");
  for (size_t i = 0; i < rows.size(); ++i) {
    ARBOR_CHECK(rows[i] >= 0 && rows[i] < src.rows, "gather_rows: row " + std::to_string(rows[i]));
    std::memcpy(f32(out) + static_cast<int64_t>(i) * out.cols,
                f32(src) + static_cast<int64_t>(rows[i]) * src.cols, sizeof(float) * out.cols);
  }
}

Tensor CpuBackend::scratch(int64_t rows, int64_t cols) {
  scratch_.emplace_back(static_cast<size_t>(rows * cols));
  return Tensor{scratch_.back().data(), DType::kF32, rows, cols};
}

void CpuBackend::reset_scratch() {
  scratch_.clear();
}

void CpuBackend::download(const Tensor& src, float* dst) {
  std::memcpy(dst, f32(src), sizeof(float) * src.numel());
}

void CpuBackend::upload(const float* src, const Tensor& dst) {
  std::memcpy(f32(dst), src, sizeof(float) * dst.numel());
}

namespace {

// A number from a one-line file (cgroup v2 memory.max / memory.current), -1 for "max" or none.
int64_t read_cgroup_number(const char* path) {
  std::FILE* f = std::fopen(path, "r");
  if (f == nullptr) return -1;
  long long v = -1;
  if (std::fscanf(f, "%lld", &v) != 1) v = -1;
  std::fclose(f);
  return v;
}

}  // namespace

int64_t CpuBackend::kv_cache_bytes(const KvCacheShape& shape) const {
  const long double bytes = 2.0L * shape.num_layers * shape.num_blocks * shape.block_size *
                            shape.num_kv_heads * shape.head_dim * sizeof(float);
  return bytes >= 9.0e18L ? INT64_MAX : static_cast<int64_t>(bytes);
}

MemoryInfo CpuBackend::memory_info() const {
  MemoryInfo m;
  m.where = "host";
  if (std::FILE* f = std::fopen("/proc/meminfo", "r")) {
    char key[64];
    long long kib = 0;
    while (std::fscanf(f, "%63s %lld kB", key, &kib) == 2) {
      if (std::strcmp(key, "MemTotal:") == 0) m.total_bytes = kib * 1024;
      if (std::strcmp(key, "MemAvailable:") == 0) m.free_bytes = kib * 1024;
    }
    std::fclose(f);
  }
  const int64_t limit = read_cgroup_number("/sys/fs/cgroup/memory.max");
  const int64_t used = read_cgroup_number("/sys/fs/cgroup/memory.current");
  if (limit > 0 && used >= 0) {
    m.total_bytes = m.total_bytes > 0 ? std::min(m.total_bytes, limit) : limit;
    m.free_bytes = std::min(m.free_bytes, std::max<int64_t>(limit - used, 0));
  }
  return m;
}

void CpuBackend::allocate_kv(const KvCacheShape& shape) {
  check_kv_cache_shape(shape);
  const MemoryInfo memory = memory_info();
  check_kv_cache_fits(
      shape, kv_cache_bytes(shape),
      memory.free_bytes + (kv_shape_.num_blocks > 0 ? kv_cache_bytes(kv_shape_) : 0), memory);
  k_cache_.clear();
  v_cache_.clear();
  kv_shape_ = KvCacheShape{};
  const size_t n = static_cast<size_t>(shape.num_blocks * shape.block_size * shape.num_kv_heads *
                                       shape.head_dim);
  for (auto* cache : {&k_cache_, &v_cache_})
    for (int64_t l = 0; l < shape.num_layers; ++l) {
      Plane plane{std::unique_ptr<float[], FreeDeleter>(
          static_cast<float*>(std::calloc(std::max<size_t>(n, 1), sizeof(float))))};
      if (plane.data() == nullptr)
        throw_error(ErrorCode::kResourceExhausted,
                    "allocate_kv: " + format_bytes(kv_cache_bytes(shape)) +
                        " of host memory could not be allocated");
      cache->push_back(std::move(plane));
    }
  kv_shape_ = shape;
}

void CpuBackend::set_step(const StepInputs& step) {
  step.validate(kv_shape_);
  step_ = step;
  step_.resolve_sources();
}

void CpuBackend::embedding(const Tensor& table, const Tensor& out) {
  ARBOR_CHECK(out.rows == step_.num_tokens() && out.cols == table.cols);
  for (int32_t id : step_.token_ids)
    if (id < 0 || id >= table.rows)
      throw_error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                   " is outside the vocabulary of " +
                                                   std::to_string(table.rows));
  embedding_shard(table, 0, out);  // the whole table: every (checked) id is inside it
}

void CpuBackend::rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out) {
  check_same_shape(x, out, "rms_norm");
  ARBOR_CHECK(weight.numel() == x.cols);
  const float* w = f32(weight);
  for (int64_t r = 0; r < x.rows; ++r) {
    const float* xi = f32(x) + r * x.cols;
    float* oi = f32(out) + r * x.cols;
    float ss = 0.f;
    for (int64_t c = 0; c < x.cols; ++c) ss += xi[c] * xi[c];
    // Same order of operations as transformers' LlamaRMSNorm in fp32.
    const float inv = 1.0f / std::sqrt(ss / static_cast<float>(x.cols) + static_cast<float>(eps));
    for (int64_t c = 0; c < x.cols; ++c) oi[c] = w[c] * (xi[c] * inv);
  }
}

void CpuBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  ARBOR_CHECK(x.cols == w.cols && out.rows == x.rows && out.cols == w.rows,
              "linear: x [" + std::to_string(x.rows) + ", " + std::to_string(x.cols) + "] w [" +
                  std::to_string(w.rows) + ", " + std::to_string(w.cols) + "]");
  float* o = f32(out);
  if (bias.data != nullptr) {
    ARBOR_CHECK(bias.numel() == w.rows);
    for (int64_t r = 0; r < out.rows; ++r) std::memcpy(o + r * out.cols, f32(bias), 4 * out.cols);
  }
  // out[N, O] = x[N, I] @ w[O, I]^T
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(x.rows),
              static_cast<int>(w.rows), static_cast<int>(x.cols), 1.0f, f32(x),
              static_cast<int>(x.cols), f32(w), static_cast<int>(w.cols),
              bias.data != nullptr ? 1.0f : 0.0f, o, static_cast<int>(out.cols));
}

void CpuBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  check_same_shape(a, b, "add");
  check_same_shape(a, out, "add");
  const float* pa = f32(a);
  const float* pb = f32(b);
  float* po = f32(out);
  for (int64_t i = 0; i < a.numel(); ++i) po[i] = pa[i] + pb[i];
}

void CpuBackend::silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  check_same_shape(gate, up, "silu_mul");
  check_same_shape(gate, out, "silu_mul");
  const float* g = f32(gate);
  const float* u = f32(up);
  float* o = f32(out);
  for (int64_t i = 0; i < gate.numel(); ++i) o[i] = (g[i] / (1.0f + std::exp(-g[i]))) * u[i];
}

void CpuBackend::rope(const Tensor& q, const Tensor& k, const RopeParams& p) {
  const int64_t d = p.head_dim;
  const int64_t half = d / 2;
  ARBOR_CHECK(q.rows == step_.num_tokens() && k.rows == q.rows);
  ARBOR_CHECK(q.cols % d == 0 && k.cols % d == 0);
  // fp32 angles as transformers computes them (inv_freq in fp32, position * inv_freq in fp32).
  const std::vector<double> inv_d = rope_inv_freq(p);
  std::vector<float> inv(inv_d.begin(), inv_d.end());
  std::vector<float> cos_v(half), sin_v(half);
  auto rotate = [&](float* x, int64_t heads) {
    for (int64_t h = 0; h < heads; ++h) {
      float* xh = x + h * d;
      for (int64_t i = 0; i < half; ++i) {
        const float x0 = xh[i];
        const float x1 = xh[i + half];
        xh[i] = x0 * cos_v[i] - x1 * sin_v[i];
        xh[i + half] = x1 * cos_v[i] + x0 * sin_v[i];
      }
    }
  };
  for (int64_t n = 0; n < q.rows; ++n) {
    const float pos = static_cast<float>(step_.positions[n]);
    for (int64_t i = 0; i < half; ++i) {
      const float angle = pos * inv[i];
      cos_v[i] = std::cos(angle);
      sin_v[i] = std::sin(angle);
    }
    rotate(f32(q) + n * q.cols, q.cols / d);
    rotate(f32(k) + n * k.cols, k.cols / d);
  }
}

void CpuBackend::write_kv(int64_t layer, const Tensor& k, const Tensor& v) {
  const int64_t width = kv_shape_.num_kv_heads * kv_shape_.head_dim;
  ARBOR_CHECK(k.cols == width && v.cols == width && k.rows == step_.num_tokens());
  float* kc = k_cache_.at(layer).data();
  float* vc = v_cache_.at(layer).data();
  for (int64_t n = 0; n < k.rows; ++n) {
    const int64_t slot = step_.slot_mapping[n];
    std::memcpy(kc + slot * width, f32(k) + n * width, sizeof(float) * width);
    std::memcpy(vc + slot * width, f32(v) + n * width, sizeof(float) * width);
  }
}

void CpuBackend::paged_tree_attention(int64_t layer, const Tensor& q, int64_t num_heads,
                                      const Tensor& out) {
  const int64_t d = kv_shape_.head_dim;
  const int64_t hkv = kv_shape_.num_kv_heads;
  const int64_t bs = kv_shape_.block_size;
  const int64_t width = hkv * d;
  ARBOR_CHECK(q.cols == num_heads * d && out.rows == q.rows && out.cols == q.cols);
  ARBOR_CHECK(num_heads % hkv == 0);
  const int64_t group = num_heads / hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const float* kc = k_cache_.at(layer).data();
  const float* vc = v_cache_.at(layer).data();
  std::vector<float> scores;
  std::vector<int64_t> slots;
  for (int32_t r = 0; r < step_.num_requests(); ++r) {
    const int32_t q0 = step_.qo_indptr[r];
    const int32_t t_len = step_.qo_indptr[r + 1] - q0;
    const int64_t committed = step_.committed_len[r];
    const int64_t kv_len = committed + t_len;
    const int32_t* table =
        step_.block_tables.data() + static_cast<int64_t>(r) * step_.max_blocks_per_request;
    slots.resize(kv_len);
    const bool paths = !step_.key_path_base.empty();
    const int64_t path_base = paths ? step_.key_path_base[r] : kv_len;
    for (int64_t j = 0; j < kv_len; ++j) {
      const int64_t jk =
          j < path_base ? j
                        : path_base + step_.key_path[step_.key_path_indptr[r] + (j - path_base)];
      slots[j] = table[jk / bs] * bs + jk % bs;
    }
    const bool causal = step_.mask_indptr[r] == step_.mask_indptr[r + 1];
    const int32_t words = (t_len + 31) / 32;
    const uint32_t* mask = step_.tree_mask.data() + step_.mask_indptr[r];
    scores.resize(kv_len);
    for (int32_t i = 0; i < t_len; ++i) {
      auto visible = [&](int64_t j) {
        if (j < committed) return true;
        const int64_t t = j - committed;
        if (causal) return t <= i;
        return ((mask[static_cast<int64_t>(i) * words + t / 32] >> (t % 32)) & 1u) != 0;
      };
      for (int64_t h = 0; h < num_heads; ++h) {
        const float* qv = f32(q) + (q0 + i) * q.cols + h * d;
        const int64_t kvh = h / group;
        float max_score = -INFINITY;
        for (int64_t j = 0; j < kv_len; ++j) {
          if (!visible(j)) {
            scores[j] = -INFINITY;
            continue;
          }
          const float* kv = kc + slots[j] * width + kvh * d;
          float s = 0.f;
          for (int64_t c = 0; c < d; ++c) s += qv[c] * kv[c];
          scores[j] = s * scale;
          max_score = std::max(max_score, scores[j]);
        }
        float sum = 0.f;
        for (int64_t j = 0; j < kv_len; ++j) {
          scores[j] = std::isinf(scores[j]) ? 0.f : std::exp(scores[j] - max_score);
          sum += scores[j];
        }
        float* o = f32(out) + (q0 + i) * out.cols + h * d;
        std::fill(o, o + d, 0.f);
        for (int64_t j = 0; j < kv_len; ++j) {
          if (scores[j] == 0.f) continue;
          const float p = scores[j] / sum;
          const float* vv = vc + slots[j] * width + kvh * d;
          for (int64_t c = 0; c < d; ++c) o[c] += p * vv[c];
        }
      }
    }
  }
}

void CpuBackend::gather_logit_rows(const Tensor& x, const Tensor& out) {
  ARBOR_CHECK(out.rows == static_cast<int64_t>(step_.logits_rows.size()) && out.cols == x.cols);
  for (int64_t m = 0; m < out.rows; ++m)
    std::memcpy(f32(out) + m * out.cols, f32(x) + step_.logits_rows[m] * x.cols,
                sizeof(float) * x.cols);
}

void CpuBackend::argmax_rows(const Tensor& logits, std::vector<int32_t>* out) {
  ARBOR_CHECK(logits.dtype == DType::kF32);
  out->assign(static_cast<size_t>(logits.rows), -1);
  for (int64_t m = 0; m < logits.rows; ++m) {
    const float* row = f32(logits) + m * logits.cols;
    int32_t best = -1;
    bool rejected = false;
    for (int64_t c = 0; c < logits.cols && !rejected; ++c) {
      const float v = row[c];
      rejected = std::isnan(v) || v == std::numeric_limits<float>::infinity();
      if (v != -std::numeric_limits<float>::infinity() && (best < 0 || v > row[best]))
        best = static_cast<int32_t>(c);
    }
    (*out)[static_cast<size_t>(m)] = rejected ? -1 : best;
  }
}

void CpuBackend::split_cols(const Tensor& x, const std::vector<Tensor>& outs) {
  ARBOR_CHECK(x.dtype == DType::kF32);
  int64_t total = 0;
  for (const Tensor& o : outs) {
    if (o.rows != x.rows || o.dtype != DType::kF32)
      throw_error(ErrorCode::kInvalidArgument, "split_cols: output rows / dtype differ from x");
    total += o.cols;
  }
  if (total != x.cols || outs.empty() || outs.size() > 3)
    throw_error(ErrorCode::kInvalidArgument, "split_cols: " + std::to_string(outs.size()) +
                                                 " outputs of " + std::to_string(total) +
                                                 " columns for x of " + std::to_string(x.cols));
  for (int64_t r = 0; r < x.rows; ++r) {
    int64_t c = 0;
    for (const Tensor& o : outs) {
      std::memcpy(f32(o) + r * o.cols, f32(x) + r * x.cols + c, sizeof(float) * o.cols);
      c += o.cols;
    }
  }
}

void CpuBackend::copy_cols(const Tensor& x, const Tensor& out, int64_t first_col) {
  check_copy_cols(x, out, first_col);
  for (int64_t r = 0; r < x.rows; ++r)
    std::memcpy(f32(out) + r * out.cols + first_col, f32(x) + r * x.cols, sizeof(float) * x.cols);
}

void CpuBackend::gather_values(const Tensor& x, const std::vector<int64_t>& index,
                               std::vector<float>* out) {
  ARBOR_CHECK(x.dtype == DType::kF32);
  out->resize(index.size());
  for (size_t i = 0; i < index.size(); ++i) {
    if (index[i] < 0 || index[i] >= x.numel())
      throw_error(ErrorCode::kInvalidArgument, "gather_values: index " + std::to_string(index[i]) +
                                                   " outside " + std::to_string(x.numel()));
    (*out)[i] = f32(x)[index[i]];
  }
}

void CpuBackend::top_k_log_softmax(const Tensor& logits, int32_t k, std::vector<int32_t>* ids,
                                   std::vector<float>* values) {
  ARBOR_CHECK(logits.dtype == DType::kF32);
  if (k < 1 || k > 1024 || k > logits.cols)
    throw_error(ErrorCode::kInvalidArgument, "top_k_log_softmax: k " + std::to_string(k) +
                                                 " outside [1, min(" + std::to_string(logits.cols) +
                                                 ", 1024)]");
  ids->clear();
  values->clear();
  std::vector<float> row(static_cast<size_t>(logits.cols));
  for (int64_t r = 0; r < logits.rows; ++r) {
    const float* x = f32(logits) + r * logits.cols;
    row.assign(x, x + logits.cols);
    host_math::log_softmax_inplace(row);
    for (int32_t id : host_math::top_k(row, k)) {
      ids->push_back(id);
      values->push_back(row[static_cast<size_t>(id)]);
    }
  }
}

void CpuBackend::top_k_ids(const Tensor& logits, int32_t k, const Tensor& ids) {
  if (ids.dtype != DType::kI32 || ids.rows != logits.rows || ids.cols != k)
    throw_error(ErrorCode::kInvalidArgument,
                "top_k_ids: ids [" + std::to_string(ids.rows) + ", " + std::to_string(ids.cols) +
                    "] " + dtype_name(ids.dtype) + " for " + std::to_string(logits.rows) +
                    " rows of k " + std::to_string(k) + " (int32 expected)");
  std::vector<int32_t> top;
  std::vector<float> values;
  top_k_log_softmax(logits, k, &top, &values);
  std::copy(top.begin(), top.end(), static_cast<int32_t*>(ids.data));
}

void CpuBackend::download_ids(const Tensor& ids, std::span<const int64_t> index,
                              std::vector<int32_t>* out) {
  if (ids.dtype != DType::kI32)
    throw_error(ErrorCode::kInvalidArgument,
                std::string("download_ids: ") + dtype_name(ids.dtype) + " ids, int32 expected");
  out->clear();
  for (int64_t i : index) {
    if (i < -1 || i >= ids.numel())
      throw_error(ErrorCode::kInvalidArgument, "download_ids: index " + std::to_string(i) +
                                                   " outside [-1, " + std::to_string(ids.numel()) +
                                                   ")");
    out->push_back(i < 0 ? -1 : static_cast<const int32_t*>(ids.data)[i]);
  }
}

void CpuBackend::set_draft_vocab_map(std::span<const int64_t> offsets) {
  vocab_offsets_.assign(offsets.begin(), offsets.end());
}

void CpuBackend::draft_frontier_roots(const Tensor& logits, int32_t k) {
  top_k_log_softmax(logits, k, &frontier_.root_ids, &frontier_.root_values);
  frontier_.root_k = k;
}

void CpuBackend::draft_frontier_begin(int32_t groups, int32_t k, int32_t max_depth,
                                      std::span<const int32_t> ids, std::span<const float> values,
                                      std::span<const int32_t> parent_rows,
                                      std::span<const int32_t> positions,
                                      std::span<const int64_t> slots,
                                      std::span<const int32_t> root_rows) {
  frontier_.begin(groups, k, max_depth, ids, values, parent_rows, positions, slots, root_rows);
}

void CpuBackend::draft_frontier_load(int32_t depth, const Tensor& source, const Tensor& in) {
  HostDraftFrontier& f = frontier_;
  f.check_depth(depth, "draft_frontier_load");
  const int32_t n = f.rows();
  bool paths = step_.key_path_base.size() == static_cast<size_t>(n);
  for (int32_t row = 0; paths && row < n; ++row)
    paths = step_.key_path_indptr[static_cast<size_t>(row) + 1] -
                step_.key_path_indptr[static_cast<size_t>(row)] >=
            depth;
  if (step_.num_tokens() != n || step_.num_requests() != n || !paths || in.rows != n ||
      in.cols != source.cols)
    throw_error(ErrorCode::kInvalidArgument,
                "draft_frontier_load: depth " + std::to_string(depth) + " of " + std::to_string(n) +
                    " rows, a step of " + std::to_string(step_.num_tokens()) + " tokens and " +
                    std::to_string(step_.key_path.size()) + " path entries");
  std::vector<int32_t> rows(static_cast<size_t>(n));
  for (int32_t row = 0; row < n; ++row) {
    const auto r = static_cast<size_t>(row);
    const int32_t id = f.ids[r];
    step_.token_ids[r] =
        vocab_offsets_.empty()
            ? id
            : static_cast<int32_t>(id + vocab_offsets_.at(static_cast<size_t>(id)));
    step_.positions[r] = f.positions[r] + depth - 1;
    step_.slot_mapping[r] = f.slots[static_cast<size_t>(depth - 1) * static_cast<size_t>(n) + r];
    step_.committed_len[r] = step_.key_path_base[r] + depth - 1;
    for (int32_t e = 0; e < depth; ++e)
      step_.key_path[static_cast<size_t>(step_.key_path_indptr[r] + e)] =
          f.path[r * static_cast<size_t>(f.max_depth) + static_cast<size_t>(e)] + f.path_shift[r];
    rows[r] = f.parent[r];
  }
  gather_rows(source, rows, in);
}

void CpuBackend::draft_frontier_shift(const Tensor& len, std::span<const int32_t> len_index,
                                      std::span<const int32_t> rows, const Tensor& root_source,
                                      const Tensor& roots) {
  HostDraftFrontier& f = frontier_;
  const auto g = static_cast<size_t>(f.groups);
  bool ok = len_index.size() == g && rows.size() == g && len.dtype == DType::kI32 &&
            root_source.dtype == DType::kF32 && roots.dtype == DType::kF32 &&
            roots.rows >= f.groups && roots.cols == root_source.cols &&
            step_.key_path_base.size() == g * static_cast<size_t>(f.k);
  std::vector<int32_t> by(g);
  const auto* lengths = static_cast<const int32_t*>(len.data);
  for (size_t t = 0; ok && t < g; ++t) {
    ok = len_index[t] >= 0 && len_index[t] < len.rows && rows[t] >= 1 && t < f.root_rows.size() &&
         f.root_rows[t] < root_source.rows;
    if (ok) by[t] = std::clamp(rows[t] - lengths[len_index[t]], 0, rows[t] - 1);
  }
  if (!ok)
    throw_error(ErrorCode::kInvalidArgument,
                "draft_frontier_shift: " + std::to_string(len_index.size()) + " trees of " +
                    std::to_string(f.groups) + ", len " + std::to_string(len.rows) +
                    " rows, roots " + std::to_string(roots.rows) + " x " +
                    std::to_string(roots.cols) + " from " + std::to_string(root_source.rows) +
                    " x " + std::to_string(root_source.cols));
  f.shift(by);
  for (size_t t = 0; t < g; ++t) {
    for (int32_t r = 0; r < f.k; ++r)
      step_.key_path_base[t * static_cast<size_t>(f.k) + static_cast<size_t>(r)] -= by[t];
    const auto* src = static_cast<const float*>(root_source.data) +
                      static_cast<int64_t>(f.root_rows[t] - by[t]) * root_source.cols;
    std::copy(src, src + roots.cols, static_cast<float*>(roots.data) + t * roots.cols);
  }
}

void CpuBackend::draft_frontier_expand(int32_t depth, const Tensor& logits) {
  if (logits.rows != frontier_.rows())
    throw_error(ErrorCode::kInvalidArgument, "draft_frontier_expand: logits " +
                                                 std::to_string(logits.rows) + " rows for " +
                                                 std::to_string(frontier_.rows()));
  std::vector<int32_t> ids;
  std::vector<float> values;
  top_k_log_softmax(logits, frontier_.k, &ids, &values);
  frontier_.expand(depth, ids, values);
}

void CpuBackend::draft_frontier_log(int32_t depths, std::vector<int32_t>* ids,
                                    std::vector<float>* values, std::vector<int32_t>* root_ids,
                                    std::vector<float>* root_values) {
  const HostDraftFrontier& f = frontier_;
  if (depths < 0 || depths > f.depths_logged())
    throw_error(ErrorCode::kInvalidArgument, "draft_frontier_log: " + std::to_string(depths) +
                                                 " depths of " + std::to_string(f.depths_logged()));
  const size_t n =
      static_cast<size_t>(depths) * static_cast<size_t>(f.rows()) * static_cast<size_t>(f.k);
  ids->assign(f.log_ids.begin(), f.log_ids.begin() + static_cast<int64_t>(n));
  values->assign(f.log_values.begin(), f.log_values.begin() + static_cast<int64_t>(n));
  *root_ids = f.first_ids;
  *root_values = f.first_values;
}

Tensor CpuBackend::draft_frontier_trees(std::span<const int32_t> depth,
                                        std::span<const int32_t> nodes, int32_t stride) {
  select_draft_trees(frontier_, depth, nodes, stride, vocab_offsets_, &trees_);
  return Tensor{trees_.data(), DType::kI32, static_cast<int64_t>(trees_.size()), 1};
}

void CpuBackend::copy_kv(const std::vector<int64_t>& src_slots,
                         const std::vector<int64_t>& dst_slots) {
  if (src_slots.size() != dst_slots.size())
    throw_error(ErrorCode::kInvalidArgument,
                "copy_kv: " + std::to_string(src_slots.size()) + " source slots but " +
                    std::to_string(dst_slots.size()) + " destination slots");
  const int64_t width = kv_shape_.num_kv_heads * kv_shape_.head_dim;
  const int64_t total = kv_shape_.num_blocks * kv_shape_.block_size;
  for (size_t i = 0; i < src_slots.size(); ++i)
    if (src_slots[i] < 0 || src_slots[i] >= total || dst_slots[i] < 0 || dst_slots[i] >= total)
      throw_error(ErrorCode::kInvalidArgument,
                  "copy_kv: slot pair " + std::to_string(src_slots[i]) + " -> " +
                      std::to_string(dst_slots[i]) + " is outside the cache's " +
                      std::to_string(total) + " slots");
  std::vector<float> staged(src_slots.size() * width);
  for (auto* cache : {&k_cache_, &v_cache_}) {
    for (auto& layer : *cache) {
      for (size_t i = 0; i < src_slots.size(); ++i)
        std::memcpy(staged.data() + i * width, layer.data() + src_slots[i] * width, 4 * width);
      for (size_t i = 0; i < dst_slots.size(); ++i)
        std::memcpy(layer.data() + dst_slots[i] * width, staged.data() + i * width, 4 * width);
    }
  }
}

}  // namespace arbor
