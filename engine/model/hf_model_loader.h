// Loads a Hugging Face model directory (config.json + model.safetensors or sharded
// model.safetensors.index.json) into fp32 ModelWeights; HF layout needs no Q/K permutation.
#pragma once

#include <string>

#include "engine/model/model_weights.h"
#include "engine/model/weight_assembly.h"

namespace arbor {

ModelWeights load_hf_weights(const std::string& dir, const LoadProgress& progress = {});

}  // namespace arbor
