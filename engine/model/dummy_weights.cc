#include "engine/model/dummy_weights.h"

#include <cmath>
#include <random>

#include "engine/core/error.h"

namespace arbor {

namespace {

// Llama 3.1's attention and RoPE (llama3 frequency scaling, 128K positions), shared by the 8B
// and 70B presets.
ModelConfig llama3_config() {
  ModelConfig c;
  c.vocab_size = 128256;
  c.num_kv_heads = 8;
  c.head_dim = 128;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 500000.0;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.low_freq_factor = 1.0;
  c.rope_scaling.high_freq_factor = 4.0;
  c.rope_scaling.original_max_position = 8192;
  c.max_position = 131072;
  c.bos_token_id = 128000;
  c.eos_token_id = 128001;
  return c;
}

HostTensor shape_only(std::vector<int64_t> shape) {
  HostTensor t;
  t.shape = std::move(shape);  // no data: filled by the backend or fill_random_host_weights
  return t;
}

std::string strip_prefix(const std::string& name) {
  return is_dummy_model_path(name) ? name.substr(std::string(kDummyModelPrefix).size()) : name;
}

}  // namespace

bool is_dummy_model_path(const std::string& path) {
  return path.rfind(kDummyModelPrefix, 0) == 0;
}

std::vector<std::string> dummy_model_presets() {
  return {"llama-3-8b", "llama-3-70b", "tiny"};
}

ModelConfig dummy_model_config(const std::string& name) {
  const std::string preset = strip_prefix(name);
  ModelConfig c;
  if (preset == "llama-3-8b") {
    c = llama3_config();
    c.hidden_size = 4096;
    c.intermediate_size = 14336;
    c.num_layers = 32;
    c.num_heads = 32;
  } else if (preset == "llama-3-70b") {
    c = llama3_config();
    c.hidden_size = 8192;
    c.intermediate_size = 28672;
    c.num_layers = 80;
    c.num_heads = 64;
  } else if (preset == "tiny") {
    c.vocab_size = 512;
    c.hidden_size = 64;
    c.intermediate_size = 192;
    c.num_layers = 2;
    c.num_heads = 4;
    c.num_kv_heads = 2;
    c.head_dim = 16;
    c.max_position = 2048;
    c.bos_token_id = 1;
    c.eos_token_id = 2;
  } else {
    std::string names;
    for (const std::string& p : dummy_model_presets()) names += (names.empty() ? "" : ", ") + p;
    throw_error(ErrorCode::kInvalidArgument, "dummy model '" + name + "': no preset named '" +
                                                 preset + "' (presets: " + names + ")");
  }
  c.validate(std::string(kDummyModelPrefix) + preset);
  return c;
}

ModelWeights shape_only_weights(const ModelConfig& c) {
  ModelWeights w;
  w.config = c;
  const int64_t h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim,
                f = c.intermediate_size;
  w.embed = shape_only({c.vocab_size, h});
  w.final_norm = shape_only({h});
  w.lm_head = shape_only({c.vocab_size, h});
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm = shape_only({h});
    lw.wq = shape_only({q, h});
    lw.wk = shape_only({kv, h});
    lw.wv = shape_only({kv, h});
    lw.wo = shape_only({h, q});
    lw.ffn_norm = shape_only({h});
    lw.w_gate = shape_only({f, h});
    lw.w_up = shape_only({f, h});
    lw.w_down = shape_only({h, f});
    w.layers.push_back(std::move(lw));
  }
  return w;
}

ModelWeights dummy_model_weights(const std::string& name) {
  return shape_only_weights(dummy_model_config(name));
}

namespace {

// f(tensor) for every weight tensor (W: ModelWeights or const ModelWeights).
template <typename W, typename F>
void for_each_tensor(W& w, F&& f) {
  f(w.embed);
  f(w.final_norm);
  f(w.lm_head);
  for (auto& l : w.layers)
    for (auto* t : {&l.attn_norm, &l.wq, &l.wk, &l.wv, &l.bq, &l.bk, &l.bv, &l.wo, &l.ffn_norm,
                    &l.w_gate, &l.w_up, &l.w_down})
      f(*t);
}

}  // namespace

int64_t host_weight_bytes(const ModelWeights& weights) {
  int64_t elements = 0;
  for_each_tensor(weights, [&](const HostTensor& t) {
    if (!t.shape.empty()) elements += HostTensor::numel_of(t.shape);
  });
  return elements * static_cast<int64_t>(sizeof(float));
}

void fill_random_host_weights(ModelWeights* weights, uint64_t seed) {
  std::mt19937_64 rng(seed);
  for_each_tensor(*weights, [&](HostTensor& t) {
    if (t.shape.empty() || !t.data.empty()) return;
    const float bound =
        t.shape.size() == 1 ? 0.1f : std::sqrt(3.0f / static_cast<float>(t.shape.back()));
    const float center = t.shape.size() == 1 ? 1.0f : 0.0f;
    std::uniform_real_distribution<float> u(center - bound, center + bound);
    t.data.resize(static_cast<size_t>(HostTensor::numel_of(t.shape)));
    for (float& x : t.data) x = u(rng);
  });
}

}  // namespace arbor
