// Verification and sampling with the logits left on the backend (Backend::sample_trees): the
// engine side. TreeSampleBuilder turns DraftTrees, sampling parameters, contexts and each
// request's Rng into a TreeSampleBatch and the backend's TreeSampleResult back into the
// VerifyResults verify() would have produced; sample_trees_on_host() is the reference
// implementation of the backend op, written with verify() itself (the CPU backend runs it).
//
// Randomness: an item draws T uniforms from its Rng up front (the most a rejection walk of T
// nodes consumes); result() rewinds the Rng and advances it by the number the walk used, so the
// Rng ends where verify() on the same Rng would leave it, and with equal probabilities the same
// seed gives the same tokens on either path.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "engine/backend/tree_sampling.h"
#include "engine/sampling/rng.h"
#include "engine/sampling/sampling_params.h"
#include "engine/verify/draft_tree.h"
#include "engine/verify/verifier.h"

namespace arbor {

// True when sample_trees computes what verify() in `mode` would for a decode / verify item with
// these parameters: greedy parameters in every mode, sampled ones in kRejection (kGreedy and
// kTypical pick argmax tokens for them; sample_trees samples). A prefill's first token is
// plain sampling: always supported. Logprobs need the logits on the host: the caller's to
// exclude.
bool tree_sampling_supports(const SamplingParams& params, VerifyMode mode);

class TreeSampleBuilder {
 public:
  explicit TreeSampleBuilder(int64_t vocab);

  // Adds an item: node i's target logits are row first_row + i. prompt / output as verify()
  // takes them (the root token ends them). rng is read only for sampled parameters, and must
  // outlive result(). Returns the item index. Throws kInvalidArgument as verify() does for a
  // malformed tree, a wrong root or a logit_bias id outside the vocabulary.
  int32_t add(const DraftTree& tree, int32_t first_row, const SamplingParams& params,
              std::span<const int32_t> prompt, std::span<const int32_t> output, Rng* rng);

  const TreeSampleBatch& batch() const { return batch_; }
  int32_t size() const { return batch_.num_items(); }

  // Item `item` of the backend's result as a VerifyResult, with its Rng advanced by the
  // uniforms the walk used. Throws kInvalidArgument (as verify() does) when the walk reached
  // logits with a NaN / +inf or no finite value.
  VerifyResult result(int32_t item, const TreeSampleResult& out);

 private:
  int64_t vocab_;
  TreeSampleBatch batch_;
  std::vector<DraftTree> trees_;  // tokens per item, for the accepted tokens
  std::vector<Rng*> rngs_;
  std::vector<Rng> snapshots_;
};

// The reference implementation of Backend::sample_trees on host logits ([rows, vocab]): verify()
// per item with the batch's uniforms as its randomness (VerifyMode::kRejection).
void sample_trees_on_host(std::span<const float> logits, int64_t vocab,
                          const TreeSampleBatch& batch, TreeSampleResult* out);

}  // namespace arbor
