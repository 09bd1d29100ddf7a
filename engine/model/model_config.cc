#include "engine/model/model_config.h"

#include <sstream>

#include "engine/core/error.h"

namespace arbor {

void ModelConfig::validate(const std::string& source) const {
  auto need_positive = [&](const char* name, int64_t v) {
    if (v <= 0)
      throw_error(ErrorCode::kCorruptData,
                  source + ": " + name + " must be positive, found " + std::to_string(v));
  };
  need_positive("vocab_size", vocab_size);
  need_positive("hidden_size", hidden_size);
  need_positive("intermediate_size", intermediate_size);
  need_positive("num_layers", num_layers);
  need_positive("num_heads", num_heads);
  need_positive("num_kv_heads", num_kv_heads);
  need_positive("head_dim", head_dim);
  if (num_heads % num_kv_heads != 0)
    throw_error(ErrorCode::kCorruptData, source + ": num_heads " + std::to_string(num_heads) +
                                             " is not a multiple of num_kv_heads " +
                                             std::to_string(num_kv_heads));
  if (head_dim % 2 != 0)
    throw_error(ErrorCode::kCorruptData,
                source + ": head_dim must be even for RoPE, found " + std::to_string(head_dim));
  if (rope_scaling.type != "none" && rope_scaling.type != "llama3" && rope_scaling.type != "linear")
    throw_error(ErrorCode::kUnsupported,
                source + ": rope scaling type '" + rope_scaling.type + "' is not supported");
}

std::string ModelConfig::summary() const {
  std::ostringstream os;
  os << architecture << " layers=" << num_layers << " hidden=" << hidden_size
     << " ffn=" << intermediate_size << " heads=" << num_heads << "/" << num_kv_heads
     << " head_dim=" << head_dim << " vocab=" << vocab_size << " rope_theta=" << rope_theta
     << (rope_scaling.type != "none" ? " rope_scaling=" + rope_scaling.type : std::string())
     << (tie_embeddings ? " tied" : "") << (attention_bias ? " qkv_bias" : "");
  return os.str();
}

}  // namespace arbor
