// Batch generation on top of the Engine: runs a fixed set of requests to completion in shared
// flat steps (chunked prefill beside speculative decode, preemption by recompute, prefix
// caching). The CLI, the benchmarks and the tests use it; the server drives the Engine directly.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

#include "engine/runner/engine.h"

namespace arbor {

using GeneratorConfig = EngineConfig;
using GeneratorStats = EngineStats;

class Generator {
 public:
  // `proposer` (optional, not owned) drafts trees for requests with speculate set.
  Generator(LlamaModel& model, const GeneratorConfig& config, Proposer* proposer = nullptr);

  // Called with (request index, token) as each token is produced (choice 0 of each request).
  using TokenCallback = std::function<void(size_t, int32_t)>;
  // Results in request order (choice 0 when n > 1). Throws for an invalid request, naming it.
  std::vector<GenerationResult> run(const std::vector<GenerationRequest>& requests,
                                    const TokenCallback& on_token = {});

  const KvCacheManager& kv() const { return engine_.kv(); }
  const GeneratorStats& stats() const { return engine_.stats(); }
  Engine& engine() { return engine_; }

 private:
  Engine engine_;
};

}  // namespace arbor
