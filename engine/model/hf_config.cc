#include "engine/model/hf_config.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "engine/core/error.h"

namespace arbor {
namespace {

using nlohmann::json;

bool has(const json& j, const char* key) {
  return j.contains(key) && !j[key].is_null();
}

int64_t get_int(const json& j, const char* key, const std::string& source) {
  if (!has(j, key))
    throw_error(ErrorCode::kCorruptData, source + ": missing field \"" + key + "\"");
  if (!j[key].is_number_integer())
    throw_error(ErrorCode::kCorruptData,
                source + ": field \"" + key + "\" must be an integer, found " + j[key].dump());
  return j[key].get<int64_t>();
}

int64_t get_int_or(const json& j, const char* key, int64_t fallback, const std::string& source) {
  return has(j, key) ? get_int(j, key, source) : fallback;
}

double get_double_or(const json& j, const char* key, double fallback, const std::string& source) {
  if (!has(j, key)) return fallback;
  if (!j[key].is_number())
    throw_error(ErrorCode::kCorruptData,
                source + ": field \"" + key + "\" must be a number, found " + j[key].dump());
  return j[key].get<double>();
}

bool get_bool_or(const json& j, const char* key, bool fallback, const std::string& source) {
  if (!has(j, key)) return fallback;
  if (!j[key].is_boolean())
    throw_error(ErrorCode::kCorruptData,
                source + ": field \"" + key + "\" must be true or false, found " + j[key].dump());
  return j[key].get<bool>();
}

// A token id field that may be an integer or a list of integers (Llama 3 eos); the first wins.
bool get_token_id(const json& j, const char* key, int32_t* out, const std::string& source) {
  if (!has(j, key)) return false;
  const json& v = j[key];
  const json& first = v.is_array() && !v.empty() ? v[0] : v;
  if (!first.is_number_integer())
    throw_error(
        ErrorCode::kCorruptData,
        source + ": field \"" + key + "\" must be a token id or a list of ids, found " + v.dump());
  *out = first.get<int32_t>();
  return true;
}

json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorCode::kNotFound, path + ": cannot open");
  std::stringstream ss;
  ss << in.rdbuf();
  json j = json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object())
    throw_error(ErrorCode::kCorruptData, path + ": not a JSON object");
  return j;
}

void parse_rope(const json& cfg, ModelConfig& c, const std::string& source) {
  // transformers 5 keeps theta and scaling together in rope_parameters; 4.x has rope_theta and
  // an optional rope_scaling object.
  const json empty = json::object();
  const json& params = has(cfg, "rope_parameters") ? cfg["rope_parameters"] : empty;
  if (!params.is_object())
    throw_error(ErrorCode::kCorruptData, source + ": rope_parameters must be an object");
  c.rope_theta = get_double_or(cfg, "rope_theta",
                               get_double_or(params, "rope_theta", 10000.0, source), source);
  const json& scaling = has(cfg, "rope_scaling") ? cfg["rope_scaling"] : params;
  if (!scaling.is_object())
    throw_error(ErrorCode::kCorruptData, source + ": rope_scaling must be an object");
  std::string type = "default";
  for (const char* key : {"rope_type", "type"}) {
    if (!has(scaling, key)) continue;
    if (!scaling[key].is_string())
      throw_error(ErrorCode::kCorruptData, source + ": rope scaling \"" + key +
                                               "\" must be a string, found " + scaling[key].dump());
    type = scaling[key].get<std::string>();
    break;
  }
  if (type == "default") {
    c.rope_scaling = RopeScaling{};
  } else if (type == "llama3") {
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = get_double_or(scaling, "factor", 0.0, source);
    c.rope_scaling.low_freq_factor = get_double_or(scaling, "low_freq_factor", 0.0, source);
    c.rope_scaling.high_freq_factor = get_double_or(scaling, "high_freq_factor", 0.0, source);
    c.rope_scaling.original_max_position =
        get_int(scaling, "original_max_position_embeddings", source + ": rope scaling");
    if (c.rope_scaling.factor <= 0 || c.rope_scaling.low_freq_factor <= 0 ||
        c.rope_scaling.high_freq_factor <= c.rope_scaling.low_freq_factor)
      throw_error(ErrorCode::kCorruptData,
                  source +
                      ": llama3 rope scaling needs factor > 0 and high_freq_factor > "
                      "low_freq_factor > 0, found " +
                      scaling.dump());
  } else if (type == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = get_double_or(scaling, "factor", 0.0, source);
    if (c.rope_scaling.factor <= 0)
      throw_error(ErrorCode::kCorruptData,
                  source + ": linear rope scaling needs factor > 0, found " + scaling.dump());
  } else {
    throw_error(ErrorCode::kUnsupported, source + ": rope scaling type '" + type +
                                             "' is not supported (expected default, llama3 or "
                                             "linear)");
  }
}

}  // namespace

