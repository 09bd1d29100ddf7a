#include "engine/runner/model_bundle.h"

#include <filesystem>

#include "engine/core/error.h"
#include "engine/model/gguf_file.h"
#include "engine/model/model_loader.h"
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

}  // namespace

ModelBundle load_model_bundle(
    const std::string& model_path, const std::string& tokenizer_path,
    const std::function<void(const std::string& stage, double fraction)>& progress) {
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
  return b;
}

}  // namespace arbor
