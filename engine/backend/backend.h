// The Backend contract: a backend owns device memory (weights, KV cache, activations) and
// implements the ops of a Llama forward over one flat batch. The model (engine/model) composes
// the ops; the runner fills StepInputs. The CPU backend (fp32) is the reference every other
// backend is tested against.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "engine/backend/tensor.h"
#include "engine/backend/tree_sampling.h"
#include "engine/core/dtype.h"
#include "engine/core/host_tensor.h"

namespace arbor {

// Geometry of the paged KV cache. Per layer K and V: [num_blocks, block_size, num_kv_heads,
// head_dim]. A slot is block_id * block_size + offset.
struct KvCacheShape {
  int64_t num_layers = 0;
  int64_t num_blocks = 0;
  int64_t block_size = 16;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  bool operator==(const KvCacheShape&) const = default;
};

// Host-side description of one forward step over a flat batch of R requests and N tokens.
// Request r owns query rows [qo_indptr[r], qo_indptr[r+1]) (T_r rows). Its keys are the
// committed prefix (logical indices [0, committed_len[r])), visible to every query row, followed
// by its T_r new tokens at logical indices committed_len[r] + t. Logical index j lives in slot
// block_tables[r * max_blocks_per_request + j / block_size] * block_size + j % block_size.
// Row i of the request sees new token t iff bit t of its packed mask row is set; a request with
// no mask words (mask_indptr[r] == mask_indptr[r+1]) is causal (t <= i): plain decode (T=1)
// and prefill chunks. A tree's mask row i has bit j set iff j == i or j is an ancestor of i.
struct StepInputs {
  std::vector<int32_t> token_ids;      // [N]
  std::vector<int32_t> positions;      // [N] RoPE position (committed_len + depth for trees)
  std::vector<int64_t> slot_mapping;   // [N] slot receiving each token's K/V
  std::vector<int32_t> qo_indptr;      // [R + 1]
  std::vector<int32_t> committed_len;  // [R]
  std::vector<int32_t> block_tables;   // [R, max_blocks_per_request], -1 padded
  int32_t max_blocks_per_request = 0;
  std::vector<uint32_t> tree_mask;   // packed rows: request r has T_r rows of ceil(T_r/32) words
  std::vector<int32_t> mask_indptr;  // [R + 1] word offsets into tree_mask
  std::vector<int32_t> logits_rows;  // [M] flat rows whose logits are wanted, ascending
  // Key paths (EAGLE's draft tree grown on the backend, Backend::draft_frontier_load): empty, or
  // for every request (each causal) key_path_base [R], key_path_indptr [R + 1] and key_path: the
  // request's logical keys from key_path_base[r] on are read at key_path_base[r] + key_path[
  // key_path_indptr[r] + i] (i < committed_len[r] + T_r - key_path_base[r], at most the
  // request's path entries); every path value lies in [0, key_path_span), which the block table
  // covers from key_path_base[r].
  std::vector<int32_t> key_path_base;
  std::vector<int32_t> key_path_indptr;
  std::vector<int32_t> key_path;
  int32_t key_path_span = 0;
  // Token ids still on the backend (a drafter's tree tokens, Backend::top_k_ids): empty, or [N]
  // flat indices into token_source (int32, backend memory the backend can read:
  // Backend::shares_memory_with); row n's id is token_source[token_source_index[n]] where the
  // index is >= 0, token_ids[n] elsewhere. set_step copies them in on the backend (no host wait);
  // token_ids[n] then holds any id inside the vocabulary (the check of the ids on the host).
  Tensor token_source;
  std::vector<int64_t> token_source_index;
  // Tree parents still on the backend (a draft tree picked there, Backend::draft_frontier_trees):
  // empty, or [N] flat indices into token_source; where row n's index is >= 0 its (item-local)
  // parent is token_source[index], and set_step rebuilds the positions and tree mask rows of
  // its request from the parents on the backend (rows with index -1 keep the parent their mask
  // row gives: its highest ancestor bit below itself). positions / tree_mask hold a placeholder
  // tree there in which no node is shallower than in the real one (a batch-invariant attention
  // plan reserves each node's path from it; DeviceTokens).
  std::vector<int64_t> parent_source_index;

