// The EAGLE draft layer (EAGLE-1/2 or EAGLE-3) run on a Backend with its own one-layer paged KV
// cache. A request's committed (token_{t+1}, feature_t) rows live in one sequence; tree expansion
// forks a short-lived sequence per frontier node from its parent's (copy-on-write of the shared
// last block), so each node attends to the committed prefix plus exactly its ancestors - the
// tree mask of the official code - through ordinary causal decode rows.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <unordered_map>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/step_graphs.h"
#include "engine/draft/eagle_checkpoint.h"
#include "engine/draft/top_k_rows.h"
#include "engine/kv_cache/kv_cache_manager.h"

namespace arbor {

class EagleDraftModel {
 public:
  // Uploads the draft weights to `backend` (which it then owns, with a KV cache of
  // kv.num_blocks blocks), plus the target's embeddings target_embed [vocab, h] unless the
  // checkpoint has its own, and for EAGLE-1/2 the target's LM head target_lm_head [vocab, h].
  // kInvalidArgument naming both sizes when the target does not fit the draft.
  EagleDraftModel(std::unique_ptr<Backend> backend, const EagleWeights& weights,
                  const HostTensor& target_embed, const HostTensor& target_lm_head,
                  const KvCacheConfig& kv);

  const EagleDraftConfig& config() const { return config_; }
  // The draft's step-graph counters (all zero when its backend records none).
  TransferStats transfer_stats() const { return backend_->transfer_stats(); }
  StepGraphStats step_graph_stats() const {
    return graphs_ != nullptr ? graphs_->stats() : StepGraphStats{};
  }
  bool eagle3() const { return config_.version == EagleVersion::kEagle3; }
  int64_t hidden_size() const { return config_.hidden_size; }
  // Width of a committed row's feature: the target's final-norm hidden (EAGLE-1/2) or the
  // concatenation of the three captured layers (EAGLE-3).
  int64_t feature_width() const;
  int64_t draft_vocab() const { return config_.draft_vocab_size; }
  int32_t to_target(int32_t draft_id) const;

  SeqId create_sequence() { return kv_.create_sequence().seq; }
  // A sequence sharing every committed row of `seq` (copy-on-write).
  SeqId fork(SeqId seq) { return kv_.fork(seq); }
  void free_sequence(SeqId seq) { kv_.free_sequence(seq); }
  int32_t length(SeqId seq) const { return kv_.committed_len(seq); }
  const KvCacheManager& kv() const { return kv_; }

  // Appends n committed rows to `seq` at RoPE positions position0 + i: row i reads tokens[i]
  // (token_{t+1}) and features [n, feature_width()] row i (feature_t). Returns the layer outputs
  // [n, hidden] host fp32 (the next features). kResourceExhausted when the KV pool is full.
  // With last_top, also the top_k best draft entries of the last row (the k best entries of its
  // log_probs(), computed where the logits are: Backend::top_k_log_softmax), in the same device
  // step.
  std::vector<float> append(SeqId seq, std::span<const int32_t> tokens,
                            std::span<const float> features, int32_t position0, int32_t top_k = 0,
                            TopKRows* last_top = nullptr);
  // append() for several sequences in one forward (one wait for the device): item i's rows
  // follow item i - 1's in the returned outputs; last_tops[i] is the top_k of item i's last row.
  // Items with no tokens are not allowed; sequences must differ.
  struct AppendItem {
    SeqId seq;
    std::span<const int32_t> tokens;
    std::span<const float> features;  // [tokens, feature_width()]
    int32_t position0;
  };
  // With download false nothing is copied back (an empty return): the outputs stay on the
  // backend as the last forward's (GrowItem::root_row reads them there), and with last_tops
  // null too the last rows' top-k (Backend::draft_frontier_roots; GrowItem::root_top_row).
  std::vector<float> append_batch(std::span<const AppendItem> items, int32_t top_k,
                                  std::vector<TopKRows>* last_tops, bool download = true);

  // append_batch's rows read from backend memory, run without a wait: item i's rows are rows
  // first .. first + rows - 1 of `features` [*, feature_width()] fp32 with tokens `next` [*, 1]
  // int32 (PathRowsOnDevice), reserved at RoPE positions position0 + j of seq but not committed:
  // commit_on_device then takes the first ones the host learns are real (the rest are
  // released), cancel_on_device none. The outputs and every row's top_k stay on the backend
  // (rows in item order: GrowItem::root_row / root_top_row with roots_from_device_append),
  // until the next append_on_device. kResourceExhausted when the KV pool is full (nothing is
  // reserved then).
  // Committed-row forwards of up to this many rows replay step graphs (more run op by op).
  static constexpr int64_t kMaxGraphFeatureRows = 64;
  bool records_steps() const { return graphs_ != nullptr; }
  // extra: slots reserved after the rows for a tree grown before the host learns how many of
  // them are real (grow_trees with a PathShift); released with the rows not committed.
  struct DeviceAppendItem {
    SeqId seq;
    int32_t position0;
    int32_t first;
    int32_t rows;
    int32_t extra = 0;
  };
  void append_on_device(std::span<const DeviceAppendItem> items, const Tensor& features,
                        const Tensor& next, int32_t top_k);
  // tokens: the token_{t+1} of the rows committed (1 .. the rows reserved).
  void commit_on_device(SeqId seq, std::span<const int32_t> tokens);
  void cancel_on_device(SeqId seq);

