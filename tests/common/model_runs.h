// Test support: a model on a tensor-parallel group of backends (it owns them), and greedy
// decoding of one prompt, one token per step, through DirectBatch steps.
#pragma once

#include <memory>
#include <utility>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/llama_model.h"
#include "tests/common/direct_batch.h"
#include "tests/common/golden.h"

namespace arbor::testing {

// `ranks` from make_cpu_tp_backends / make_cuda_tp_backends (one backend: no group).
struct TpModel {
  std::unique_ptr<Backend> rank0;
  std::unique_ptr<LlamaModel> model;
  TpModel(std::vector<std::unique_ptr<Backend>> ranks, const ModelWeights& w) {
    rank0 = std::move(ranks[0]);
    ranks.erase(ranks.begin());
    model = std::make_unique<LlamaModel>(*rank0, w, std::move(ranks));
  }
};

// Prefills `prompt`, then decodes n greedy tokens (the argmax of each step's last logits row).
// With prompt_logits, the prefill returns every prompt row's logits into it.
inline std::vector<int32_t> greedy_decode(LlamaModel& model, const std::vector<int32_t>& prompt,
                                          int n, int64_t block_size = 16,
                                          std::vector<float>* prompt_logits = nullptr) {
  DirectBatch batch(256, block_size, /*seed=*/3);
  const int seq = batch.add_sequence();
  const bool all = prompt_logits != nullptr;
  ForwardOutput out;
  model.forward(batch.step({{seq, prompt, all}}), &out);
  if (all) *prompt_logits = out.logits;
  const int64_t vocab = model.config().vocab_size;
  std::vector<int32_t> tokens;
  for (int i = 0; i < n; ++i) {
    tokens.push_back(argmax(out.logits.data() + out.logits.size() - vocab, vocab));
    if (i + 1 < n) model.forward(batch.step({{seq, {tokens.back()}, false}}), &out);
  }
  return tokens;
}

}  // namespace arbor::testing
