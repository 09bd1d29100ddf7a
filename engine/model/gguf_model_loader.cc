#include "engine/model/gguf_model_loader.h"

#include <algorithm>
#include <cmath>

#include "engine/core/error.h"

namespace arbor {
namespace {

using nlohmann::json;

class GgufSource : public TensorSource {
 public:
  explicit GgufSource(const GgufFile& file) : file_(file) {}
  bool contains(const std::string& name) const override { return file_.find(name) != nullptr; }
  std::vector<int64_t> shape(const std::string& name) const override {
    const auto& dims = file_.find(name)->dims;
    return std::vector<int64_t>(dims.rbegin(), dims.rend());
  }
  HostTensor read_f32(const std::string& name) const override { return file_.read_f32(name); }
  std::string file_of(const std::string&) const override { return file_.path(); }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& t : file_.tensors()) out.push_back(t.name);
    return out;
  }

 private:
  const GgufFile& file_;
};

class MetadataReader {
 public:
  MetadataReader(const GgufFile& file) : file_(file), md_(file.metadata()) {}

  bool has(const std::string& key) const { return md_.contains(key); }
  int64_t get_int(const std::string& key) const {
    if (!has(key))
      throw_error(ErrorCode::kCorruptData, file_.path() + ": missing metadata key " + key);
    const json& v = md_[key];
    if (!v.is_number_integer())
      throw_error(ErrorCode::kUnsupported,
                  file_.path() + ": metadata " + key + " must be an integer, found " + brief(v));
    if (v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX))
      throw_error(ErrorCode::kCorruptData,
                  file_.path() + ": metadata " + key + " is out of range: " + v.dump());
    return v.get<int64_t>();
  }
  int64_t get_int_or(const std::string& key, int64_t fallback) const {
    return has(key) ? get_int(key) : fallback;
  }
  double get_double_or(const std::string& key, double fallback) const {
    if (!has(key)) return fallback;
    const json& v = md_[key];
    if (!v.is_number())
      throw_error(ErrorCode::kCorruptData,
                  file_.path() + ": metadata " + key + " must be a number, found " + brief(v));
    return v.get<double>();
  }
  std::string get_string_or(const std::string& key, const std::string& fallback) const {
    if (!has(key)) return fallback;
    const json& v = md_[key];
    if (!v.is_string())
      throw_error(ErrorCode::kCorruptData,
                  file_.path() + ": metadata " + key + " must be a string, found " + brief(v));
    return v.get<std::string>();
  }

 private:
  static std::string brief(const json& v) {
    if (v.is_array()) return "an array of " + std::to_string(v.size());
    std::string s = v.dump(-1, ' ', false, json::error_handler_t::replace);
    return s.size() > 64 ? s.substr(0, 64) + "..." : s;
  }
  const GgufFile& file_;
  const json& md_;
};

// llama.cpp's converter writes Llama 3 rope scaling as per-frequency factors (rope_freqs,
// [head_dim / 2]) computed from (factor, low/high_freq_factor, original context). Find the
// setting that reproduces them.
void recover_llama3_scaling(const GgufFile& file, ModelConfig& c) {
  const HostTensor factors = file.read_f32("rope_freqs.weight");
  const int64_t half = c.head_dim / 2;
  check_tensor_shape(file.path(), "rope_freqs.weight", {half}, factors.shape);
  const float max_factor = *std::max_element(factors.data.begin(), factors.data.end());
  bool all_one = true;
  for (float f : factors.data) all_one &= std::fabs(f - 1.0f) < 1e-6f;
  if (all_one) return;
  auto reproduce = [&](double factor, double low, double high, double original) {
    const double low_wavelen = original / low, high_wavelen = original / high;
    for (int64_t i = 0; i < half; ++i) {
      const double freq = 1.0 / std::pow(c.rope_theta, static_cast<double>(2 * i) / c.head_dim);
      const double wavelen = 2 * M_PI / freq;
      double expected;
      if (wavelen < high_wavelen) {
        expected = 1.0;
      } else if (wavelen > low_wavelen) {
        expected = factor;
      } else {
        const double smooth = (original / wavelen - low) / (high - low);
        expected = 1.0 / ((1 - smooth) / factor + smooth);
      }
      if (std::fabs(expected - factors.data[i]) > 1e-4 * expected) return false;
    }
    return true;
  };
  for (double original : {8192.0, 4096.0, 2048.0, 16384.0, 32768.0, 65536.0, 131072.0})
    for (double low : {1.0, 2.0, 0.5})
      for (double high : {4.0, 2.0, 8.0, 1.0})
        if (high > low && reproduce(max_factor, low, high, original)) {
          c.rope_scaling.type = "llama3";
          c.rope_scaling.factor = max_factor;
          c.rope_scaling.low_freq_factor = low;
          c.rope_scaling.high_freq_factor = high;
          c.rope_scaling.original_max_position = static_cast<int64_t>(original);
          return;
        }
  throw_error(ErrorCode::kUnsupported,
              file.path() +
                  ": tensor rope_freqs.weight holds rope factors that match no Llama 3 "
                  "scaling setting (factor " +
                  std::to_string(max_factor) + ")");
}

}  // namespace

