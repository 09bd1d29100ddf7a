#include "engine/model/weight_assembly.h"

#include <cstring>
#include <set>

#include "engine/core/error.h"

namespace arbor {
namespace {

struct HfGgufName {
  const char* role;
  const char* hf;
  const char* gguf;
};

// Per-layer tensors; {} is replaced by the layer index.
constexpr HfGgufName kLayerNames[] = {
    {"attn_norm", "model.layers.{}.input_layernorm.weight", "blk.{}.attn_norm.weight"},
    {"wq", "model.layers.{}.self_attn.q_proj.weight", "blk.{}.attn_q.weight"},
    {"wk", "model.layers.{}.self_attn.k_proj.weight", "blk.{}.attn_k.weight"},
    {"wv", "model.layers.{}.self_attn.v_proj.weight", "blk.{}.attn_v.weight"},
    {"bq", "model.layers.{}.self_attn.q_proj.bias", "blk.{}.attn_q.bias"},
    {"bk", "model.layers.{}.self_attn.k_proj.bias", "blk.{}.attn_k.bias"},
    {"bv", "model.layers.{}.self_attn.v_proj.bias", "blk.{}.attn_v.bias"},
    {"wo", "model.layers.{}.self_attn.o_proj.weight", "blk.{}.attn_output.weight"},
    {"ffn_norm", "model.layers.{}.post_attention_layernorm.weight", "blk.{}.ffn_norm.weight"},
    {"w_gate", "model.layers.{}.mlp.gate_proj.weight", "blk.{}.ffn_gate.weight"},
    {"w_up", "model.layers.{}.mlp.up_proj.weight", "blk.{}.ffn_up.weight"},
    {"w_down", "model.layers.{}.mlp.down_proj.weight", "blk.{}.ffn_down.weight"},
};
constexpr HfGgufName kModelNames[] = {
    {"embed", "model.embed_tokens.weight", "token_embd.weight"},
    {"final_norm", "model.norm.weight", "output_norm.weight"},
    {"lm_head", "lm_head.weight", "output.weight"},
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

std::string weight_tensor_name(WeightNaming naming, const std::string& role, int layer) {
  const bool hf = naming == WeightNaming::kHuggingFace;
  for (const auto& n : kModelNames)
    if (role == n.role) return hf ? n.hf : n.gguf;
  for (const auto& n : kLayerNames) {
    if (role != n.role) continue;
    std::string pattern = hf ? n.hf : n.gguf;
    const size_t pos = pattern.find("{}");
    return pattern.replace(pos, 2, std::to_string(layer));
  }
  ARBOR_CHECK(false, "unknown weight role " + role);
  return {};
}

void check_tensor_shape(const std::string& file, const std::string& tensor,
                        const std::vector<int64_t>& expected, const std::vector<int64_t>& found) {
  if (expected != found)
    throw_error(ErrorCode::kCorruptData, file + ": tensor " + tensor + ": expected shape " +
                                             shape_str(expected) + ", found " + shape_str(found));
}

HostTensor meta_to_hf_rope_rows(const HostTensor& w, int64_t n_heads, int64_t head_dim) {
  ARBOR_CHECK(!w.shape.empty() && w.shape[0] == n_heads * head_dim && head_dim % 2 == 0,
              "rope rows " + shape_str(w.shape) + " vs " + std::to_string(n_heads) + " heads of " +
                  std::to_string(head_dim));
  const int64_t cols = w.shape[0] == 0 ? 0 : w.numel() / w.shape[0];
  const int64_t half = head_dim / 2;
  HostTensor out(w.shape);
  for (int64_t h = 0; h < n_heads; ++h) {
    for (int64_t r = 0; r < head_dim; ++r) {
      const int64_t meta_row = r < half ? 2 * r : 2 * (r - half) + 1;
      std::memcpy(out.ptr() + (h * head_dim + r) * cols, w.ptr() + (h * head_dim + meta_row) * cols,
                  static_cast<size_t>(cols) * sizeof(float));
    }
  }
  return out;
}

ModelWeights assemble_weights(const ModelConfig& c, const TensorSource& source,
                              const AssembleOptions& options) {
  const int64_t q_rows = c.num_heads * c.head_dim;
  const int64_t kv_rows = c.num_kv_heads * c.head_dim;
  std::set<std::string> used;

  ModelWeights w;
  w.config = c;
  const int64_t total =
      3 + c.num_layers * (c.attention_bias ? 12 : 9);  // for progress reporting only
  int64_t done = 0;

  auto read = [&](const std::string& role, int layer, const std::vector<int64_t>& expected,
                  const char* meaning) -> HostTensor {
    const std::string name = weight_tensor_name(options.naming, role, layer);
    if (!source.contains(name))
      throw_error(ErrorCode::kNotFound, source.file_of(name) + ": missing tensor " + name + " (" +
                                            meaning + ", expected shape " + shape_str(expected) +
                                            ")");
    check_tensor_shape(source.file_of(name), name, expected, source.shape(name));
    HostTensor t = source.read_f32(name);
    ARBOR_CHECK(t.shape == expected, name + " read with shape " + shape_str(t.shape));
    used.insert(name);
    if (options.progress) options.progress("reading tensors", static_cast<double>(++done) / total);
    return t;
  };
  auto rope_rows = [&](HostTensor t, int64_t heads) {
    return options.meta_rope_layout ? meta_to_hf_rope_rows(t, heads, c.head_dim) : t;
  };

  w.embed = read("embed", -1, {c.vocab_size, c.hidden_size}, "token embedding [vocab, hidden]");
  // Layer by layer: a config that claims more layers than the checkpoint holds (a corrupt
  // block_count of 1.5 billion) fails at the first missing tensor, before anything is allocated
  // for layers the file does not have.
  for (int i = 0; i < c.num_layers; ++i) {
    LayerWeights& l = w.layers.emplace_back();
    l.attn_norm = read("attn_norm", i, {c.hidden_size}, "attention RMSNorm [hidden]");
    l.wq = rope_rows(read("wq", i, {q_rows, c.hidden_size}, "query projection"), c.num_heads);
    l.wk = rope_rows(read("wk", i, {kv_rows, c.hidden_size}, "key projection"), c.num_kv_heads);
    l.wv = read("wv", i, {kv_rows, c.hidden_size}, "value projection");
    if (c.attention_bias) {
      l.bq = rope_rows(read("bq", i, {q_rows}, "query bias"), c.num_heads);
      l.bk = rope_rows(read("bk", i, {kv_rows}, "key bias"), c.num_kv_heads);
      l.bv = read("bv", i, {kv_rows}, "value bias");
    }
    l.wo = read("wo", i, {c.hidden_size, q_rows}, "attention output projection");
    l.ffn_norm = read("ffn_norm", i, {c.hidden_size}, "MLP RMSNorm [hidden]");
    l.w_gate = read("w_gate", i, {c.intermediate_size, c.hidden_size}, "MLP gate projection");
    l.w_up = read("w_up", i, {c.intermediate_size, c.hidden_size}, "MLP up projection");
    l.w_down = read("w_down", i, {c.hidden_size, c.intermediate_size}, "MLP down projection");
  }
  w.final_norm = read("final_norm", -1, {c.hidden_size}, "final RMSNorm [hidden]");
  if (!c.tie_embeddings)
    w.lm_head = read("lm_head", -1, {c.vocab_size, c.hidden_size}, "LM head [vocab, hidden]");

  // A tensor the model does not use means the checkpoint has features this engine would
  // silently ignore (an o_proj bias, more layers than the config says): refuse it.
  std::set<std::string> ignored(options.ignored_tensors.begin(), options.ignored_tensors.end());
  if (c.tie_embeddings) ignored.insert(weight_tensor_name(options.naming, "lm_head", -1));
  for (const std::string& name : source.names()) {
    if (used.count(name) || ignored.count(name)) continue;
    bool skip = false;
    for (const std::string& suffix : options.ignored_suffixes) skip |= ends_with(name, suffix);
    if (skip) continue;
    throw_error(ErrorCode::kUnsupported,
                source.file_of(name) + ": unexpected tensor " + name + " with shape " +
                    shape_str(source.shape(name)) + " (" + c.architecture + " with " +
                    std::to_string(c.num_layers) + " layers" +
                    (c.attention_bias ? ", q/k/v bias" : ", no attention bias") +
                    " does not use it)");
  }
  if (options.progress) options.progress("reading tensors", 1.0);
  return w;
}

}  // namespace arbor
