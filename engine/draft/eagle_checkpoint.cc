#include "engine/draft/eagle_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/core/error.h"
#include "engine/model/safetensors_file.h"

namespace arbor {

namespace {

using nlohmann::json;

json read_config(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error(ErrorCode::kNotFound, "EAGLE draft: " + path + " not found");
  json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded() || !doc.is_object())
    throw_error(ErrorCode::kCorruptData, path + ": not a JSON object");
  return doc;
}

int64_t get_int(const json& doc, const std::string& path, const char* key, int64_t fallback,
                bool required) {
  if (!doc.contains(key) || doc[key].is_null()) {
    if (required) throw_error(ErrorCode::kCorruptData, path + ": missing field \"" + key + "\"");
    return fallback;
  }
  if (!doc[key].is_number_integer() || doc[key].get<int64_t>() <= 0)
    throw_error(ErrorCode::kCorruptData, path + ": field \"" + key + "\" is " + doc[key].dump() +
                                             ", expected a positive integer");
  return doc[key].get<int64_t>();
}

double get_double(const json& doc, const std::string& path, const char* key, double fallback) {
  if (!doc.contains(key) || doc[key].is_null()) return fallback;
  if (!doc[key].is_number() || doc[key].get<double>() <= 0)
    throw_error(ErrorCode::kCorruptData, path + ": field \"" + key + "\" is " + doc[key].dump() +
                                             ", expected a positive number");
  return doc[key].get<double>();
}

bool get_bool(const json& doc, const std::string& path, const char* key, bool fallback) {
  if (!doc.contains(key) || doc[key].is_null()) return fallback;
  if (!doc[key].is_boolean())
    throw_error(ErrorCode::kCorruptData,
                path + ": field \"" + key + "\" is " + doc[key].dump() + ", expected true/false");
  return doc[key].get<bool>();
}

EagleDraftConfig parse_config(const json& doc, const std::string& path, EagleVersion version) {
  EagleDraftConfig c;
  c.version = version;
  c.hidden_size = get_int(doc, path, "hidden_size", 0, true);
  c.intermediate_size = get_int(doc, path, "intermediate_size", 0, true);
  c.num_heads = get_int(doc, path, "num_attention_heads", 0, true);
  c.num_kv_heads = get_int(doc, path, "num_key_value_heads", c.num_heads, false);
  c.vocab_size = get_int(doc, path, "vocab_size", 0, true);
  const int64_t layers = get_int(doc, path, "num_hidden_layers", 1, false);
  if (layers != 1)
    throw_error(ErrorCode::kUnsupported, path + ": num_hidden_layers is " + std::to_string(layers) +
                                             "; EAGLE drafts with one layer are supported");
  if (doc.contains("hidden_act") && doc["hidden_act"] != "silu")
    throw_error(ErrorCode::kUnsupported,
                path + ": hidden_act is " + doc["hidden_act"].dump() + ", only silu is supported");
  if (c.hidden_size % c.num_heads != 0)
    throw_error(ErrorCode::kCorruptData, path + ": hidden_size " + std::to_string(c.hidden_size) +
                                             " is not a multiple of num_attention_heads " +
                                             std::to_string(c.num_heads));
  c.head_dim = c.hidden_size / c.num_heads;
  if (c.num_heads % c.num_kv_heads != 0)
    throw_error(ErrorCode::kCorruptData,
                path + ": num_attention_heads " + std::to_string(c.num_heads) +
                    " is not a multiple of num_key_value_heads " + std::to_string(c.num_kv_heads));
  c.rms_norm_eps = get_double(doc, path, "rms_norm_eps", 1e-6);
  c.rope_theta = get_double(doc, path, "rope_theta", 10000.0);
  if (doc.contains("rope_parameters") && doc["rope_parameters"].is_object())
    c.rope_theta = get_double(doc["rope_parameters"], path, "rope_theta", c.rope_theta);
  if (doc.contains("rope_scaling") && !doc["rope_scaling"].is_null()) {
    const json& rs = doc["rope_scaling"];
    const std::string type = rs.is_object() ? rs.value("type", rs.value("rope_type", "")) : "";
    if (type == "linear") {
      c.rope_linear_factor = get_double(rs, path, "factor", 1.0);
    } else if (type != "default") {
      throw_error(ErrorCode::kUnsupported,
                  path + ": rope_scaling " + rs.dump() + " is not supported (none or linear)");
    }
  }
  c.fc_bias = get_bool(doc, path, "bias", true);
  c.qkv_bias = get_bool(doc, path, "qkv_bias", false);
  c.draft_vocab_size = c.vocab_size;
  c.target_hidden_size = c.hidden_size;
  if (version == EagleVersion::kEagle3) {
    c.fc_bias = false;  // cnets.py: nn.Linear(3h, h, bias=False)
    c.draft_vocab_size = get_int(doc, path, "draft_vocab_size", c.vocab_size, false);
    c.target_hidden_size = get_int(doc, path, "target_hidden_size", c.hidden_size, false);
    if (doc.contains("eagle_config") && doc["eagle_config"].is_object() &&
        doc["eagle_config"].contains("eagle_aux_hidden_state_layer_ids")) {
      const json& ids = doc["eagle_config"]["eagle_aux_hidden_state_layer_ids"];
      if (!ids.is_array() || ids.size() != 3)
        throw_error(ErrorCode::kCorruptData,
                    path + ": eagle_config.eagle_aux_hidden_state_layer_ids is " + ids.dump() +
                        ", expected a list of 3 layer indices");
      for (const json& v : ids) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0)
          throw_error(ErrorCode::kCorruptData,
                      path + ": eagle_config.eagle_aux_hidden_state_layer_ids holds " + v.dump());
        c.capture_layers.push_back(v.get<int32_t>());
      }
    }
  }
  return c;
}

