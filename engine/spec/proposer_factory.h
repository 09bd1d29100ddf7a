// One place that turns the speculation settings (CLI / config file) into a Proposer: the method,
// where its heads live, and the tree options, validated with messages that name the field.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "engine/backend/backend.h"
#include "engine/model/model_weights.h"
#include "engine/spec/proposer.h"

namespace arbor {

enum class SpecMethod { kOff, kMedusa, kEagle, kEagle3, kNgram };

const char* spec_method_name(SpecMethod method);
// "off" | "medusa" | "eagle" (EAGLE-1/2) | "eagle3" | "ngram"; kInvalidArgument listing them.
SpecMethod parse_spec_method(const std::string& name);

struct SpecConfig {
  SpecMethod method = SpecMethod::kOff;
  std::string head_path;              // Medusa: directory or medusa_lm_head.safetensors;
                                      // EAGLE: checkpoint directory
  std::string tree = "mc_sim_7b_63";  // Medusa static tree: built-in name, inline JSON or file
  int32_t medusa_top_k = 10;          // Medusa: candidates per head a tree may use (ranks < it)
  int32_t total_tokens = 60;          // EAGLE: tree nodes including the root
  int32_t depth = 5;                  // EAGLE: draft steps after the first (tree depth <= depth+1)
  int32_t top_k = 10;                 // EAGLE: children per node and frontier width
  int32_t draft_kv_blocks = 2048;     // EAGLE: blocks of the draft's own KV cache
  int32_t draft_block_size = 16;      // EAGLE: tokens per draft KV block
  int32_t grow_on_device = -1;        // EAGLE: trees grown on the draft's backend
                                      // (EagleOptions::grow_on_backend: -1 auto, 0, 1)
  int32_t pick_on_device = -1;        // EAGLE: grown trees also picked there (one wait a step;
                                      // EagleOptions::pick_on_backend: -1 auto, 0, 1)
  int32_t paths_on_device = -1;       // EAGLE, Medusa: verified paths run through the draft
                                      // (heads) before the step's wait (-1 auto, 0, 1)
  int32_t grow_before_wait = 0;       // EAGLE: with the paths on the device, the next trees
                                      // grow before the wait too (EagleOptions'; -1 auto, 0, 1)
  // EAGLE-1/2: a frequency-ranked draft vocabulary (load_token_map's file); "" = the heads'
  // token_map.json when the checkpoint directory has one, "none" = the whole vocabulary.
  std::string token_map;
  int32_t draft_vocab = 0;       // EAGLE-1/2: the token map's first N ids (0 = all of them)
  int32_t min_ngram = 1;         // n-gram: shortest suffix matched
  int32_t max_ngram = 4;         // n-gram: longest suffix matched (tried first)
  int32_t ngram_max_depth = 8;   // n-gram: longest continuation proposed
  int32_t ngram_max_nodes = 64;  // n-gram: tree nodes including the root
  int num_threads = 0;           // BLAS threads of a draft's CPU backend (0 = default)

  // kInvalidArgument naming the field and value ("spec depth is -1, need >= 0"); head_path must
  // be set for medusa / eagle / eagle3.
  void validate() const;
};

// The token map file an EAGLE-1/2 draft uses under `config` ("" = none): config.token_map, or
// the heads' kDefaultTokenMapName when the directory has one (unless token_map is "none").
inline constexpr const char* kDefaultTokenMapName = "token_map.json";
std::string resolve_token_map(const SpecConfig& config);

// The proposer for `config` (nullptr for kOff). `target` supplies what the heads share with the
// target model: hidden size, vocabulary, embeddings and LM head, layer count. Loader errors
// (missing or malformed head checkpoints) propagate with the file and tensor named.
// `draft_backend` (optional): where an EAGLE draft model or the Medusa heads run (the target's
// kind of backend, e.g. a CUDA backend when serving on the GPU); nullptr = a private CPU
// backend (EAGLE) or the host (Medusa).
std::unique_ptr<Proposer> make_proposer(const SpecConfig& config, const ModelWeights& target,
                                        std::unique_ptr<Backend> draft_backend = nullptr);

}  // namespace arbor
