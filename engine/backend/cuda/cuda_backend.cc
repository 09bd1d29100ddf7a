#include "engine/backend/cuda/cuda_backend.h"

#include <cublasLt.h>
#include <cublas_v2.h>
#include <cuda_runtime.h>
#ifdef ARBOR_NCCL
#include <nccl.h>
#endif

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstddef>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "engine/backend/draft_frontier.h"
#include "engine/backend/step_graphs.h"
#include "engine/core/error.h"
#include "kernels/attention/paged_tree_attention.h"
#include "kernels/common/pdl.h"
#include "kernels/elementwise/elementwise.h"
#include "kernels/elementwise/gather_values.h"
#include "kernels/elementwise/split_cols.h"
#include "kernels/gemm/batch_invariant_gemm.h"
#include "kernels/gemm/chain_gemm.h"
#include "kernels/gemm/chunked_gemm.h"
#include "kernels/gemm/skinny_gemm.h"
#include "kernels/kv/kv_cache_ops.h"
#include "kernels/norm_rope/norm_rope.h"
#include "kernels/sampling/argmax_rows.h"
#include "kernels/sampling/device_tree.h"
#include "kernels/sampling/draft_frontier.h"
#include "kernels/sampling/gather_path_rows.h"
#include "kernels/sampling/top_k_rows.h"
#include "kernels/sampling/tree_sampling.h"

namespace arbor {

namespace {

// Step-graph timing: device time between two timed replays longer than this holds steps run op
// by op (prefill, recordings) and is not counted as a gap (SharedStream::collect).
constexpr float kMaxGraphGapMs = 1.0f;

void cuda_check(cudaError_t e, const char* what) {
  if (e != cudaSuccess)
    throw_error(ErrorCode::kInternal,
                std::string("CUDA error in ") + what + ": " + cudaGetErrorString(e));
}

void cublas_check(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS)
    throw_error(ErrorCode::kInternal,
                std::string("cuBLAS error in ") + what + ": " + cublasGetStatusString(st));
}

kernels::ElemType elem(DType t) {
  switch (t) {
    case DType::kF32:
      return kernels::ElemType::kF32;
    case DType::kBF16:
      return kernels::ElemType::kBF16;
    case DType::kF16:
      return kernels::ElemType::kF16;
    default:
      break;
  }
  throw_error(ErrorCode::kUnsupported, std::string("cuda backend: tensors of dtype ") +
                                           dtype_name(t) + " are not supported");
}

std::string shape(const Tensor& t) {
  return std::string(dtype_name(t.dtype)) + " [" + std::to_string(t.rows) + ", " +
         std::to_string(t.cols) + "]";
}

// top_k_log_softmax's and top_k_ids' arguments: fp32 logits of 1 to 2^31 - 2 columns, k in
// [1, min(cols, 1024)].
void check_top_k(const Tensor& logits, int32_t k, const char* op) {
  if (logits.dtype != DType::kF32 || logits.cols <= 0 || logits.cols >= (int64_t{1} << 31) - 1)
    throw_error(ErrorCode::kInvalidArgument, std::string(op) + ": logits " + shape(logits) + " " +
                                                 dtype_name(logits.dtype) + ", need fp32");
  if (k < 1 || k > 1024 || k > logits.cols)
    throw_error(ErrorCode::kInvalidArgument, std::string(op) + ": k " + std::to_string(k) +
                                                 " outside [1, min(" + std::to_string(logits.cols) +
                                                 ", 1024)]");
}

void check_same_shape(const Tensor& a, const Tensor& b, const char* op) {
  if (a.rows != b.rows || a.cols != b.cols)
    throw_error(ErrorCode::kInvalidArgument,
                std::string(op) + ": shape mismatch " + shape(a) + " vs " + shape(b));
}

void require_step(bool has_step, const char* op) {
  if (!has_step)
    throw_error(ErrorCode::kInvalidArgument, std::string(op) + ": set_step() must come first");
}

size_t align_up(size_t n, size_t a) {
  return (n + a - 1) / a * a;
}

// ARBOR_STEP_GRAPH_TRACE=1: one stderr line per device reallocation ("moved": memory recordings
// point into; "grown": the rest), with the owning backend's epoch address to tell backends apart.
void trace_memory(const char* verb, const char* what, size_t bytes, const void* ptr,
                  const void* epoch) {
  if (step_graph_trace_enabled())
    std::fprintf(stderr, "memory %s: %s %zu bytes at %p (epoch %p)\n", verb, what, bytes, ptr,
                 epoch);
}

// A grow-only device allocation. Buffers that recorded step graphs point into have `epoch`
// set: a reallocation moves it (the recordings are then dropped) and grows by half again, so
// that slowly growing needs reallocate rarely.
struct DeviceBuffer {
  void* ptr = nullptr;
  size_t bytes = 0;
  uint64_t* epoch = nullptr;
  void ensure(size_t need, const char* what) {
    if (need <= bytes) return;
    if (epoch != nullptr) {
      ++*epoch;
      need += need / 2;
    }
    if (ptr != nullptr) cuda_check(cudaFree(ptr), what);
    ptr = nullptr;
    bytes = 0;
    cuda_check(cudaMalloc(&ptr, need), what);
    bytes = need;
    trace_memory(epoch != nullptr ? "moved" : "grown", what, need, ptr, epoch);
  }
  ~DeviceBuffer() {
    if (ptr != nullptr) cudaFree(ptr);
  }
};

// Pinned host memory for host -> device copies on a stream: rewritten only after the previous
// copy from it has finished (event), the copy itself ordered on the stream.
struct PinnedStaging {
  void* host = nullptr;
  size_t host_bytes = 0;
  cudaEvent_t done = nullptr;

  // Waits for the previous copy out of it; grows it to `bytes`.
  uint8_t* acquire(size_t bytes, const char* what) {
    if (done == nullptr) cuda_check(cudaEventCreateWithFlags(&done, cudaEventDisableTiming), what);
    cuda_check(cudaEventSynchronize(done), what);
    if (bytes > host_bytes) {
      if (host != nullptr) cuda_check(cudaFreeHost(host), what);
      host = nullptr;
      host_bytes = 0;
      cuda_check(cudaMallocHost(&host, bytes), what);
      host_bytes = bytes;
    }
    return static_cast<uint8_t*>(host);
  }
  void copy_to(void* dst, size_t bytes, cudaStream_t stream, const char* what) {
    if (bytes > 0)
      cuda_check(cudaMemcpyAsync(dst, host, bytes, cudaMemcpyHostToDevice, stream), what);
    cuda_check(cudaEventRecord(done, stream), what);
  }
  ~PinnedStaging() {
    if (done != nullptr) {
      cudaEventSynchronize(done);
      cudaEventDestroy(done);
    }
    if (host != nullptr) cudaFreeHost(host);
  }
};

// Host -> device metadata upload into a device buffer of its own, through pinned staging: a few
// stagings in turn, so that a step set up while the device still runs the steps before it (a
// draft forward queued before the host's wait, then the next one) does not wait for their
// copies; the copies into `device` stay in stream order with the kernels that read it.
struct StagedUpload {
  DeviceBuffer device;
  // After device: its copies are waited for before device is freed.
  std::array<PinnedStaging, 3> staging;
  size_t next = 0;

  uint8_t* begin(size_t bytes, const char* what) {
    uint8_t* host = staging[next].acquire(bytes, what);
    device.ensure(bytes, what);
    return host;
  }
  void commit(size_t bytes, cudaStream_t stream, const char* what) {
    staging[next].copy_to(device.ptr, bytes, stream, what);
    next = (next + 1) % staging.size();
  }
};

// upload(): caller memory -> device without waiting for the device: copied into one of a few
// pinned stagings (round robin), from there on the stream, ordered with the kernels around it.
struct PinnedRing {
  std::array<PinnedStaging, 4> slots;
  size_t next = 0;
  void copy(void* dst, const void* src, size_t bytes, cudaStream_t stream, const char* what) {
    PinnedStaging& sl = slots[next];
    next = (next + 1) % slots.size();
    std::memcpy(sl.acquire(bytes, what), src, bytes);
    sl.copy_to(dst, bytes, stream, what);
  }
};

// The values last uploaded to one device address, so that an upload of the same values there can
// be skipped (each skipped copy is one operation less on the stream between two step graphs).
struct UploadCache {
  const void* dst = nullptr;
  std::vector<int32_t> values;
  // True when `v` already lies at `to`; else remembers it (the caller uploads it).
  bool holds(const void* to, std::span<const int32_t> v) {
    if (to == dst && std::equal(v.begin(), v.end(), values.begin(), values.end())) return true;
    dst = to;
    values.assign(v.begin(), v.end());
    return false;
  }
  void forget() { dst = nullptr; }
};

// Lays out several host arrays in one buffer (256-byte aligned sections).
class Packer {
 public:
  // v's elements, in a section of room for at least `capacity` of them (the rest unwritten).
  template <typename T>
  size_t add(const std::vector<T>& v, size_t capacity = 0) {
    const size_t off = size_;
    sections_.push_back({off, v.data(), v.size() * sizeof(T)});
    size_ = align_up(off + std::max(v.size(), capacity) * sizeof(T), 256);
    return off;
  }
  size_t size() const { return std::max<size_t>(size_, 256); }
  void write(uint8_t* dst) const {
    for (const auto& s : sections_)
      if (s.bytes > 0) std::memcpy(dst + s.offset, s.src, s.bytes);
  }

 private:
  struct Section {
    size_t offset;
    const void* src;
    size_t bytes;
  };
  std::vector<Section> sections_;
  size_t size_ = 0;
};

}  // namespace

struct CudaBackend::State {
  // A CUDA stream and the backends that launch into it (make_cuda_backend_on_stream_of: an
  // EAGLE draft beside its target). The last backend to go destroys it.
  struct SharedStream {
    cudaStream_t stream = nullptr;
    std::vector<State*> users;
    // set_graph_timing: an event pair around each timed replay of any backend on the stream, in
    // launch order, read at the next wait of any of them (never a wait of its own: the host
    // keeps running ahead of the device as without timing). Each replay's device time goes to
    // its backend's TransferStats, and so does the device time between the end of the timed
    // replay before it and its start (graph_gap_*: the device idle or running ops outside the
    // graphs, e.g. waiting for the host between a verify step and the next draft).
    struct Timed {
      cudaEvent_t start = nullptr, end = nullptr;
      TransferStats* owner = nullptr;
    };
    std::vector<Timed> pending;
    std::vector<std::pair<cudaEvent_t, cudaEvent_t>> free;
    Timed last;  // the last replay read: its end starts the next gap
    // completed_only: the replays whose end has passed (in order; after a wait for an event
    // that later work on the stream may follow), else every one (after a wait for the stream).
    void collect(bool completed_only = false) {
      size_t n = 0;
      for (; n < pending.size(); ++n) {
        const Timed& t = pending[n];
        if (completed_only && cudaEventQuery(t.end) != cudaSuccess) break;
        cuda_check(cudaEventSynchronize(t.end), "graph timing");  // passed already after a wait
        float ms = 0;
        cuda_check(cudaEventElapsedTime(&ms, t.start, t.end), "graph timing");
        t.owner->graph_device_ms += ms;
        ++t.owner->graphs_timed;
        if (last.end != nullptr) {
          float gap = 0;
          cuda_check(cudaEventElapsedTime(&gap, last.end, t.start), "graph timing");
          // Longer gaps hold whole steps run op by op (prefill, recordings), not a wait.
          if (gap <= kMaxGraphGapMs) {
            const bool same = last.owner == t.owner;
            (same ? t.owner->graph_gap_same_ms : t.owner->graph_gap_other_ms) += std::max(gap, 0.f);
            ++(same ? t.owner->graph_gaps_same : t.owner->graph_gaps_other);
          }
          free.emplace_back(last.start, last.end);
        }
        last = t;
      }
      pending.erase(pending.begin(), pending.begin() + static_cast<std::ptrdiff_t>(n));
    }
    // A backend that goes, after a wait for the stream: its replays are read, and the next
    // replay counts no gap from its last one.
    void forget(const TransferStats* owner) {
      collect();
      if (last.owner == owner) {
        free.emplace_back(last.start, last.end);
        last = Timed{};
      }
    }
    ~SharedStream() {
      for (const Timed& t : pending) free.emplace_back(t.start, t.end);
      if (last.end != nullptr) free.emplace_back(last.start, last.end);
      for (auto& [a, b] : free) {
        cudaEventDestroy(a);
        cudaEventDestroy(b);
      }
      if (stream != nullptr) cudaStreamDestroy(stream);
    }
  };
  // First member, so it goes last: everything below is released before the stream may be.
  std::shared_ptr<SharedStream> shared_stream;
  CudaBackendOptions options;
  cudaStream_t stream = nullptr;
  // Host waits and bytes copied (Backend::transfer_stats).
  TransferStats transfers;
  void wait(const char* what) {
    cuda_check(cudaStreamSynchronize(stream), what);
    ++transfers.syncs;
    if (!shared_stream->pending.empty()) shared_stream->collect();
  }
  bool graph_timing = false;  // set_graph_timing (SharedStream::pending)
  void d2h(void* dst, const void* src, size_t bytes, const char* what) {
    cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDeviceToHost, stream), what);
    transfers.d2h_bytes += static_cast<int64_t>(bytes);
  }
  cublasHandle_t cublas = nullptr;
  int num_sms = 0;
  std::string device_name;  // "device 0 (NVIDIA H200)" (MemoryInfo::where)
  // Tensor parallelism (make_cuda_tp_backends): this rank's NCCL communicator (ncclComm_t).
  void* nccl_comm = nullptr;
  int tp_rank = 0, tp_size = 1;
  DeviceBuffer row_index;  // gather_rows' indices (not recorded: no epoch)
  // wait_for's marker on another backend's stream (made at first use, destroyed with the State).
  struct Event {
    cudaEvent_t e = nullptr;
    ~Event() {
      if (e != nullptr) cudaEventDestroy(e);
    }
  } order_event;
  // device_interval_*: one timed event pair (created at first use).
  struct Interval {
    cudaEvent_t begin = nullptr, end = nullptr;
    bool open = false, ended = false;
    ~Interval() {
      if (begin != nullptr) cudaEventDestroy(begin);
      if (end != nullptr) cudaEventDestroy(end);
    }
  } interval;
  StagedUpload token_index;  // set_step's token_source_index

  std::vector<void*> weights;  // owned weight allocations
  uint64_t random_weight_seed = 1;

  // Scratch arena: chunks handed out in order; reset_scratch() rewinds (and, when a step
  // outgrew the first chunk, replaces the chunks with one that fits the whole step).
  struct Chunk {
    void* ptr;
    size_t bytes;
  };
  std::vector<Chunk> chunks;
  size_t chunk_index = 0, chunk_used = 0, step_scratch_bytes = 0;

  // KV cache: 2 * layers planes of [num_slots, width] 16-bit elements.
  DeviceBuffer kv;
  kernels::ElemType kv_type = kernels::ElemType::kBF16;
  int64_t num_slots = 0, kv_width = 0;

  // Step metadata (device copies) and the host copy the checks read.
  StepInputs step;
  bool has_step = false;
  StagedUpload meta;
  const int32_t* d_token_ids = nullptr;
  const int32_t* d_positions = nullptr;
  const int64_t* d_slots = nullptr;
  const int32_t* d_qo_indptr = nullptr;
  const int32_t* d_committed = nullptr;
  const int32_t* d_block_tables = nullptr;
  const uint32_t* d_tree_mask = nullptr;
  const int32_t* d_mask_indptr = nullptr;
  const int32_t* d_logits_rows = nullptr;
  const int32_t* d_token_request = nullptr;
  // Key paths (StepInputs::key_path*; nullptr when the step has none).
  const int32_t* d_key_path_base = nullptr;
  const int32_t* d_key_path_indptr = nullptr;
  int32_t* d_key_path = nullptr;

  // Draft trees grown on the device (Backend::draft_frontier_*): two frontiers (the current
  // one and the next), then every depth's top-k log (ids, then values).
  DeviceBuffer frontier;
  DeviceBuffer vocab_offset;  // set_draft_vocab_map's [draft_vocab] int64 (empty: none)
  bool has_vocab_offset = false;
  int32_t fr_groups = 0, fr_k = 0, fr_max_depth = 0, fr_current = 0;
  kernels::DraftFrontier fr[2];
  int32_t* fr_positions0 = nullptr;
  int64_t* fr_slots = nullptr;
  int32_t* fr_first = nullptr;      // the first frontier's ids then scores [n] each (the log's)
  int32_t* fr_root_rows = nullptr;  // begin's root_rows
  std::vector<int32_t> fr_root_rows_host;
  DeviceBuffer fr_shift;  // draft_frontier_shift's len_index then rows [G] each
  // draft_frontier_roots: [rows, k] ids then values.
  DeviceBuffer fr_roots;
  int32_t fr_roots_k = 0, fr_roots_rows = 0;
  int32_t* fr_log_ids = nullptr;
  float* fr_log_values = nullptr;
  int32_t* fr_log_chosen = nullptr;  // [max_depth, n] each select's candidates (the trees' log)
  int32_t* fr_path_shift = nullptr;  // [n] draft_frontier_shift's (zeroed by begin's upload)
  // Small uploads that repeat step after step (kept roots, shift rows, tree sizes): skipped when
  // the same values already lie at the same address (the frontier's layout unchanged since).
  UploadCache fr_root_rows_sent, fr_shift_sent, fr_sizes_sent;
  std::array<int64_t, 4> fr_layout{};  // groups, k, depth, frontier address of the last begin
  // The kept roots' top-k (draft_frontier_roots: ids then values, rows of fr_roots_k).
  const int32_t* fr_root_ids() const { return static_cast<const int32_t*>(fr_roots.ptr); }
  const float* fr_root_values() const {
    return reinterpret_cast<const float*>(fr_root_ids() + static_cast<size_t>(fr_roots_rows) *
                                                              static_cast<size_t>(fr_roots_k));
  }
  // uploads.copy of `values` to `dst`, unless `sent` says they already lie there.
  void upload_unless_held(UploadCache& sent, void* dst, std::span<const int32_t> values,
                          const char* what) {
    if (sent.holds(dst, values)) return;
    uploads.copy(dst, values.data(), values.size() * 4, stream, what);
    transfers.h2d_bytes += static_cast<int64_t>(values.size() * 4);
  }
  DeviceBuffer fr_trees;      // draft_frontier_trees' [G, 2, stride] and its [G] depths and nodes
  StagedUpload parent_index;  // set_step's parent_source_index

  // Attention plan of this step (built at the first attention call, or by prepare_step_graph;
  // keyed by head count). A plan for a step graph launches plan_num_work CTAs (the work list
  // padded to a bucket with empty items) and always the split merge, so that its launches do
  // not change while the split counts grow with the context.
  bool plan_valid = false;
  int64_t plan_heads = 0;
  kernels::AttentionPlan plan;
  bool plan_for_graph = false;
  int32_t plan_num_work = 0;
  bool plan_needs_merge = false;
  void build_plan(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim, bool for_graph);
  StagedUpload plan_upload;
  const kernels::AttentionWorkItem* d_work = nullptr;
  const int32_t* d_splits = nullptr;
  const int32_t* d_kv_chunk = nullptr;
  const int32_t* d_partial_row = nullptr;
  struct VirtualArrays {  // device copies of plan.virt's arrays (batch-invariant plans)
    const int32_t *qo_indptr, *committed_len, *mask_indptr, *table_request, *path_base,
        *path_indptr, *path, *token_request;
  };
  VirtualArrays d_virt{};
  DeviceBuffer partial_out, partial_lse;

  // Step graphs (CUDA graphs): recordings by id, the epoch of the memory they point into
  // (DeviceBuffer::epoch), whether a recording is under way.
  uint64_t epoch = 1;
  bool capturing = false;
  uint64_t capture_epoch = 0;  // epoch when the recording began (a move fails it)
  std::map<int64_t, cudaGraphExec_t> graphs;
  int64_t next_graph = 0;
  int backend_index = 0;  // this process's backends in creation order (graph_dot_dir's names)
  DeviceBuffer cublas_workspace;  // cuBLAS must not allocate inside a recording
  int32_t last_splits = 1;
  bool last_tensor_core = false;
  bool use_wgmma = false;
  bool last_wgmma = false;
  bool last_wide = false;
  int last_tree_groups = 0;

  // RoPE inverse frequencies, cached by parameters.
  std::vector<float> inv_freq_host;
  DeviceBuffer inv_freq;

  // Deferred launches (see flush()): consecutive skinny linears reading the same x become one
  // multi-segment launch (Q/K/V, gate/up); a residual add followed by the RMSNorm of its result
  // becomes one fused launch. Every other op, download and synchronize flush first.
  bool gemm_pending = false;
  kernels::SkinnyGemmParams pending_gemm;
  bool add_pending = false;
  kernels::AddParams pending_add;

  // RoPE waits for the next op: when that is the write_kv of the rotated K, one fused launch.
  bool rope_pending = false;
  kernels::RopeParams pending_rope;

  // split_cols waits for the next op: RoPE of its q | k | v outputs, or SiLU * up of its
  // gate | up outputs, reads the fused projection in place and writes the outputs itself (no
  // split launch); any other op launches the split first.
  bool split_pending = false;
  kernels::SplitColsParams pending_split;
  // The pending split, if it has `count` outputs starting with tensors a and b (their rows and
  // widths as split); it is then no longer pending and the caller writes its outputs.
  bool take_split(int count, const Tensor& a, const Tensor& b) {
    const kernels::SplitColsParams& p = pending_split;
    const int have = p.width[2] != 0 ? 3 : p.width[1] != 0 ? 2 : 1;
    if (!split_pending || have != count || p.out[0] != a.data || p.out[1] != b.data ||
        a.rows != p.rows || b.rows != p.rows || a.cols != p.width[0] || b.cols != p.width[1] ||
        a.dtype != DType::kF32 || b.dtype != DType::kF32)
      return false;
    split_pending = false;
    ++splits_in_place;
    return true;
  }
  int64_t splits_in_place = 0;
  int64_t chain_launches = 0;  // chain_gemm_launches()

  // The bf16 GEMM input written by the op before (RMSNorm, SiLU * up, attention write a bf16
  // copy of their fp32 output into gemm_input): valid for the very next op only (every op's
  // flush() ends it), which uses it when it is a linear() reading that output.
  const void* bf16_copy_of = nullptr;  // the fp32 tensor gemm_input holds a copy of
  int64_t bf16_copy_numel = 0;

  // gemm_input sized for [numel] bf16 values.
  void* gemm_input_for(int64_t numel) {
    gemm_input.ensure(static_cast<size_t>(numel) * 2 + 16, "linear");
    return gemm_input.ptr;
  }
  // Room for a bf16 copy of an fp32 [numel] op output in gemm_input, remembered for the next
  // linear(); returns where to write it.
  void* bf16_copy_for(const void* out, int64_t numel) {
    bf16_copy_of = out;
    bf16_copy_numel = numel;
    return gemm_input_for(numel);
  }

  void flush() {
    bf16_copy_of = nullptr;
    if (split_pending) {
      split_pending = false;
      cuda_check(kernels::launch_split_cols(pending_split, stream), "split_cols");
    }
    if (rope_pending) {
      rope_pending = false;
      cuda_check(kernels::launch_rope(pending_rope, stream), "rope");
    }
    if (add_pending) {
      add_pending = false;
      cuda_check(kernels::launch_add(pending_add, stream), "add");
    }
    if (gemm_pending) {
      gemm_pending = false;
      cuda_check(kernels::launch_skinny_gemm(pending_gemm, stream), "linear (skinny)");
    }
  }

  // Batch-invariant linear through cuBLASLt: one algorithm per (out, in), chosen at first use
  // and reused for every row count; layouts cached by shape.
  cublasLtHandle_t lt = nullptr;
  cublasLtMatmulDesc_t lt_desc = nullptr;
  DeviceBuffer lt_workspace;
  struct LtAlgo {
    cublasLtMatmulAlgo_t algo;
    std::string words;
    bool chain = false;    // the chain GEMM gives its bits at <= max_rows rows
    int64_t max_rows = 0;  // chain_gemm_max_rows, or chain_gemm_small_max_rows for small weights
  };
  std::map<std::pair<int64_t, int64_t>, LtAlgo> lt_algos;
  std::map<std::tuple<int, int64_t, int64_t>, cublasLtMatrixLayout_t> lt_layouts;
  cublasLtMatrixLayout_t lt_layout(cudaDataType type, int64_t rows, int64_t cols);
  // Sets a.chain: the chain GEMM against a's cuBLASLt algorithm on this weight (bitwise at 1,
  // 9 and 16 rows; cold time at one row when tuning).
  void check_chain_gemm(LtAlgo& a, int64_t out_features, int64_t in_features, const void* weight);
  // The batch-invariant linear through cuBLASLt: y [n, o] fp32 = x [n, k] bf16 @ w [o, k]^T.
  cublasStatus_t lt_matmul(const cublasLtMatmulAlgo_t& algo, const void* w, int64_t o, int64_t k,
                           const void* x, int64_t n, void* y);
  // Host -> device copy on the stream, waited for. A plain cudaMemcpy from pageable memory may
  // return before its DMA lands, and this (non-blocking) stream's kernels would not wait for
  // it: a linear right after an upload read part of the old contents.
  void copy_to_device(void* dst, const void* src, size_t bytes, const char* what);
  // Best of 4 runs of `run` with the L2 overwritten (flush, > L2 bytes) before each: the time of
  // a decode step's cold weights, ms.
  float best_cold_ms(const DeviceBuffer& flush, const std::function<void()>& run, const char* what);
  // `weight` (the [out, in] bf16 matrix) lets the first use time the candidates
  // (CudaBackendOptions::tune_invariant_gemm); nullptr takes the heuristic's first.
  const LtAlgo& lt_algo(int64_t out_features, int64_t in_features, const void* weight = nullptr);

  DeviceBuffer gemm_input;  // bf16 copy of linear()'s fp32 input
  DeviceBuffer convert;     // fp32 staging for download/upload of 16-bit tensors
  DeviceBuffer argmax_ids;  // [M] int32 argmax_rows() output
  DeviceBuffer top_k_out;   // top_k_log_softmax's ids and values
  DeviceBuffer top_k_work;  // its kernel's workspace (zero between launches)
  // The top-k log-softmax of logits' rows into device ids / values [rows, k], its workspace
  // grown (and zeroed) first when too small: not inside a recording (draft_frontier_begin
  // makes it for the recorded depths).
  void ensure_top_k_work(int64_t rows, const char* what) {
    const size_t work = kernels::top_k_workspace_bytes(rows);
    if (top_k_work.bytes >= work) return;
    ARBOR_CHECK(!capturing, std::string(what) + ": the top-k workspace grows in a recording");
    top_k_work.epoch = &epoch;  // recorded draft depths point into it
    top_k_work.ensure(work, what);
    cuda_check(cudaMemsetAsync(top_k_work.ptr, 0, top_k_work.bytes, stream), what);
  }
  void launch_top_k(const Tensor& logits, int32_t k, int32_t* ids, float* values,
                    const char* what) {
    ensure_top_k_work(logits.rows, what);
    kernels::TopKRowsParams p;
    p.x = static_cast<const float*>(logits.data);
    p.ids = ids;
    p.values = values;
    p.rows = logits.rows;
    p.cols = logits.cols;
    p.k = k;
    p.workspace = top_k_work.ptr;
    cuda_check(kernels::launch_top_k_log_softmax(p, stream), what);
  }
  DeviceBuffer gather_buf;  // gather_values' and download_ids' indices and values
  // out[i] = the 4-byte element of x (device) at flat index[i] (checked by the caller), all
  // bits set (int32 -1) where index[i] is -1: one upload, one gather, one download, one wait.
  void gather_to_host(const void* x, std::span<const int64_t> index, void* out, const char* what) {
    if (index.empty()) return;
    const size_t n = index.size();
    gather_buf.ensure(n * 12, what);
    auto* d_index = static_cast<int64_t*>(gather_buf.ptr);
    auto* d_out = reinterpret_cast<int32_t*>(static_cast<uint8_t*>(gather_buf.ptr) + n * 8);
    cuda_check(cudaMemcpyAsync(d_index, index.data(), n * 8, cudaMemcpyHostToDevice, stream), what);
    cuda_check(cudaMemsetAsync(d_out, 0xff, n * 4, stream), what);
    cuda_check(kernels::launch_gather_ids(static_cast<const int32_t*>(x), d_index, d_out,
                                          static_cast<int64_t>(n), stream),
               what);
    d2h(out, d_out, n * 4, what);
    wait(what);
  }
  StagedUpload sample_meta;     // sample_trees' batch
  DeviceBuffer sample_scratch;  // sample_trees' per-row / per-item scratch and outputs
  DeviceBuffer path_rows;       // sample_trees_and_path_rows' gathered rows
  DeviceBuffer path_next;       // and the tokens after them (PathRowsRequest::on_device)
  // sample_trees' results copied to pinned memory, so that the host waits for them (an event)
  // and not for the work PathRowsRequest::on_device queued behind them.
  PinnedStaging sample_results;
  StagedUpload copy_slots;  // copy_kv's slot lists
  PinnedRing uploads;       // upload()'s staging
  DeviceBuffer copy_staging;

  template <typename T>
  const T* meta_ptr(size_t off) const {
    return reinterpret_cast<const T*>(static_cast<const uint8_t*>(meta.device.ptr) + off);
  }
};

