#include "engine/verify/device_verify.h"

#include <algorithm>
#include <string>
#include <utility>

#include "engine/core/error.h"
#include "engine/sampling/sampler.h"
#include "engine/verify/tree_layout.h"

namespace arbor {

static_assert(kMaxTreeSampleBias == kMaxLogitBias &&
                  kMaxTreeSampleBiasEntries == kMaxLogitBiasEntries,
              "the batch must accept exactly the logit_bias SamplingParams accepts");

namespace {

bool has_penalty(const SamplingParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

TreeSampleParams flat_params(const SamplingParams& p) {
  TreeSampleParams f;
  f.greedy = p.greedy() ? 1 : 0;
  f.temperature = p.temperature;
  f.top_k = p.top_k;
  f.top_p = p.top_p;
  f.min_p = p.min_p;
  f.repetition_penalty = p.repetition_penalty;
  f.presence_penalty = p.presence_penalty;
  f.frequency_penalty = p.frequency_penalty;
  return f;
}

SamplingParams unflat_params(const TreeSampleParams& f) {
  SamplingParams p;
  p.temperature = f.greedy ? 0.0f : f.temperature;
  p.top_k = f.top_k;
  p.top_p = f.top_p;
  p.min_p = f.min_p;
  p.repetition_penalty = f.repetition_penalty;
  p.presence_penalty = f.presence_penalty;
  p.frequency_penalty = f.frequency_penalty;
  return p;
}

// VerifyRandomness over a fixed list of uniforms, counting what it used.
class ReplayRandomness final : public VerifyRandomness {
 public:
  explicit ReplayRandomness(std::span<const double> u) : u_(u) {}
  bool bernoulli(double probability) override { return next() < probability; }
  int32_t categorical(std::span<const double> weights) override {
    return categorical_from_uniform(weights, next());
  }
  int32_t used() const { return static_cast<int32_t>(k_); }

 private:
  double next() {
    ARBOR_CHECK(k_ < u_.size(),
                "the walk needs more than " + std::to_string(u_.size()) + " uniforms");
    return u_[k_++];
  }
  std::span<const double> u_;
  size_t k_ = 0;
};

}  // namespace

bool tree_sampling_supports(const SamplingParams& params, VerifyMode mode) {
  return params.greedy() || mode == VerifyMode::kRejection;
}

TreeSampleBuilder::TreeSampleBuilder(int64_t vocab) : vocab_(vocab) {
  batch_.node_indptr = {0};
  batch_.ctx_indptr = {0};
  batch_.bias_indptr = {0};
  batch_.uniform_indptr = {0};
}

int32_t TreeSampleBuilder::add(const DraftTree& tree, int32_t first_row,
                               const SamplingParams& params, std::span<const int32_t> prompt,
                               std::span<const int32_t> output, Rng* rng) {
  validate_draft_tree(tree, vocab_);
  for (const auto& [token, bias] : params.logit_bias)
    if (token < 0 || token >= vocab_)
      throw_error(ErrorCode::kInvalidArgument, "logit_bias token id " + std::to_string(token) +
                                                   " is outside the vocabulary [0, " +
                                                   std::to_string(vocab_) + ")");
  const int32_t last = !output.empty() ? output.back() : !prompt.empty() ? prompt.back() : -1;
  if (last != tree.token[0])
    throw_error(ErrorCode::kInvalidArgument,
                "verify: the committed tokens end with " + std::to_string(last) +
                    " but the tree's root token is " + std::to_string(tree.token[0]));
  const int32_t t = tree.size();
  const TreeSampleParams flat = flat_params(params);
  batch_.params.push_back(flat);
  const int32_t q_offset = static_cast<int32_t>(batch_.q.size() / static_cast<size_t>(vocab_));
  for (int32_t i = 0; i < t; ++i) {
    batch_.logits_row.push_back(first_row + i);
    batch_.parent.push_back(tree.parent[static_cast<size_t>(i)]);
    batch_.token.push_back(tree.token[static_cast<size_t>(i)]);
    const int32_t qr = tree.q_row.empty() ? -1 : tree.q_row[static_cast<size_t>(i)];
    batch_.q_row.push_back(qr < 0 ? -1 : q_offset + qr);
  }
  batch_.q.insert(batch_.q.end(), tree.q.begin(), tree.q.end());
  if (!tree.device.empty()) {
    ARBOR_CHECK(tree.device.index.size() == static_cast<size_t>(t),
                "device tokens: " + std::to_string(tree.device.index.size()) + " indices for " +
                    std::to_string(t) + " nodes");
    ARBOR_CHECK(
        batch_.token_source.data == nullptr || batch_.token_source.data == tree.device.ids.data,
        "trees of one batch with tokens in different device buffers");
    batch_.token_source = tree.device.ids;
  }
  // Parents left on the device likewise (the same buffer as the tokens).
  ARBOR_CHECK(tree.device.parent_index.empty() || !tree.device.empty(),
              "device parents without device tokens");
  const auto before = static_cast<size_t>(batch_.num_nodes() - t);
  append_source_index(&batch_.token_source_index, tree.device.index, before,
                      static_cast<size_t>(t));
  append_source_index(&batch_.parent_source_index, tree.device.parent_index, before,
                      static_cast<size_t>(t));
  batch_.node_indptr.push_back(batch_.num_nodes());
  if (has_penalty(params)) {
    // Distinct ids < vocab of prompt ++ output, ascending, with their output counts.
    std::vector<std::pair<int32_t, int32_t>> ids;  // (token, 1 if from the output)
    ids.reserve(prompt.size() + output.size());
    for (auto [tokens, from_output] : {std::pair{prompt, 0}, {output, 1}})
      for (int32_t tok : tokens) {
        if (tok < 0)
          throw_error(ErrorCode::kInvalidArgument,
                      "the context holds negative token id " + std::to_string(tok));
        if (tok < vocab_) ids.emplace_back(tok, from_output);
      }
    std::sort(ids.begin(), ids.end());
    for (size_t i = 0; i < ids.size();) {
      size_t j = i;
      int32_t count = 0;
      for (; j < ids.size() && ids[j].first == ids[i].first; ++j) count += ids[j].second;
      batch_.ctx_token.push_back(ids[i].first);
      batch_.ctx_output_count.push_back(count);
      i = j;
    }
  }
  batch_.ctx_indptr.push_back(static_cast<int32_t>(batch_.ctx_token.size()));
  for (const auto& [token, bias] : params.logit_bias) {
    batch_.bias_token.push_back(token);
    batch_.bias_value.push_back(bias);
  }
  batch_.bias_indptr.push_back(static_cast<int32_t>(batch_.bias_token.size()));
  rngs_.push_back(rng);
  snapshots_.push_back(rng ? *rng : Rng(0));
  if (!flat.greedy) {
    ARBOR_CHECK(rng != nullptr, "a sampled item needs an Rng");
    for (int32_t i = 0; i < t; ++i) batch_.uniforms.push_back(rng->uniform());
  }
  batch_.uniform_indptr.push_back(static_cast<int32_t>(batch_.uniforms.size()));
  trees_.push_back(DraftTree{});
  trees_.back().token = tree.token;
  return batch_.num_items() - 1;
}

VerifyResult TreeSampleBuilder::result(int32_t item, const TreeSampleResult& out) {
  ARBOR_CHECK(item >= 0 && item < size() && out.status.size() == static_cast<size_t>(size()));
  const size_t i = static_cast<size_t>(item);
  if (out.status[i] != 0)
    throw_error(ErrorCode::kInvalidArgument,
                "verify: the target's logits on the accepted path have a NaN or +inf, or no "
                "finite value");
  VerifyResult r;
  const std::vector<int32_t>& tokens = trees_[i].token;
  // The backend's path tokens (those left on a device are only known from there).
  const bool path_tokens = out.path_tokens.size() == out.path_nodes.size();
  ARBOR_CHECK(path_tokens || batch_.token_source_index.empty(),
              "sample_trees returned no path tokens for device tokens");
  for (int32_t k = out.path_indptr[i]; k < out.path_indptr[i + 1]; ++k) {
    const int32_t node = out.path_nodes[static_cast<size_t>(k)];
    ARBOR_CHECK(node >= 0 && node < static_cast<int32_t>(tokens.size()));
    r.accepted_nodes.push_back(node);
    if (k > out.path_indptr[i])
      r.accepted_tokens.push_back(path_tokens ? out.path_tokens[static_cast<size_t>(k)]
                                              : tokens[static_cast<size_t>(node)]);
    r.children_tried.push_back(out.children_tried[static_cast<size_t>(k)]);
  }
  ARBOR_CHECK(!r.accepted_nodes.empty() && r.accepted_nodes[0] == 0);
  r.bonus_token = out.bonus[i];
  ARBOR_CHECK(r.bonus_token >= 0 && r.bonus_token < vocab_);
  if (Rng* rng = rngs_[i]; rng && !batch_.params[i].greedy) {
    *rng = snapshots_[i];
    for (int32_t k = 0; k < out.uniforms_used[i]; ++k) rng->uniform();
  }
  return r;
}

void sample_trees_on_host(std::span<const float> logits, int64_t vocab,
                          const TreeSampleBatch& batch, TreeSampleResult* out) {
  const int64_t rows = static_cast<int64_t>(logits.size()) / vocab;
  validate_tree_sample_batch(batch, vocab, rows);
  ARBOR_CHECK(batch.token_source_index.empty() && batch.parent_source_index.empty(),
              "sample_trees_on_host: tokens or parents left on a backend (resolve them first)");
  const int32_t items = batch.num_items();
  *out = TreeSampleResult{};
  out->path_indptr = {0};
  out->bonus.assign(static_cast<size_t>(items), -1);
  out->uniforms_used.assign(static_cast<size_t>(items), 0);
  out->status.assign(static_cast<size_t>(items), 0);
  for (int32_t i = 0; i < items; ++i) {
    const size_t ii = static_cast<size_t>(i);
    const int32_t first = batch.node_indptr[ii], t = batch.node_indptr[ii + 1] - first;
    DraftTree tree;
    std::vector<float> node_logits(static_cast<size_t>(t * vocab));
    std::vector<int32_t> q_rows;  // batch q rows this item uses, in order of first use
    for (int32_t j = 0; j < t; ++j) {
      const size_t g = static_cast<size_t>(first + j);
      tree.parent.push_back(batch.parent[g]);
      tree.token.push_back(batch.token[g]);
      std::copy_n(logits.begin() + static_cast<int64_t>(batch.logits_row[g]) * vocab, vocab,
                  node_logits.begin() + static_cast<int64_t>(j) * vocab);
      const int32_t qr = batch.q_row.empty() ? -1 : batch.q_row[g];
      int32_t local = -1;
      if (qr >= 0) {
        auto it = std::find(q_rows.begin(), q_rows.end(), qr);
        local = static_cast<int32_t>(it - q_rows.begin());
        if (it == q_rows.end()) {
          q_rows.push_back(qr);
          tree.q.insert(tree.q.end(), batch.q.begin() + static_cast<int64_t>(qr) * vocab,
                        batch.q.begin() + static_cast<int64_t>(qr + 1) * vocab);
        }
      }
      tree.q_row.push_back(local);
    }
    // The penalty context as a prompt (every distinct token) and an output (each token as
    // often as it was generated); penalties depend on membership and counts only.
    std::vector<int32_t> prompt, output;
    for (int32_t c = batch.ctx_indptr[ii]; c < batch.ctx_indptr[ii + 1]; ++c) {
      prompt.push_back(batch.ctx_token[static_cast<size_t>(c)]);
      output.insert(output.end(),
                    static_cast<size_t>(batch.ctx_output_count[static_cast<size_t>(c)]),
                    batch.ctx_token[static_cast<size_t>(c)]);
    }
    SamplingParams params = unflat_params(batch.params[ii]);
    if (!batch.bias_indptr.empty())
      for (int32_t e = batch.bias_indptr[ii]; e < batch.bias_indptr[ii + 1]; ++e)
        params.logit_bias.emplace_back(batch.bias_token[static_cast<size_t>(e)],
                                       batch.bias_value[static_cast<size_t>(e)]);
    const Sampler sampler(params);
    ReplayRandomness randomness(
        std::span<const double>(batch.uniforms)
            .subspan(static_cast<size_t>(batch.uniform_indptr[ii]),
                     static_cast<size_t>(batch.uniform_indptr[ii + 1] - batch.uniform_indptr[ii])));
    VerifyOptions options;
    options.mode = VerifyMode::kRejection;
    options.check_root = false;
    try {
      const VerifyResult r =
          verify(tree, node_logits, vocab, sampler, prompt, output, randomness, options);
      out->path_nodes.insert(out->path_nodes.end(), r.accepted_nodes.begin(),
                             r.accepted_nodes.end());
      out->children_tried.insert(out->children_tried.end(), r.children_tried.begin(),
                                 r.children_tried.end());
      out->bonus[ii] = r.bonus_token;
      out->uniforms_used[ii] = randomness.used();
    } catch (const Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument) throw;
      out->status[ii] = 1;  // the batch was validated: what remains is a logits row verify rejects
      out->path_nodes.push_back(0);
      out->children_tried.push_back(0);
    }
    out->path_indptr.push_back(static_cast<int32_t>(out->path_nodes.size()));
  }
  fill_path_tokens(batch, batch.token, out);
}

}  // namespace arbor
