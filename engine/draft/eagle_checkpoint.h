// EAGLE draft-head checkpoints in the SafeAILab format: a directory with config.json (a one-layer
// Llama config plus `bias`, and for EAGLE-3 `draft_vocab_size`) and model.safetensors (convert a
// pytorch_model.bin with scripts/convert_eagle_bin.py).
//  - EAGLE-1/2: fc [h, 2h] (+ fc.bias unless bias is false) over concat(embed(token_{t+1}),
//    feature_t), then layers.0.* (no input_layernorm); the target's embeddings and LM head.
//  - EAGLE-3: fc [h, 3h] over concat(low, mid, high) residual streams of the target, midlayer.*
//    whose q/k/v read concat(input_layernorm(emb), hidden_norm(h)) (in-dim 2h), own norm and
//    lm_head [draft_V, h], d2t [draft_V] (target id = draft id + d2t[draft id]).
// An `embed_tokens.weight` in the checkpoint replaces the target's embeddings, as the official
// load_state_dict(strict=False) does.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/core/host_tensor.h"

namespace arbor {

enum class EagleVersion { kEagle1, kEagle3 };  // EAGLE-1 and EAGLE-2 share one format

const char* eagle_version_name(EagleVersion v);

struct EagleDraftConfig {
  EagleVersion version = EagleVersion::kEagle1;
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;            // hidden_size / num_heads, as the official code computes it
  int64_t vocab_size = 0;          // the target's vocabulary (embedding rows)
  int64_t draft_vocab_size = 0;    // LM head rows: EAGLE-3's, or an EAGLE-1/2 token map's
                                   // (restrict_draft_vocab); else == vocab_size
  int64_t target_hidden_size = 0;  // feature width read from the target (== hidden_size unless
                                   // EAGLE-3's config gives target_hidden_size)
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  double rope_linear_factor = 1.0;  // rope_scaling {"type": "linear", "factor": f}
  bool fc_bias = true;              // EAGLE-1/2 config `bias`
  bool qkv_bias = false;
  std::vector<int32_t> capture_layers;  // EAGLE-3 eagle_config.eagle_aux_hidden_state_layer_ids
                                        // when given, else empty (eagle3_capture_layers)
};

struct EagleWeights {
  std::string source;  // the checkpoint directory, for messages
  EagleDraftConfig config;
  HostTensor fc;            // [h, 2h] (EAGLE-1/2) or [h, 3 * target_h] (EAGLE-3)
  HostTensor fc_bias;       // [h] or empty
  HostTensor embed;         // [vocab, h] the checkpoint's own embed_tokens, empty: the target's
  HostTensor input_norm;    // EAGLE-3 [h]: RMSNorm of the token embedding
  HostTensor hidden_norm;   // EAGLE-3 [h]: RMSNorm of the incoming hidden state
  HostTensor wq;            // [heads * head_dim, in] in = h (EAGLE-1/2) or 2h (EAGLE-3)
  HostTensor wk, wv;        // [kv_heads * head_dim, in]
  HostTensor bq, bk, bv;    // [out] when qkv_bias, else empty
  HostTensor wo;            // [h, heads * head_dim]
  HostTensor post_norm;     // [h]
  HostTensor w_gate, w_up;  // [intermediate, h]
  HostTensor w_down;        // [h, intermediate]
  HostTensor norm;          // EAGLE-3 [h]: before lm_head
  HostTensor lm_head;       // EAGLE-3 [draft_vocab, h]
  // [draft_vocab] when draft_vocab != vocab, else empty: EAGLE-3's own, or for EAGLE-1/2 a
  // token map's (restrict_draft_vocab: the draft scores those rows of the target's LM head).
  std::vector<int64_t> d2t;
};

// Loads and validates a draft checkpoint directory. Errors name the file and the tensor:
// kNotFound for a missing config.json / model.safetensors / tensor, kCorruptData for a wrong
// shape (expected vs found) or a d2t entry mapping outside the vocabulary, kUnsupported for
// several draft layers, another activation or RoPE scaling, and kInvalidArgument when the
// checkpoint is of the other EAGLE version than `version`.
EagleWeights load_eagle_checkpoint(const std::string& dir, EagleVersion version);

// A frequency-ranked draft vocabulary for an EAGLE-1/2 draft ("token map", as SGLang's
// --speculative-token-map / FR-Spec; scripts/make_token_map.py writes one): a JSON file holding
// either an array of target token ids or an object whose "token_ids" is one, most frequent
// first. Returns its first `limit` ids (all when limit is 0). kNotFound for a missing file,
// kCorruptData naming the file for malformed JSON, an empty list, an id outside [0, vocab_size)
// or a repeated id, kInvalidArgument when limit exceeds the map's length.
std::vector<int32_t> load_token_map(const std::string& path, int64_t vocab_size, int64_t limit);

// Restricts an EAGLE-1/2 draft to the target ids `token_ids` (load_token_map's): its draft
// vocabulary becomes those ids in that order (d2t), and EagleDraftModel scores only those rows
// of the target's LM head. Lossless: the target verifies every proposed token; a target token
// outside the map is never proposed. kInvalidArgument for an EAGLE-3 draft (it has its own head
// and d2t).
void restrict_draft_vocab(EagleWeights* weights, std::span<const int32_t> token_ids);

// EAGLE-3's default capture layers for a target of `num_layers` layers: the residual stream at
// the input of layers 2, L/2 and L-3 (official modeling_llama_kv.py) for L >= 7. Those collide for
// smaller models, which use (0, 1, 2) for L = 2, (0, 1, 3) for L = 3, (1, L/2, L-1) for
// 4 <= L <= 6 and (0, 0, 1) for L = 1; index L is the stream after the last layer (before the
// final norm). scripts/spec_heads_reference.py and the trainers use the same rule.
std::vector<int32_t> eagle3_capture_layers(int64_t num_layers);

}  // namespace arbor