namespace {
// The value of integer environment variable `name` (nullopt when unset or empty); anything but
// a whole number in [lo, hi] that is a multiple of `multiple` is refused, naming the value.
std::optional<long> env_int(const char* name, long lo, long hi, long multiple,
                            const std::string& expected) {
  const char* e = std::getenv(name);
  if (e == nullptr || *e == '\0') return std::nullopt;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  if (*end != '\0' || v < lo || v > hi || v % multiple != 0)
    throw_error(ErrorCode::kInvalidArgument,
                std::string(name) + "='" + e + "' (expected " + expected + ")");
  return v;
}

// The environment variables that override CudaBackendOptions, so the CLI and server can pick
// them without flags of their own (docs/environment.md lists them all): ARBOR_GEMM (cublas |
// own | chunked) batch_invariant_gemm, ARBOR_ATTN_SPLIT_KEYS (a multiple of 64)
// invariant_split_keys, ARBOR_ATTN_KERNEL (0..3) attention_kernel, ARBOR_CHAIN_GEMM (0..16)
// chain_gemm_max_rows and chain_gemm_small_max_rows, ARBOR_CHAIN_SMALL / ARBOR_CHAIN_DEEP
// (<warps><stages><stage k>) the chain GEMM tilings, ARBOR_CHUNKED_WGMMA (0..2)
// chunked_gemm_wgmma, ARBOR_PDL (0 | 1) pdl, ARBOR_DEFER_SPLIT (0 | 1) defer_split,
// ARBOR_STEP_GRAPH_DOT (a folder) graph_dot_dir.
CudaBackendOptions with_env_overrides(CudaBackendOptions o) {
  if (const char* dot = std::getenv("ARBOR_STEP_GRAPH_DOT"); dot != nullptr && *dot != '\0')
    o.graph_dot_dir = dot;
  if (const auto v = env_int("ARBOR_PDL", 0, 1, 1, "0 or 1")) o.pdl = *v != 0;
  if (const auto v = env_int("ARBOR_DEFER_SPLIT", 0, 1, 1, "0 or 1")) o.defer_split = *v != 0;
  if (const auto v = env_int("ARBOR_CHUNKED_WGMMA", 0, 2, 1, "0 never, 1 always, 2 auto"))
    o.chunked_gemm_wgmma = static_cast<int>(*v);
  const std::string tiling = "<warps><stages><stage k>, e.g. 44256";
  if (const auto v = env_int("ARBOR_CHAIN_SMALL", 10000, 99999, 1, tiling))
    o.chain_gemm_small_tiling = static_cast<int>(*v);
  if (const auto v = env_int("ARBOR_CHAIN_DEEP", 10000, 99999, 1, tiling))
    o.chain_gemm_deep_tiling = static_cast<int>(*v);
  if (const auto v = env_int("ARBOR_ATTN_KERNEL", 0, 3, 1,
                             "0 auto, 1 mma.sync, 2 wgmma, 3 wgmma with 128-row tiles"))
    o.attention_kernel = static_cast<int>(*v);
  if (const auto v =
          env_int("ARBOR_ATTN_SPLIT_KEYS", 64, 64 * 1024, 64, "a multiple of 64 from 64 to 65536"))
    o.invariant_split_keys = static_cast<int32_t>(*v);
  if (const auto v = env_int("ARBOR_CHAIN_GEMM", 0, kernels::kChainGemmMaxRows, 1,
                             "0 to " + std::to_string(kernels::kChainGemmMaxRows) + " rows"))
    o.chain_gemm_max_rows = o.chain_gemm_small_max_rows = static_cast<int>(*v);
  const char* e = std::getenv("ARBOR_GEMM");
  if (e == nullptr || *e == '\0') return o;
  const std::string v = e;
  if (v == "cublas")
    o.batch_invariant_gemm = 0;
  else if (v == "own")
    o.batch_invariant_gemm = 1;
  else if (v == "chunked")
    o.batch_invariant_gemm = 2;
  else
    throw_error(ErrorCode::kInvalidArgument,
                "ARBOR_GEMM='" + v + "' (expected cublas, own or chunked)");
  return o;
}
}  // namespace

CudaBackend::CudaBackend(const CudaBackendOptions& requested) : s_(std::make_unique<State>()) {
  const CudaBackendOptions options = with_env_overrides(requested);
  s_->options = options;
  static std::atomic<int> backends_created{0};
  s_->backend_index = backends_created++;
  if (options.kv_dtype != DType::kBF16 && options.kv_dtype != DType::kF16)
    throw_error(ErrorCode::kUnsupported, std::string("cuda backend: KV cache dtype ") +
                                             dtype_name(options.kv_dtype) +
                                             " is not supported (bf16 or f16)");
  int count = 0;
  cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (options.device < 0 || options.device >= count)
    throw_error(ErrorCode::kInvalidArgument, "cuda backend: device " +
                                                 std::to_string(options.device) + " requested, " +
                                                 std::to_string(count) + " present");
  cuda_check(cudaSetDevice(options.device), "cudaSetDevice");
  cuda_check(cudaDeviceGetAttribute(&s_->num_sms, cudaDevAttrMultiProcessorCount, options.device),
             "cudaDeviceGetAttribute");
  cudaDeviceProp prop{};
  cuda_check(cudaGetDeviceProperties(&prop, options.device), "cudaGetDeviceProperties");
  s_->device_name = "device " + std::to_string(options.device) + " (" + prop.name + ")";
  cuda_check(cudaStreamCreateWithFlags(&s_->stream, cudaStreamNonBlocking), "cudaStreamCreate");
  s_->shared_stream = std::make_shared<State::SharedStream>();
  s_->shared_stream->stream = s_->stream;
  s_->shared_stream->users.push_back(s_.get());
  kernels::set_pdl_allowed(options.pdl);
  kernels::pdl_enabled();  // its one-time probe now, never inside a step-graph capture
  cublas_check(cublasCreate(&s_->cublas), "cublasCreate");
  cublas_check(cublasSetStream(s_->cublas, s_->stream), "cublasSetStream");
  constexpr size_t kCublasWorkspaceBytes = 32u << 20;
  s_->cublas_workspace.ensure(kCublasWorkspaceBytes, "cublasSetWorkspace");
  cublas_check(cublasSetWorkspace(s_->cublas, s_->cublas_workspace.ptr, kCublasWorkspaceBytes),
               "cublasSetWorkspace");
  for (DeviceBuffer* b : {&s_->meta.device, &s_->plan_upload.device, &s_->partial_out,
                          &s_->partial_lse, &s_->inv_freq, &s_->gemm_input, &s_->lt_workspace})
    b->epoch = &s_->epoch;
  s_->kv_type = elem(options.kv_dtype);
  bool wgmma = false;
  cuda_check(kernels::attention_wgmma_available(&wgmma), "attention_wgmma_available");
  if ((options.attention_kernel == 2 || options.attention_kernel == 3) && !wgmma)
    throw_error(ErrorCode::kUnsupported,
                "cuda backend: the wgmma attention kernel needs an sm_90a build on a Hopper GPU");
  if (options.attention_kernel < 0 || options.attention_kernel > 3)
    throw_error(ErrorCode::kInvalidArgument,
                "cuda backend: attention_kernel " + std::to_string(options.attention_kernel) +
                    " (0 auto, 1 mma.sync, 2 wgmma, 3 wgmma with 128-row tiles)");
  s_->use_wgmma = wgmma && options.attention_kernel != 1;
  if (options.batch_invariant_gemm < 0 || options.batch_invariant_gemm > 2)
    throw_error(ErrorCode::kInvalidArgument,
                "cuda backend: batch_invariant_gemm " +
                    std::to_string(options.batch_invariant_gemm) +
                    " (0 cuBLASLt fixed algorithm, 1 own kernel, 2 chunked kernel)");
  for (const auto& [name, rows] :
       {std::pair<const char*, int>{"chain_gemm_max_rows", options.chain_gemm_max_rows},
        {"chain_gemm_small_max_rows", options.chain_gemm_small_max_rows}})
    if (rows < 0 || rows > kernels::kChainGemmMaxRows)
      throw_error(ErrorCode::kInvalidArgument,
                  std::string("cuda backend: ") + name + " " + std::to_string(rows) + " (0 to " +
                      std::to_string(kernels::kChainGemmMaxRows) + ")");
  if (options.chain_gemm_small_bytes < 0)
    throw_error(ErrorCode::kInvalidArgument, "cuda backend: chain_gemm_small_bytes " +
                                                 std::to_string(options.chain_gemm_small_bytes) +
                                                 " (at least 0)");
  if (options.attention_tree_groups < 0 || options.attention_tree_groups > 2)
    throw_error(ErrorCode::kInvalidArgument, "cuda backend: attention_tree_groups " +
                                                 std::to_string(options.attention_tree_groups) +
                                                 " (0 never, 1 auto, 2 always)");
  if (options.invariant_split_keys != 0 &&
      (options.invariant_split_keys < 64 || options.invariant_split_keys % 64 != 0 ||
       options.invariant_split_keys > 64 * 1024))
    throw_error(ErrorCode::kInvalidArgument,
                "cuda backend: invariant_split_keys " +
                    std::to_string(options.invariant_split_keys) +
                    " (0 for auto, or a multiple of 64 in [64, 65536])");
  cublas_check(cublasLtCreate(&s_->lt), "cublasLtCreate");
  cublas_check(cublasLtMatmulDescCreate(&s_->lt_desc, CUBLAS_COMPUTE_32F, CUDA_R_32F),
               "cublasLtMatmulDescCreate");
  const cublasOperation_t op_t = CUBLAS_OP_T, op_n = CUBLAS_OP_N;
  cublas_check(
      cublasLtMatmulDescSetAttribute(s_->lt_desc, CUBLASLT_MATMUL_DESC_TRANSA, &op_t, sizeof(op_t)),
      "cublasLtMatmulDescSetAttribute");
  cublas_check(
      cublasLtMatmulDescSetAttribute(s_->lt_desc, CUBLASLT_MATMUL_DESC_TRANSB, &op_n, sizeof(op_n)),
      "cublasLtMatmulDescSetAttribute");
  if (options.skinny_gemm_max_rows < 0 ||
      options.skinny_gemm_max_rows > kernels::kSkinnyGemmMaxRows)
    throw_error(ErrorCode::kInvalidArgument, "cuda backend: skinny_gemm_max_rows " +
                                                 std::to_string(options.skinny_gemm_max_rows) +
                                                 " (0.." +
                                                 std::to_string(kernels::kSkinnyGemmMaxRows) + ")");
}

