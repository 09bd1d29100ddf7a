#include "engine/runner/model_bundle.h"

#include <algorithm>
#include <filesystem>
#include <fstream>

#include "engine/core/error.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/gguf_file.h"
#include "engine/model/model_loader.h"
#include "engine/tokenizer/id_tokenizer.h"
#include "engine/tokenizer/tokenizer_loaders.h"

namespace arbor {

namespace fs = std::filesystem;

namespace {

TokenizerSpec load_spec(const std::string& path, int32_t vocab_size) {
  if (fs::is_directory(path) || fs::path(path).extension() == ".json")
    return load_hf_tokenizer(path);
  if (detect_checkpoint_format(path) == CheckpointFormat::kGguf)
    return tokenizer_spec_from_gguf(GgufFile::open(path).metadata());
  return load_llama2c_tokenizer(path, vocab_size);
}

// llama2.c checkpoints carry no tokenizer: look beside the checkpoint.
std::string find_llama2c_tokenizer(const std::string& model_path) {
  const fs::path dir = fs::path(model_path).parent_path();
  for (const char* name : {"tokenizer.bin", "tok512.bin", "tok4096.bin", "tok32000.bin"}) {
    if (fs::exists(dir / name)) return (dir / name).string();
  }
  throw_error(ErrorCode::kNotFound,
              "no tokenizer found for llama2.c checkpoint " + model_path +
                  ": expected tokenizer.bin or tok*.bin beside it, or pass --tokenizer");
}

void add_unique(std::vector<int32_t>* v, int64_t id) {
  if (id < 0) return;
  if (std::find(v->begin(), v->end(), id) == v->end()) v->push_back(static_cast<int32_t>(id));
}

std::vector<int32_t> default_stop_ids(const std::string& model_path, CheckpointFormat format,
                                      const Tokenizer& tok, int32_t config_eos) {
  std::vector<int32_t> ids;
  add_unique(&ids, config_eos);
  add_unique(&ids, tok.eos_id());
  if (format == CheckpointFormat::kLlama2c) {
    add_unique(&ids, tok.bos_id());
  } else if (format == CheckpointFormat::kGguf) {
    const GgufFile gguf = GgufFile::open(model_path);  // keeps the metadata alive
    const nlohmann::json& md = gguf.metadata();
    for (const char* key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
      if (md.contains(key) && md[key].is_number_integer()) add_unique(&ids, md[key].get<int64_t>());
  } else {
    const fs::path gen = fs::path(model_path) / "generation_config.json";
    if (fs::exists(gen)) {
      std::ifstream f(gen);
      const nlohmann::json j = nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
      if (j.is_object() && j.contains("eos_token_id")) {
        const nlohmann::json& e = j["eos_token_id"];
        if (e.is_number_integer()) add_unique(&ids, e.get<int64_t>());
        if (e.is_array())
          for (const auto& x : e)
            if (x.is_number_integer()) add_unique(&ids, x.get<int64_t>());
      }
    }
  }
  return ids;
}

// A dummy model: shape-only weights of the preset, and an IdTokenizer unless a tokenizer is
// named (e.g. Llama 3's tokenizer.json beside dummy:llama-3-8b, for text requests).
ModelBundle load_dummy_bundle(const std::string& model_path, const std::string& tokenizer_path) {
  ModelBundle b;
  b.weights = dummy_model_weights(model_path);
  const ModelConfig& c = b.weights.config;
  if (tokenizer_path.empty()) {
    b.tokenizer = std::make_unique<IdTokenizer>(model_path, static_cast<int32_t>(c.vocab_size),
                                                c.bos_token_id, c.eos_token_id);
  } else {
    b.tokenizer = Tokenizer::create(load_spec(tokenizer_path, static_cast<int32_t>(c.vocab_size)));
    if (b.tokenizer->vocab_size() > c.vocab_size)
      throw_error(ErrorCode::kInvalidArgument,
                  "tokenizer " + tokenizer_path + " has " +
                      std::to_string(b.tokenizer->vocab_size()) + " tokens but " + model_path +
                      "'s vocabulary is " + std::to_string(c.vocab_size));
  }
  add_unique(&b.stop_token_ids, c.eos_token_id);
  return b;
}

}  // namespace

ModelBundle load_model_bundle(
    const std::string& model_path, const std::string& tokenizer_path,
    const std::function<void(const std::string& stage, double fraction)>& progress) {
  if (is_dummy_model_path(model_path)) return load_dummy_bundle(model_path, tokenizer_path);
  ModelBundle b;
  b.weights = load_model_weights(model_path, progress);
  std::string tok = tokenizer_path;
  if (tok.empty()) {
    tok = detect_checkpoint_format(model_path) == CheckpointFormat::kLlama2c
              ? find_llama2c_tokenizer(model_path)
              : model_path;
  }
  TokenizerSpec spec = load_spec(tok, static_cast<int32_t>(b.weights.config.vocab_size));
  b.tokenizer = Tokenizer::create(std::move(spec));
  if (b.tokenizer->vocab_size() > b.weights.config.vocab_size)
    throw_error(ErrorCode::kCorruptData, "tokenizer " + tok + " has " +
                                             std::to_string(b.tokenizer->vocab_size()) +
                                             " tokens but the model's vocabulary is " +
                                             std::to_string(b.weights.config.vocab_size));
  b.stop_token_ids = default_stop_ids(model_path, detect_checkpoint_format(model_path),
                                      *b.tokenizer, b.weights.config.eos_token_id);
  return b;
}

}  // namespace arbor
