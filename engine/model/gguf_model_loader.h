// Loads a GGUF model (arch llama or qwen2) into fp32 ModelWeights: config from the GGUF
// metadata, tensors dequantized, and for arch llama the Q/K rows that llama.cpp's converter
// permuted to the Meta pairwise layout put back into the HF rotate-halves layout.
#pragma once

#include <string>

#include "engine/model/gguf_file.h"
#include "engine/model/model_weights.h"
#include "engine/model/weight_assembly.h"

namespace arbor {

// ModelConfig from GGUF metadata ({arch}.block_count, ...), validated. Llama 3 rope scaling,
// which llama.cpp stores as a rope_freqs tensor of per-frequency factors, is recovered as
// RopeScaling{llama3, ...}; throws kUnsupported when those factors fit no llama3 setting.
ModelConfig gguf_model_config(const GgufFile& file);

ModelWeights load_gguf_weights(const std::string& path, const LoadProgress& progress = {});

}  // namespace arbor