CudaBackend::~CudaBackend() {
  cudaSetDevice(s_->options.device);
  if (s_->stream != nullptr) cudaStreamSynchronize(s_->stream);
#ifdef ARBOR_NCCL
  if (s_->nccl_comm != nullptr) ncclCommDestroy(static_cast<ncclComm_t>(s_->nccl_comm));
#endif
  for (auto& [id, exec] : s_->graphs) cudaGraphExecDestroy(exec);
  for (void* w : s_->weights) cudaFree(w);
  for (auto& c : s_->chunks) cudaFree(c.ptr);
  if (s_->cublas != nullptr) cublasDestroy(s_->cublas);
  for (auto& [key, layout] : s_->lt_layouts) cublasLtMatrixLayoutDestroy(layout);
  if (s_->lt_desc != nullptr) cublasLtMatmulDescDestroy(s_->lt_desc);
  if (s_->lt != nullptr) cublasLtDestroy(s_->lt);
  // Buffers and events are released by State's members before the stream (shared_stream, the
  // first member), which goes with the last backend using it.
  if (s_->shared_stream != nullptr) {
    s_->shared_stream->forget(&s_->transfers);
    std::erase(s_->shared_stream->users, s_.get());
  }
  s_.reset();
}

std::unique_ptr<Backend> make_cuda_backend_on_stream_of(const CudaBackendOptions& options,
                                                        Backend& peer) {
  auto* p = dynamic_cast<CudaBackend*>(&peer);
  if (p == nullptr)
    throw_error(ErrorCode::kInvalidArgument,
                "make_cuda_backend_on_stream_of: the peer is a " + peer.name() + " backend");
  if (p->s_->options.device != options.device)
    throw_error(ErrorCode::kInvalidArgument,
                "make_cuda_backend_on_stream_of: the peer is on device " +
                    std::to_string(p->s_->options.device) + ", not " +
                    std::to_string(options.device));
  auto b = std::make_unique<CudaBackend>(options);
  CudaBackend::State& s = *b->s_;
  s.wait("make_cuda_backend_on_stream_of");  // nothing of its own stream is left in flight
  s.shared_stream->forget(&s.transfers);
  std::erase(s.shared_stream->users, &s);
  s.shared_stream = p->s_->shared_stream;  // its own stream goes with the last reference
  s.shared_stream->users.push_back(&s);
  s.stream = s.shared_stream->stream;
  cublas_check(cublasSetStream(s.cublas, s.stream), "cublasSetStream");
  return b;
}

// --- batch-invariant linear (cuBLASLt) --------------------------------------------------------

namespace {
constexpr size_t kLtWorkspaceBytes = 8u << 20;
constexpr size_t kFlushBytes = 128u << 20;  // > the H100's 50 MB L2
// n bf16 values in [-1, 1) (sign, exponent 126..127, random mantissa): the inputs of the GEMM
// tuning and of the chain GEMM check.
std::vector<uint16_t> tuning_input(size_t n, uint32_t state) {
  std::vector<uint16_t> h(n);
  for (auto& v : h) {
    state = state * 1664525u + 1013904223u;
    v = static_cast<uint16_t>(((state >> 16) & 0x807fu) | 0x3f00u);
  }
  return h;
}
// Row count the algorithm is chosen for; it is then checked and used at every row count.
constexpr int64_t kLtRepresentativeRows = 64;
}  // namespace

cublasLtMatrixLayout_t CudaBackend::State::lt_layout(cudaDataType type, int64_t rows,
                                                     int64_t cols) {
  const auto key = std::make_tuple(static_cast<int>(type), rows, cols);
  auto it = lt_layouts.find(key);
  if (it != lt_layouts.end()) return it->second;
  cublasLtMatrixLayout_t l = nullptr;  // column-major [rows, cols], ld = rows
  cublas_check(cublasLtMatrixLayoutCreate(&l, type, static_cast<uint64_t>(rows),
                                          static_cast<uint64_t>(cols), rows),
               "cublasLtMatrixLayoutCreate");
  lt_layouts.emplace(key, l);
  return l;
}

// Column-major view: out^T [O, N] = (w^T stored [K, O], op T) x (x^T [K, N]). The heuristic's
// candidates for N = kLtRepresentativeRows are taken in order; each is forced to one K split
// with no reduction scheme and kept if cuBLASLt accepts it at every probed N, so the kernel (and
// with it the per-element summation order over K) is the same for every row count.
const CudaBackend::State::LtAlgo& CudaBackend::State::lt_algo(int64_t out_features,
                                                              int64_t in_features,
                                                              const void* weight) {
  const auto key = std::make_pair(out_features, in_features);
  auto it = lt_algos.find(key);
  if (it != lt_algos.end()) return it->second;
  lt_workspace.ensure(kLtWorkspaceBytes, "linear workspace");
  cublasLtMatmulPreference_t pref = nullptr;
  cublas_check(cublasLtMatmulPreferenceCreate(&pref), "cublasLtMatmulPreferenceCreate");
  const uint64_t ws = kLtWorkspaceBytes;
  cublas_check(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES,
                                                    &ws, sizeof(ws)),
               "cublasLtMatmulPreferenceSetAttribute");
  const int64_t o = out_features, k = in_features;
  cublasLtMatrixLayout_t a = lt_layout(CUDA_R_16BF, k, o);
  constexpr int kCandidates = 32;
  cublasLtMatmulHeuristicResult_t results[kCandidates] = {};
  int found = 0;
  std::vector<LtAlgo> valid;
  const cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(
      lt, lt_desc, a, lt_layout(CUDA_R_16BF, k, kLtRepresentativeRows),
      lt_layout(CUDA_R_32F, o, kLtRepresentativeRows),
      lt_layout(CUDA_R_32F, o, kLtRepresentativeRows), pref, kCandidates, results, &found);
  cublasLtMatmulPreferenceDestroy(pref);
  cublas_check(st, "cublasLtMatmulAlgoGetHeuristic");
  // Each candidate forced to one K split without a reduction scheme (split-K candidates with
  // cuBLASLt's in-place, sequenced reduction were tried on the H100: cuBLAS 13 accepted none).
  for (int i = 0; i < found; ++i) {
    if (results[i].state != CUBLAS_STATUS_SUCCESS) continue;
    cublasLtMatmulAlgo_t algo = results[i].algo;
    const uint32_t one = 1, none = CUBLASLT_REDUCTION_SCHEME_NONE;
    if (cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &one,
                                             sizeof(one)) != CUBLAS_STATUS_SUCCESS ||
        cublasLtMatmulAlgoConfigSetAttribute(&algo, CUBLASLT_ALGO_CONFIG_REDUCTION_SCHEME, &none,
                                             sizeof(none)) != CUBLAS_STATUS_SUCCESS)
      continue;
    bool ok = true;
    for (int64_t n : {int64_t{1}, int64_t{3}, int64_t{17}, kLtRepresentativeRows, int64_t{512},
                      int64_t{4096}}) {
      cublasLtMatmulHeuristicResult_t check{};
      ok = ok &&
           cublasLtMatmulAlgoCheck(lt, lt_desc, a, lt_layout(CUDA_R_16BF, k, n),
                                   lt_layout(CUDA_R_32F, o, n), lt_layout(CUDA_R_32F, o, n), &algo,
                                   &check) == CUBLAS_STATUS_SUCCESS &&
           check.workspaceSize <= kLtWorkspaceBytes;
    }
    if (!ok) continue;
    uint32_t id = 0, tile = 0, stages = 0, splitk = 0, cluster = 0;
    size_t written = 0;
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_ID, &id, sizeof(id), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_TILE_ID, &tile, sizeof(tile),
                                         &written);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_STAGES_ID, &stages,
                                         sizeof(stages), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &splitk,
                                         sizeof(splitk), &written);
    cublasLtMatmulAlgoConfigGetAttribute(&algo, CUBLASLT_ALGO_CONFIG_CLUSTER_SHAPE_ID, &cluster,
                                         sizeof(cluster), &written);
    valid.push_back({algo, "candidate " + std::to_string(i) + " algo " + std::to_string(id) +
                               " tile " + std::to_string(tile) + " stages " +
                               std::to_string(stages) + " splitK " + std::to_string(splitk) +
                               " cluster " + std::to_string(cluster)});
  }
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capturing);
  if (valid.size() > 1 && weight != nullptr && options.tune_invariant_gemm &&
      capturing == cudaStreamCaptureStatusNone) {
    // Time every candidate at 1, 16 and 128 rows (the speed does not depend on the values)
    // with the weights cold, as in a decode step (L2 overwritten before each timed run), and
    // keep the one with the smallest score, time / best time at each size with the 1-row time
    // counted twice: the same algorithm serves every row count, so it must not be slow at any
    // of them, and one-row launches (decode at small batch) are the steady state. Scores within
    // 2% are a tie, which the faster 1-row time wins: on the H200 two candidates for 4096 x
    // 14336 (48 / 48 / 49 and 53 / 50 / 42 us) scored 1% apart and timing noise flipped the
    // pick between runs, batch-1 decode 197 vs 180 tok/s. A candidate whose row 0 differs
    // bitwise between the 1-row and the 128-row launch is dropped.
    const int64_t sizes[] = {1, 16, 128};
    DeviceBuffer x, y, y1, flush;
    x.ensure(static_cast<size_t>(128 * k) * 2, "linear tuning");
    y.ensure(static_cast<size_t>(128 * o) * 4, "linear tuning");
    y1.ensure(static_cast<size_t>(o) * 4, "linear tuning");
    flush.ensure(kFlushBytes, "linear tuning");
    {
      const std::vector<uint16_t> hx = tuning_input(static_cast<size_t>(128 * k), 12345u);
      copy_to_device(x.ptr, hx.data(), hx.size() * 2, "linear tuning");
    }
    std::vector<std::array<float, 3>> ms(valid.size(), {1e30f, 1e30f, 1e30f});
    std::vector<char> invariant(valid.size(), 1);
    std::vector<float> row_all(static_cast<size_t>(o)), row_one(static_cast<size_t>(o));
    for (size_t c = 0; c < valid.size(); ++c) {
      auto run = [&](int64_t n, void* out) {
        return lt_matmul(valid[c].algo, weight, o, k, x.ptr, n, out);
      };
      cublas_check(run(128, y.ptr), "linear tuning");
      cublas_check(run(1, y1.ptr), "linear tuning");
      d2h(row_all.data(), y.ptr, row_all.size() * 4, "linear tuning");
      d2h(row_one.data(), y1.ptr, row_one.size() * 4, "linear tuning");
      wait("linear tuning");
      invariant[c] = std::memcmp(row_all.data(), row_one.data(), row_all.size() * 4) == 0;
      if (!invariant[c]) continue;  // never picked: not worth timing
      for (int si = 0; si < 3; ++si)
        ms[c][static_cast<size_t>(si)] = best_cold_ms(
            flush, [&] { cublas_check(run(sizes[si], y.ptr), "linear tuning"); }, "linear tuning");
    }
    std::array<float, 3> fastest = {1e30f, 1e30f, 1e30f};
    for (const auto& t : ms)
      for (size_t si = 0; si < 3; ++si) fastest[si] = std::min(fastest[si], t[si]);
    std::vector<double> score(valid.size(), 1e300);
    double best_score = 1e300;
    for (size_t c = 0; c < valid.size(); ++c) {
      if (!invariant[c]) continue;
      score[c] = 2.0 * ms[c][0] / fastest[0] + ms[c][1] / fastest[1] + ms[c][2] / fastest[2];
      best_score = std::min(best_score, score[c]);
    }
    size_t pick = 0;
    float pick_one_row = 1e30f;
    for (size_t c = 0; c < valid.size(); ++c) {
      if (score[c] <= 1.02 * best_score && ms[c][0] < pick_one_row) {
        pick_one_row = ms[c][0];
        pick = c;
      }
    }
    char buf[128];
    std::snprintf(buf, sizeof(buf), " (tuned over %zu: %.1f / %.1f / %.1f us at 1 / 16 / 128 rows)",
                  valid.size(), ms[pick][0] * 1e3, ms[pick][1] * 1e3, ms[pick][2] * 1e3);
    valid[pick].words += buf;
    check_chain_gemm(valid[pick], o, k, weight);
    return lt_algos.emplace(key, valid[pick]).first->second;
  }
  if (!valid.empty()) {
    check_chain_gemm(valid[0], o, k, weight);
    return lt_algos.emplace(key, valid[0]).first->second;
  }
  throw_error(ErrorCode::kUnsupported, "linear: no cuBLASLt algorithm without split-K for out " +
                                           std::to_string(o) + ", in " + std::to_string(k) + " (" +
                                           std::to_string(found) +
                                           " candidates); use batch_invariant_gemm = 1");
}

cublasStatus_t CudaBackend::State::lt_matmul(const cublasLtMatmulAlgo_t& algo, const void* w,
                                             int64_t o, int64_t k, const void* x, int64_t n,
                                             void* y) {
  // Column-major view: y^T [o, n] = (w^T stored [k, o], op T) x (x^T [k, n]).
  const float alpha = 1.f, beta = 0.f;
  const cublasLtMatrixLayout_t lc = lt_layout(CUDA_R_32F, o, n);
  return cublasLtMatmul(lt, lt_desc, &alpha, w, lt_layout(CUDA_R_16BF, k, o), x,
                        lt_layout(CUDA_R_16BF, k, n), &beta, y, lc, y, lc, &algo, lt_workspace.ptr,
                        kLtWorkspaceBytes, stream);
}

void CudaBackend::State::copy_to_device(void* dst, const void* src, size_t bytes,
                                        const char* what) {
  cuda_check(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyHostToDevice, stream), what);
  transfers.h2d_bytes += static_cast<int64_t>(bytes);
  wait(what);
}

