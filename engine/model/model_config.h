// The architecture hyper-parameters of a Llama-family model, filled by every loader
// (config.json, GGUF metadata, llama2.c header). One struct for Llama 2/3, Mistral, Qwen2,
// SmolLM2: the differences are fields (GQA, q/k/v bias, RoPE scaling, tied embeddings).
#pragma once

#include <cstdint>
#include <string>

namespace arbor {

struct RopeScaling {
  // "none" or "llama3" (Llama 3.1 frequency-dependent scaling). Linear scaling is folded into
  // `factor` with type "linear".
  std::string type = "none";
  double factor = 1.0;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_position = 8192;
};

struct ModelConfig {
  std::string architecture = "llama";  // llama | mistral | qwen2 (SmolLM2 is llama)
  int64_t vocab_size = 0;
  int64_t hidden_size = 0;        // model dim
  int64_t intermediate_size = 0;  // SwiGLU hidden dim
  int64_t num_layers = 0;
  int64_t num_heads = 0;     // query heads
  int64_t num_kv_heads = 0;  // key/value heads (GQA when < num_heads)
  int64_t head_dim = 0;      // usually hidden_size / num_heads
  double rms_norm_eps = 1e-5;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  int64_t max_position = 2048;
  bool tie_embeddings = false;  // LM head shares the token embedding
  bool attention_bias = false;  // q/k/v projections have a bias (Qwen2)
  int32_t bos_token_id = 1;
  int32_t eos_token_id = 2;

  // Throws kInvalidArgument/kCorruptData naming the field when values are inconsistent.
  void validate(const std::string& source) const;
  std::string summary() const;
};

}  // namespace arbor