  // One tree-expansion step: row i forks parents[i] and appends (tokens[i], hidden row i) at
  // RoPE position `position`, where hidden [B, hidden] are earlier layer outputs (EAGLE-3 skips
  // fc for them, as the official code does). children receives the B new sequences (the caller
  // frees them). Returns the outputs [B, hidden]; with top, also every row's top_k best draft
  // entries (as for append()'s last_top), computed in the same device step (the LM head is
  // part of the step's recording, and only one wait for the device per step).
  std::vector<float> expand(std::span<const SeqId> parents, std::span<const int32_t> tokens,
                            std::span<const float> hidden, int32_t position,
                            std::vector<SeqId>* children, int32_t top_k = 0,
                            TopKRows* top = nullptr);
  // The same with a RoPE position per row (rows of several requests in one forward).
  std::vector<float> expand(std::span<const SeqId> parents, std::span<const int32_t> tokens,
                            std::span<const float> hidden, std::span<const int32_t> positions,
                            std::vector<SeqId>* children, int32_t top_k = 0,
                            TopKRows* top = nullptr);
  // An expansion step whose outputs stay on the draft's backend (nothing copied back; the next
  // step reads them there): hidden row i is host row i of `hidden`, or, with `hidden` empty,
  // row last_rows[i] of the previous forward's outputs (append, append_batch or an expansion),
  // gathered on the device.
  void expand_on_device(std::span<const SeqId> parents, std::span<const int32_t> tokens,
                        std::span<const float> hidden, std::span<const int32_t> last_rows,
                        std::span<const int32_t> positions, std::vector<SeqId>* children,
                        int32_t top_k, TopKRows* top);

  // EAGLE-2's dynamic trees of several requests grown on the backend, every depth's frontier
  // chosen there (Backend::draft_frontier_*: no host wait between depths, one download at the
  // end). Item i's first frontier is its root's top-k (k entries) and reads its root's output:
  //   device roots (root_row >= 0; these items come first): the root row was the last row of
  //   an item of the last append_batch run without download and without last_tops, whose
  //   outputs and top-k stayed on the backend: output row root_row, top-k row root_top_row;
  //   host roots: *root and root_output [hidden].
  // Its depth-d rows sit at RoPE position position + d - 1 and attend to the sequence's
  // committed rows and their ancestors, whose K/V live in depths * k slots reserved after the
  // committed rows for the call (released at its end). Returns depth d's top-k rows (rows
  // i * k .. i * k + k - 1 are item i's frontier rows in DynamicTreeGrower's order), d =
  // 1..depths, and in *root_tops every item's root top-k. kResourceExhausted when the KV pool is
  // full.
  bool grows_on_backend() const { return backend_->has_draft_frontier(); }
  std::string backend_name() const { return backend_->name(); }
  struct GrowItem {
    SeqId seq;
    int32_t position;
    const TopKRows* root = nullptr;
    std::span<const float> root_output;
    int32_t root_row = -1;
    int32_t root_top_row = -1;
  };
  // With `device` set, the trees are picked on the backend instead (Backend::draft_frontier_trees:
  // item i's tree after device->depth[i] expansions, device->nodes[i] nodes): nothing is
  // downloaded and nothing waits; device->out receives the [G, 2, stride] trees, and the log
  // and *root_tops come back empty.
  struct DeviceTrees {
    std::vector<int32_t> depth, nodes;
    int32_t stride = 0;
    Tensor out;
  };
  bool picks_trees_on_backend() const { return backend_->has_draft_frontier_trees(); }
  Backend& backend() { return *backend_; }
  // roots_from_device_append: the device roots are rows of the last append_on_device instead
  // of the last forward.
  // With `shift` (trees picked on the backend, roots from the last append_on_device, whose
  // reservations are not committed yet and hold `extra` >= depths * k slots): the trees grow
  // before the host knows how many of each item's reserved rows are real. Item i's root_row,
  // root_top_row and position are those of its last reserved row; the backend moves tree i back
  // by rows[i] - len[len_index[i]] rows (Backend::draft_frontier_shift), and its rows' K/V go to
  // the extra slots. The reservations are left for commit_on_device / cancel_on_device.
  struct PathShift {
    Tensor len;                      // [*, 1] int32, backend memory (PathRowsOnDevice::len)
    std::vector<int32_t> len_index;  // [items]
    std::vector<int32_t> rows;       // [items]: the rows reserved for each item's path
  };
  std::vector<TopKRows> grow_trees(std::span<const GrowItem> items, int32_t k, int32_t depths,
                                   std::vector<TopKRows>* root_tops, DeviceTrees* device = nullptr,
                                   bool roots_from_device_append = false,
                                   const PathShift* shift = nullptr);