  int32_t num_tokens() const { return static_cast<int32_t>(token_ids.size()); }
  int32_t num_requests() const {
    return qo_indptr.empty() ? 0 : static_cast<int32_t>(qo_indptr.size()) - 1;
  }
  // Throws kInvalidArgument naming the inconsistent field (sizes, ranges, table too short).
  void validate(const KvCacheShape& kv) const;
  // For backends whose memory is the host's: the token ids and the parents left in token_source
  // copied in (positions and tree masks rebuilt from the parents, as set_step does on a GPU).
  void resolve_sources();
};

struct RopeParams {
  int64_t head_dim = 0;
  double theta = 10000.0;
  std::string scaling = "none";  // none | linear | llama3
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

// Inverse frequencies for RoPE ([head_dim / 2]), with llama3 / linear scaling applied.
std::vector<double> rope_inv_freq(const RopeParams& p);

// What a backend moved between host and device and how often the host waited for the device,
// counted since it was created (Backend::transfer_stats; zero for a backend in host memory).
struct TransferStats {
  // Host waits for device results or completion (stream synchronisations: every download,
  // argmax / top-k / sampling result, a large upload, one-time tuning). Waits for a pinned
  // upload buffer's previous copy before reusing it are not counted: they order host writes,
  // and in steady state the copy finished a step ago.
  int64_t syncs = 0;
  int64_t d2h_bytes = 0;  // device -> host
  int64_t h2d_bytes = 0;  // host -> device (step metadata, uploads; weights included)
  // Step-graph replays timed on the device (Backend::set_graph_timing) and their device time:
  // from the replay's start on the stream to its end, waits for the host excluded.
  int64_t graphs_timed = 0;
  double graph_device_ms = 0;
  // Of those, the device time from the end of the timed replay before each (on the stream this
  // backend shares) to its start, when that replay was this backend's (same) or another's
  // (other: an EAGLE draft's after the target's verify step, or the other way round): the
  // device idle, waiting for the host, or running ops outside the graphs. Gaps over 1 ms (steps
  // run op by op) are left out.
  int64_t graph_gaps_same = 0, graph_gaps_other = 0;
  double graph_gap_same_ms = 0, graph_gap_other_ms = 0;
  // Step-graph launches and the host's time in them (the CUDA backend's cudaGraphLaunch).
  int64_t graph_launches = 0;
  double graph_launch_host_ms = 0;
  TransferStats operator-(const TransferStats& o) const {
    return {syncs - o.syncs,
            d2h_bytes - o.d2h_bytes,
            h2d_bytes - o.h2d_bytes,
            graphs_timed - o.graphs_timed,
            graph_device_ms - o.graph_device_ms,
            graph_gaps_same - o.graph_gaps_same,
            graph_gaps_other - o.graph_gaps_other,
            graph_gap_same_ms - o.graph_gap_same_ms,
            graph_gap_other_ms - o.graph_gap_other_ms,
            graph_launches - o.graph_launches,
            graph_launch_host_ms - o.graph_launch_host_ms};
  }
  TransferStats operator+(const TransferStats& o) const {
    return {syncs + o.syncs,
            d2h_bytes + o.d2h_bytes,
            h2d_bytes + o.h2d_bytes,
            graphs_timed + o.graphs_timed,
            graph_device_ms + o.graph_device_ms,
            graph_gaps_same + o.graph_gaps_same,
            graph_gaps_other + o.graph_gaps_other,
            graph_gap_same_ms + o.graph_gap_same_ms,
            graph_gap_other_ms + o.graph_gap_other_ms,
            graph_launches + o.graph_launches,
            graph_launch_host_ms + o.graph_launch_host_ms};
  }
};

// The accepted paths' rows and the tokens after them, left in backend memory by a tree-sampling
// call before the host waits for its results (PathRowsRequest::on_device): item i owns rows
// offset[i] .. offset[i + 1] - 1 (its tree's depth + 1, room for any path). Row d of a path of
// len nodes holds the row of path node min(d, len - 1), and next[offset[i] + d] the token after
// it: path node d + 1's, the bonus token from d = len - 1 on (0 where there is none: a failed
// item). Valid until the backend's next sampling call.
struct PathRowsOnDevice {
  Tensor rows;                  // [offset.back(), cols] fp32
  Tensor next;                  // [offset.back(), 1] int32
  Tensor len;                   // [items, 1] int32: each item's path length (its real rows)
  std::vector<int32_t> offset;  // [items + 1]
};

// Rows of a backend tensor to bring back with a tree-sampling result
// (Backend::sample_trees_and_path_rows): node g's row of `source` is node_row[g].
struct PathRowsRequest {
  Tensor source;                  // [*, cols] fp32, backend memory
  std::vector<int32_t> node_row;  // [batch nodes]
  // Called with the rows and tokens on the backend once their work is launched and before the
  // host waits for the results, so that work reading them (a drafter's forward on the same
  // stream) is queued behind it without a round trip to the host. Backends without
  // path_rows_on_device() leave it to the caller (LlamaModel builds them after the results).
  std::function<void(const PathRowsOnDevice&)> on_device;
};

// The memory a backend allocates from (Backend::memory_info): device memory on the CUDA backend,
// host memory on the CPU backend.
struct MemoryInfo {
  int64_t total_bytes = 0;
  int64_t free_bytes = 0;  // what an allocation may take now
  std::string where;       // "device 0 (NVIDIA H200)", "host"
};

// "1.5 GiB", "640 KiB", "12 B": binary units, one decimal.
std::string format_bytes(int64_t bytes);
// Throws kInvalidArgument naming every dimension unless all of them are positive.
void check_kv_cache_shape(const KvCacheShape& shape);
// Throws kResourceExhausted when a KV cache of `bytes` (the cache `shape`) does not fit in
// `available` bytes of `memory` (free memory plus what the cache being replaced holds), naming
// both sizes.
void check_kv_cache_fits(const KvCacheShape& shape, int64_t bytes, int64_t available,
                         const MemoryInfo& memory);

// A tensor-parallel rank's part of a weight (Backend::upload_weight_shard): the rows of each
// (begin, count) in row_ranges of the unsharded weight, concatenated in order, then pad_rows
// rows of zeros; or, with col_count >= 0, columns [col_begin, col_begin + col_count) of every
// row. Vectors ([n]) are sliced by row_ranges.
struct WeightShard {
  std::vector<std::pair<int64_t, int64_t>> row_ranges;
  int64_t pad_rows = 0;
  int64_t col_begin = 0;
  int64_t col_count = -1;
};
// The shard's shape, and the shard of `full` as its own host tensor (shape-only when `full`
// is). kInvalidArgument for a range outside the weight.
std::vector<int64_t> weight_shard_shape(const std::vector<int64_t>& full, const WeightShard& s);
HostTensor slice_weight(const HostTensor& full, const WeightShard& s);

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // --- memory -------------------------------------------------------------------------------
  // Copies a host fp32 weight to backend memory (converted to the backend's weight dtype); the
  // backend keeps it alive until destruction.
  virtual Tensor upload_weight(const HostTensor& w) = 0;
  // Scratch activations, valid until the next reset_scratch() (called once per step).
  virtual Tensor scratch(int64_t rows, int64_t cols) = 0;
  // An fp32 [rows, cols] buffer that lives as long as the backend: results kept from one step to
  // the next on the device (a draft model's layer outputs between its depths). The default
  // throws kUnsupported.
  virtual Tensor persistent(int64_t rows, int64_t cols);
  virtual void reset_scratch() = 0;
  virtual void download(const Tensor& src, float* dst) = 0;  // [rows * cols] fp32 host
  // [rows * cols] fp32 host -> dst. Ordered before every later op and download; src may be
  // reused as soon as it returns (which need not wait for the device).
  virtual void upload(const float* src, const Tensor& dst) = 0;
  // Allocates the KV cache (dropping the previous one). Throws kResourceExhausted naming the
  // size and the free memory when it does not fit.
  virtual void allocate_kv(const KvCacheShape& shape) = 0;
  // Bytes allocate_kv(shape) takes.
  virtual int64_t kv_cache_bytes(const KvCacheShape& shape) const = 0;
  // The memory the KV cache and activations come from, now (the engine sizes the cache from it:
  // runner/kv_sizing.h).
  virtual MemoryInfo memory_info() const = 0;
  virtual const KvCacheShape& kv_shape() const = 0;
  // Per-step metadata (ids, positions, slots, tables, masks); ops below read it.
  virtual void set_step(const StepInputs& step) = 0;