ModelConfig gguf_model_config(const GgufFile& file) {
  const MetadataReader md(file);
  const std::string arch = md.get_string_or("general.architecture", "");
  ModelConfig c;
  if (arch == "llama" || arch == "qwen2") {
    c.architecture = arch;
  } else {
    throw_error(ErrorCode::kUnsupported, file.path() + ": general.architecture '" + arch +
                                             "' is not supported (expected llama or qwen2)");
  }
  const std::string p = arch + ".";
  c.num_layers = md.get_int(p + "block_count");
  c.hidden_size = md.get_int(p + "embedding_length");
  c.intermediate_size = md.get_int(p + "feed_forward_length");
  c.num_heads = md.get_int(p + "attention.head_count");
  c.num_kv_heads = md.get_int_or(p + "attention.head_count_kv", c.num_heads);
  if (c.num_heads <= 0)
    throw_error(ErrorCode::kCorruptData,
                file.path() + ": " + p + "attention.head_count is " + std::to_string(c.num_heads));
  c.head_dim = md.get_int_or(p + "attention.key_length", c.hidden_size / c.num_heads);
  const int64_t value_dim = md.get_int_or(p + "attention.value_length", c.head_dim);
  if (value_dim != c.head_dim)
    throw_error(ErrorCode::kUnsupported,
                file.path() + ": " + p + "attention.value_length " + std::to_string(value_dim) +
                    " differs from the key length " + std::to_string(c.head_dim));
  const int64_t rope_dims = md.get_int_or(p + "rope.dimension_count", c.head_dim);
  if (rope_dims != c.head_dim)
    throw_error(ErrorCode::kUnsupported,
                file.path() + ": " + p + "rope.dimension_count " + std::to_string(rope_dims) +
                    " (partial rotary) is not supported, expected head_dim " +
                    std::to_string(c.head_dim));
  c.rms_norm_eps = md.get_double_or(p + "attention.layer_norm_rms_epsilon", 1e-5);
  c.rope_theta = md.get_double_or(p + "rope.freq_base", 10000.0);
  c.max_position = md.get_int_or(p + "context_length", 2048);

  const GgufFile::TensorInfo* embd = file.find("token_embd.weight");
  if (md.has(p + "vocab_size")) {
    c.vocab_size = md.get_int(p + "vocab_size");
  } else if (embd && embd->dims.size() == 2) {
    c.vocab_size = embd->dims[1];
  } else if (md.has("tokenizer.ggml.tokens")) {
    c.vocab_size = static_cast<int64_t>(file.metadata()["tokenizer.ggml.tokens"].size());
  }

  const std::string scaling = md.get_string_or(p + "rope.scaling.type", "none");
  if (scaling == "linear") {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = md.get_double_or(p + "rope.scaling.factor", 1.0);
  } else if (scaling != "none") {
    throw_error(ErrorCode::kUnsupported, file.path() + ": " + p + "rope.scaling.type '" + scaling +
                                             "' is not supported (expected none or "
                                             "linear)");
  } else if (md.has(p + "rope.scale_linear")) {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = md.get_double_or(p + "rope.scale_linear", 1.0);
  }
  if (c.rope_scaling.type == "linear" && c.rope_scaling.factor == 1.0) c.rope_scaling = {};

  c.tie_embeddings = file.find("output.weight") == nullptr;
  c.attention_bias = file.find("blk.0.attn_q.bias") != nullptr;
  if (md.has("tokenizer.ggml.bos_token_id"))
    c.bos_token_id = static_cast<int32_t>(md.get_int("tokenizer.ggml.bos_token_id"));
  if (md.has("tokenizer.ggml.eos_token_id"))
    c.eos_token_id = static_cast<int32_t>(md.get_int("tokenizer.ggml.eos_token_id"));
  c.validate(file.path());
  if (file.find("rope_freqs.weight")) recover_llama3_scaling(file, c);
  return c;
}

ModelWeights load_gguf_weights(const std::string& path, const LoadProgress& progress) {
  if (progress) progress("reading metadata", 0.0);
  const GgufFile file = GgufFile::open(path);
  const ModelConfig config = gguf_model_config(file);
  const GgufSource source(file);
  AssembleOptions options;
  options.naming = WeightNaming::kGguf;
  // llama.cpp's converter permutes Q/K of arch llama to the Meta pairwise layout; qwen2 is
  // written in HF order.
  options.meta_rope_layout = config.architecture == "llama";
  options.ignored_tensors = {"rope_freqs.weight"};  // folded into config.rope_scaling
  options.ignored_suffixes = {".attn_rot_embd"};    // an old, unused rotary buffer
  options.progress = progress;
  return assemble_weights(config, source, options);
}

}  // namespace arbor