float CudaBackend::State::best_cold_ms(const DeviceBuffer& flush, const std::function<void()>& run,
                                       const char* what) {
  cudaEvent_t e0, e1;
  cuda_check(cudaEventCreate(&e0), what);
  cuda_check(cudaEventCreate(&e1), what);
  float best = 1e30f;
  for (int rep = 0; rep < 4; ++rep) {
    cuda_check(cudaMemsetAsync(flush.ptr, rep, flush.bytes, stream), what);
    cuda_check(cudaEventRecord(e0, stream), what);
    run();
    cuda_check(cudaEventRecord(e1, stream), what);
    cuda_check(cudaEventSynchronize(e1), what);
    float t = 0;
    cuda_check(cudaEventElapsedTime(&t, e0, e1), what);
    best = std::min(best, t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  return best;
}

void CudaBackend::State::check_chain_gemm(LtAlgo& a, int64_t o, int64_t k, const void* weight) {
  a.chain = false;
  // chain_gemm_max_rows 0: never (the tests' cuBLASLt-only references).
  a.max_rows = options.chain_gemm_max_rows > 0 && o * k * 2 <= options.chain_gemm_small_bytes
                   ? std::max(options.chain_gemm_max_rows, options.chain_gemm_small_max_rows)
                   : options.chain_gemm_max_rows;
  if (a.max_rows == 0 || weight == nullptr) return;
  cudaStreamCaptureStatus capturing = cudaStreamCaptureStatusNone;
  cudaStreamIsCapturing(stream, &capturing);
  if (capturing != cudaStreamCaptureStatusNone) return;  // cannot check: cuBLASLt it is
  constexpr int64_t kRows = kernels::kChainGemmMaxRows;
  const char* what = "chain gemm check";
  DeviceBuffer x, y_lt, y_chain;
  x.ensure(static_cast<size_t>(kRows * k) * 2, what);
  y_lt.ensure(static_cast<size_t>(kRows * o) * 4, what);
  y_chain.ensure(static_cast<size_t>(kRows * o) * 4, what);
  {
    const std::vector<uint16_t> hx = tuning_input(static_cast<size_t>(kRows * k), 777u);
    copy_to_device(x.ptr, hx.data(), hx.size() * 2, what);
  }
  auto run_chain = [&](int64_t n) {
    kernels::ChainGemmParams p{x.ptr, weight, static_cast<float*>(y_chain.ptr), n, k, o};
    p.small_tiling = options.chain_gemm_small_tiling;
    p.deep_tiling = options.chain_gemm_deep_tiling;
    cuda_check(kernels::launch_chain_gemm(p, stream), what);
  };
  const bool supported =
      kernels::chain_gemm_supported({x.ptr, weight, static_cast<float*>(y_chain.ptr), 1, k, o});
  std::string diff_words;
  bool same = supported;
  std::vector<float> h_lt(static_cast<size_t>(kRows * o)), h_chain(h_lt.size());
  for (int64_t n : {int64_t{1}, int64_t{9}, kRows}) {
    if (!same) break;
    const size_t count = static_cast<size_t>(n * o);
    cublas_check(lt_matmul(a.algo, weight, o, k, x.ptr, n, y_lt.ptr), what);
    cuda_check(cudaMemsetAsync(y_chain.ptr, 0xff, count * 4, stream), what);
    run_chain(n);
    d2h(h_lt.data(), y_lt.ptr, count * 4, what);
    d2h(h_chain.data(), y_chain.ptr, count * 4, what);
    wait(what);
    same = std::memcmp(h_lt.data(), h_chain.data(), count * 4) == 0;
    if (!same) {  // say how: a different order (a few ulps) or something worse
      size_t bad = 0;
      double worst = 0;
      for (size_t i = 0; i < count; ++i) {
        if (std::memcmp(&h_lt[i], &h_chain[i], 4) == 0) continue;
        ++bad;
        const double ref = h_lt[i];
        worst = std::max(worst, std::abs(ref - h_chain[i]) / (std::abs(ref) + 1e-30));
      }
      char buf[128];
      std::snprintf(buf, sizeof(buf), " (%lld rows: %zu of %zu elements, max rel %.1e)",
                    static_cast<long long>(n), bad, count, worst);
      diff_words = buf;
    }
  }
  if (!same) {
    a.words += supported ? "; chain GEMM: differs" + diff_words : "; chain GEMM: unsupported";
    return;
  }
  if (options.tune_invariant_gemm) {  // cold weights, as in a decode step
    DeviceBuffer flush;
    flush.ensure(kFlushBytes, what);
    const float lt_ms = best_cold_ms(
        flush, [&] { cublas_check(lt_matmul(a.algo, weight, o, k, x.ptr, 1, y_lt.ptr), what); },
        what);
    const float chain_ms = best_cold_ms(
        flush, [&] { run_chain(1); }, what);
    // Its gain in a step is larger than alone (its weights stream before the previous kernel
    // ends, programmatic launch); 5% slower alone is still taken.
    a.chain = chain_ms <= 1.05f * lt_ms;
    char buf[128];
    std::snprintf(buf, sizeof(buf), "; chain GEMM %.1f vs %.1f us at 1 row: ", chain_ms * 1e3,
                  lt_ms * 1e3);
    a.words += buf;
    if (!a.chain) {
      a.words += "not used";
      return;
    }
    a.words += "used";
  } else {
    a.chain = true;
    a.words += "; chain GEMM";
  }
  a.words += " at <= " + std::to_string(a.max_rows) + " rows";
}

std::string CudaBackend::batch_invariant_gemm_algo(int64_t out_features,
                                                   int64_t in_features) const {
  auto it = s_->lt_algos.find({out_features, in_features});
  return it == s_->lt_algos.end() ? "" : it->second.words;
}

std::string CudaBackend::tuning_report() const {
  std::string out;
  for (const auto& [shape, algo] : s_->lt_algos)
    out += "linear " + std::to_string(shape.first) + " x " + std::to_string(shape.second) + ": " +
           algo.words + "\n";
  return out;
}

std::unique_ptr<Backend> make_cuda_backend(const CudaBackendOptions& options) {
  return std::make_unique<CudaBackend>(options);
}

// --- tensor parallelism (NCCL) ------------------------------------------------------------------

#ifdef ARBOR_NCCL
namespace {
void nccl_check(ncclResult_t r, const char* what) {
  if (r != ncclSuccess)
    throw_error(ErrorCode::kInternal, std::string(what) + ": " + ncclGetErrorString(r));
}
}  // namespace
#endif

bool cuda_tensor_parallel_available() {
#ifdef ARBOR_NCCL
  return true;
#else
  return false;
#endif
}

std::vector<std::unique_ptr<Backend>> make_cuda_tp_backends(const CudaBackendOptions& options,
                                                            int size) {
  if (size < 1)
    throw_error(ErrorCode::kInvalidArgument,
                "tensor parallel size " + std::to_string(size) + " (expected >= 1)");
  std::vector<std::unique_ptr<Backend>> ranks;
  if (size == 1) {
    ranks.push_back(make_cuda_backend(options));
    return ranks;
  }
#ifndef ARBOR_NCCL
  throw_error(ErrorCode::kUnsupported,
              "tensor parallel size " + std::to_string(size) +
                  ": this build has no NCCL (install the nvidia-nccl-cu13 wheel or libnccl-dev "
                  "and configure again; docs/tensor_parallel.md)");
#else
  int count = 0;
  cuda_check(cudaGetDeviceCount(&count), "cudaGetDeviceCount");
  if (options.device < 0 || options.device + size > count)
    throw_error(ErrorCode::kInvalidArgument,
                "tensor parallel size " + std::to_string(size) + " needs GPUs " +
                    std::to_string(options.device) + ".." +
                    std::to_string(options.device + size - 1) + ", but " + std::to_string(count) +
                    (count == 1 ? " GPU is" : " GPUs are") + " visible");
  std::vector<int> devices;
  for (int r = 0; r < size; ++r) {
    CudaBackendOptions o = options;
    o.device = options.device + r;
    devices.push_back(o.device);
    ranks.push_back(std::make_unique<CudaBackend>(o));
  }
  std::vector<ncclComm_t> comms(static_cast<size_t>(size));
  nccl_check(ncclCommInitAll(comms.data(), size, devices.data()), "ncclCommInitAll");
  for (int r = 0; r < size; ++r) {
    CudaBackend::State& s = *static_cast<CudaBackend&>(*ranks[static_cast<size_t>(r)]).s_;
    s.nccl_comm = comms[static_cast<size_t>(r)];
    s.tp_rank = r;
    s.tp_size = size;
  }
  cuda_check(cudaSetDevice(options.device), "cudaSetDevice");
  return ranks;
#endif
}

int CudaBackend::tp_rank() const {
  return s_->tp_rank;
}

int CudaBackend::tp_size() const {
  return s_->tp_size;
}

void CudaBackend::bind_thread() {
  cuda_check(cudaSetDevice(s_->options.device), "cudaSetDevice");
}

void CudaBackend::all_reduce_sum(const Tensor& x) {
  s_->flush();
  State& s = *s_;
  if (s.tp_size == 1) return;
  if (x.dtype != DType::kF32)
    throw_error(ErrorCode::kInvalidArgument, "all_reduce_sum: fp32 tensors only");
#ifdef ARBOR_NCCL
  nccl_check(ncclAllReduce(x.data, x.data, static_cast<size_t>(x.numel()), ncclFloat32, ncclSum,
                           static_cast<ncclComm_t>(s.nccl_comm), s.stream),
             "ncclAllReduce");
#endif
}

void CudaBackend::all_gather_cols(const Tensor& local, const Tensor& out) {
  s_->flush();
  State& s = *s_;
  const int64_t c = local.cols, w = out.cols;
  if (local.rows != out.rows || local.dtype != DType::kF32 || out.dtype != DType::kF32 ||
      c * s.tp_size < w || c * (s.tp_size - 1) >= w)
    throw_error(ErrorCode::kInvalidArgument, "all_gather_cols: local " + shape(local) + " on " +
                                                 std::to_string(s.tp_size) + " ranks for out " +
                                                 shape(out));
  if (s.tp_size == 1) {
    cuda_check(cudaMemcpyAsync(out.data, local.data, static_cast<size_t>(out.numel()) * 4,
                               cudaMemcpyDeviceToDevice, s.stream),
               "all_gather_cols");
    return;
  }
#ifdef ARBOR_NCCL
  const Tensor gathered = scratch(s.tp_size * local.rows, c);  // [rank][rows][c]
  nccl_check(ncclAllGather(local.data, gathered.data, static_cast<size_t>(local.numel()),
                           ncclFloat32, static_cast<ncclComm_t>(s.nccl_comm), s.stream),
             "ncclAllGather");
  for (int r = 0; r < s.tp_size; ++r) {
    const int64_t width = std::min(c, w - r * c);
    cuda_check(cudaMemcpy2DAsync(static_cast<float*>(out.data) + r * c, w * 4,
                                 static_cast<const float*>(gathered.data) + r * local.rows * c,
                                 c * 4, width * 4, local.rows, cudaMemcpyDeviceToDevice, s.stream),
               "all_gather_cols");
  }
#endif
}

void CudaBackend::embedding_shard(const Tensor& table, int64_t first_id, const Tensor& out) {
  s_->flush();
  State& s = *s_;
  require_step(s.has_step, "embedding_shard");
  if (out.rows != s.step.num_tokens() || out.cols != table.cols)
    throw_error(ErrorCode::kInvalidArgument, "embedding_shard: out " + shape(out) + " for " +
                                                 std::to_string(s.step.num_tokens()) +
                                                 " tokens and table " + shape(table));
  kernels::GatherRowsParams p;
  p.src = table.data;
  p.dst = out.data;
  p.index = s.d_token_ids;
  p.src_type = elem(table.dtype);
  p.dst_type = elem(out.dtype);
  p.num_rows = out.rows;
  p.cols = out.cols;
  p.index_offset = first_id;
  p.src_rows = table.rows;
  cuda_check(kernels::launch_gather_rows(p, s.stream), "embedding_shard");
}

Tensor CudaBackend::upload_weight_shard(const HostTensor& full, const WeightShard& shard) {
  const bool dummy = s_->options.random_weights && full.data.empty() && !full.shape.empty();
  if (!dummy) return Backend::upload_weight_shard(full, shard);
  // The unsharded dummy weight's values at the shard's elements (FillRandomParams::index_base):
  // a rank holds exactly what a single GPU would. Each dummy upload takes the next seed.
  s_->flush();
  const std::vector<int64_t> shape_of = weight_shard_shape(full.shape, shard);
  const bool vector = full.shape.size() == 1;
  const int64_t full_cols = vector ? 1 : full.shape[1];
  Tensor t;  // vectors are [1, n] and stay fp32
  t.rows = vector ? 1 : shape_of[0];
  t.cols = vector ? shape_of[0] : shape_of[1];
  t.dtype = vector ? DType::kF32 : DType::kBF16;
  const size_t bytes = static_cast<size_t>(t.numel()) * (vector ? 4 : 2);
  cuda_check(cudaMalloc(&t.data, std::max<size_t>(bytes, 16)), "upload_weight_shard");
  s_->weights.push_back(t.data);
  kernels::FillRandomParams p;
  p.dst_type = vector ? kernels::ElemType::kF32 : kernels::ElemType::kBF16;
  p.seed = s_->random_weight_seed++;
  p.scale = vector ? 0.1f : std::sqrt(3.0f / static_cast<float>(full_cols));
  p.offset = vector ? 1.0f : 0.0f;
  const size_t elem_bytes = vector ? 4 : 2;
  if (shard.col_count >= 0) {
    p.dst = t.data;
    p.n = full.shape[0] * shard.col_count;
    p.cols = shard.col_count;
    p.src_stride = full_cols;
    p.index_base = shard.col_begin;
    cuda_check(kernels::launch_fill_random(p, s_->stream), "upload_weight_shard (random)");
  } else {
    char* dst = static_cast<char*>(t.data);
    for (const auto& [begin, count] : shard.row_ranges) {
      p.dst = dst;
      p.n = count * full_cols;
      p.index_base = begin * full_cols;
      cuda_check(kernels::launch_fill_random(p, s_->stream), "upload_weight_shard (random)");
      dst += static_cast<size_t>(count * full_cols) * elem_bytes;
    }
    if (shard.pad_rows > 0)
      cuda_check(
          cudaMemsetAsync(dst, 0, static_cast<size_t>(shard.pad_rows * full_cols) * elem_bytes,
                          s_->stream),
          "upload_weight_shard");
  }
  s_->wait("upload_weight_shard (random)");
  return t;
}

void CudaBackend::set_random_weight_seed(uint64_t seed) {
  s_->random_weight_seed = seed;
}

void* CudaBackend::stream_handle() const {
  return s_->stream;
}

void CudaBackend::flush() {
  s_->flush();
}

TransferStats CudaBackend::transfer_stats() const {
  return s_->transfers;
}

void CudaBackend::synchronize() {
  s_->flush();
  s_->wait("cudaStreamSynchronize");
}

// --- memory -------------------------------------------------------------------------------

Tensor CudaBackend::upload_weight(const HostTensor& w) {
  s_->flush();
  Tensor t;
  t.rows = w.shape.empty() ? 0 : w.shape[0];
  t.cols = w.shape.size() >= 2 ? w.numel() / std::max<int64_t>(t.rows, 1) : 1;
  if (w.shape.size() == 1) {  // vectors are [1, n] and stay fp32
    t.rows = 1;
    t.cols = w.shape[0];
  }
  const bool vector = w.shape.size() <= 1;
  t.dtype = vector ? DType::kF32 : DType::kBF16;
  if (s_->options.random_weights && w.data.empty() && !w.shape.empty()) {
    WeightShard all;  // a dummy weight is its own one shard
    all.row_ranges = {{0, w.shape[0]}};
    return upload_weight_shard(w, all);
  }
  const size_t bytes = static_cast<size_t>(w.numel()) * (vector ? 4 : 2);
  void* ptr = nullptr;
  cuda_check(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)), "upload_weight");
  s_->weights.push_back(ptr);
  if (vector) {
    s_->copy_to_device(ptr, w.data.data(), bytes, "upload_weight");
  } else {
    std::vector<uint16_t> h(static_cast<size_t>(w.numel()));
    for (size_t i = 0; i < h.size(); ++i) h[i] = f32_to_bf16(w.data[i]);
    s_->copy_to_device(ptr, h.data(), bytes, "upload_weight");
  }
  t.data = ptr;
  return t;
}

Tensor CudaBackend::persistent(int64_t rows, int64_t cols) {
  s_->flush();
  void* ptr = nullptr;
  const size_t bytes = static_cast<size_t>(rows * cols) * 4;
  cuda_check(cudaMalloc(&ptr, std::max<size_t>(bytes, 16)), "persistent");
  s_->weights.push_back(ptr);  // freed with the weights
  return Tensor{ptr, DType::kF32, rows, cols};
}

void CudaBackend::gather_rows(const Tensor& src, std::span<const int32_t> rows, const Tensor& out) {
  s_->flush();
  State& s = *s_;
  if (out.rows != static_cast<int64_t>(rows.size()) || out.cols != src.cols ||
      src.dtype != DType::kF32 || out.dtype != DType::kF32)
    throw_error(ErrorCode::kInvalidArgument, "gather_rows: src " + shape(src) + ", " +
                                                 std::to_string(rows.size()) + " rows, out " +
                                                 shape(out));
  for (int32_t r : rows)
    if (r < 0 || r >= src.rows)
      throw_error(ErrorCode::kInvalidArgument,
                  "gather_rows: row " + std::to_string(r) + " of " + shape(src));
  if (rows.empty()) return;
  s.row_index.ensure(rows.size() * 4, "gather_rows");
  s.uploads.copy(s.row_index.ptr, rows.data(), rows.size() * 4, s.stream, "gather_rows");
  s.transfers.h2d_bytes += static_cast<int64_t>(rows.size() * 4);
  kernels::GatherRowsParams p;
  p.src = src.data;
  p.dst = out.data;
  p.index = static_cast<const int32_t*>(s.row_index.ptr);
  p.num_rows = out.rows;
  p.cols = out.cols;
  cuda_check(kernels::launch_gather_rows(p, s.stream), "gather_rows");
}

Tensor CudaBackend::scratch(int64_t rows, int64_t cols) {
  if (rows < 0 || cols < 0)
    throw_error(ErrorCode::kInvalidArgument, "scratch: negative shape [" + std::to_string(rows) +
                                                 ", " + std::to_string(cols) + "]");
  const size_t bytes = align_up(static_cast<size_t>(rows * cols) * 4 + 1, 256);
  State& s = *s_;
  s.step_scratch_bytes += bytes;
  while (s.chunk_index < s.chunks.size() && s.chunk_used + bytes > s.chunks[s.chunk_index].bytes) {
    ++s.chunk_index;
    s.chunk_used = 0;
  }
  if (s.chunk_index == s.chunks.size()) {
    State::Chunk c{nullptr, std::max<size_t>(bytes, 64u << 20)};
    cuda_check(cudaMalloc(&c.ptr, c.bytes), "scratch");
    ++s.epoch;
    trace_memory("moved", "scratch chunk", c.bytes, c.ptr, &s.epoch);
    s.chunks.push_back(c);
    s.chunk_used = 0;
  }
  void* ptr = static_cast<uint8_t*>(s.chunks[s.chunk_index].ptr) + s.chunk_used;
  s.chunk_used += bytes;
  return Tensor{ptr, DType::kF32, rows, cols};
}

void CudaBackend::reset_scratch() {
  s_->flush();
  State& s = *s_;
  if (s.chunks.size() > 1) {  // the step outgrew one chunk: replace them with one that fits
    s.wait("reset_scratch");
    size_t total = 0;
    for (auto& c : s.chunks) {
      total += c.bytes;
      cuda_check(cudaFree(c.ptr), "reset_scratch");
    }
    s.chunks.clear();
    State::Chunk c{nullptr, std::max(total, s.step_scratch_bytes)};
    cuda_check(cudaMalloc(&c.ptr, c.bytes), "reset_scratch");
    s.chunks.push_back(c);
    ++s.epoch;
    trace_memory("moved", "scratch", c.bytes, c.ptr, &s.epoch);
  }
  s.chunk_index = 0;
  s.chunk_used = 0;
  s.step_scratch_bytes = 0;
}

void CudaBackend::download(const Tensor& src, float* dst) {
  s_->flush();
  State& s = *s_;
  const size_t n = static_cast<size_t>(src.numel());
  const void* from = src.data;
  if (src.dtype != DType::kF32) {
    s.convert.ensure(n * 4 + 16, "download");
    cuda_check(kernels::launch_convert({src.data, s.convert.ptr, elem(src.dtype),
                                        kernels::ElemType::kF32, static_cast<int64_t>(n)},
                                       s.stream),
               "download convert");
    from = s.convert.ptr;
  }
  s.d2h(dst, from, n * 4, "download");
  s.wait("download");
}

void CudaBackend::upload(const float* src, const Tensor& dst) {
  s_->flush();
  State& s = *s_;
  const size_t n = static_cast<size_t>(dst.numel());
  // Up to 16 MiB goes through the pinned ring and returns at once (the copy is ordered on the
  // stream before every later op); larger uploads (test inputs, not steps) are waited for.
  constexpr size_t kStagedMax = size_t{16} << 20;
  const bool staged = n * 4 <= kStagedMax;
  void* to = dst.data;
  if (dst.dtype != DType::kF32) {
    s.convert.ensure(n * 4 + 16, "upload");
    to = s.convert.ptr;
  }
  s.transfers.h2d_bytes += static_cast<int64_t>(n * 4);
  if (staged)
    s.uploads.copy(to, src, n * 4, s.stream, "upload");
  else
    cuda_check(cudaMemcpyAsync(to, src, n * 4, cudaMemcpyHostToDevice, s.stream), "upload");
  if (dst.dtype != DType::kF32)
    cuda_check(kernels::launch_convert({s.convert.ptr, dst.data, kernels::ElemType::kF32,
                                        elem(dst.dtype), static_cast<int64_t>(n)},
                                       s.stream),
               "upload convert");
  if (!staged) s.wait("upload");
}

int64_t CudaBackend::kv_cache_bytes(const KvCacheShape& shape) const {
  const long double bytes = 2.0L * shape.num_layers * shape.num_blocks * shape.block_size *
                            shape.num_kv_heads * shape.head_dim * 2;  // bf16 / f16
  return bytes >= 9.0e18L ? INT64_MAX : static_cast<int64_t>(bytes);
}

MemoryInfo CudaBackend::memory_info() const {
  size_t free = 0, total = 0;
  int current = 0;
  cuda_check(cudaGetDevice(&current), "cudaGetDevice");
  cuda_check(cudaSetDevice(s_->options.device), "cudaSetDevice");
  cuda_check(cudaMemGetInfo(&free, &total), "cudaMemGetInfo");
  cuda_check(cudaSetDevice(current), "cudaSetDevice");
  return {static_cast<int64_t>(total), static_cast<int64_t>(free), s_->device_name};
}

void CudaBackend::allocate_kv(const KvCacheShape& shape) {
  s_->flush();
  check_kv_cache_shape(shape);
  if (shape.head_dim % 2 != 0 || shape.head_dim > kernels::kAttnMaxGenericHeadDim)
    throw_error(ErrorCode::kUnsupported,
                "allocate_kv: head_dim " + std::to_string(shape.head_dim) +
                    " is not supported by the CUDA attention (even, at most " +
                    std::to_string(kernels::kAttnMaxGenericHeadDim) + ")");
  State& s = *s_;
  s.wait("allocate_kv");
  // The cache being replaced is freed first when the new one is larger (DeviceBuffer::ensure).
  check_kv_cache_fits(shape, kv_cache_bytes(shape),
                      memory_info().free_bytes + static_cast<int64_t>(s.kv.bytes), memory_info());
  const bool same_shape = s.kv.ptr != nullptr && shape == kv_shape_;
  kv_shape_ = shape;
  s.num_slots = shape.num_blocks * shape.block_size;
  s.kv_width = shape.num_kv_heads * shape.head_dim;
  const size_t bytes = static_cast<size_t>(2 * shape.num_layers * s.num_slots * s.kv_width) * 2;
  const void* before = s.kv.ptr;
  s.kv.ensure(bytes, "allocate_kv");
  // A cache of the same shape in the same memory (a new engine on this backend: spec-bench's
  // runs, a generator per batch) keeps the step graphs recorded over the old one: they read the
  // planes through the same addresses and geometry. Anything else moves them.
  if (!same_shape || s.kv.ptr != before) {
    ++s.epoch;
    trace_memory("moved", "kv cache", s.kv.bytes, s.kv.ptr, &s.epoch);
  }
  cuda_check(cudaMemsetAsync(s.kv.ptr, 0, bytes, s.stream), "allocate_kv");
  s.wait("allocate_kv");
}

void CudaBackend::poison_kv() {
  s_->flush();
  State& s = *s_;
  const size_t bytes = static_cast<size_t>(2 * kv_shape_.num_layers * s.num_slots * s.kv_width) * 2;
  // 0xFFFF is a NaN in both bf16 and fp16.
  cuda_check(cudaMemsetAsync(s.kv.ptr, 0xFF, bytes, s.stream), "poison_kv");
  synchronize();
}

void CudaBackend::download_kv(int64_t layer, std::vector<float>* k, std::vector<float>* v) {
  State& s = *s_;
  ARBOR_CHECK(layer >= 0 && layer < kv_shape_.num_layers);
  const int64_t n = s.num_slots * s.kv_width;
  for (int plane = 0; plane < 2; ++plane) {
    const void* src = static_cast<uint8_t*>(s.kv.ptr) + (2 * layer + plane) * n * 2;
    const Tensor t{const_cast<void*>(src),
                   s.kv_type == kernels::ElemType::kF16 ? DType::kF16 : DType::kBF16, s.num_slots,
                   s.kv_width};
    std::vector<float>* dst = plane == 0 ? k : v;
    dst->resize(static_cast<size_t>(n));
    download(t, dst->data());
  }
}

int32_t CudaBackend::last_attention_splits() const {
  return s_->last_splits;
}
bool CudaBackend::last_attention_tensor_core() const {
  return s_->last_tensor_core;
}
int64_t CudaBackend::splits_consumed_in_place() const {
  return s_->splits_in_place;
}

int64_t CudaBackend::chain_gemm_launches() const {
  return s_->chain_launches;
}

bool CudaBackend::last_attention_wgmma() const {
  return s_->last_wgmma;
}
bool CudaBackend::last_attention_wide() const {
  return s_->last_wide;
}
int CudaBackend::last_attention_tree_groups() const {
  return s_->last_tree_groups;
}

// --- step metadata ---------------------------------------------------------------------------

