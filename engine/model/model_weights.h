// Host-side weights of a Llama-family model, fp32, in the Hugging Face layout: every linear
// weight is [out_features, in_features] row-major, and Q/K rows are ordered for the
// rotate-halves RoPE (loaders of Meta-layout checkpoints, GGUF and llama2.c, un-permute them).
#pragma once

#include <vector>

#include "engine/core/host_tensor.h"
#include "engine/model/model_config.h"

namespace arbor {

struct LayerWeights {
  HostTensor attn_norm;   // [hidden]
  HostTensor wq;          // [num_heads * head_dim, hidden]
  HostTensor wk;          // [num_kv_heads * head_dim, hidden]
  HostTensor wv;          // [num_kv_heads * head_dim, hidden]
  HostTensor bq, bk, bv;  // [out] or empty when the model has no attention bias
  HostTensor wo;          // [hidden, num_heads * head_dim]
  HostTensor ffn_norm;    // [hidden]
  HostTensor w_gate;      // [intermediate, hidden]
  HostTensor w_up;        // [intermediate, hidden]
  HostTensor w_down;      // [hidden, intermediate]
};

struct ModelWeights {
  ModelConfig config;
  HostTensor embed;  // [vocab, hidden]
  std::vector<LayerWeights> layers;
  HostTensor final_norm;  // [hidden]
  HostTensor lm_head;     // [vocab, hidden]; empty when config.tie_embeddings

  const HostTensor& output_weight() const { return config.tie_embeddings ? embed : lm_head; }
};

}  // namespace arbor