  // --- ops (shapes in rows x cols) ------------------------------------------------------------
  // out[N, hidden] = table[token_ids[n]]
  virtual void embedding(const Tensor& table, const Tensor& out) = 0;
  // out = x * rsqrt(mean(x^2) + eps) * weight, per row; weight [1, cols] or [cols, 1]
  virtual void rms_norm(const Tensor& x, const Tensor& weight, double eps, const Tensor& out) = 0;
  // out[N, out] = x[N, in] @ w[out, in]^T (+ bias[out] when bias.data != nullptr)
  virtual void linear(const Tensor& x, const Tensor& w, const Tensor& bias, const Tensor& out) = 0;
  // outs[j] = columns [c_j, c_j + outs[j].cols) of x, c_j the sum of the earlier widths (each
  // output [N, w_j], the widths summing to x.cols; at most 3 outputs): unpacks a fused
  // projection's output (q|k|v, gate|up).
  virtual void split_cols(const Tensor& x, const std::vector<Tensor>& outs) = 0;
  // out[:, first_col, first_col + x.cols) = x (fp32, the same rows; the other columns are left
  // as they are): packs rows into part of a wider tensor, e.g. the residual stream of EAGLE-3's
  // capture layers side by side. The default downloads both tensors and uploads `out`.
  virtual void copy_cols(const Tensor& x, const Tensor& out, int64_t first_col);
  // out[i] = x's element at flat index[i] (row * cols + col), read back to the host (resized);
  // kInvalidArgument for an index outside x.
  virtual void gather_values(const Tensor& x, const std::vector<int64_t>& index,
                             std::vector<float>* out) = 0;
  // Whether LlamaModel should run q/k/v and gate/up as one linear each (concatenated weights)
  // on this backend: fewer, larger GEMMs where launches and small matrices cost.
  virtual bool fuse_projections() const { return false; }
  // out = a + b (elementwise; out may alias a)
  virtual void add(const Tensor& a, const Tensor& b, const Tensor& out) = 0;
  // out[N, F] = silu(gate[N, F]) * up[N, F]
  virtual void silu_mul(const Tensor& gate, const Tensor& up, const Tensor& out) = 0;
  // In place, rotate-halves (HF) RoPE at step positions: q [N, Hq*D], k [N, Hkv*D].
  virtual void rope(const Tensor& q, const Tensor& k, const RopeParams& p) = 0;
  // Writes k, v [N, Hkv*D] into layer's cache at the step's slot_mapping.
  virtual void write_kv(int64_t layer, const Tensor& k, const Tensor& v) = 0;
  // out[N, Hq*D] = softmax(q k^T / sqrt(D), tree/causal mask over the paged prefix) v
  virtual void paged_tree_attention(int64_t layer, const Tensor& q, int64_t num_heads,
                                    const Tensor& out) = 0;
  // out[M, cols] = x[logits_rows[m]]
  virtual void gather_logit_rows(const Tensor& x, const Tensor& out) = 0;
  // out[i] = src[rows[i]] (fp32 [*, cols] tensors in backend memory, host row indices), e.g. a
  // step's input gathered from an earlier step's outputs without a trip through the host. Not
  // for step-graph recordings (the indices are uploaded with it). The default downloads src and
  // uploads the rows.
  virtual void gather_rows(const Tensor& src, std::span<const int32_t> rows, const Tensor& out);
  // Greedy decoding on the device, so only token ids cross to the host. logits: [M, vocab] fp32
  // (backend memory); out: [M] host, resized. out[m] = the index of row m's largest value, the
  // lowest index among equal values (argmax() in engine/sampling), or -1 where that argmax
  // rejects the row: a NaN or +inf in it, or every value -inf.
  virtual void argmax_rows(const Tensor& logits, std::vector<int32_t>* out) = 0;
  // The k best entries of each row of logits [rows, cols] fp32 (backend memory) and their
  // log-softmax values: ids [rows, k] (host, resized) best first, the lower id first among
  // equal values (host_math::top_k), values = min(x - logsumexp(row), 0)
  // (host_math::log_softmax_inplace). 1 <= k <= min(cols, 1024), else kInvalidArgument.
  virtual void top_k_log_softmax(const Tensor& logits, int32_t k, std::vector<int32_t>* ids,
                                 std::vector<float>* values) = 0;
  // top_k_log_softmax's ids, left in backend memory: ids [logits.rows, k] int32 (a persistent
  // tensor of this backend), no wait for the device. The default throws kUnsupported.
  virtual void top_k_ids(const Tensor& logits, int32_t k, const Tensor& ids);
  // out[i] = ids' element at flat index[i] (int32, memory this backend shares_memory_with), -1
  // where index[i] is -1 (token_source_index's form), read back to the host (resized; one
  // wait). kInvalidArgument for an index outside [-1, ids.numel()). The default throws
  // kUnsupported.
  virtual void download_ids(const Tensor& ids, std::span<const int64_t> index,
                            std::vector<int32_t>* out);
  // Whether this backend's ops may read `other`'s memory directly (token_source,
  // TreeSampleBatch::token_source): both in host memory, or on the same GPU.
  virtual bool shares_memory_with(const Backend& other) const {
    (void)other;
    return false;
  }
  // Orders this backend's later work after everything issued so far on `other` (a memory it
  // shares_memory_with that other's ops write), without a host wait. The default does nothing
  // (host memory: every op has finished when it returns).
  virtual void wait_for(Backend& other) { (void)other; }
  // Sampling and speculative verification of a batch of trees with the logits left in backend
  // memory (tree_sampling.h): logits [M, vocab] fp32, rows named by batch.logits_row; they may be
  // overwritten (the backend may process them in place). Throws kInvalidArgument for a malformed
  // batch (validate_tree_sample_batch) before any work. A backend without it (has_sample_trees()
  // false: the CPU backend, whose logits are host memory anyway) leaves it to the caller, which
  // runs the host reference (engine/verify/device_verify.h sample_trees_on_host) on the
  // downloaded logits; the default throws kUnsupported.
  virtual bool has_sample_trees() const { return false; }
  virtual void sample_trees(const Tensor& logits, const TreeSampleBatch& batch,
                            TreeSampleResult* out);
  // sample_trees, and out->path_rows: [path_nodes.size(), cols] host fp32, row j = the source
  // row of path node j (rows.node_row[node_indptr[i] + path_nodes[j]] for j in item i's path),
  // e.g. the target's final hidden states at the accepted paths, which a drafter reads. The CUDA
  // backend gathers them on the device and copies them back with the ids (one wait, no [nodes,
  // hidden] download); the default runs sample_trees, downloads the source and gathers on the
  // host (gather_path_rows_on_host).
  virtual void sample_trees_and_path_rows(const Tensor& logits, const TreeSampleBatch& batch,
                                          const PathRowsRequest& rows, TreeSampleResult* out);
  // Whether sample_trees_and_path_rows calls rows.on_device itself, before its wait.
  virtual bool path_rows_on_device() const { return false; }
  // KV compaction: for every layer, cache[dst_slots[i]] = cache[src_slots[i]] (K and V). The
  // copies are done as if simultaneously (sources read before any destination is written).
  virtual void copy_kv(const std::vector<int64_t>& src_slots,
                       const std::vector<int64_t>& dst_slots) = 0;
  // --- EAGLE-2's dynamic trees grown on the backend (EagleDraftModel::grow_trees) ------------
  // G trees of frontier width k grow depth by depth with no host round trip between depths:
  // each depth's step reads its frontier (token ids, key paths, input rows) from backend memory,
  // and its logits' top-k choose the next frontier there, by DynamicTreeGrower's rule
  // (engine/spec/eagle_tree.h). The host downloads every depth's top-k rows once, at the end,
  // and replays the grower on them. has_draft_frontier() false: the draft grows on the host
  // (one wait per depth); the defaults throw kUnsupported.
  virtual bool has_draft_frontier() const { return false; }
  // Draft id -> target id: id + offsets[id] (empty: the same ids); kept until the next call.
  virtual void set_draft_vocab_map(std::span<const int64_t> offsets);
  // The top-k log-softmax of logits [R, vocab] (top_k_log_softmax's), kept on the backend for
  // the next draft_frontier_begin: the roots' children of trees whose root rows were just run.
  virtual void draft_frontier_roots(const Tensor& logits, int32_t k);
  // Starts G trees: row g * k + r of the first frontier is the draft id ids[g * k + r] with
  // score values[g * k + r] (the root's top-k), or for g < root_rows.size() entry r of row
  // root_rows[g] of the last draft_frontier_roots (ids and values there are ignored); input row
  // parent_rows[g * k + r] of the first load's source, key path {r}. At most max_depth depths
  // follow; at depth d row i sits at RoPE position positions[i] + d - 1 and writes its K/V to
  // slots[(d - 1) * G * k + i].
  virtual void draft_frontier_begin(int32_t groups, int32_t k, int32_t max_depth,
                                    std::span<const int32_t> ids, std::span<const float> values,
                                    std::span<const int32_t> parent_rows,
                                    std::span<const int32_t> positions,
                                    std::span<const int64_t> slots,
                                    std::span<const int32_t> root_rows = {});
  // Depth d (1-based) of a step set for all of them (set_step: G * k rows, each its own causal
  // request whose key path holds max_depth entries from key_path_base, the request's committed
  // rows): writes the step's token ids (the frontier's target ids), positions, slots, committed
  // lengths (key_path_base + d - 1) and key paths (the row's ancestors' offsets (e - 1) * k +
  // rank_e, then its own), and in [G * k, cols] = the rows of `source` [*, cols] the frontier
  // reads (fp32, backend memory). Every depth's load, layer and expand may run in one step
  // graph: neither load nor expand waits for the device or uploads.
  virtual void draft_frontier_load(int32_t depth, const Tensor& source, const Tensor& in);
  // Trees grown from rows whose count only the backend knows yet (the verify step's accepted
  // paths, PathRowsOnDevice: the host sets the step up as if every reserved row of tree g were
  // real): after draft_frontier_begin with every tree's root row kept (root_rows, G entries)
  // and set_step, and before the first load, tree g moves back by shift_g = rows[g] -
  // len[len_index[g]] (clamped to [0, rows[g] - 1]): its depth-1 positions and its rows'
  // key_path_base (so their committed lengths) by shift_g while its key paths' offsets grow by
  // shift_g (its tree slots stay at the logical keys the host set them at), its root row to
  // root_rows[g] - shift_g (the first frontier re-read from the kept roots), and roots row g =
  // that row of root_source [*, cols] (fp32). Nothing waits or downloads.
  virtual void draft_frontier_shift(const Tensor& len, std::span<const int32_t> len_index,
                                    std::span<const int32_t> rows, const Tensor& root_source,
                                    const Tensor& roots);
  // Depth d's logits [G * k, vocab] fp32: their top-k log-softmax (top_k_log_softmax's ids and
  // values, kept as depth d's log), and the next frontier: per tree the k best of its k * k
  // candidates by score (the row's score + the value), ties to the lower candidate index (row r's
  // j-th entry is candidate r * k + j), best first; their rows of this depth's outputs are the
  // next load's source rows.
  virtual void draft_frontier_expand(int32_t depth, const Tensor& logits);
  // Depths 1..depths' top-k, in one download: ids and values [depths][G * k][k], and the first
  // frontier (the roots' top-k) root_ids and root_values [G][k], resized.
  virtual void draft_frontier_log(int32_t depths, std::vector<int32_t>* ids,
                                  std::vector<float>* values, std::vector<int32_t>* root_ids,
                                  std::vector<float>* root_values);
  // The final trees, picked on the backend with no wait (DynamicTreeGrower::tree()'s choice,
  // engine/backend/draft_frontier.h's select_draft_trees): tree g after depth[g] expansions
  // (<= the depths expanded), with nodes[g] nodes (draft_tree_nodes) <= stride. Returns [G, 2,
  // stride] int32 in backend memory, valid until the next draft_frontier_begin: tree g's target
  // ids at g * 2 * stride + i, its parent nodes at g * 2 * stride + stride + i (node 0, the root:
  // id 0, parent -1). A verify step reads them through StepInputs::token_source /
  // parent_source_index. has_draft_frontier_trees() false: the default throws kUnsupported.
  virtual bool has_draft_frontier_trees() const { return false; }
  virtual Tensor draft_frontier_trees(std::span<const int32_t> depth,
                                      std::span<const int32_t> nodes, int32_t stride);