void CudaBackend::set_step(const StepInputs& step) {
  s_->flush();
  if (kv_shape_.num_layers == 0)
    throw_error(ErrorCode::kInvalidArgument, "set_step: allocate_kv() must come first");
  step.validate(kv_shape_);
  State& s = *s_;
  const int32_t r_count = step.num_requests();
  for (int32_t r = 0; r < r_count; ++r) {
    const int32_t t = step.qo_indptr[r + 1] - step.qo_indptr[r];
    if (step.mask_indptr[r + 1] != step.mask_indptr[r] && t > s.options.max_tree_nodes)
      throw_error(ErrorCode::kInvalidArgument, "set_step: request " + std::to_string(r) +
                                                   " has a tree of " + std::to_string(t) +
                                                   " nodes, the CUDA backend supports at most " +
                                                   std::to_string(s.options.max_tree_nodes));
    if (!step.parent_source_index.empty() && t > kernels::kMaxTreeLayoutNodes)
      throw_error(ErrorCode::kInvalidArgument,
                  "set_step: request " + std::to_string(r) + " has more than " +
                      std::to_string(kernels::kMaxTreeLayoutNodes) +
                      " rows, the most a tree with parents on the device may have");
  }
  s.step = step;
  s.has_step = true;
  std::vector<int32_t> token_request(step.token_ids.size());
  for (int32_t r = 0; r < r_count; ++r)
    for (int32_t i = step.qo_indptr[r]; i < step.qo_indptr[r + 1]; ++i) token_request[i] = r;

  // Per-request sections are laid out for graph_request_capacity(R) requests, so the offsets of
  // the sections after them move only when that capacity does (a step graph's key holds it, not
  // R).
  const auto cap = static_cast<size_t>(graph_request_capacity(r_count));
  const auto width = static_cast<size_t>(step.max_blocks_per_request);
  Packer pk;
  const size_t o_ids = pk.add(step.token_ids), o_pos = pk.add(step.positions),
               o_slots = pk.add(step.slot_mapping), o_qo = pk.add(step.qo_indptr, cap + 1),
               o_committed = pk.add(step.committed_len, cap),
               o_tables = pk.add(step.block_tables, cap * width),
               o_mask_ptr = pk.add(step.mask_indptr, cap + 1), o_logits = pk.add(step.logits_rows),
               o_treq = pk.add(token_request);
  // The tree masks last: their size depends on how the tokens split into trees, which a step
  // graph's key leaves out, so it must not move the other sections.
  const size_t o_mask = pk.add(step.tree_mask);
  // Key paths after them (draft steps have no tree masks, so their offsets are steady too).
  const bool paths = !step.key_path_base.empty();
  const size_t o_kp_base = paths ? pk.add(step.key_path_base, cap) : 0,
               o_kp_indptr = paths ? pk.add(step.key_path_indptr, cap + 1) : 0,
               o_kp = paths ? pk.add(step.key_path) : 0;
  uint8_t* host = s.meta.begin(pk.size(), "set_step");
  pk.write(host);
  s.meta.commit(pk.size(), s.stream, "set_step");
  s.transfers.h2d_bytes += static_cast<int64_t>(pk.size());
  s.d_token_ids = s.meta_ptr<int32_t>(o_ids);
  s.d_positions = s.meta_ptr<int32_t>(o_pos);
  s.d_slots = s.meta_ptr<int64_t>(o_slots);
  s.d_qo_indptr = s.meta_ptr<int32_t>(o_qo);
  s.d_committed = s.meta_ptr<int32_t>(o_committed);
  s.d_block_tables = s.meta_ptr<int32_t>(o_tables);
  s.d_tree_mask = s.meta_ptr<uint32_t>(o_mask);
  s.d_mask_indptr = s.meta_ptr<int32_t>(o_mask_ptr);
  s.d_logits_rows = s.meta_ptr<int32_t>(o_logits);
  s.d_token_request = s.meta_ptr<int32_t>(o_treq);
  s.d_key_path_base = paths ? s.meta_ptr<int32_t>(o_kp_base) : nullptr;
  s.d_key_path_indptr = paths ? s.meta_ptr<int32_t>(o_kp_indptr) : nullptr;
  s.d_key_path = paths ? const_cast<int32_t*>(s.meta_ptr<int32_t>(o_kp)) : nullptr;
  s.plan_valid = false;
  if (!step.token_source_index.empty()) {
    // The drafter's ids into the uploaded token ids, on the device (outside any recording: a
    // step graph reads them from the same address).
    const size_t bytes = step.token_source_index.size() * 8;
    std::memcpy(s.token_index.begin(bytes, "set_step token ids"), step.token_source_index.data(),
                bytes);
    s.token_index.commit(bytes, s.stream, "set_step token ids");
    s.transfers.h2d_bytes += static_cast<int64_t>(bytes);
    cuda_check(kernels::launch_gather_ids(static_cast<const int32_t*>(step.token_source.data),
                                          static_cast<const int64_t*>(s.token_index.device.ptr),
                                          const_cast<int32_t*>(s.d_token_ids),
                                          static_cast<int64_t>(bytes / 8), s.stream),
               "set_step token ids");
  }
  if (!step.parent_source_index.empty()) {
    // Trees whose parents a drafter left on the device: their positions and mask rows rebuilt
    // there, before any op reads them.
    const size_t bytes = step.parent_source_index.size() * 8;
    std::memcpy(s.parent_index.begin(bytes, "set_step tree parents"),
                step.parent_source_index.data(), bytes);
    s.parent_index.commit(bytes, s.stream, "set_step tree parents");
    s.transfers.h2d_bytes += static_cast<int64_t>(bytes);
    kernels::TreeLayoutParams p;
    p.parent_source = static_cast<const int32_t*>(step.token_source.data);
    p.parent_index = static_cast<const int64_t*>(s.parent_index.device.ptr);
    p.qo_indptr = s.d_qo_indptr;
    p.mask_indptr = s.d_mask_indptr;
    p.tree_mask = const_cast<uint32_t*>(s.d_tree_mask);
    p.positions = const_cast<int32_t*>(s.d_positions);
    p.num_requests = r_count;
    cuda_check(kernels::launch_tree_layout(p, s.stream), "set_step tree parents");
  }
}

// --- ops ----------------------------------------------------------------------------------

void CudaBackend::embedding(const Tensor& table, const Tensor& out) {
  s_->flush();
  State& s = *s_;
  require_step(s.has_step, "embedding");
  if (out.rows != s.step.num_tokens() || out.cols != table.cols)
    throw_error(ErrorCode::kInvalidArgument, "embedding: out " + shape(out) + " for " +
                                                 std::to_string(s.step.num_tokens()) +
                                                 " tokens and table " + shape(table));
  for (int32_t id : s.step.token_ids)
    if (id < 0 || id >= table.rows)
      throw_error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                   " is outside the vocabulary of " +
                                                   std::to_string(table.rows));
  embedding_shard(table, 0, out);  // the whole table: every (checked) id is inside it
}

void CudaBackend::rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out) {
  check_same_shape(x, out, "rms_norm");
  if (weight.numel() != x.cols || weight.dtype != DType::kF32)
    throw_error(ErrorCode::kInvalidArgument, "rms_norm: weight " + shape(weight) + " for rows of " +
                                                 std::to_string(x.cols) +
                                                 " (an fp32 vector expected)");
  State& s = *s_;
  if (s.add_pending && s.pending_add.out == x.data && s.pending_add.n == x.numel() &&
      x.dtype == DType::kF32 && out.dtype == DType::kF32) {
    // The residual add just before, fused: same arithmetic, one launch.
    s.add_pending = false;
    kernels::AddRmsNormParams f;
    f.a = static_cast<const float*>(s.pending_add.a);
    f.b = static_cast<const float*>(s.pending_add.b);
    f.sum = static_cast<float*>(x.data);
    f.weight = static_cast<const float*>(weight.data);
    f.out = static_cast<float*>(out.data);
    f.rows = x.rows;
    f.cols = x.cols;
    f.eps = static_cast<float>(eps);
    s.flush();
    f.out_bf16 = s.bf16_copy_for(out.data, out.numel());
    cuda_check(kernels::launch_add_rms_norm(f, s.stream), "add + rms_norm");
    return;
  }
  s.flush();
  kernels::RmsNormParams p;
  p.x = x.data;
  p.weight = static_cast<const float*>(weight.data);
  p.out = out.data;
  p.x_type = elem(x.dtype);
  p.out_type = elem(out.dtype);
  p.rows = x.rows;
  p.cols = x.cols;
  p.eps = static_cast<float>(eps);
  if (out.dtype == DType::kF32) p.out_bf16 = s.bf16_copy_for(out.data, out.numel());
  cuda_check(kernels::launch_rms_norm(p, s_->stream), "rms_norm");
}

void CudaBackend::linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) {
  State& s = *s_;
  if (x.cols != w.cols || out.rows != x.rows || out.cols != w.rows)
    throw_error(ErrorCode::kInvalidArgument,
                "linear: x " + shape(x) + ", w " + shape(w) + ", out " + shape(out));
  if (w.dtype != DType::kBF16 || out.dtype != DType::kF32)
    throw_error(ErrorCode::kUnsupported, "linear: needs a bf16 weight and an f32 output, got w " +
                                             shape(w) + " and out " + shape(out));
  if (bias.data != nullptr && (bias.numel() != w.rows || bias.dtype != DType::kF32))
    throw_error(ErrorCode::kInvalidArgument,
                "linear: bias " + shape(bias) + " for " + std::to_string(w.rows) + " outputs");
  if (x.rows == 0) return;
  // The op just before wrote x's bf16 copy into gemm_input (bf16_copy_for): no conversion.
  const bool have_bf16_copy =
      x.dtype == DType::kF32 && s.bf16_copy_of == x.data && s.bf16_copy_numel == x.numel();
  if (x.dtype == DType::kF32 && x.rows <= s.options.skinny_gemm_max_rows &&
      !s.options.batch_invariant) {
    const kernels::SkinnyGemmSegment seg{w.data, static_cast<const float*>(bias.data),
                                         static_cast<float*>(out.data), w.rows};
    auto disjoint = [](const void* a, int64_t a_bytes, const void* b, int64_t b_bytes) {
      const auto pa = reinterpret_cast<uintptr_t>(a), pb = reinterpret_cast<uintptr_t>(b);
      return pa + static_cast<uintptr_t>(a_bytes) <= pb ||
             pb + static_cast<uintptr_t>(b_bytes) <= pa;
    };
    const int64_t out_bytes = out.numel() * 4;
    kernels::SkinnyGemmParams& pg = s.pending_gemm;
    bool join = s.gemm_pending && pg.x == x.data && pg.rows == x.rows && pg.in_features == x.cols &&
                pg.num_segments < kernels::kSkinnyGemmMaxSegments &&
                disjoint(out.data, out_bytes, x.data, x.numel() * 4);
    for (int i = 0; join && i < pg.num_segments; ++i)
      join = disjoint(out.data, out_bytes, pg.seg[i].out, pg.seg[i].out_features * x.rows * 4);
    if (join) {  // another matrix reading the same x (Q/K/V, gate/up): one launch
      pg.seg[pg.num_segments++] = seg;
      if (kernels::skinny_gemm_supported(pg)) return;
      --pg.num_segments;
    }
    s.flush();
    kernels::SkinnyGemmParams p;
    p.x = static_cast<const float*>(x.data);
    p.rows = static_cast<int32_t>(x.rows);
    p.in_features = x.cols;
    p.seg[0] = seg;
    p.num_segments = 1;
    if (kernels::skinny_gemm_supported(p)) {
      pg = p;
      s.gemm_pending = true;
      return;
    }
  }
  s.flush();
  const void* xin = x.data;
  if (x.dtype != DType::kBF16) {  // round the activations to bf16 for the tensor cores
    xin = s.gemm_input_for(x.numel());
    if (!have_bf16_copy)
      cuda_check(kernels::launch_convert(
                     {x.data, s.gemm_input.ptr, elem(x.dtype), kernels::ElemType::kBF16, x.numel()},
                     s.stream),
                 "linear convert");
  }
  const float alpha = 1.f, beta = 0.f;
  float* const y = static_cast<float*>(out.data);
  kernels::ChunkedGemmParams cp{xin, w.data, y, x.rows, x.cols, w.rows};
  cp.wgmma_mode = s.options.chunked_gemm_wgmma;
  // The chunked kernel's support depends only on the shape (K % 32) and on alignments that
  // every backend buffer has, so one (out, in) shape always takes the same path.
  if (s.options.batch_invariant && s.options.batch_invariant_gemm == 2 &&
      kernels::chunked_gemm_supported(cp)) {
    cuda_check(kernels::launch_chunked_gemm(cp, s.stream), "linear (chunked)");
  } else if (s.options.batch_invariant && s.options.batch_invariant_gemm == 1) {
    const kernels::BatchInvariantGemmParams p{xin, w.data, y, x.rows, x.cols, w.rows};
    if (x.cols % 2 != 0)
      throw_error(ErrorCode::kUnsupported,
                  "linear: the batch-invariant kernel needs an even in_features, got " + shape(w));
    cuda_check(kernels::launch_batch_invariant_gemm(p, s.stream), "linear (batch-invariant)");
  } else if (s.options.batch_invariant) {
    const State::LtAlgo& algo = s.lt_algo(w.rows, w.cols, w.data);
    kernels::ChainGemmParams chp{xin, w.data, y, x.rows, x.cols, w.rows};
    chp.small_tiling = s.options.chain_gemm_small_tiling;
    chp.deep_tiling = s.options.chain_gemm_deep_tiling;
    if (algo.chain && x.rows <= algo.max_rows &&
        kernels::chain_gemm_supported(chp)) {  // the same bits as the cuBLASLt call below
      cuda_check(kernels::launch_chain_gemm(chp, s.stream), "linear (chain)");
      ++s.chain_launches;
    } else {
      cublas_check(s.lt_matmul(algo.algo, w.data, w.rows, w.cols, xin, x.rows, out.data),
                   "linear (cuBLASLt)");
    }
  } else {
    // Column-major view: out^T [O, N] = w [O, I] (stored as w^T, so op T) x x^T [I, N].
    cublas_check(cublasGemmEx(s.cublas, CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows),
                              static_cast<int>(x.rows), static_cast<int>(x.cols), &alpha, w.data,
                              CUDA_R_16BF, static_cast<int>(w.cols), xin, CUDA_R_16BF,
                              static_cast<int>(x.cols), &beta, out.data, CUDA_R_32F,
                              static_cast<int>(out.cols), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 "linear");
  }
  if (bias.data != nullptr) {
    kernels::AddBiasParams p;
    p.out = out.data;
    p.bias = static_cast<const float*>(bias.data);
    p.rows = out.rows;
    p.cols = out.cols;
    cuda_check(kernels::launch_add_bias(p, s.stream), "linear bias");
  }
}

void CudaBackend::split_cols(const Tensor& x, const std::vector<Tensor>& outs) {
  State& s = *s_;
  s.flush();
  if (x.dtype != DType::kF32 || outs.empty() || outs.size() > 3 || x.rows > 65535)
    throw_error(ErrorCode::kInvalidArgument, "split_cols: x " + shape(x) + " " +
                                                 dtype_name(x.dtype) + " into " +
                                                 std::to_string(outs.size()) + " outputs");
  kernels::SplitColsParams p;
  p.x = static_cast<const float*>(x.data);
  p.rows = x.rows;
  int64_t total = 0;
  for (size_t j = 0; j < outs.size(); ++j) {
    if (outs[j].rows != x.rows || outs[j].dtype != DType::kF32)
      throw_error(ErrorCode::kInvalidArgument,
                  "split_cols: output " + shape(outs[j]) + " for x " + shape(x));
    p.out[j] = static_cast<float*>(outs[j].data);
    p.width[j] = outs[j].cols;
    total += outs[j].cols;
  }
  if (total != x.cols)
    throw_error(ErrorCode::kInvalidArgument,
                "split_cols: output widths sum to " + std::to_string(total) + ", x " + shape(x));
  // Launched by the next op unless that is RoPE / SiLU * up of the outputs (options.defer_split
  // off: at once, for A/B measurements).
  if (!s.options.defer_split) {
    cuda_check(kernels::launch_split_cols(p, s.stream), "split_cols");
    return;
  }
  s.pending_split = p;
  s.split_pending = true;
}

void CudaBackend::copy_cols(const Tensor& x, const Tensor& out, int64_t first_col) {
  State& s = *s_;
  s.flush();
  check_copy_cols(x, out, first_col);
  if (x.numel() == 0) return;
  // A pitched device-to-device copy: one memcpy node in a step graph, no kernel.
  cuda_check(cudaMemcpy2DAsync(static_cast<float*>(out.data) + first_col,
                               sizeof(float) * static_cast<size_t>(out.cols), x.data,
                               sizeof(float) * static_cast<size_t>(x.cols),
                               sizeof(float) * static_cast<size_t>(x.cols),
                               static_cast<size_t>(x.rows), cudaMemcpyDeviceToDevice, s.stream),
             "copy_cols");
}

void CudaBackend::gather_values(const Tensor& x, const std::vector<int64_t>& index,
                                std::vector<float>* out) {
  s_->flush();
  if (x.dtype != DType::kF32)
    throw_error(ErrorCode::kInvalidArgument, "gather_values: x " + shape(x) + " is not fp32");
  for (int64_t i : index)
    if (i < 0 || i >= x.numel())
      throw_error(ErrorCode::kInvalidArgument,
                  "gather_values: index " + std::to_string(i) + " outside " + shape(x));
  out->resize(index.size());
  s_->gather_to_host(x.data, index, out->data(), "gather_values");
}

bool CudaBackend::fuse_projections() const {
  return s_->options.fuse_projections;
}

void CudaBackend::add(const Tensor& a, const Tensor& b, const Tensor& out) {
  check_same_shape(a, b, "add");
  check_same_shape(a, out, "add");
  State& s = *s_;
  s.flush();
  const kernels::AddParams p{a.data,        b.data,          out.data, elem(a.dtype),
                             elem(b.dtype), elem(out.dtype), a.numel()};
  if (a.dtype == DType::kF32 && b.dtype == DType::kF32 && out.dtype == DType::kF32) {
    s.pending_add = p;  // launched by the next op, fused when that is the RMSNorm of `out`
    s.add_pending = true;
    return;
  }
  cuda_check(kernels::launch_add(p, s.stream), "add");
}

void CudaBackend::silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) {
  State& s = *s_;
  check_same_shape(gate, up, "silu_mul");
  check_same_shape(gate, out, "silu_mul");
  // gate and up just split from one gate | up projection: read them from it in place.
  const bool from_split = s.take_split(2, gate, up);
  const kernels::SplitColsParams split = s.pending_split;
  s.flush();
  kernels::SiluMulParams p{gate.data,      up.data,         out.data,    elem(gate.dtype),
                           elem(up.dtype), elem(out.dtype), gate.numel()};
  if (from_split) {
    p.gate = split.x;
    p.up = split.x + split.width[0];
    p.in_stride = split.width[0] + split.width[1];
    p.cols = split.width[0];
    p.up_copy = split.out[1];
    if (out.data != gate.data) p.gate_copy = split.out[0];
  }
  if (out.dtype == DType::kF32) p.out_bf16 = s_->bf16_copy_for(out.data, out.numel());
  cuda_check(kernels::launch_silu_mul(p, s_->stream), "silu_mul");
}

void CudaBackend::rope(const Tensor& q, const Tensor& k, const RopeParams& rp) {
  State& s = *s_;
  require_step(s.has_step, "rope");
  const int64_t d = rp.head_dim;
  if (d <= 0 || d % 2 != 0 || q.rows != s.step.num_tokens() || k.rows != q.rows ||
      q.cols % d != 0 || k.cols % d != 0 || q.dtype != DType::kF32 || k.dtype != DType::kF32)
    throw_error(ErrorCode::kInvalidArgument, "rope: q " + shape(q) + ", k " + shape(k) +
                                                 ", head_dim " + std::to_string(d) + " for " +
                                                 std::to_string(s.step.num_tokens()) +
                                                 " tokens (f32, even head_dim expected)");
  // q and k just split from one q | k | v projection (v as wide as k): read them, and copy v,
  // from it in place.
  const bool from_split =
      s.split_pending && s.pending_split.width[2] == k.cols && s.take_split(3, q, k);
  const kernels::SplitColsParams split = s.pending_split;
  s.flush();
  const std::vector<double> inv_d = rope_inv_freq(rp);
  std::vector<float> inv(inv_d.begin(), inv_d.end());
  if (inv != s.inv_freq_host) {
    if (s.capturing)
      throw_error(ErrorCode::kInternal, "rope: new RoPE frequencies inside a step graph");
    s.inv_freq.ensure(inv.size() * 4, "rope");
    cuda_check(cudaMemcpyAsync(s.inv_freq.ptr, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice,
                               s.stream),
               "rope");
    s.wait("rope");
    s.inv_freq_host = inv;
    ++s.epoch;  // recordings read the old frequencies
  }
  kernels::RopeParams p;
  p.q = static_cast<float*>(q.data);
  p.k = static_cast<float*>(k.data);
  p.positions = s.d_positions;
  p.inv_freq = static_cast<const float*>(s.inv_freq.ptr);
  p.num_tokens = static_cast<int32_t>(q.rows);
  p.num_q_heads = static_cast<int32_t>(q.cols / d);
  p.num_k_heads = static_cast<int32_t>(k.cols / d);
  p.head_dim = static_cast<int32_t>(d);
  if (from_split) {
    p.q_in = split.x;
    p.k_in = split.x + split.width[0];
    p.v_in = split.x + split.width[0] + split.width[1];
    p.v_out = split.out[2];
    p.in_stride = split.width[0] + split.width[1] + split.width[2];
  }
  s.pending_rope = p;  // launched by the next op, fused when that is write_kv of this K
  s.rope_pending = true;
}

