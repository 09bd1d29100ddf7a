// Random-weight models of a named shape ("dummy:llama-3-8b"), for measuring a deployment's
// step times without a weight file: the presets' configs, and their weights as shapes only
// (HostTensor with a shape and no data). A CUDA backend with CudaBackendOptions::random_weights
// fills shape-only weights on the device; fill_random_host_weights() fills them on the host for
// the CPU backend (small presets only: the host holds fp32).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/model/model_config.h"
#include "engine/model/model_weights.h"

namespace arbor {

// The model path prefix that names a preset: "dummy:" + preset name.
inline constexpr const char* kDummyModelPrefix = "dummy:";

// True when `path` names a dummy model ("dummy:..."), whether or not the preset exists.
bool is_dummy_model_path(const std::string& path);

// The preset names, in the order they are documented:
//   llama-3-8b   32 layers, hidden 4096, 32 / 8 heads, head_dim 128, FFN 14336, vocab 128256
//   llama-3-70b  80 layers, hidden 8192, 64 / 8 heads, head_dim 128, FFN 28672, vocab 128256
//   tiny         2 layers, hidden 64, 4 / 2 heads, head_dim 16, FFN 192, vocab 512 (tests)
std::vector<std::string> dummy_model_presets();

// The config of a preset, named with or without the "dummy:" prefix. Throws kInvalidArgument
// naming the presets for an unknown name.
ModelConfig dummy_model_config(const std::string& name);

// Weights of `config`'s shapes with no data (untied LM head, no attention bias).
ModelWeights shape_only_weights(const ModelConfig& config);

// dummy_model_config + shape_only_weights.
ModelWeights dummy_model_weights(const std::string& name);

// fp32 bytes the weights take on the host once filled (what fill_random_host_weights allocates).
int64_t host_weight_bytes(const ModelWeights& weights);

// Fills every shape-only tensor of `weights` on the host with the distribution the CUDA
// backend's random weights use: matrices [out, in] uniform in +-sqrt(3 / in) (unit-variance
// outputs for unit-variance inputs), vectors (norm weights) 1 +- 0.1. Deterministic in `seed`.
void fill_random_host_weights(ModelWeights* weights, uint64_t seed);

}  // namespace arbor
