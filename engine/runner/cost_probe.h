// Measures the verify-step cost curve of the model being served, at start-up: the wall time of
// one forward step (every row's logits reduced to an argmax on the backend, as a greedy verify
// step) for B requests that each score a tree of T nodes after a fixed context, over a grid of
// B and T. The tree-budget policy plans with this curve (CostModelConfig::curves) instead of a
// prior measured on another model or machine (configs/verify_cost_*.json), and keeps correcting
// its level online. `arbor serve --cost-model measure` and `arbor spec-bench --cost-model
// measure` use it.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "engine/model/llama_model.h"
#include "engine/scheduler/cost_model.h"
#include "engine/spec/proposer.h"

namespace arbor {

struct CostProbeOptions {
  std::vector<int32_t> batches = {1, 2, 4, 8, 16, 32, 64};     // requests per step (ascending)
  std::vector<int32_t> tree_sizes = {1, 2, 4, 8, 16, 32, 64};  // nodes per request (ascending)
  int32_t context = 256;                                       // committed tokens before each tree
  int32_t warmup = 3;      // untimed steps per point (the step graph is recorded in these)
  int32_t iters = 5;       // timed steps per point (median)
  double budget_s = 20.0;  // stop measuring larger points after this much wall time
  void validate() const;   // throws kInvalidArgument naming the field
};

// The measured curves (total tokens B * T -> step ms, per B). Points are limited to
// max_step_tokens tokens, max_running requests, max_tree nodes and the KV cache's blocks, whose
// contents it overwrites: call it before the cache holds anything. `proposer` (optional) adds
// what its verify steps ask of the forward (hidden states, captured layers); step graphs
// recorded for the probe's shapes are dropped afterwards.
std::map<int32_t, std::vector<CostCurvePoint>> measure_verify_cost(
    LlamaModel& model, const Proposer* proposer, const CostProbeOptions& options,
    int32_t max_step_tokens, int32_t max_running, int32_t max_tree);

}  // namespace arbor
