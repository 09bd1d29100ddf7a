// Builds ModelWeights from a checkpoint whose tensors are addressable by name (HF safetensors,
// GGUF): maps each weight to the format's tensor name, checks every shape against the config
// before reading it, un-permutes Meta-layout Q/K rows, and rejects tensors it does not know.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "engine/core/host_tensor.h"
#include "engine/model/model_weights.h"

namespace arbor {

using LoadProgress = std::function<void(const std::string& stage, double fraction)>;

// A checkpoint's tensors by name. Shapes are row-major (slowest dimension first).
class TensorSource {
 public:
  virtual ~TensorSource() = default;
  virtual bool contains(const std::string& name) const = 0;
  virtual std::vector<int64_t> shape(const std::string& name) const = 0;
  virtual HostTensor read_f32(const std::string& name) const = 0;  // throws kUnsupported dtype
  virtual std::string file_of(const std::string& name) const = 0;  // for messages
  virtual std::vector<std::string> names() const = 0;
};

enum class WeightNaming {
  kHuggingFace,  // model.layers.{i}.self_attn.q_proj.weight, ...
  kGguf,         // blk.{i}.attn_q.weight, ...
};

struct AssembleOptions {
  WeightNaming naming = WeightNaming::kHuggingFace;
  bool meta_rope_layout = false;              // Q/K rows stored pairwise: un-permute them
  std::vector<std::string> ignored_tensors;   // present in the checkpoint, deliberately unused
  std::vector<std::string> ignored_suffixes;  // e.g. "rotary_emb.inv_freq"
  LoadProgress progress;                      // may be empty
};

// Reads every weight the config calls for. Throws kNotFound for a missing tensor, kCorruptData
// for a shape that disagrees with the config, kUnsupported for an unknown extra tensor; each
// message names the file, the tensor, and expected vs found.
ModelWeights assemble_weights(const ModelConfig& config, const TensorSource& source,
                              const AssembleOptions& options);

// The checkpoint name of a weight: `role` is one of embed, final_norm, lm_head (layer -1) or
// attn_norm, wq, wk, wv, bq, bk, bv, wo, ffn_norm, w_gate, w_up, w_down.
std::string weight_tensor_name(WeightNaming naming, const std::string& role, int layer);

// Meta pairwise RoPE row order -> Hugging Face rotate-halves order, independently per head.
// w: [n_heads * head_dim, cols] (or a bias [n_heads * head_dim]); HF row r of a head takes
// Meta row 2r for r < head_dim/2 and 2(r - head_dim/2) + 1 otherwise.
HostTensor meta_to_hf_rope_rows(const HostTensor& w, int64_t n_heads, int64_t head_dim);

// Throws kCorruptData "<file>: tensor <name>: expected shape [..], found [..]" on mismatch.
void check_tensor_shape(const std::string& file, const std::string& tensor,
                        const std::vector<int64_t>& expected, const std::vector<int64_t>& found);

}  // namespace arbor
