// Loads a llama2.c checkpoint (Karpathy's "legacy" version 0 and the version 1 fp32 export)
// into fp32 ModelWeights. Q/K rows, stored for llama2.c's pairwise RoPE (the Meta layout), are
// un-permuted to the HF rotate-halves layout.
#pragma once

#include <string>

#include "engine/model/model_weights.h"
#include "engine/model/weight_assembly.h"

namespace arbor {

// Throws kCorruptData naming the file and the array (e.g. "wq of layer 3") when the header is
// implausible or the file is shorter or longer than the header implies.
ModelWeights load_llama2c_weights(const std::string& path, const LoadProgress& progress = {});

}  // namespace arbor