class TensorReader {
 public:
  explicit TensorReader(const SafetensorsFile& st) : st_(st) {}
  HostTensor take(const std::string& name, const std::vector<int64_t>& shape) const {
    if (!st_.find(name))
      throw_error(ErrorCode::kNotFound, st_.path() + ": tensor " + name + " not found (expected " +
                                            shape_str(shape) + ")");
    HostTensor t = st_.read_f32(name);
    if (t.shape != shape)
      throw_error(ErrorCode::kCorruptData, st_.path() + ": tensor " + name + ": expected shape " +
                                               shape_str(shape) + ", found " + shape_str(t.shape));
    return t;
  }
  HostTensor take_optional(const std::string& name, const std::vector<int64_t>& shape) const {
    return st_.find(name) ? take(name, shape) : HostTensor{};
  }

 private:
  const SafetensorsFile& st_;
};

}  // namespace

const char* eagle_version_name(EagleVersion v) {
  return v == EagleVersion::kEagle3 ? "EAGLE-3" : "EAGLE-1/2";
}

std::vector<int32_t> eagle3_capture_layers(int64_t num_layers) {
  const int32_t l = static_cast<int32_t>(num_layers);
  if (l >= 7) return {2, l / 2, l - 3};
  if (l <= 1) return {0, 0, l};
  if (l == 2) return {0, 1, 2};
  if (l == 3) return {0, 1, 3};
  return {1, l / 2, l - 1};
}

EagleWeights load_eagle_checkpoint(const std::string& dir, EagleVersion version) {
  namespace fs = std::filesystem;
  if (!fs::is_directory(dir))
    throw_error(ErrorCode::kNotFound, "EAGLE draft: directory " + dir + " not found");
  const std::string config_path = (fs::path(dir) / "config.json").string();
  const std::string weights_path = (fs::path(dir) / "model.safetensors").string();
  EagleWeights w;
  w.source = dir;
  w.config = parse_config(read_config(config_path), config_path, version);
  if (!fs::exists(weights_path))
    throw_error(ErrorCode::kNotFound,
                "EAGLE draft: " + weights_path +
                    " not found (convert pytorch_model.bin with scripts/convert_eagle_bin.py)");
  const SafetensorsFile st = SafetensorsFile::open(weights_path);
  const bool eagle3 = version == EagleVersion::kEagle3;
  const bool has_midlayer = st.find("midlayer.self_attn.q_proj.weight") != nullptr;
  const bool has_layer0 = st.find("layers.0.self_attn.q_proj.weight") != nullptr;
  if (eagle3 && !has_midlayer && has_layer0)
    throw_error(ErrorCode::kInvalidArgument,
                weights_path + " is an EAGLE-1/2 checkpoint (layers.0.* tensors), not EAGLE-3");
  if (!eagle3 && has_midlayer)
    throw_error(ErrorCode::kInvalidArgument,
                weights_path + " is an EAGLE-3 checkpoint (midlayer.* tensors), not EAGLE-1/2");
  for (const auto& [name, info] : st.tensors())
    if (name.rfind("layers.", 0) == 0 && name.rfind("layers.0.", 0) != 0)
      throw_error(ErrorCode::kUnsupported,
                  weights_path + ": tensor " + name +
                      " belongs to a second draft layer; one-layer EAGLE drafts are supported");

  const EagleDraftConfig& c = w.config;
  const int64_t h = c.hidden_size;
  const int64_t q_out = c.num_heads * c.head_dim;
  const int64_t kv_out = c.num_kv_heads * c.head_dim;
  const int64_t in = eagle3 ? 2 * h : h;
  const std::string p = eagle3 ? "midlayer." : "layers.0.";
  const TensorReader r(st);
  w.fc = r.take("fc.weight", {h, eagle3 ? 3 * c.target_hidden_size : 2 * h});
  if (c.fc_bias) w.fc_bias = r.take("fc.bias", {h});
  w.embed = r.take_optional("embed_tokens.weight", {c.vocab_size, h});
  w.wq = r.take(p + "self_attn.q_proj.weight", {q_out, in});
  w.wk = r.take(p + "self_attn.k_proj.weight", {kv_out, in});
  w.wv = r.take(p + "self_attn.v_proj.weight", {kv_out, in});
  if (c.qkv_bias) {
    w.bq = r.take(p + "self_attn.q_proj.bias", {q_out});
    w.bk = r.take(p + "self_attn.k_proj.bias", {kv_out});
    w.bv = r.take(p + "self_attn.v_proj.bias", {kv_out});
  }
  w.wo = r.take(p + "self_attn.o_proj.weight", {h, q_out});
  w.post_norm = r.take(p + "post_attention_layernorm.weight", {h});
  w.w_gate = r.take(p + "mlp.gate_proj.weight", {c.intermediate_size, h});
  w.w_up = r.take(p + "mlp.up_proj.weight", {c.intermediate_size, h});
  w.w_down = r.take(p + "mlp.down_proj.weight", {h, c.intermediate_size});
  if (eagle3) {
    w.input_norm = r.take(p + "input_layernorm.weight", {h});
    w.hidden_norm = r.take(p + "hidden_norm.weight", {h});
    w.norm = r.take("norm.weight", {h});
    w.lm_head = r.take("lm_head.weight", {c.draft_vocab_size, h});
    if (c.draft_vocab_size != c.vocab_size) {
      if (!st.find("d2t"))
        throw_error(ErrorCode::kNotFound,
                    weights_path + ": tensor d2t not found (draft_vocab_size " +
                        std::to_string(c.draft_vocab_size) + " differs from vocab_size " +
                        std::to_string(c.vocab_size) + ")");
      const SafetensorsFile::TensorInfo& info = *st.find("d2t");
      if (info.shape != std::vector<int64_t>{c.draft_vocab_size})
        throw_error(ErrorCode::kCorruptData, weights_path + ": tensor d2t: expected shape " +
                                                 shape_str({c.draft_vocab_size}) + ", found " +
                                                 shape_str(info.shape));
      w.d2t = st.read_i64("d2t");
      for (int64_t i = 0; i < c.draft_vocab_size; ++i) {
        const int64_t target = i + w.d2t[i];
        if (target < 0 || target >= c.vocab_size)
          throw_error(ErrorCode::kCorruptData, weights_path + ": tensor d2t maps draft id " +
                                                   std::to_string(i) + " to target id " +
                                                   std::to_string(target) + ", outside [0, " +
                                                   std::to_string(c.vocab_size) + ")");
      }
    }
  }
  return w;
}

