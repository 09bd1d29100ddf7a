// The one entry point for loading base-model weights: picks the format from the path (a
// Hugging Face directory, a GGUF file, or a llama2.c checkpoint) and returns validated fp32
// ModelWeights in the HF layout.
#pragma once

#include <functional>
#include <string>

#include "engine/model/model_weights.h"

namespace arbor {

enum class CheckpointFormat { kHuggingFace, kGguf, kLlama2c };

// Directory (or a config.json / *.safetensors inside one) -> kHuggingFace; a file starting with
// the GGUF magic or named *.gguf -> kGguf; any other file -> kLlama2c. Throws kNotFound for a
// missing path or a directory without config.json.
CheckpointFormat detect_checkpoint_format(const std::string& path);

// Loads the weights; progress (optional) gets a stage name and a fraction in [0, 1]. Every
// tensor's shape is checked against the config; errors name the file, the tensor, and expected
// vs found.
ModelWeights load_model_weights(
    const std::string& path,
    const std::function<void(const std::string& stage, double fraction)>& progress = {});

// Checks every tensor of `w` against w.config (shapes, biases present iff attention_bias,
// lm_head empty iff tied); throws kCorruptData naming `source` and the tensor.
void validate_model_weights(const ModelWeights& w, const std::string& source);

}  // namespace arbor