  // Draft logits of layer outputs hidden [rows, hidden]: the target's LM head (EAGLE-1/2, no
  // final norm) or lm_head(norm(h)) (EAGLE-3). [rows, draft_vocab] host fp32.
  std::vector<float> logits(std::span<const float> hidden, int64_t rows);
  // log_softmax of logits(), per row.
  std::vector<float> log_probs(std::span<const float> hidden, int64_t rows);

 private:
  struct Row {
    SeqId seq;
    std::vector<int32_t> tokens;
    int32_t position0;
    std::vector<int64_t> slots;
  };
  // Which rows' draft logits a forward also reduces to their top-k: none, every token row, or
  // the last token row of each Row.
  enum class Head { kNone, kAll, kLast };
  // Runs the layer over the reserved rows; `input` is [N, in_width] (features or hidden). With
  // a head, also the top_k of those rows' draft logits (into top) in the same step.
  // With input_rows, the input is those rows of the previous forward's outputs instead (and
  // with download false nothing is copied back).
  // With `device`, the features are its rows of device->features, the ids its rows of
  // device->tokens, and the outputs are kept in device_out_ instead of last_out_.
  struct DeviceRows {
    Tensor features;            // [*, feature_width()] fp32
    Tensor tokens;              // [*, 1] int32
    std::vector<int32_t> rows;  // [real rows]: each row's row of both
  };
  std::vector<float> forward(const std::vector<Row>& rows, std::span<const float> input,
                             bool input_is_feature, Head head = Head::kNone, int32_t top_k = 0,
                             TopKRows* top = nullptr, std::span<const int32_t> input_rows = {},
                             bool download = true, const DeviceRows* device = nullptr);
  // fork + reserve one row per parent (children receives them), then forward.
  std::vector<float> expand_rows(std::span<const SeqId> parents, std::span<const int32_t> tokens,
                                 std::span<const float> hidden, std::span<const int32_t> last_rows,
                                 std::span<const int32_t> positions, std::vector<SeqId>* children,
                                 int32_t top_k, TopKRows* top, bool download);
  // The layer's ops on the step's input `in` [N, in_width] (no uploads or downloads, so a
  // step graph can record them); returns the outputs [N, hidden] in backend scratch.
  Tensor layer(const Tensor& in, int64_t n, bool input_is_feature);
  // The draft logits [rows, draft_vocab] in backend scratch (valid until the next reset).
  Tensor device_logits(std::span<const float> hidden, int64_t rows);
  // The LM head's ops on layer outputs x [rows, hidden] already in backend scratch.
  Tensor head(const Tensor& x);
  std::vector<int64_t> reserve(SeqId seq, int32_t num_tokens, SlotCopies* copies);

  // The last forward's outputs [last_rows_, hidden], kept on the backend for expand_from_last
  // (grown by doubling; a backend's persistent buffers live as long as it does).
  Tensor last_out_;
  int64_t last_rows_ = 0;
  Tensor device_out_;  // the last append_on_device's outputs [device_rows_, hidden]
  int64_t device_rows_ = 0;
  // The last append_on_device's extra slots per sequence (DeviceAppendItem::extra).
  std::unordered_map<SeqId, std::vector<int64_t>> extra_slots_;
  // Committed-row forwards recorded as step graphs pad their rows to a few counts with rows
  // that write this sequence's one reserved slot and are never read (made at first use).
  SeqId pad_seq_ = -1;
  int64_t pad_slot_ = -1;
  Tensor root_out_;             // grow_trees: the roots' outputs (grown by doubling)
  bool vocab_map_set_ = false;  // d2t_ handed to the backend (set_draft_vocab_map)
  std::unique_ptr<Backend> backend_;
  EagleDraftConfig config_;
  KvCacheManager kv_;
  RopeParams rope_;
  std::vector<int64_t> d2t_;  // [draft_vocab] or empty
  // Backend weights ([out, in] as Backend::linear takes them).
  Tensor embed_;                       // [vocab, h]
  Tensor fc_emb_, fc_feat_, fc_bias_;  // EAGLE-1/2: fc split into [h, h] halves (+ [h] bias)
  Tensor fc_;                          // EAGLE-3: [h, 3 * target_h]
  Tensor input_norm_, hidden_norm_;    // EAGLE-3 [h]
  Tensor wq_, wk_, wv_;                // EAGLE-1/2: [out, h]; EAGLE-3: the halves reading emb
  Tensor wq_h_, wk_h_, wv_h_;          // EAGLE-3: the halves reading hidden_norm(h)
  Tensor bq_, bk_, bv_, wo_, post_norm_, w_gate_, w_up_, w_down_;
  // Backend::fuse_projections(): q|k|v (EAGLE-3: of each input half) and gate|up stacked.
  bool fused_ = false;
  Tensor wqkv_, wqkv_h_, bqkv_, w_gate_up_;
  Tensor norm_, lm_head_;                   // EAGLE-3 own; EAGLE-1/2: lm_head_ = target's
  std::unique_ptr<StepGraphCache> graphs_;  // after backend_: released before it
};

}  // namespace arbor
