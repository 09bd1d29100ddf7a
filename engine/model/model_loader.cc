#include "engine/model/model_loader.h"

#include <filesystem>
#include <fstream>

#include "engine/core/error.h"
#include "engine/model/gguf_model_loader.h"
#include "engine/model/hf_model_loader.h"
#include "engine/model/llama2c_loader.h"

namespace arbor {
namespace {

namespace fs = std::filesystem;

std::string hf_dir_of(const std::string& path) {
  const fs::path p(path);
  if (fs::is_directory(p)) return p.string();
  return p.parent_path().empty() ? std::string(".") : p.parent_path().string();
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

CheckpointFormat detect_checkpoint_format(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (ec || !fs::exists(st))
    throw_error(ErrorCode::kNotFound, path + ": no such file or directory");
  if (fs::is_directory(st)) {
    if (!fs::exists(fs::path(path) / "config.json"))
      throw_error(ErrorCode::kNotFound,
                  path + ": a model directory needs config.json (Hugging Face layout)");
    return CheckpointFormat::kHuggingFace;
  }
  const std::string name = fs::path(path).filename().string();
  if (name == "config.json" || ends_with(name, ".safetensors") ||
      name == "model.safetensors.index.json")
    return CheckpointFormat::kHuggingFace;
  if (ends_with(name, ".gguf")) return CheckpointFormat::kGguf;
  char magic[4] = {0, 0, 0, 0};
  std::ifstream in(path, std::ios::binary);
  in.read(magic, 4);
  if (in.gcount() == 4 && std::string(magic, 4) == "GGUF") return CheckpointFormat::kGguf;
  return CheckpointFormat::kLlama2c;
}

ModelWeights load_model_weights(
    const std::string& path,
    const std::function<void(const std::string& stage, double fraction)>& progress) {
  ModelWeights w;
  std::string source = path;
  switch (detect_checkpoint_format(path)) {
    case CheckpointFormat::kHuggingFace:
      source = hf_dir_of(path);
      w = load_hf_weights(source, progress);
      break;
    case CheckpointFormat::kGguf:
      w = load_gguf_weights(path, progress);
      break;
    case CheckpointFormat::kLlama2c:
      w = load_llama2c_weights(path, progress);
      break;
  }
  validate_model_weights(w, source);
  if (progress) progress("done", 1.0);
  return w;
}

void validate_model_weights(const ModelWeights& w, const std::string& source) {
  const ModelConfig& c = w.config;
  c.validate(source);
  auto expect = [&](const std::string& tensor, const HostTensor& t,
                    const std::vector<int64_t>& shape) {
    if (t.shape != shape || t.numel() != HostTensor::numel_of(shape))
      throw_error(ErrorCode::kCorruptData, source + ": tensor " + tensor + ": expected shape " +
                                               shape_str(shape) + ", found " + shape_str(t.shape));
  };
  const int64_t q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim;
  expect("embed", w.embed, {c.vocab_size, c.hidden_size});
  expect("final_norm", w.final_norm, {c.hidden_size});
  if (c.tie_embeddings) {
    if (!w.lm_head.empty())
      throw_error(ErrorCode::kCorruptData,
                  source + ": tensor lm_head: expected none (tied embeddings), found " +
                      shape_str(w.lm_head.shape));
  } else {
    expect("lm_head", w.lm_head, {c.vocab_size, c.hidden_size});
  }
  if (static_cast<int64_t>(w.layers.size()) != c.num_layers)
    throw_error(ErrorCode::kCorruptData, source + ": expected " + std::to_string(c.num_layers) +
                                             " layers, found " + std::to_string(w.layers.size()));
  for (size_t i = 0; i < w.layers.size(); ++i) {
    const LayerWeights& l = w.layers[i];
    const std::string p = "layers." + std::to_string(i) + ".";
    expect(p + "attn_norm", l.attn_norm, {c.hidden_size});
    expect(p + "wq", l.wq, {q, c.hidden_size});
    expect(p + "wk", l.wk, {kv, c.hidden_size});
    expect(p + "wv", l.wv, {kv, c.hidden_size});
    if (c.attention_bias) {
      expect(p + "bq", l.bq, {q});
      expect(p + "bk", l.bk, {kv});
      expect(p + "bv", l.bv, {kv});
    } else if (!l.bq.empty() || !l.bk.empty() || !l.bv.empty()) {
      throw_error(ErrorCode::kCorruptData,
                  source + ": tensor " + p + "bq: expected no attention bias, found one");
    }
    expect(p + "wo", l.wo, {c.hidden_size, q});
    expect(p + "ffn_norm", l.ffn_norm, {c.hidden_size});
    expect(p + "w_gate", l.w_gate, {c.intermediate_size, c.hidden_size});
    expect(p + "w_up", l.w_up, {c.intermediate_size, c.hidden_size});
    expect(p + "w_down", l.w_down, {c.hidden_size, c.intermediate_size});
  }
}

}  // namespace arbor
