// The step loop: runs a set of requests to completion in shared flat steps. Each step mixes
// chunked prefill of some requests with a decode item per running request: a draft tree from
// the proposer (speculation) or the root alone (plain decode, the T = 1 tree), verified against
// the target's logits and compacted in the paged KV cache. The KV cache manager owns block
// tables, prefix sharing and preemption by recompute when blocks run out.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "engine/kv_cache/kv_cache_manager.h"
#include "engine/model/llama_model.h"
#include "engine/sampling/sampler.h"
#include "engine/spec/proposer.h"
#include "engine/spec/verifier.h"

namespace arbor {

struct GenerationRequest {
  std::vector<int32_t> prompt;  // token ids, BOS included when wanted
  SamplingParams sampling;
  int32_t max_tokens = 128;             // generated tokens at most
  bool ignore_eos = false;              // keep going past EOS (benchmarks)
  std::vector<int32_t> stop_token_ids;  // ends the request besides the model's EOS
  bool speculate = true;                // use the generator's proposer (if it has one)
};

struct GenerationResult {
  std::vector<int32_t> tokens;       // generated ids (a stop token included)
  std::string finish_reason;         // "stop" (EOS / stop id) or "length"
  int32_t cached_prompt_tokens = 0;  // prompt tokens served from the prefix cache
  int32_t preemptions = 0;
  AcceptanceStats acceptance;  // decode / verify steps: tokens emitted per step, by depth
};

struct GeneratorConfig {
  int32_t num_blocks = 256;       // KV cache blocks
  int32_t block_size = 16;        // tokens per block
  int32_t max_step_tokens = 512;  // token budget of one step (prefill chunking)
  int32_t max_running = 64;       // requests decoding at once
  bool prefix_caching = true;
  TreeBudget tree_budget;  // largest tree a proposer may return
  VerifyOptions verify;    // rejection sampling (lossless) unless typical is asked for
  void validate() const;
};

struct GeneratorStats {
  int64_t steps = 0;
  int64_t prefill_tokens = 0;  // prompt tokens run through the model
  int64_t decode_tokens = 0;   // tokens generated
  int64_t tree_tokens = 0;     // tokens scored in decode / verify steps (tree nodes)
  double prefill_seconds = 0;  // wall time of steps that carried prefill only
  double decode_seconds = 0;   // wall time of steps that carried decode only
  double mixed_seconds = 0;    // steps with both
};

class Generator {
 public:
  // `proposer` (optional, not owned) drafts trees for requests with speculate set.
  Generator(LlamaModel& model, const GeneratorConfig& config, Proposer* proposer = nullptr);

  // Called with (request index, token) as each token is produced.
  using TokenCallback = std::function<void(size_t, int32_t)>;
  std::vector<GenerationResult> run(const std::vector<GenerationRequest>& requests,
                                    const TokenCallback& on_token = {});

  const KvCacheManager& kv() const { return kv_; }
  const GeneratorStats& stats() const { return stats_; }

 private:
  LlamaModel& model_;
  GeneratorConfig config_;
  Proposer* proposer_;
  KvCacheManager kv_;
  GeneratorStats stats_;
};

}  // namespace arbor
