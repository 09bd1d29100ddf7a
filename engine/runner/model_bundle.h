// Loads what serving one model needs from a single path: the weights (any supported
// checkpoint format) and the matching tokenizer (tokenizer.json beside an HF checkpoint, the
// GGUF's own metadata, or a llama2.c tokenizer.bin beside the checkpoint).
#pragma once

#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "engine/model/model_weights.h"
#include "engine/tokenizer/tokenizer.h"

namespace arbor {

struct ModelBundle {
  ModelWeights weights;
  std::unique_ptr<Tokenizer> tokenizer;
  // Tokens that end a generation by default: EOS, plus generation_config.json's eos list (HF),
  // the end-of-turn token (GGUF), or BOS for llama2.c story models (run.c stops there).
  std::vector<int32_t> stop_token_ids;
};

// tokenizer_path overrides the tokenizer location (needed for llama2.c checkpoints without a
// tok*.bin / tokenizer.bin beside them). Throws arbor::Error naming the missing file.
// A path "dummy:PRESET" (engine/model/dummy_weights.h) gives the preset's shape-only weights
// (the backend fills them with random values) and, without tokenizer_path, an IdTokenizer:
// token-id prompts only.
ModelBundle load_model_bundle(
    const std::string& model_path, const std::string& tokenizer_path = "",
    const std::function<void(const std::string& stage, double fraction)>& progress = {});

}  // namespace arbor