  // Host <-> device traffic and host waits so far (the probe of spec-bench and the GPU tests).
  virtual TransferStats transfer_stats() const { return {}; }
  // Diagnostics (spec-bench --time-graphs): time every step-graph replay on the device with
  // events around it, read at the next wait (TransferStats::graph_device_ms). No-op where steps
  // are not recorded.
  virtual void set_graph_timing(bool on) { (void)on; }
  // The device time of the work enqueued between device_interval_begin() and _end(), read
  // without a wait once the device has passed the end (after a later wait): the last interval's
  // milliseconds, or -1 when none has completed or the backend runs its ops as they are called
  // (the CPU's: the host time is the device time). Engine: what drafting costs when the draft
  // does not wait for the device.
  virtual void device_interval_begin() {}
  virtual void device_interval_end() {}
  virtual double last_device_interval_ms() { return -1.0; }
  // What the backend chose at run time for each shape it met (the CUDA backend: the tuned
  // cuBLASLt algorithm and chain GEMM per (out, in) weight shape), one line each; "" where
  // nothing is chosen at run time. spec-bench --gemm-report prints it.
  virtual std::string tuning_report() const { return ""; }

  // --- tensor parallelism (docs/tensor_parallel.md) -------------------------------------------
  // A backend made as one rank of a group (make_cpu_tp_backends, make_cuda_tp_backends) holds
  // its rank's shard of the weights and KV heads; the collectives below combine the ranks. Every
  // rank issues the same collectives in the same order, each from the thread that drives it.
  virtual int tp_rank() const { return 0; }
  virtual int tp_size() const { return 1; }
  // Uploads `shard` of the unsharded weight `full`. The default slices on the host
  // (slice_weight) and uploads the slice; the CUDA backend fills a shape-only (dummy) weight's
  // shard with the values the unsharded dummy weight holds at those elements.
  virtual Tensor upload_weight_shard(const HostTensor& full, const WeightShard& shard);
  // out[N, hidden] = table[token_ids[n] - first_id] for ids in [first_id, first_id +
  // table.rows), zeros for every other id: the rank's vocabulary shard of the embedding (the
  // caller checks the ids against the whole vocabulary). The default throws kUnsupported.
  virtual void embedding_shard(const Tensor& table, int64_t first_id, const Tensor& out);
  // x = the elementwise sum of x over the group's ranks, the same bits on every rank (a no-op
  // without a group).
  virtual void all_reduce_sum(const Tensor& x);
  // out[rows, W] = the ranks' local[rows, c] side by side, rank r's at columns [r * c, (r + 1) *
  // c), cut at W (the vocabulary shards of the logits). Without a group: a copy of local.
  virtual void all_gather_cols(const Tensor& local, const Tensor& out);
  // Makes the calling thread drive this backend (its GPU current); a rank's worker thread calls
  // it before anything else.
  virtual void bind_thread() {}