void CudaBackend::write_kv(int64_t layer, const Tensor& k, const Tensor& v) {
  State& s = *s_;
  require_step(s.has_step, "write_kv");
  if (layer < 0 || layer >= kv_shape_.num_layers)
    throw_error(ErrorCode::kInvalidArgument, "write_kv: layer " + std::to_string(layer) + " of " +
                                                 std::to_string(kv_shape_.num_layers));
  if (k.cols != s.kv_width || v.cols != s.kv_width || k.rows != s.step.num_tokens() ||
      v.rows != k.rows)
    throw_error(ErrorCode::kInvalidArgument, "write_kv: k " + shape(k) + ", v " + shape(v) +
                                                 " for " + std::to_string(s.step.num_tokens()) +
                                                 " tokens of width " + std::to_string(s.kv_width));
  const int64_t plane = s.num_slots * s.kv_width * 2;
  kernels::WriteKvParams p;
  p.k = k.data;
  p.v = v.data;
  p.k_plane = static_cast<uint8_t*>(s.kv.ptr) + (2 * layer) * plane;
  p.v_plane = static_cast<uint8_t*>(s.kv.ptr) + (2 * layer + 1) * plane;
  p.slots = s.d_slots;
  p.src_type = elem(k.dtype);
  p.cache_type = s.kv_type;
  p.num_tokens = k.rows;
  p.width = s.kv_width;
  // A pending RoPE of this K (the op just before): taken over here instead of flushed.
  const bool fuse_rope = s.rope_pending && s.pending_rope.k == k.data && k.dtype == DType::kF32 &&
                         v.dtype == DType::kF32 &&
                         k.cols == int64_t{s.pending_rope.num_k_heads} * s.pending_rope.head_dim;
  if (fuse_rope) s.rope_pending = false;
  s.flush();
  if (fuse_rope) {  // RoPE of q and k, then K and V into their slots: one launch
    kernels::RopeParams& r = s.pending_rope;
    r.v = v.data;
    r.v_type = elem(v.dtype);
    if (r.v_out != nullptr && r.v_out == v.data) {  // V not split yet: read it in place
      r.v = r.v_in;
      r.v_type = kernels::ElemType::kF32;
      r.v_stride = r.in_stride;
    }
    r.k_plane = p.k_plane;
    r.v_plane = p.v_plane;
    r.slots = p.slots;
    r.cache_type = p.cache_type;
    cuda_check(kernels::launch_rope(r, s.stream), "rope + write_kv");
    return;
  }
  cuda_check(kernels::launch_write_kv(p, s.stream), "write_kv");
}

void CudaBackend::State::build_plan(int64_t num_heads, int64_t num_kv_heads, int64_t head_dim,
                                    bool for_graph) {
  const int32_t r_count = step.num_requests();
  kernels::AttentionPlanInputs in;
  in.qo_indptr = step.qo_indptr.data();
  in.committed_len = step.committed_len.data();
  in.num_requests = r_count;
  in.num_q_heads = static_cast<int32_t>(num_heads);
  in.num_kv_heads = static_cast<int32_t>(num_kv_heads);
  in.head_dim = static_cast<int32_t>(head_dim);
  in.num_sms = num_sms;
  in.max_splits = options.attention_max_splits;
  in.wgmma = use_wgmma;
  in.wide = options.attention_kernel == 3 ? 1 : -1;  // 3: 128-row tiles forced
  in.batch_invariant = options.batch_invariant;
  const int32_t split_keys = options.invariant_split_keys != 0 ? options.invariant_split_keys
                             : num_kv_heads >= 8               ? 512
                                                               : 256;
  in.invariant_chunk_tiles = split_keys / 64;
  // Tree groups rely on O + 0 * V == O for the masked rows, i.e. finite V; an fp16 cache can
  // hold Inf (values past 65504), so groups are bf16-only.
  in.tree_groups = kv_type == kernels::ElemType::kF16 ? 0 : options.attention_tree_groups;
  in.tree_mask = step.tree_mask.data();
  in.mask_indptr = step.mask_indptr.data();
  in.num_tokens = step.num_tokens();
  plan = kernels::plan_paged_tree_attention(in);
  plan_for_graph = for_graph;
  plan_num_work = static_cast<int32_t>(plan.work.size());
  plan_needs_merge = plan.needs_merge;
  std::vector<kernels::AttentionWorkItem> padded;
  const std::vector<kernels::AttentionWorkItem>* work = &plan.work;
  if (for_graph && plan.tensor_core) {
    // Empty items (request -1: the CTA exits at once) make the grid a bucket: a multiple of 16
    // CTAs, then a power of two, since the item count follows how the planner groups each
    // tree's nodes and splits each context, which changes from step to step (2 buckets per
    // power of two gave SmolLM2's n-gram steps at batch 8 up to 3 grids per token count); the
    // merge skips unsplit requests.
    plan_num_work = static_cast<int32_t>(graph_bucket((plan_num_work + 15) / 16 * 16, 1));
    padded = plan.work;
    padded.resize(static_cast<size_t>(plan_num_work),
                  kernels::AttentionWorkItem{-1, 0, 0, 0, 1, 0, 0});
    work = &padded;
    plan_needs_merge = true;
  }
  // Sections whose sizes the graph key fixes come first; the key-path (its size depends on the
  // tree's shape, not in the key) last, so the offsets of the others never move.
  Packer pk;
  const size_t o_work = pk.add(*work), o_splits = pk.add(plan.request_splits),
               o_chunk = pk.add(plan.request_kv_chunk), o_prow = pk.add(plan.request_partial_row);
  const kernels::AttentionVirtualRequests& v = plan.virt;
  const size_t o_vqo = pk.add(v.qo_indptr), o_vcommitted = pk.add(v.committed_len),
               o_vmask = pk.add(v.mask_indptr), o_vtable = pk.add(v.table_request),
               o_vbase = pk.add(v.path_base), o_vpathptr = pk.add(v.path_indptr),
               o_vtreq = pk.add(v.token_request), o_vpath = pk.add(v.path);
  uint8_t* host = plan_upload.begin(pk.size(), "attention plan");
  pk.write(host);
  plan_upload.commit(pk.size(), stream, "attention plan");
  transfers.h2d_bytes += static_cast<int64_t>(pk.size());
  auto* base = static_cast<uint8_t*>(plan_upload.device.ptr);
  d_work = reinterpret_cast<const kernels::AttentionWorkItem*>(base + o_work);
  d_splits = reinterpret_cast<const int32_t*>(base + o_splits);
  d_kv_chunk = reinterpret_cast<const int32_t*>(base + o_chunk);
  d_partial_row = reinterpret_cast<const int32_t*>(base + o_prow);
  auto at = [&](size_t off) { return reinterpret_cast<const int32_t*>(base + off); };
  d_virt = {at(o_vqo),   at(o_vcommitted), at(o_vmask), at(o_vtable),
            at(o_vbase), at(o_vpathptr),   at(o_vpath), at(o_vtreq)};
  if (plan.batch_invariant && !step.parent_source_index.empty()) {
    // Trees laid out on the device (set_step): their nodes' paths and key counts from the
    // rebuilt masks (the host planned them from placeholders at least as deep).
    kernels::TreeVirtualPathsParams t;
    t.parent_index = static_cast<const int64_t*>(parent_index.device.ptr);
    t.qo_indptr = d_qo_indptr;
    t.mask_indptr = d_mask_indptr;
    t.tree_mask = d_tree_mask;
    t.token_request = at(o_vtreq);
    t.path_indptr = at(o_vpathptr);
    t.path_base = at(o_vbase);
    t.path = const_cast<int32_t*>(at(o_vpath));
    t.committed_len = const_cast<int32_t*>(at(o_vcommitted));
    t.num_requests = step.num_requests();
    cuda_check(kernels::launch_tree_virtual_paths(t, stream), "attention plan tree paths");
  }
  if (plan_needs_merge) {
    // A graph's plan keeps room for a few splits per row, so growing contexts rarely move the
    // partials (and with them the epoch).
    const int64_t rows =
        std::max<int64_t>(plan.num_partial_rows, for_graph ? 4 * int64_t{step.num_tokens()} : 0);
    partial_out.ensure(static_cast<size_t>(rows * num_heads * head_dim) * 4, "attention partials");
    partial_lse.ensure(static_cast<size_t>(rows * num_heads) * 4, "attention partials");
  }
  plan_valid = true;
  plan_heads = num_heads;
}

void CudaBackend::paged_tree_attention(int64_t layer, const Tensor& q, int64_t num_heads,
                                       const Tensor& out) {
  s_->flush();
  State& s = *s_;
  require_step(s.has_step, "paged_tree_attention");
  const int64_t d = kv_shape_.head_dim;
  const int64_t hkv = kv_shape_.num_kv_heads;
  if (layer < 0 || layer >= kv_shape_.num_layers)
    throw_error(ErrorCode::kInvalidArgument, "paged_tree_attention: layer " +
                                                 std::to_string(layer) + " of " +
                                                 std::to_string(kv_shape_.num_layers));
  const std::string why = kernels::attention_unsupported_reason(
      static_cast<int32_t>(num_heads), static_cast<int32_t>(hkv), static_cast<int32_t>(d));
  if (!why.empty()) throw_error(ErrorCode::kUnsupported, "paged_tree_attention: " + why);
  if (q.cols != num_heads * d || q.rows != s.step.num_tokens() || out.rows != q.rows ||
      out.cols != q.cols || out.dtype != q.dtype)
    throw_error(ErrorCode::kInvalidArgument,
                "paged_tree_attention: q " + shape(q) + ", out " + shape(out) + " for " +
                    std::to_string(s.step.num_tokens()) + " tokens x " + std::to_string(num_heads) +
                    " heads x head_dim " + std::to_string(d));
  const int32_t r_count = s.step.num_requests();
  if (!s.plan_valid || s.plan_heads != num_heads) {
    if (s.capturing)  // a recording would copy the plan from host memory at replay time
      throw_error(ErrorCode::kInternal,
                  "paged_tree_attention: no attention plan prepared for the step graph");
    s.build_plan(num_heads, hkv, d, false);
  }
  const int64_t plane = s.num_slots * s.kv_width * 2;
  kernels::PagedTreeAttentionParams p;
  p.q = q.data;
  p.out = out.data;
  p.k_cache = static_cast<uint8_t*>(s.kv.ptr) + (2 * layer) * plane;
  p.v_cache = static_cast<uint8_t*>(s.kv.ptr) + (2 * layer + 1) * plane;
  p.io_type = elem(q.dtype);
  p.kv_type = s.kv_type;
  p.qo_indptr = s.d_qo_indptr;
  p.committed_len = s.d_committed;
  p.block_tables = s.d_block_tables;
  p.tree_mask = s.d_tree_mask;
  p.mask_indptr = s.d_mask_indptr;
  p.token_request = s.d_token_request;
  p.max_blocks_per_request = s.step.max_blocks_per_request;
  p.num_requests = r_count;
  p.num_tokens = s.step.num_tokens();
  p.num_q_heads = static_cast<int32_t>(num_heads);
  p.num_kv_heads = static_cast<int32_t>(hkv);
  p.head_dim = static_cast<int32_t>(d);
  p.block_size = static_cast<int32_t>(kv_shape_.block_size);
  p.sm_scale = 1.0f / std::sqrt(static_cast<float>(d));
  p.tensor_core = s.plan.tensor_core;
  p.wgmma = s.plan.wgmma;
  p.wide = s.plan.wide;
  p.work = s.d_work;
  p.num_work = s.plan_num_work;
  p.request_splits = s.d_splits;
  p.request_kv_chunk = s.d_kv_chunk;
  p.request_partial_row = s.d_partial_row;
  p.needs_merge = s.plan_needs_merge;
  p.max_splits = s.plan.max_splits_used;
  if (s.plan.batch_invariant) {  // the kernel sees the virtual requests (all causal)
    p.qo_indptr = s.d_virt.qo_indptr;
    p.committed_len = s.d_virt.committed_len;
    p.mask_indptr = s.d_virt.mask_indptr;
    p.token_request = s.d_virt.token_request;
    p.table_request = s.d_virt.table_request;
    p.path_base = s.d_virt.path_base;
    p.path_indptr = s.d_virt.path_indptr;
    p.path = s.d_virt.path;
    p.num_requests = static_cast<int32_t>(s.plan.virt.committed_len.size());
  }
  if (s.d_key_path != nullptr) {
    // Causal requests only, so a batch-invariant plan's virtual requests are the real ones; the
    // step's own arrays, which draft_frontier_load rewrites on the device, are read.
    p.qo_indptr = s.d_qo_indptr;
    p.committed_len = s.d_committed;
    p.mask_indptr = s.d_mask_indptr;
    p.token_request = s.d_token_request;
    p.table_request = nullptr;
    p.num_requests = r_count;
    p.path_base = s.d_key_path_base;
    p.path_indptr = s.d_key_path_indptr;
    p.path = s.d_key_path;
  }
  p.partial_out = static_cast<float*>(s.partial_out.ptr);
  p.partial_lse = static_cast<float*>(s.partial_lse.ptr);
  if (out.dtype == DType::kF32) p.out_bf16 = s.bf16_copy_for(out.data, out.numel());
  cuda_check(kernels::launch_paged_tree_attention(p, s.stream), "paged_tree_attention");
  s.last_splits = s.plan.max_splits_used;
  s.last_tensor_core = s.plan.tensor_core;
  s.last_wgmma = s.plan.wgmma;
  s.last_wide = s.plan.wide;
  s.last_tree_groups = s.plan.tree_group_items;
}

// --- step graphs ------------------------------------------------------------------------------

bool CudaBackend::prepare_step_graph(int64_t num_q_heads, std::vector<int64_t>* key) {
  s_->flush();
  State& s = *s_;
  require_step(s.has_step, "prepare_step_graph");
  const int64_t d = kv_shape_.head_dim, hkv = kv_shape_.num_kv_heads;
  if (!s.options.cuda_graphs || s.capturing ||
      !kernels::attention_unsupported_reason(static_cast<int32_t>(num_q_heads),
                                             static_cast<int32_t>(hkv), static_cast<int32_t>(d))
           .empty())
    return false;
  s.build_plan(num_q_heads, hkv, d, true);
  // What the attention launches take by value beyond the step's shape: the (padded) grid, the
  // number of (virtual) requests, the kernel.
  key->insert(key->end(),
              {num_q_heads, s.plan_num_work, static_cast<int64_t>(s.plan.request_splits.size()),
               s.plan.tensor_core ? 1 : 0, s.plan.wgmma ? (s.plan.wide ? 2 : 1) : 0,
               s.plan_needs_merge ? 1 : 0});
  return true;
}

void CudaBackend::begin_step_capture() {
  s_->flush();
  State& s = *s_;
  // Deferred launches of a backend sharing the stream go in now, not into this recording.
  for (State* u : s.shared_stream->users)
    if (u != &s) u->flush();
  ARBOR_CHECK(!s.capturing, "begin_step_capture: a recording is already under way");
  // Relaxed: cuBLASLt's capture path is proven in this mode (tests/cuda/model_bench); a host
  // synchronisation on the stream still fails the recording (then the step runs eagerly).
  cuda_check(cudaStreamBeginCapture(s.stream, cudaStreamCaptureModeRelaxed),
             "cudaStreamBeginCapture");
  s.capturing = true;
  s.capture_epoch = s.epoch;
}

int64_t CudaBackend::end_step_capture() {
  State& s = *s_;
  ARBOR_CHECK(s.capturing, "end_step_capture without begin_step_capture");
  bool flushed = true;
  try {
    s.flush();  // deferred (fused) launches belong to the recording
  } catch (const std::exception&) {
    flushed = false;
  }
  s.gemm_pending = s.add_pending = s.rope_pending = s.split_pending = false;
  s.capturing = false;
  cudaGraph_t graph = nullptr;
  cudaError_t e = cudaStreamEndCapture(s.stream, &graph);
  cudaGraphExec_t exec = nullptr;
  if (e == cudaSuccess && flushed && graph != nullptr) e = cudaGraphInstantiate(&exec, graph, 0);
  if (e == cudaSuccess && graph != nullptr && step_graph_trace_enabled()) {
    size_t nodes = 0;
    cudaGraphGetNodes(graph, nullptr, &nodes);
    std::fprintf(stderr, "step graph %lld of backend %d recorded: %zu nodes\n",
                 static_cast<long long>(s.next_graph), s.backend_index, nodes);
  }
  if (e == cudaSuccess && graph != nullptr && !s.options.graph_dot_dir.empty()) {
    const std::string path = s.options.graph_dot_dir + "/b" + std::to_string(s.backend_index) +
                             "_g" + std::to_string(s.next_graph) + ".dot";
    cudaGraphDebugDotPrint(graph, path.c_str(), cudaGraphDebugDotFlagsVerbose);
  }
  if (graph != nullptr) cudaGraphDestroy(graph);
  // Memory reallocated inside the recording (a grown buffer, a new scratch chunk): earlier
  // nodes may point at what was freed.
  const bool moved = s.epoch != s.capture_epoch;
  if (e != cudaSuccess || !flushed || moved || exec == nullptr) {
    cudaGetLastError();  // capture errors are not sticky; clear the last-error slot
    if (exec != nullptr) cudaGraphExecDestroy(exec);
    return -1;
  }
  const int64_t id = s.next_graph++;
  s.graphs.emplace(id, exec);
  return id;
}

void CudaBackend::abort_step_capture() {
  State& s = *s_;
  if (!s.capturing) return;
  s.gemm_pending = s.add_pending = false;
  s.capturing = false;
  cudaGraph_t graph = nullptr;
  cudaStreamEndCapture(s.stream, &graph);
  if (graph != nullptr) cudaGraphDestroy(graph);
  cudaGetLastError();
}

void CudaBackend::replay_step_graph(int64_t graph) {
  s_->flush();
  State& s = *s_;
  auto it = s.graphs.find(graph);
  ARBOR_CHECK(it != s.graphs.end(), "replay_step_graph: no graph " + std::to_string(graph));
  State::SharedStream& t = *s.shared_stream;
  std::pair<cudaEvent_t, cudaEvent_t> events{nullptr, nullptr};
  if (s.graph_timing) {
    // Replays with no wait between them (a backend whose waits are another's): read them now.
    if (t.pending.size() >= 64) t.collect();
    if (!t.free.empty()) {
      events = t.free.back();
      t.free.pop_back();
    } else {
      cuda_check(cudaEventCreate(&events.first), "graph timing");
      cuda_check(cudaEventCreate(&events.second), "graph timing");
    }
    cuda_check(cudaEventRecord(events.first, s.stream), "graph timing");
  }
  const auto launch_start = std::chrono::steady_clock::now();
  cuda_check(cudaGraphLaunch(it->second, s.stream), "cudaGraphLaunch");
  s.transfers.graph_launch_host_ms +=
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - launch_start)
          .count();
  ++s.transfers.graph_launches;
  if (s.graph_timing) {
    cuda_check(cudaEventRecord(events.second, s.stream), "graph timing");
    t.pending.push_back({events.first, events.second, &s.transfers});
  }
}

void CudaBackend::set_graph_timing(bool on) {
  State& s = *s_;
  if (!on && !s.shared_stream->pending.empty()) {
    cuda_check(cudaStreamSynchronize(s.stream), "graph timing");
    s.shared_stream->collect();
  }
  s.graph_timing = on;
}