ModelConfig parse_hf_config(const json& cfg, const std::string& source) {
  if (!cfg.is_object()) throw_error(ErrorCode::kCorruptData, source + ": not a JSON object");
  ModelConfig c;
  std::string arch;
  if (has(cfg, "architectures") && cfg["architectures"].is_array() &&
      !cfg["architectures"].empty() && cfg["architectures"][0].is_string())
    arch = cfg["architectures"][0].get<std::string>();
  const std::string model_type = has(cfg, "model_type") && cfg["model_type"].is_string()
                                     ? cfg["model_type"].get<std::string>()
                                     : "";
  if (arch == "LlamaForCausalLM" || (arch.empty() && model_type == "llama")) {
    c.architecture = "llama";
  } else if (arch == "MistralForCausalLM" || (arch.empty() && model_type == "mistral")) {
    c.architecture = "mistral";
  } else if (arch == "Qwen2ForCausalLM" || (arch.empty() && model_type == "qwen2")) {
    c.architecture = "qwen2";
  } else {
    throw_error(ErrorCode::kUnsupported,
                source + ": architecture '" + (arch.empty() ? model_type : arch) +
                    "' is not supported (expected LlamaForCausalLM, MistralForCausalLM or "
                    "Qwen2ForCausalLM)");
  }

  if (has(cfg, "hidden_act") && cfg["hidden_act"] != "silu")
    throw_error(ErrorCode::kUnsupported, source + ": hidden_act " + cfg["hidden_act"].dump() +
                                             " is not supported (expected \"silu\")");
  if (get_double_or(cfg, "partial_rotary_factor", 1.0, source) != 1.0)
    throw_error(ErrorCode::kUnsupported, source + ": partial_rotary_factor " +
                                             cfg["partial_rotary_factor"].dump() +
                                             " is not supported (expected 1.0)");
  if (get_bool_or(cfg, "mlp_bias", false, source))
    throw_error(ErrorCode::kUnsupported, source + ": mlp_bias true is not supported");
  if (c.architecture == "qwen2") {
    c.attention_bias = true;  // Qwen2 always has q/k/v bias (and none on o_proj)
  } else if (get_bool_or(cfg, "attention_bias", false, source)) {
    throw_error(ErrorCode::kUnsupported,
                source + ": attention_bias true (bias on q/k/v and o_proj) is not supported for " +
                    c.architecture);
  }

  c.vocab_size = get_int(cfg, "vocab_size", source);
  c.hidden_size = get_int(cfg, "hidden_size", source);
  c.intermediate_size = get_int(cfg, "intermediate_size", source);
  c.num_layers = get_int(cfg, "num_hidden_layers", source);
  c.num_heads = get_int(cfg, "num_attention_heads", source);
  c.num_kv_heads = get_int_or(cfg, "num_key_value_heads", c.num_heads, source);
  if (has(cfg, "head_dim")) {
    c.head_dim = get_int(cfg, "head_dim", source);
  } else {
    if (c.num_heads <= 0 || c.hidden_size % c.num_heads != 0)
      throw_error(ErrorCode::kCorruptData,
                  source + ": hidden_size " + std::to_string(c.hidden_size) +
                      " is not a multiple of num_attention_heads " + std::to_string(c.num_heads) +
                      " and head_dim is not given");
    c.head_dim = c.hidden_size / c.num_heads;
  }
  c.rms_norm_eps = get_double_or(cfg, "rms_norm_eps", 1e-6, source);
  parse_rope(cfg, c, source);
  c.max_position = get_int_or(cfg, "max_position_embeddings", 2048, source);
  // Sliding-window attention is not implemented: cap the context at the window, where full
  // attention and sliding-window attention agree.
  const bool sliding =
      c.architecture == "mistral" ||
      (c.architecture == "qwen2" && get_bool_or(cfg, "use_sliding_window", false, source));
  if (sliding && has(cfg, "sliding_window")) {
    const int64_t window = get_int(cfg, "sliding_window", source);
    if (window > 0 && window < c.max_position) c.max_position = window;
  }
  c.tie_embeddings = get_bool_or(cfg, "tie_word_embeddings", false, source);
  get_token_id(cfg, "bos_token_id", &c.bos_token_id, source);
  get_token_id(cfg, "eos_token_id", &c.eos_token_id, source);
  c.validate(source);
  return c;
}

ModelConfig load_hf_config(const std::string& dir) {
  namespace fs = std::filesystem;
  const std::string config_path = (fs::path(dir) / "config.json").string();
  ModelConfig c = parse_hf_config(read_json(config_path), config_path);
  const std::string gen_path = (fs::path(dir) / "generation_config.json").string();
  if (fs::exists(gen_path)) {
    const json gen = read_json(gen_path);
    get_token_id(gen, "bos_token_id", &c.bos_token_id, gen_path);
    get_token_id(gen, "eos_token_id", &c.eos_token_id, gen_path);
  }
  return c;
}

}  // namespace arbor
