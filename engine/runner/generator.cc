#include "engine/runner/generator.h"

#include "engine/core/error.h"

namespace arbor {

Generator::Generator(LlamaModel& model, const GeneratorConfig& config, Proposer* proposer)
    : engine_(model, config, proposer) {}

std::vector<GenerationResult> Generator::run(const std::vector<GenerationRequest>& requests,
                                             const TokenCallback& on_token) {
  for (size_t i = 0; i < requests.size(); ++i) {
    try {
      engine_.add(static_cast<ReqId>(i), requests[i]);
    } catch (const Error& e) {
      for (size_t j = 0; j < i; ++j) engine_.cancel(static_cast<ReqId>(j));
      throw_error(e.code(), "request " + std::to_string(i) + ": " + e.what());
    }
  }
  std::vector<GenerationResult> results(requests.size());
  while (!engine_.idle()) {
    for (EngineEvent& ev : engine_.step()) {
      if (ev.choice != 0) continue;
      if (on_token)
        for (int32_t t : ev.tokens) on_token(static_cast<size_t>(ev.id), t);
      if (ev.finished) results[static_cast<size_t>(ev.id)] = std::move(ev.result);
    }
  }
  return results;
}

}  // namespace arbor
