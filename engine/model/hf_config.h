// Hugging Face config.json (+ generation_config.json) -> ModelConfig for LlamaForCausalLM,
// MistralForCausalLM and Qwen2ForCausalLM. Reads both the transformers 4 (rope_theta,
// rope_scaling) and transformers 5 (rope_parameters) spellings.
#pragma once

#include <nlohmann/json.hpp>
#include <string>

#include "engine/model/model_config.h"

namespace arbor {

// `config` is the parsed config.json; `source` names it in messages. Throws kUnsupported for
// other architectures or features the engine lacks (o_proj/MLP bias, partial rotary, YaRN),
// kCorruptData for missing or mistyped fields. The result is validate()d.
ModelConfig parse_hf_config(const nlohmann::json& config, const std::string& source);

// Reads <dir>/config.json and, when present, takes bos/eos ids from
// <dir>/generation_config.json (the first id when eos_token_id is a list).
ModelConfig load_hf_config(const std::string& dir);

}  // namespace arbor