  // --- step graphs (engine/backend/step_graphs.h; CUDA graphs on the CUDA backend) -----------
  // A backend that can record the device work of a step's ops and replay it implements these;
  // the defaults say it cannot. The ops between begin_step_capture() and end_step_capture()
  // are recorded, not run, so they must do no host synchronisation and allocate nothing; the
  // step's metadata (set_step) and what prepare_step_graph() uploads stay outside the
  // recording, written to the same device addresses every step.
  //
  // Whether step graphs are wanted (CudaBackendOptions::cuda_graphs).
  virtual bool step_graphs_enabled() const { return false; }
  // For the step of the last set_step(), whose attention has num_q_heads query heads: does now
  // the host-side preparation the ops would do lazily (the attention plan and its upload), in
  // the form a recording can replay (launch sizes rounded up to buckets), and appends to `key`
  // every launch value it derives from the step's contents. False: this step cannot be
  // recorded (run it eagerly).
  virtual bool prepare_step_graph(int64_t num_q_heads, std::vector<int64_t>* key) {
    (void)num_q_heads;
    (void)key;
    return false;
  }
  // Records the ops issued until end_step_capture() instead of running them.
  virtual void begin_step_capture();
  // Ends the recording: a graph id >= 0, or -1 when the backend could not record the step
  // (nothing recorded ran: run the ops again eagerly).
  virtual int64_t end_step_capture() { return -1; }
  // Abandons a recording after an op threw inside it (nothing recorded ran).
  virtual void abort_step_capture() {}
  // Runs a recording (after set_step() and prepare_step_graph() of a step with its key).
  virtual void replay_step_graph(int64_t graph);
  virtual void release_step_graph(int64_t graph) { (void)graph; }
  // Changes whenever memory a recording may point into is reallocated or re-laid out (scratch
  // arena, metadata and plan buffers, KV cache): recordings from another epoch must not run.
  virtual uint64_t step_graph_epoch() const { return 0; }
};

// Backend::copy_cols' argument check (kInvalidArgument naming the shapes).
void check_copy_cols(const Tensor& x, const Tensor& out, int64_t first_col);

// out->path_rows from host rows `source` [*, cols] (Backend::sample_trees_and_path_rows).
void gather_path_rows_on_host(const float* source, int64_t cols, const TreeSampleBatch& batch,
                              std::span<const int32_t> node_row, TreeSampleResult* out);
// PathRowsOnDevice's layout built on the host from a result with path rows [path nodes, cols]:
// offset [items + 1], rows [offset.back(), cols], next [offset.back()].
void pad_path_rows_on_host(const TreeSampleBatch& batch, const TreeSampleResult& result,
                           int64_t cols, std::vector<int32_t>* offset, std::vector<float>* rows,
                           std::vector<int32_t>* next);
// Rows per item of PathRowsOnDevice::offset: its tree's depth + 1 (from batch.parent).
std::vector<int32_t> path_row_offsets(const TreeSampleBatch& batch);

std::unique_ptr<Backend> make_cpu_backend(int num_threads = 0);
// `size` CPU backends forming one tensor-parallel group (collectives in host memory between the
// rank threads): the reference the CUDA group (NCCL) is tested against.
std::vector<std::unique_ptr<Backend>> make_cpu_tp_backends(int size, int num_threads = 0);

}  // namespace arbor
