// Medusa heads in the FasterDecoding format (medusa_lm_head.safetensors): head i is
// ResBlock^L (x + SiLU(W x + b)) followed by its own bias-free LM head, or, for Medusa-2 style
// heads saved without one, the base model's LM head. Head i reads the target's final-norm hidden
// state at position t and predicts the token at t + i + 2. Heads are counted from tensor names
// (published config.json files are known to be wrong; a config.json beside them is not read).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/core/host_tensor.h"

namespace arbor {

struct MedusaHead {
  std::vector<HostTensor> res_weight;  // [L] each [hidden, hidden]
  std::vector<HostTensor> res_bias;    // [L] each [hidden]
  HostTensor lm_head;                  // [vocab, hidden]; empty: the base model's LM head
};

struct MedusaHeads {
  std::string source;  // the file the heads came from, for messages
  int64_t hidden_size = 0;
  int64_t vocab_size = 0;
  std::vector<MedusaHead> heads;
  HostTensor base_lm_head;  // [vocab, hidden]; filled only when some head has no LM head

  int32_t num_heads() const { return static_cast<int32_t>(heads.size()); }
  bool uses_base_lm_head() const;
};

// Loads `path` (a directory holding medusa_lm_head.safetensors, or the file itself). Tensor names
// are `{i}.{l}.linear.weight [h, h]`, `{i}.{l}.linear.bias [h]` for l < L_i and optionally
// `{i}.{L_i}.weight [V, h]`, optionally prefixed `medusa_head.`. `base_lm_head` ([V, h], the
// target's output weight) is copied for heads without their own. Throws kNotFound for a missing
// file, kCorruptData naming the tensor for an unknown name, a gap in the head / layer numbering
// or a wrong shape (expected vs found).
MedusaHeads load_medusa_heads(const std::string& path, const HostTensor& base_lm_head);

// Logits of every head for `rows` hidden states: [num_heads][rows, vocab] host fp32.
// hidden: [rows, hidden_size].
std::vector<std::vector<float>> medusa_head_logits(const MedusaHeads& heads,
                                                   std::span<const float> hidden, int64_t rows);

}  // namespace arbor