void CudaBackend::release_step_graph(int64_t graph) {
  State& s = *s_;
  auto it = s.graphs.find(graph);
  if (it == s.graphs.end()) return;
  // A launched recording may still run: cudaGraphExecDestroy waits for nothing, but the
  // runtime keeps the executable alive until its launches complete.
  cudaGraphExecDestroy(it->second);
  s.graphs.erase(it);
}

uint64_t CudaBackend::step_graph_epoch() const {
  return s_->epoch;
}

bool CudaBackend::step_graphs_enabled() const {
  return s_->options.cuda_graphs;
}

void CudaBackend::gather_logit_rows(const Tensor& x, const Tensor& out) {
  s_->flush();
  State& s = *s_;
  require_step(s.has_step, "gather_logit_rows");
  if (out.rows != static_cast<int64_t>(s.step.logits_rows.size()) || out.cols != x.cols ||
      x.rows != s.step.num_tokens())
    throw_error(ErrorCode::kInvalidArgument,
                "gather_logit_rows: x " + shape(x) + ", out " + shape(out) + " for " +
                    std::to_string(s.step.logits_rows.size()) + " logits rows");
  kernels::GatherRowsParams p;
  p.src = x.data;
  p.dst = out.data;
  p.index = s.d_logits_rows;
  p.src_type = elem(x.dtype);
  p.dst_type = elem(out.dtype);
  p.num_rows = out.rows;
  p.cols = out.cols;
  cuda_check(kernels::launch_gather_rows(p, s.stream), "gather_logit_rows");
}

void CudaBackend::argmax_rows(const Tensor& logits, std::vector<int32_t>* out) {
  s_->flush();
  State& s = *s_;
  if (logits.dtype != DType::kF32 || logits.cols <= 0 || logits.cols >= (int64_t{1} << 31) - 1)
    throw_error(ErrorCode::kInvalidArgument, "argmax_rows: logits " + shape(logits) + " " +
                                                 dtype_name(logits.dtype) +
                                                 ", need fp32 with 1 to 2^31 - 2 columns");
  out->assign(static_cast<size_t>(logits.rows), -1);
  if (logits.rows == 0) return;
  s.argmax_ids.ensure(static_cast<size_t>(logits.rows) * 4, "argmax_rows");
  kernels::ArgmaxRowsParams p;
  p.logits = static_cast<const float*>(logits.data);
  p.out = static_cast<int32_t*>(s.argmax_ids.ptr);
  p.num_rows = logits.rows;
  p.cols = logits.cols;
  cuda_check(kernels::launch_argmax_rows(p, s.stream), "argmax_rows");
  s.d2h(out->data(), s.argmax_ids.ptr, out->size() * 4, "argmax_rows download");
  s.wait("argmax_rows");
}

void CudaBackend::top_k_log_softmax(const Tensor& logits, int32_t k, std::vector<int32_t>* ids,
                                    std::vector<float>* values) {
  s_->flush();
  State& s = *s_;
  check_top_k(logits, k, "top_k_log_softmax");
  const size_t n = static_cast<size_t>(logits.rows) * static_cast<size_t>(k);
  ids->assign(n, -1);
  values->assign(n, 0.0f);
  if (n == 0) return;
  s.top_k_out.ensure(n * 8, "top_k_log_softmax");
  auto* d_ids = static_cast<int32_t*>(s.top_k_out.ptr);
  auto* d_values = reinterpret_cast<float*>(d_ids + n);
  s.launch_top_k(logits, k, d_ids, d_values, "top_k_log_softmax");
  s.d2h(ids->data(), d_ids, n * 4, "top_k_log_softmax download");
  s.d2h(values->data(), d_values, n * 4, "top_k_log_softmax download");
  s.wait("top_k_log_softmax");
}

void CudaBackend::top_k_ids(const Tensor& logits, int32_t k, const Tensor& ids) {
  s_->flush();
  State& s = *s_;
  check_top_k(logits, k, "top_k_ids");
  if (ids.dtype != DType::kI32 || ids.rows != logits.rows || ids.cols != k)
    throw_error(ErrorCode::kInvalidArgument, "top_k_ids: ids " + shape(ids) + " " +
                                                 dtype_name(ids.dtype) + " for " +
                                                 std::to_string(logits.rows) + " rows of k " +
                                                 std::to_string(k) + " (int32 expected)");
  const size_t n = static_cast<size_t>(logits.rows) * static_cast<size_t>(k);
  if (n == 0) return;
  s.top_k_out.ensure(n * 8, "top_k_ids");
  auto* d_values = reinterpret_cast<float*>(static_cast<int32_t*>(s.top_k_out.ptr) + n);
  s.launch_top_k(logits, k, static_cast<int32_t*>(ids.data), d_values, "top_k_ids");
}

void CudaBackend::download_ids(const Tensor& ids, std::span<const int64_t> index,
                               std::vector<int32_t>* out) {
  s_->flush();
  if (ids.dtype != DType::kI32)
    throw_error(ErrorCode::kInvalidArgument, "download_ids: ids " + shape(ids) + " " +
                                                 dtype_name(ids.dtype) + ", int32 expected");
  for (int64_t i : index)
    if (i < -1 || i >= ids.numel())
      throw_error(ErrorCode::kInvalidArgument,
                  "download_ids: index " + std::to_string(i) + " outside " + shape(ids));
  out->assign(index.size(), -1);
  s_->gather_to_host(ids.data, index, out->data(), "download_ids");
}

bool CudaBackend::shares_memory_with(const Backend& other) const {
  const auto* o = dynamic_cast<const CudaBackend*>(&other);
  return o != nullptr && o->s_->options.device == s_->options.device;
}

void CudaBackend::wait_for(Backend& other) {
  auto* o = dynamic_cast<CudaBackend*>(&other);
  if (o == nullptr || o == this) return;
  o->s_->flush();
  s_->flush();
  State& s = *s_;
  if (o->s_->stream == s.stream) return;  // one stream: in order already
  if (s.order_event.e == nullptr)
    cuda_check(cudaEventCreateWithFlags(&s.order_event.e, cudaEventDisableTiming), "wait_for");
  cuda_check(cudaEventRecord(s.order_event.e, o->s_->stream), "wait_for");
  cuda_check(cudaStreamWaitEvent(s.stream, s.order_event.e, 0), "wait_for");
}

void CudaBackend::set_draft_vocab_map(std::span<const int64_t> offsets) {
  s_->flush();
  State& s = *s_;
  s.has_vocab_offset = !offsets.empty();
  if (offsets.empty()) return;
  s.vocab_offset.ensure(offsets.size() * 8, "set_draft_vocab_map");
  cuda_check(cudaMemcpyAsync(s.vocab_offset.ptr, offsets.data(), offsets.size() * 8,
                             cudaMemcpyHostToDevice, s.stream),
             "set_draft_vocab_map");
  s.wait("set_draft_vocab_map");  // once per draft model: the host copy may go
  s.transfers.h2d_bytes += static_cast<int64_t>(offsets.size() * 8);
}

void CudaBackend::draft_frontier_begin(int32_t groups, int32_t k, int32_t max_depth,
                                       std::span<const int32_t> ids, std::span<const float> values,
                                       std::span<const int32_t> parent_rows,
                                       std::span<const int32_t> positions,
                                       std::span<const int64_t> slots,
                                       std::span<const int32_t> root_rows) {
  s_->flush();
  State& s = *s_;
  const auto n = static_cast<size_t>(groups) * static_cast<size_t>(k);
  const auto depth = static_cast<size_t>(max_depth);
  check_draft_frontier_begin(groups, k, max_depth, ids, values, parent_rows, positions, slots,
                             root_rows, s.fr_roots_k, s.fr_roots_rows);
  // Device layout (4-byte words): two frontiers (ids, scores, parents [n], paths [n, depth]),
  // the depth-1 positions [n], every depth's slots [depth, n] (8 bytes each), then the top-k log
  // (ids, then values, [depth, n, k] each). Step graphs record these addresses (epoch).
  const size_t frontier_words = n * (3 + depth);
  const size_t log_words = 2 * depth * n * static_cast<size_t>(k);
  const size_t slot_words = (2 * depth * n + 1) / 2 * 2;  // 8-byte aligned
  // (then the path shifts [n], zeroed by the same upload)
  const size_t head_words = 2 * frontier_words + 2 * n;
  s.frontier.epoch = &s.epoch;
  // First frontier, root rows, the selects' choices.
  const size_t tail_words = 2 * n + static_cast<size_t>(groups) + depth * n;
  s.frontier.ensure((head_words + slot_words + log_words + tail_words) * 4, "draft_frontier_begin");
  auto* base = static_cast<int32_t*>(s.frontier.ptr);
  for (int i = 0; i < 2; ++i) {
    int32_t* f = base + static_cast<size_t>(i) * frontier_words;
    s.fr[i] = {f, reinterpret_cast<float*>(f + n), f + 2 * n, f + 3 * n};
  }
  s.fr_positions0 = base + 2 * frontier_words;
  s.fr_path_shift = s.fr_positions0 + n;
  s.fr_slots = reinterpret_cast<int64_t*>(base + head_words);
  s.fr_log_ids = base + head_words + slot_words;
  s.fr_log_values = reinterpret_cast<float*>(s.fr_log_ids + log_words / 2);
  s.fr_first = s.fr_log_ids + log_words;
  s.fr_root_rows = s.fr_first + 2 * n;
  s.fr_log_chosen = s.fr_root_rows + groups;
  const std::array<int64_t, 4> layout = {groups, k, max_depth,
                                         reinterpret_cast<int64_t>(s.frontier.ptr)};
  if (layout != s.fr_layout) {  // the cached regions may hold other data now
    s.fr_root_rows_sent.forget();
    s.fr_layout = layout;
  }
  // The top-k workspace for these rows, made here: nothing allocates inside a recording.
  s.ensure_top_k_work(static_cast<int64_t>(n), "draft_frontier_begin workspace");
  // The first frontier, the positions and the slots, staged in one upload.
  std::vector<int32_t> first(head_words + slot_words, 0);
  std::copy(ids.begin(), ids.end(), first.begin());
  std::memcpy(first.data() + n, values.data(), n * 4);
  std::copy(parent_rows.begin(), parent_rows.end(), first.begin() + static_cast<int64_t>(2 * n));
  for (size_t row = 0; row < n; ++row)
    first[3 * n + row * depth] = static_cast<int32_t>(row % static_cast<size_t>(k));
  std::copy(positions.begin(), positions.end(),
            first.begin() + static_cast<int64_t>(2 * frontier_words));
  std::memcpy(first.data() + head_words, slots.data(), slots.size() * 8);
  s.uploads.copy(s.fr[0].ids, first.data(), first.size() * 4, s.stream, "draft_frontier_begin");
  s.transfers.h2d_bytes += static_cast<int64_t>(first.size() * 4);
  s.fr_root_rows_host.assign(root_rows.begin(), root_rows.end());
  if (!root_rows.empty())
    s.upload_unless_held(s.fr_root_rows_sent, s.fr_root_rows, root_rows, "draft_frontier_begin");
  // The trees' first frontiers, those with kept root rows from them, all kept for the log too.
  kernels::DraftFrontierRootsParams p;
  p.f = s.fr[0];
  p.first_ids = s.fr_first;
  p.first_scores = reinterpret_cast<float*>(s.fr_first + n);
  p.root_ids = s.fr_root_ids();
  p.root_values = s.fr_root_values();
  p.rows = s.fr_root_rows;
  p.groups = groups;
  p.root_groups = static_cast<int32_t>(root_rows.size());
  p.k = k;
  cuda_check(kernels::launch_draft_frontier_roots(p, s.stream), "draft_frontier_begin roots");
  s.fr_groups = groups;
  s.fr_k = k;
  s.fr_max_depth = max_depth;
  s.fr_current = 0;
}

void CudaBackend::draft_frontier_roots(const Tensor& logits, int32_t k) {
  s_->flush();
  State& s = *s_;
  if (logits.dtype != DType::kF32 || logits.rows < 1 || k < 1 || k > 32 || k > logits.cols ||
      logits.cols >= (int64_t{1} << 31) - 1)
    throw_error(ErrorCode::kInvalidArgument, "draft_frontier_roots: logits " + shape(logits) +
                                                 ", k " + std::to_string(k) + " (1..32)");
  const size_t n = static_cast<size_t>(logits.rows) * static_cast<size_t>(k);
  s.fr_roots.ensure(n * 8, "draft_frontier_roots");
  auto* ids = static_cast<int32_t*>(s.fr_roots.ptr);
  s.launch_top_k(logits, k, ids, reinterpret_cast<float*>(ids + n), "draft_frontier_roots");
  s.fr_roots_k = k;
  s.fr_roots_rows = static_cast<int32_t>(logits.rows);
}

void CudaBackend::draft_frontier_load(int32_t depth, const Tensor& source, const Tensor& in) {
  s_->flush();
  State& s = *s_;
  require_step(s.has_step, "draft_frontier_load");
  const int32_t n = s.fr_groups * s.fr_k;
  if (s.fr_groups == 0 || depth < 1 || depth > s.fr_max_depth || s.step.num_tokens() != n ||
      s.step.num_requests() != n || s.d_key_path == nullptr ||
      s.step.key_path.size() < static_cast<size_t>(n) * static_cast<size_t>(s.fr_max_depth) ||
      in.rows != n || in.cols != source.cols || source.dtype != DType::kF32 ||
      in.dtype != DType::kF32)
    throw_error(ErrorCode::kInvalidArgument,
                "draft_frontier_load: depth " + std::to_string(depth) + " of " +
                    std::to_string(s.fr_max_depth) + " for " + std::to_string(n) +
                    " rows, a step of " + std::to_string(s.step.num_tokens()) + " tokens and " +
                    std::to_string(s.step.key_path.size()) + " path entries, in " + shape(in) +
                    ", source " + shape(source));
  kernels::DraftFrontierLoadParams p;
  p.f = s.fr[s.fr_current];
  p.vocab_offset = s.has_vocab_offset ? static_cast<const int64_t*>(s.vocab_offset.ptr) : nullptr;
  p.positions0 = s.fr_positions0;
  p.all_slots = s.fr_slots;
  p.token_ids = const_cast<int32_t*>(s.d_token_ids);
  p.positions = const_cast<int32_t*>(s.d_positions);
  p.slots = const_cast<int64_t*>(s.d_slots);
  p.committed_len = const_cast<int32_t*>(s.d_committed);
  p.key_path_base = s.d_key_path_base;
  p.key_path_indptr = s.d_key_path_indptr;
  p.key_path = s.d_key_path;
  p.path_shift = s.fr_path_shift;
  p.rows = n;
  p.depth = depth;
  p.max_depth = s.fr_max_depth;
  cuda_check(kernels::launch_draft_frontier_load(p, s.stream), "draft_frontier_load");
  kernels::GatherRowsParams g;  // the parents' rows (parents index source's rows)
  g.src = source.data;
  g.dst = in.data;
  g.index = s.fr[s.fr_current].parent;
  g.num_rows = n;
  g.cols = in.cols;
  cuda_check(kernels::launch_gather_rows(g, s.stream), "draft_frontier_load rows");
}

void CudaBackend::draft_frontier_shift(const Tensor& len, std::span<const int32_t> len_index,
                                       std::span<const int32_t> rows, const Tensor& root_source,
                                       const Tensor& roots) {
  s_->flush();
  State& s = *s_;
  require_step(s.has_step, "draft_frontier_shift");
  const int32_t groups = s.fr_groups;
  const auto g = static_cast<size_t>(groups);
  bool ok = groups > 0 && s.fr_root_rows_host.size() == g && len_index.size() == g &&
            rows.size() == g && len.dtype == DType::kI32 && root_source.dtype == DType::kF32 &&
            roots.dtype == DType::kF32 && roots.rows >= groups && roots.cols == root_source.cols &&
            s.d_key_path_base != nullptr &&
            s.step.key_path_base.size() == g * static_cast<size_t>(s.fr_k);
  for (size_t t = 0; ok && t < g; ++t) {
    const int32_t top = s.fr_root_rows_host[t];
    ok = len_index[t] >= 0 && len_index[t] < len.rows && rows[t] >= 1 && top - rows[t] + 1 >= 0 &&
         top < root_source.rows && top < s.fr_roots_rows;
  }
  if (!ok)
    throw_error(ErrorCode::kInvalidArgument,
                "draft_frontier_shift: " + std::to_string(len_index.size()) + " trees of " +
                    std::to_string(groups) + " begun with " +
                    std::to_string(s.fr_root_rows_host.size()) + " kept roots, len " + shape(len) +
                    ", roots " + shape(roots) + " from " + shape(root_source) +
                    " (each tree's rows within its kept and source rows)");
  s.fr_shift.ensure(2 * g * 4, "draft_frontier_shift");
  std::vector<int32_t> host(len_index.begin(), len_index.end());
  host.insert(host.end(), rows.begin(), rows.end());
  auto* index = static_cast<int32_t*>(s.fr_shift.ptr);
  s.upload_unless_held(s.fr_shift_sent, index, host, "draft_frontier_shift");
  const size_t n = g * static_cast<size_t>(s.fr_k);
  kernels::DraftFrontierShiftParams p;
  p.f = s.fr[0];
  p.first_ids = s.fr_first;
  p.first_scores = reinterpret_cast<float*>(s.fr_first + n);
  p.root_ids = s.fr_root_ids();
  p.root_values = s.fr_root_values();
  p.root_rows = s.fr_root_rows;
  p.positions0 = s.fr_positions0;
  p.key_path_base = const_cast<int32_t*>(s.d_key_path_base);
  p.path_shift = s.fr_path_shift;
  p.len = static_cast<const int32_t*>(len.data);
  p.len_index = index;
  p.rows = index + g;
  p.root_source = static_cast<const float*>(root_source.data);
  p.roots = static_cast<float*>(roots.data);
  p.cols = roots.cols;
  p.groups = groups;
  p.k = s.fr_k;
  cuda_check(kernels::launch_draft_frontier_shift(p, s.stream), "draft_frontier_shift");
}

void CudaBackend::draft_frontier_expand(int32_t depth, const Tensor& logits) {
  s_->flush();
  State& s = *s_;
  const int32_t n = s.fr_groups * s.fr_k, k = s.fr_k;
  if (s.fr_groups == 0 || depth < 1 || depth > s.fr_max_depth || logits.rows != n ||
      logits.dtype != DType::kF32 || logits.cols < k || logits.cols >= (int64_t{1} << 31) - 1)
    throw_error(ErrorCode::kInvalidArgument,
                "draft_frontier_expand: depth " + std::to_string(depth) + " of " +
                    std::to_string(s.fr_max_depth) + ", logits " + shape(logits) + " for " +
                    std::to_string(n) + " rows of top-" + std::to_string(k));
  const size_t at =
      static_cast<size_t>(n) * static_cast<size_t>(k) * static_cast<size_t>(depth - 1);
  int32_t* top_ids = s.fr_log_ids + at;
  float* top_values = s.fr_log_values + at;
  s.launch_top_k(logits, k, top_ids, top_values, "draft_frontier_expand top-k");
  if (depth == s.fr_max_depth) return;  // no frontier after the last depth
  kernels::DraftFrontierSelectParams p;
  p.in = s.fr[s.fr_current];
  p.out = s.fr[1 - s.fr_current];
  p.top_ids = top_ids;
  p.top_values = top_values;
  p.chosen = s.fr_log_chosen + static_cast<size_t>(n) * static_cast<size_t>(depth - 1);
  p.groups = s.fr_groups;
  p.k = k;
  p.depth = depth;
  p.max_depth = s.fr_max_depth;
  cuda_check(kernels::launch_draft_frontier_select(p, s.stream), "draft_frontier_expand select");
  s.fr_current = 1 - s.fr_current;
}

