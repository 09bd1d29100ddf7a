// Sampling and speculative verification on the backend (Backend::sample_trees): the flat batch
// the engine hands over and what comes back. Logits stay in backend memory; only these small
// arrays cross to the host. The math is engine/verify/verifier.h's (greedy matching for greedy
// items, lossless multi-branch rejection sampling for sampled ones) with the logits processing
// of engine/sampling/sampler.h; engine/verify/device_verify.h builds a batch from DraftTrees and
// converts the result back to VerifyResults.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/tensor.h"

namespace arbor {

// One item's sampling parameters (SamplingParams without the seed, the randomness comes as
// uniforms, and without the logit bias, which is TreeSampleBatch's bias CSR). greedy != 0:
// argmax of the biased and penalised logits, no temperature / top-k / top-p / min-p, no uniforms
// used.
struct TreeSampleParams {
  float temperature = 1.0f;
  int32_t top_k = 0;
  float top_p = 1.0f;
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  float presence_penalty = 0.0f;
  float frequency_penalty = 0.0f;
  int32_t greedy = 0;
};

// I items (one request choice each), each a draft tree of T_i >= 1 nodes (T_i = 1: plain
// sampling of the next token). Node j of item i is global node node_indptr[i] + j; its target
// logits are row logits_row[global node] of the logits tensor. Items may share a logits row
// only if they have the same parameters, logit bias and context at that node (n > 1 choices
// drawing their first token from one prefill row).
struct TreeSampleBatch {
  std::vector<TreeSampleParams> params;  // [I]
  std::vector<int32_t> node_indptr;      // [I + 1]
  std::vector<int32_t> logits_row;       // [nodes]
  std::vector<int32_t> parent;           // [nodes] item-local; -1 for each item's root
  std::vector<int32_t> token;            // [nodes] in [0, vocab)
  // Sampled draft proposals: q_row[node] >= 0 names the row of q ([q rows, vocab], normalised)
  // that the node's children were drawn from; -1 = deterministic children (q one-hot). Empty:
  // every node deterministic.
  std::vector<int32_t> q_row;  // [nodes] or empty
  std::vector<float> q;        // [q rows, vocab]
  // Penalty context of item i: the distinct token ids < vocab of its prompt and output,
  // ascending, in ctx_token[ctx_indptr[i] .. ctx_indptr[i + 1]), with their number of
  // occurrences in the output (generated tokens) in ctx_output_count. Tree path tokens (root
  // excluded) count as output on top. Only read when the item has a penalty.
  std::vector<int32_t> ctx_indptr;        // [I + 1]
  std::vector<int32_t> ctx_token;         // [ctx]
  std::vector<int32_t> ctx_output_count;  // [ctx]
  // Logit bias of item i (SamplingParams::logit_bias): bias_value[b] is added to the logit of
  // token bias_token[b] for b in [bias_indptr[i], bias_indptr[i + 1]), ids strictly ascending
  // in [0, vocab), before the penalties, at every node of the item. bias_indptr empty (with
  // bias_token and bias_value): no item has a bias.
  std::vector<int32_t> bias_indptr;  // [I + 1] or empty
  std::vector<int32_t> bias_token;   // [bias]
  std::vector<float> bias_value;     // [bias] finite, in [-kMaxTreeSampleBias, kMaxTreeSampleBias]
  // Uniforms in [0, 1) the walk of item i consumes in order (one per tested child, one for the
  // final draw): uniform_indptr[i + 1] - uniform_indptr[i] >= T_i for a sampled item.
  std::vector<int32_t> uniform_indptr;  // [I + 1]
  std::vector<double> uniforms;
  // Tokens still on the backend (StepInputs::token_source's form): empty, or [nodes] flat
  // indices into token_source (int32, memory the sampling backend shares); node g's token is
  // token_source[token_source_index[g]] where the index is >= 0, token[g] (any id inside the
  // vocabulary) elsewhere. Only backends with sample_trees read them.
  Tensor token_source;
  std::vector<int64_t> token_source_index;
  // Parents still on the backend (StepInputs::parent_source_index's form): empty, or [nodes] flat
  // indices into token_source; node g's item-local parent is token_source[index] where the
  // index is >= 0. `parent` then holds a placeholder no shallower than the real tree at any
  // node (DeviceTokens), which bounds the accepted paths' length.
  std::vector<int64_t> parent_source_index;

  int32_t num_items() const { return static_cast<int32_t>(params.size()); }
  int32_t num_nodes() const { return static_cast<int32_t>(token.size()); }
};

// Per item: the accepted root-to-node path (item-local node ids, starting with 0), the tested
// children count at each of its nodes (VerifyResult::children_tried), the bonus token, the
// uniforms consumed, and a status: 0 = ok, 1 = a visited node's logits had a NaN / +inf or no
// finite value (the host verifier throws kInvalidArgument there; the path is then {0}, 0 tried,
// bonus -1, 0 uniforms used).
struct TreeSampleResult {
  std::vector<int32_t> path_indptr;  // [I + 1]
  std::vector<int32_t> path_nodes;
  std::vector<int32_t> children_tried;  // parallel to path_nodes
  std::vector<int32_t> path_tokens;     // parallel to path_nodes: each node's token
  std::vector<int32_t> bonus;           // [I]
  std::vector<int32_t> uniforms_used;   // [I]
  std::vector<int32_t> status;          // [I]
  // Backend::sample_trees_and_path_rows only: [path_nodes.size(), cols] rows at the paths.
  std::vector<float> path_rows;
};

// Largest tree (nodes per item) sample_trees accepts.
inline constexpr int32_t kMaxTreeSampleNodes = 1024;
// SamplingParams' logit_bias limits (kMaxLogitBias, kMaxLogitBiasEntries; device_verify.cc
// asserts they are equal), so that the batch accepts exactly what the host reference does.
inline constexpr float kMaxTreeSampleBias = 100.0f;
inline constexpr int32_t kMaxTreeSampleBiasEntries = 1024;

// Throws kInvalidArgument naming the first inconsistent field: sizes and indptrs, a tree larger
// than kMaxTreeSampleNodes, parents not topological from a root at each item's node 0, tokens,
// penalty-context or logit-bias ids outside [0, vocab), a context or bias list not strictly
// ascending, a bias out of range or an item with more than kMaxTreeSampleBiasEntries, logits
// rows outside [0, logits_rows), q rows outside q, too few uniforms for a sampled item,
// parameters out of range.
void validate_tree_sample_batch(const TreeSampleBatch& batch, int64_t vocab, int64_t logits_rows);

// What is wrong with a token_source / token_source_index pair (StepInputs, TreeSampleBatch) for
// `entries` ids, or "" when nothing is: an index list of another size, no int32 source, an index
// outside [-1, source.numel()).
// `name` names the index list in the message.
std::string token_source_problem(const Tensor& source, std::span<const int64_t> index,
                                 size_t entries, const char* name = "token_source_index");

// Appends one item's `count` entries to a flat index list of StepInputs / TreeSampleBatch form
// (token_source_index, parent_source_index) that held `before` entries: the item's own `index`
// when it has one (the list padded with -1 first), else -1s when the list is in use already.
void append_source_index(std::vector<int64_t>* list, std::span<const int64_t> index, size_t before,
                         size_t count);

// out->path_tokens from out's paths and the batch's node tokens `token` ([nodes]: batch.token, or
// those with token_source's ids in).
void fill_path_tokens(const TreeSampleBatch& batch, std::span<const int32_t> token,
                      TreeSampleResult* out);

}  // namespace arbor