std::vector<int32_t> load_token_map(const std::string& path, int64_t vocab_size, int64_t limit) {
  std::ifstream in(path);
  if (!in) throw_error(ErrorCode::kNotFound, "token map " + path + " not found");
  const json doc = json::parse(in, nullptr, /*allow_exceptions=*/false);
  const json* ids = &doc;
  if (doc.is_object() && doc.contains("token_ids")) ids = &doc["token_ids"];
  if (doc.is_discarded() || !ids->is_array() || ids->empty())
    throw_error(ErrorCode::kCorruptData,
                path +
                    ": expected a non-empty JSON array of token ids, or an object whose "
                    "\"token_ids\" is one");
  const int64_t n = static_cast<int64_t>(ids->size());
  if (limit < 0 || limit > n)
    throw_error(ErrorCode::kInvalidArgument, "draft vocabulary of " + std::to_string(limit) +
                                                 " tokens asked for, token map " + path +
                                                 " holds " + std::to_string(n));
  const int64_t take = limit == 0 ? n : limit;
  std::vector<int32_t> out;
  out.reserve(static_cast<size_t>(take));
  std::vector<bool> seen(static_cast<size_t>(vocab_size), false);
  for (int64_t i = 0; i < n; ++i) {
    const json& v = (*ids)[static_cast<size_t>(i)];
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab_size)
      throw_error(ErrorCode::kCorruptData, path + ": entry " + std::to_string(i) + " is " +
                                               v.dump() + ", expected a token id in [0, " +
                                               std::to_string(vocab_size) + ")");
    const int64_t id = v.get<int64_t>();
    if (seen[static_cast<size_t>(id)])
      throw_error(ErrorCode::kCorruptData,
                  path + ": token id " + std::to_string(id) + " appears twice");
    seen[static_cast<size_t>(id)] = true;
    if (i < take) out.push_back(static_cast<int32_t>(id));
  }
  return out;
}

void restrict_draft_vocab(EagleWeights* weights, std::span<const int32_t> token_ids) {
  EagleDraftConfig& c = weights->config;
  if (c.version == EagleVersion::kEagle3)
    throw_error(ErrorCode::kInvalidArgument,
                "EAGLE-3 draft " + weights->source +
                    ": a token map applies to EAGLE-1/2 drafts (EAGLE-3 has its own draft "
                    "vocabulary and d2t)");
  ARBOR_CHECK(!token_ids.empty() && static_cast<int64_t>(token_ids.size()) <= c.vocab_size);
  c.draft_vocab_size = static_cast<int64_t>(token_ids.size());
  weights->d2t.resize(token_ids.size());
  for (size_t i = 0; i < token_ids.size(); ++i) {
    ARBOR_CHECK(token_ids[i] >= 0 && token_ids[i] < c.vocab_size);
    weights->d2t[i] = static_cast<int64_t>(token_ids[i]) - static_cast<int64_t>(i);
  }
}

}  // namespace arbor