void CudaBackend::draft_frontier_log(int32_t depths, std::vector<int32_t>* ids,
                                     std::vector<float>* values, std::vector<int32_t>* root_ids,
                                     std::vector<float>* root_values) {
  s_->flush();
  State& s = *s_;
  if (s.fr_groups == 0 || depths < 0 || depths > s.fr_max_depth)
    throw_error(ErrorCode::kInvalidArgument, "draft_frontier_log: " + std::to_string(depths) +
                                                 " depths of " + std::to_string(s.fr_max_depth));
  const size_t n = static_cast<size_t>(depths) * static_cast<size_t>(s.fr_groups) *
                   static_cast<size_t>(s.fr_k) * static_cast<size_t>(s.fr_k);
  const size_t first = static_cast<size_t>(s.fr_groups) * static_cast<size_t>(s.fr_k);
  ids->resize(n);
  values->resize(n);
  root_ids->resize(first);
  root_values->resize(first);
  s.d2h(root_ids->data(), s.fr_first, first * 4, "draft_frontier_log");
  s.d2h(root_values->data(), s.fr_first + first, first * 4, "draft_frontier_log");
  if (n > 0) {
    s.d2h(ids->data(), s.fr_log_ids, n * 4, "draft_frontier_log");
    s.d2h(values->data(), s.fr_log_values, n * 4, "draft_frontier_log");
  }
  s.wait("draft_frontier_log");
}

void CudaBackend::device_interval_begin() {
  s_->flush();
  State& s = *s_;
  if (s.interval.begin == nullptr) {
    cuda_check(cudaEventCreate(&s.interval.begin), "device_interval_begin");
    cuda_check(cudaEventCreate(&s.interval.end), "device_interval_begin");
  }
  cuda_check(cudaEventRecord(s.interval.begin, s.stream), "device_interval_begin");
  s.interval.open = true;
  s.interval.ended = false;
}

void CudaBackend::device_interval_end() {
  s_->flush();
  State& s = *s_;
  if (!s.interval.open) return;
  cuda_check(cudaEventRecord(s.interval.end, s.stream), "device_interval_end");
  s.interval.open = false;
  s.interval.ended = true;
}

double CudaBackend::last_device_interval_ms() {
  State& s = *s_;
  if (!s.interval.ended || cudaEventQuery(s.interval.end) != cudaSuccess) return -1.0;
  float ms = 0;
  cuda_check(cudaEventElapsedTime(&ms, s.interval.begin, s.interval.end),
             "last_device_interval_ms");
  return ms;
}

Tensor CudaBackend::draft_frontier_trees(std::span<const int32_t> depth,
                                         std::span<const int32_t> nodes, int32_t stride) {
  s_->flush();
  State& s = *s_;
  // (A replayed step graph expands every depth without the host's calls: the begin's depths.)
  check_draft_frontier_trees(s.fr_groups, s.fr_k, s.fr_max_depth, depth, nodes, stride);
  const auto g = static_cast<size_t>(s.fr_groups);
  const size_t out_words = g * 2 * static_cast<size_t>(stride);
  s.fr_trees.ensure((out_words + 2 * g) * 4, "draft_frontier_trees");
  auto* out = static_cast<int32_t*>(s.fr_trees.ptr);
  std::vector<int32_t> sizes(depth.begin(), depth.end());
  sizes.insert(sizes.end(), nodes.begin(), nodes.end());
  s.upload_unless_held(s.fr_sizes_sent, out + out_words, sizes, "draft_frontier_trees");
  kernels::DraftTreeSelectParams p;
  p.first_ids = s.fr_first;
  p.first_scores = reinterpret_cast<const float*>(s.fr_first + g * static_cast<size_t>(s.fr_k));
  p.log_ids = s.fr_log_ids;
  p.log_values = s.fr_log_values;
  p.chosen = s.fr_log_chosen;
  p.vocab_offset = s.has_vocab_offset ? static_cast<const int64_t*>(s.vocab_offset.ptr) : nullptr;
  p.depth = out + out_words;
  p.nodes = out + out_words + g;
  p.out = out;
  p.groups = s.fr_groups;
  p.k = s.fr_k;
  p.stride = stride;
  cuda_check(kernels::launch_draft_tree_select(p, s.stream), "draft_frontier_trees");
  return Tensor{out, DType::kI32, static_cast<int64_t>(out_words), 1};
}

static_assert(kMaxDraftTreeCandidates == kernels::kMaxDraftTreeCandidates);

static_assert(sizeof(TreeSampleParams) == sizeof(kernels::TreeSampleItemParams) &&
              offsetof(TreeSampleParams, greedy) ==
                  offsetof(kernels::TreeSampleItemParams, greedy));

void CudaBackend::sample_trees(const Tensor& logits, const TreeSampleBatch& batch,
                               TreeSampleResult* out) {
  sample_trees_impl(logits, batch, nullptr, out);
}

void CudaBackend::sample_trees_and_path_rows(const Tensor& logits, const TreeSampleBatch& batch,
                                             const PathRowsRequest& rows, TreeSampleResult* out) {
  if (rows.source.dtype != DType::kF32 || rows.source.cols <= 0 ||
      static_cast<int32_t>(rows.node_row.size()) != batch.num_nodes())
    throw_error(ErrorCode::kInvalidArgument,
                "sample_trees_and_path_rows: source " + shape(rows.source) + " " +
                    dtype_name(rows.source.dtype) + " with " +
                    std::to_string(rows.node_row.size()) + " node rows for " +
                    std::to_string(batch.num_nodes()) + " nodes");
  for (int32_t r : rows.node_row)
    if (r < 0 || r >= rows.source.rows)
      throw_error(ErrorCode::kInvalidArgument, "sample_trees_and_path_rows: node row " +
                                                   std::to_string(r) + " outside [0, " +
                                                   std::to_string(rows.source.rows) + ")");
  sample_trees_impl(logits, batch, &rows, out);
}

void CudaBackend::sample_trees_impl(const Tensor& logits, const TreeSampleBatch& batch,
                                    const PathRowsRequest* rows, TreeSampleResult* out) {
  s_->flush();
  State& s = *s_;
  if (logits.dtype != DType::kF32 || logits.cols <= 0 || logits.cols >= (int64_t{1} << 31) - 1)
    throw_error(ErrorCode::kInvalidArgument, "sample_trees: logits " + shape(logits) + " " +
                                                 dtype_name(logits.dtype) +
                                                 ", need fp32 with 1 to 2^31 - 2 columns");
  validate_tree_sample_batch(batch, logits.cols, logits.rows);
  const int32_t items = batch.num_items(), nodes = batch.num_nodes();
  *out = TreeSampleResult{};
  out->path_indptr = {0};
  if (items == 0) return;
  // One processing task per distinct logits row (items sharing a row share its parameters).
  std::vector<int32_t> task_node, task_item;
  std::vector<uint8_t> row_seen(static_cast<size_t>(logits.rows), 0);
  for (int32_t i = 0; i < items; ++i)
    for (int32_t g = batch.node_indptr[i]; g < batch.node_indptr[i + 1]; ++g) {
      uint8_t& seen = row_seen[static_cast<size_t>(batch.logits_row[g])];
      if (seen) continue;
      seen = 1;
      task_node.push_back(g);
      task_item.push_back(i);
    }
  const std::vector<int32_t> no_q(batch.q_row.empty() ? static_cast<size_t>(nodes) : 0, -1);
  const bool any_bias = !batch.bias_token.empty();
  Packer pk;
  const size_t o_params = pk.add(batch.params), o_nodes = pk.add(batch.node_indptr),
               o_rows = pk.add(batch.logits_row), o_parent = pk.add(batch.parent),
               o_token = pk.add(batch.token),
               o_qrow = pk.add(batch.q_row.empty() ? no_q : batch.q_row), o_q = pk.add(batch.q),
               o_ctx = pk.add(batch.ctx_indptr), o_ctx_tok = pk.add(batch.ctx_token),
               o_ctx_cnt = pk.add(batch.ctx_output_count), o_bias = pk.add(batch.bias_indptr),
               o_bias_tok = pk.add(batch.bias_token), o_bias_val = pk.add(batch.bias_value),
               o_uptr = pk.add(batch.uniform_indptr), o_u = pk.add(batch.uniforms),
               o_tnode = pk.add(task_node), o_titem = pk.add(task_item);
  const bool device_tokens = !batch.token_source_index.empty();
  const size_t o_tindex = device_tokens ? pk.add(batch.token_source_index) : 0;
  const bool device_parents = !batch.parent_source_index.empty();
  const size_t o_pindex = device_parents ? pk.add(batch.parent_source_index) : 0;
  // Path rows: item i's at most (its tree's depth + 1) rows from out_offset[i] on.
  std::vector<int32_t> out_offset;
  int32_t max_rows = 0;
  size_t o_noderow = 0, o_outoff = 0;
  if (rows != nullptr) {
    // (Parents on the device: the placeholder's depths bound the real ones, DeviceTokens.)
    out_offset = path_row_offsets(batch);
    for (int32_t i = 0; i < items; ++i)
      max_rows = std::max(max_rows, out_offset[i + 1] - out_offset[i]);
    o_noderow = pk.add(rows->node_row);
    o_outoff = pk.add(out_offset);
  }
  uint8_t* host = s.sample_meta.begin(pk.size(), "sample_trees");
  pk.write(host);
  s.sample_meta.commit(pk.size(), s.stream, "sample_trees");
  s.transfers.h2d_bytes += static_cast<int64_t>(pk.size());
  uint8_t* meta = static_cast<uint8_t*>(s.sample_meta.device.ptr);

  // Scratch: [outputs: path, tried (nodes each), len, bonus, used, status (items each)], then
  // row argmax / status (rows each), then the work rows (items x vocab fp32).
  const size_t out_ints = 2 * static_cast<size_t>(nodes) + 4 * static_cast<size_t>(items);
  const size_t o_rowint = align_up(out_ints * 4, 256);
  const size_t o_work = align_up(o_rowint + 2 * static_cast<size_t>(logits.rows) * 4, 256);
  s.sample_scratch.ensure(o_work + static_cast<size_t>(items) * logits.cols * 4, "sample_trees");
  uint8_t* scratch = static_cast<uint8_t*>(s.sample_scratch.ptr);
  int32_t* outs = reinterpret_cast<int32_t*>(scratch);

  kernels::TreeSampleLaunch p;
  p.logits = static_cast<float*>(logits.data);
  p.vocab = logits.cols;
  p.num_items = items;
  p.num_tasks = static_cast<int32_t>(task_node.size());
  p.params = reinterpret_cast<const kernels::TreeSampleItemParams*>(meta + o_params);
  p.node_indptr = reinterpret_cast<const int32_t*>(meta + o_nodes);
  p.logits_row = reinterpret_cast<const int32_t*>(meta + o_rows);
  p.parent = reinterpret_cast<const int32_t*>(meta + o_parent);
  p.token = reinterpret_cast<const int32_t*>(meta + o_token);
  p.q_row = reinterpret_cast<const int32_t*>(meta + o_qrow);
  p.q = reinterpret_cast<const float*>(meta + o_q);
  p.ctx_indptr = reinterpret_cast<const int32_t*>(meta + o_ctx);
  p.ctx_token = reinterpret_cast<const int32_t*>(meta + o_ctx_tok);
  p.ctx_output_count = reinterpret_cast<const int32_t*>(meta + o_ctx_cnt);
  if (any_bias) {  // else the kernel skips the bias (bias_indptr may be empty then)
    p.bias_indptr = reinterpret_cast<const int32_t*>(meta + o_bias);
    p.bias_token = reinterpret_cast<const int32_t*>(meta + o_bias_tok);
    p.bias_value = reinterpret_cast<const float*>(meta + o_bias_val);
  }
  p.uniform_indptr = reinterpret_cast<const int32_t*>(meta + o_uptr);
  p.uniforms = reinterpret_cast<const double*>(meta + o_u);
  p.task_node = reinterpret_cast<const int32_t*>(meta + o_tnode);
  p.task_item = reinterpret_cast<const int32_t*>(meta + o_titem);
  p.out_path = outs;
  p.out_tried = outs + nodes;
  p.out_len = outs + 2 * nodes;
  p.out_bonus = p.out_len + items;
  p.out_used = p.out_bonus + items;
  p.out_status = p.out_used + items;
  p.row_argmax = reinterpret_cast<int32_t*>(scratch + o_rowint);
  p.row_status = p.row_argmax + logits.rows;
  p.work = reinterpret_cast<float*>(scratch + o_work);
  if (device_tokens)  // the drafter's ids into the uploaded tokens (comes back with the path)
    cuda_check(
        kernels::launch_gather_ids(static_cast<const int32_t*>(batch.token_source.data),
                                   reinterpret_cast<const int64_t*>(meta + o_tindex),
                                   reinterpret_cast<int32_t*>(meta + o_token), nodes, s.stream),
        "sample_trees tokens");
  if (device_parents)  // and its parents
    cuda_check(
        kernels::launch_gather_ids(static_cast<const int32_t*>(batch.token_source.data),
                                   reinterpret_cast<const int64_t*>(meta + o_pindex),
                                   reinterpret_cast<int32_t*>(meta + o_parent), nodes, s.stream),
        "sample_trees parents");
  cuda_check(kernels::launch_tree_sample(p, s.stream), "sample_trees");
  std::vector<float> padded_rows;
  if (rows != nullptr) {
    const int64_t cols = rows->source.cols;
    const size_t bytes = static_cast<size_t>(out_offset.back()) * static_cast<size_t>(cols) * 4;
    s.path_rows.ensure(std::max<size_t>(bytes, 16), "sample_trees path rows");
    kernels::GatherPathRowsParams g;
    g.x = static_cast<const float*>(rows->source.data);
    g.cols = cols;
    g.node_indptr = p.node_indptr;
    g.path = p.out_path;
    g.len = p.out_len;
    g.node_row = reinterpret_cast<const int32_t*>(meta + o_noderow);
    g.out_offset = reinterpret_cast<const int32_t*>(meta + o_outoff);
    g.out = static_cast<float*>(s.path_rows.ptr);
    g.num_items = items;
    g.max_rows_per_item = max_rows;
    if (rows->on_device) {
      s.path_next.ensure(std::max<size_t>(static_cast<size_t>(out_offset.back()) * 4, 16),
                         "sample_trees path tokens");
      g.token = reinterpret_cast<const int32_t*>(meta + o_token);
      g.bonus = p.out_bonus;
      g.next = static_cast<int32_t*>(s.path_next.ptr);
    }
    cuda_check(kernels::launch_gather_path_rows(g, s.stream), "sample_trees path rows");
    padded_rows.resize(static_cast<size_t>(out_offset.back()) * static_cast<size_t>(cols));
  }
  std::vector<int32_t> h(out_ints), tokens;
  if (device_tokens) tokens.resize(static_cast<size_t>(nodes));
  if (rows != nullptr && rows->on_device) {
    // The results into pinned memory (asynchronous), an event after them, then the caller's
    // work on the stream behind them: the host waits for the event only.
    const size_t rows_bytes = padded_rows.size() * 4;
    const size_t o_tok = align_up(out_ints * 4, 256);
    const size_t o_rows_h = align_up(o_tok + tokens.size() * 4, 256);
    uint8_t* pin = s.sample_results.acquire(o_rows_h + rows_bytes, "sample_trees download");
    const auto to_host = [&](void* dst, const void* src, size_t n) {
      if (n > 0)
        cuda_check(cudaMemcpyAsync(dst, src, n, cudaMemcpyDeviceToHost, s.stream),
                   "sample_trees download");
      s.transfers.d2h_bytes += static_cast<int64_t>(n);
    };
    to_host(pin, outs, out_ints * 4);
    to_host(pin + o_tok, meta + o_token, tokens.size() * 4);
    to_host(pin + o_rows_h, s.path_rows.ptr, rows_bytes);
    cuda_check(cudaEventRecord(s.sample_results.done, s.stream), "sample_trees download");
    PathRowsOnDevice view;
    view.rows = Tensor{s.path_rows.ptr, DType::kF32, out_offset.back(), rows->source.cols};
    view.next = Tensor{s.path_next.ptr, DType::kI32, out_offset.back(), 1};
    view.len = Tensor{p.out_len, DType::kI32, items, 1};
    view.offset = out_offset;
    rows->on_device(view);
    cuda_check(cudaEventSynchronize(s.sample_results.done), "sample_trees");
    ++s.transfers.syncs;
    if (!s.shared_stream->pending.empty()) s.shared_stream->collect(/*completed_only=*/true);
    std::memcpy(h.data(), pin, out_ints * 4);
    if (!tokens.empty()) std::memcpy(tokens.data(), pin + o_tok, tokens.size() * 4);
    if (rows_bytes > 0) std::memcpy(padded_rows.data(), pin + o_rows_h, rows_bytes);
  } else {
    if (rows != nullptr)
      s.d2h(padded_rows.data(), s.path_rows.ptr, padded_rows.size() * 4,
            "sample_trees path rows download");
    s.d2h(h.data(), outs, out_ints * 4, "sample_trees download");
    if (device_tokens)
      s.d2h(tokens.data(), meta + o_token, tokens.size() * 4, "sample_trees tokens download");
    s.wait("sample_trees");
  }
  const int32_t* len = h.data() + 2 * nodes;
  for (int32_t i = 0; i < items; ++i) {
    const int32_t first = batch.node_indptr[i];
    ARBOR_CHECK(len[i] >= 1 && len[i] <= batch.node_indptr[i + 1] - first,
                "sample_trees: path of " + std::to_string(len[i]) + " nodes");
    out->path_nodes.insert(out->path_nodes.end(), h.begin() + first, h.begin() + first + len[i]);
    out->children_tried.insert(out->children_tried.end(), h.begin() + nodes + first,
                               h.begin() + nodes + first + len[i]);
    out->path_indptr.push_back(static_cast<int32_t>(out->path_nodes.size()));
  }
  out->bonus.assign(len + items, len + 2 * items);
  out->uniforms_used.assign(len + 2 * items, len + 3 * items);
  out->status.assign(len + 3 * items, len + 4 * items);
  fill_path_tokens(batch, device_tokens ? tokens : batch.token, out);
  if (rows != nullptr) {  // item i's len[i] <= depth + 1 rows, compacted into path order
    const int64_t cols = rows->source.cols;
    out->path_rows.resize(out->path_nodes.size() * static_cast<size_t>(cols));
    for (int32_t i = 0; i < items; ++i)
      std::copy_n(padded_rows.begin() + static_cast<int64_t>(out_offset[i]) * cols,
                  static_cast<int64_t>(len[i]) * cols,
                  out->path_rows.begin() + static_cast<int64_t>(out->path_indptr[i]) * cols);
  }
}

void CudaBackend::copy_kv(const std::vector<int64_t>& src_slots,
                          const std::vector<int64_t>& dst_slots) {
  s_->flush();
  State& s = *s_;
  if (src_slots.size() != dst_slots.size())
    throw_error(ErrorCode::kInvalidArgument,
                "copy_kv: " + std::to_string(src_slots.size()) + " source slots but " +
                    std::to_string(dst_slots.size()) + " destination slots");
  for (size_t i = 0; i < src_slots.size(); ++i)
    if (src_slots[i] < 0 || src_slots[i] >= s.num_slots || dst_slots[i] < 0 ||
        dst_slots[i] >= s.num_slots)
      throw_error(ErrorCode::kInvalidArgument,
                  "copy_kv: slot pair " + std::to_string(src_slots[i]) + " -> " +
                      std::to_string(dst_slots[i]) + " is outside the cache's " +
                      std::to_string(s.num_slots) + " slots");
  if (src_slots.empty()) return;
  Packer pk;
  const size_t o_src = pk.add(src_slots), o_dst = pk.add(dst_slots);
  uint8_t* host = s.copy_slots.begin(pk.size(), "copy_kv");
  pk.write(host);
  s.copy_slots.commit(pk.size(), s.stream, "copy_kv");
  s.transfers.h2d_bytes += static_cast<int64_t>(pk.size());
  const int64_t planes = 2 * kv_shape_.num_layers;
  const int64_t pairs = static_cast<int64_t>(src_slots.size());
  s.copy_staging.ensure(static_cast<size_t>(planes * pairs * s.kv_width) * 2 + 16, "copy_kv");
  kernels::CopyKvParams p;
  p.cache = s.kv.ptr;
  p.staging = s.copy_staging.ptr;
  auto* base = static_cast<uint8_t*>(s.copy_slots.device.ptr);
  p.src_slots = reinterpret_cast<const int64_t*>(base + o_src);
  p.dst_slots = reinterpret_cast<const int64_t*>(base + o_dst);
  p.num_planes = planes;
  p.num_slots = s.num_slots;
  p.width = s.kv_width;
  p.num_pairs = pairs;
  cuda_check(kernels::launch_copy_kv(p, s.stream), "copy_kv");
}

}  // namespace arbor
