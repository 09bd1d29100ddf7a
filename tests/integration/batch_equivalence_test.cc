// Flat-batch semantics of the forward pass: (1) prompts run one at a time and together in one
// flat batch (different lengths, chunked prefill resuming mid-block) give the same logits;
// (2) a speculation tree scored in one tree-masked pass gives, at every node, the logits of the
// causal sequence prefix + root-to-node path - for several requests with different tree sizes
// in one batch, trees starting mid-block and spanning blocks, masks wider than 32 nodes, next
// to plain decode rows and a prefill chunk in the same step.
#include <gtest/gtest.h>

#include <random>

#include "engine/backend/backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "tests/common/direct_batch.h"
#include "tests/common/golden.h"

namespace arbor {
namespace {

using testing::DirectBatch;

std::string model_path(const std::string& name) {
  if (name == "stories260K")
    return std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  return std::string(ARBOR_TEST_DATA_DIR) + "/models/" + name;
}

std::vector<int32_t> random_tokens(std::mt19937& rng, int n, int vocab) {
  std::uniform_int_distribution<int> d(3, vocab - 1);
  std::vector<int32_t> t(n);
  for (auto& x : t) x = d(rng);
  return t;
}

double rel_diff(const float* a, const float* b, int64_t n) {
  double md = 0, mr = 0;
  for (int64_t i = 0; i < n; ++i) {
    md = std::max(md, std::fabs(double(a[i]) - b[i]));
    mr = std::max(mr, std::fabs(double(b[i])));
  }
  return md / mr;
}

class FlatBatch : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    weights_ = load_model_weights(model_path(GetParam()));
    backend_ = make_cpu_backend();
    model_ = std::make_unique<LlamaModel>(*backend_, weights_);
    backend_->allocate_kv(model_->kv_shape(512, kBlock));
    vocab_ = model_->config().vocab_size;
  }
  // Logits of every row of `tokens` run alone as one causal prefill.
  std::vector<float> alone(const std::vector<int32_t>& tokens) {
    DirectBatch b(512, kBlock, 99);
    const int s = b.add_sequence();
    ForwardOutput out;
    model_->forward(b.step({{s, tokens, true}}), &out);
    return out.logits;
  }
  static constexpr int64_t kBlock = 16;
  ModelWeights weights_;
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<LlamaModel> model_;
  int64_t vocab_ = 0;
};

TEST_P(FlatBatch, PromptsTogetherEqualPromptsAlone) {
  std::mt19937 rng(1);
  const std::vector<int> lengths = {5, 16, 23, 40, 1, 33};
  std::vector<std::vector<int32_t>> prompts;
  for (int n : lengths) prompts.push_back(random_tokens(rng, n, static_cast<int>(vocab_)));

  // Together: first a chunk of each prompt (split points in mid-block), then the rest, with the
  // sequences in a different order in the second step.
  DirectBatch b(512, kBlock, 5);
  std::vector<DirectBatch::Chunk> first, second;
  std::vector<int> seqs;
  for (size_t i = 0; i < prompts.size(); ++i) seqs.push_back(b.add_sequence());
  std::vector<size_t> split(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    split[i] = std::max<size_t>(1, prompts[i].size() * 2 / 3);
    first.push_back({seqs[i], {prompts[i].begin(), prompts[i].begin() + split[i]}, true});
  }
  ForwardOutput out1, out2;
  model_->forward(b.step(first), &out1);
  for (size_t k = prompts.size(); k-- > 0;)
    if (split[k] < prompts[k].size())
      second.push_back({seqs[k], {prompts[k].begin() + split[k], prompts[k].end()}, true});
  model_->forward(b.step(second), &out2);

  // Reassemble per prompt from the two steps' rows.
  size_t row1 = 0;
  std::vector<std::vector<float>> together(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) {
    together[i].assign(out1.logits.begin() + row1 * vocab_,
                       out1.logits.begin() + (row1 + split[i]) * vocab_);
    row1 += split[i];
  }
  size_t row2 = 0;
  for (size_t k = prompts.size(); k-- > 0;) {
    const size_t rest = prompts[k].size() - split[k];
    together[k].insert(together[k].end(), out2.logits.begin() + row2 * vocab_,
                       out2.logits.begin() + (row2 + rest) * vocab_);
    row2 += rest;
  }
  for (size_t i = 0; i < prompts.size(); ++i) {
    const std::vector<float> ref = alone(prompts[i]);
    ASSERT_EQ(ref.size(), together[i].size());
    for (size_t r = 0; r < prompts[i].size(); ++r)
      EXPECT_LE(rel_diff(together[i].data() + r * vocab_, ref.data() + r * vocab_, vocab_), 1e-5)
          << "prompt " << i << " row " << r;
  }
}

TEST_P(FlatBatch, TreeNodesEqualTheirCausalPaths) {
  std::mt19937 rng(2);
  // (prefix length, tree size): mid-block starts, block-spanning trees, >32 and >64 nodes.
  const std::vector<std::pair<int, int>> shapes = {{13, 7}, {16, 1}, {30, 40}, {5, 70}, {47, 12}};
  DirectBatch b(512, kBlock, 11);
  std::vector<int> seqs;
  std::vector<std::vector<int32_t>> prefixes;
  std::vector<DirectBatch::Chunk> prefill;
  for (auto [len, t] : shapes) {
    seqs.push_back(b.add_sequence());
    prefixes.push_back(random_tokens(rng, len, static_cast<int>(vocab_)));
    prefill.push_back({seqs.back(), prefixes.back(), false});
  }
  ForwardOutput out;
  model_->forward(b.step(prefill), &out);

  // One step: a tree per request, plus a fresh request's prefill chunk in the same batch.
  std::vector<DirectBatch::Chunk> step;
  std::vector<std::vector<int32_t>> parents, tokens;
  for (size_t i = 0; i < shapes.size(); ++i) {
    const int t = shapes[i].second;
    std::vector<int32_t> par(t, -1);
    for (int n = 1; n < t; ++n) par[n] = std::uniform_int_distribution<int>(0, n - 1)(rng);
    parents.push_back(par);
    tokens.push_back(random_tokens(rng, t, static_cast<int>(vocab_)));
    step.push_back({seqs[i], tokens.back(), true, par});
  }
  const std::vector<int32_t> extra = random_tokens(rng, 9, static_cast<int>(vocab_));
  step.push_back({b.add_sequence(), extra, true});
  model_->forward(b.step(step), &out);

  size_t row = 0;
  double worst = 0;
  for (size_t i = 0; i < shapes.size(); ++i) {
    for (size_t n = 0; n < tokens[i].size(); ++n, ++row) {
      std::vector<int32_t> path;
      for (int32_t v = static_cast<int32_t>(n); v >= 0; v = parents[i][v]) path.push_back(v);
      std::vector<int32_t> seq = prefixes[i];
      for (auto it = path.rbegin(); it != path.rend(); ++it) seq.push_back(tokens[i][*it]);
      const std::vector<float> ref = alone(seq);
      const double err = rel_diff(out.logits.data() + row * vocab_,
                                  ref.data() + (seq.size() - 1) * vocab_, vocab_);
      worst = std::max(worst, err);
      EXPECT_LE(err, 1e-5) << "request " << i << " node " << n;
    }
  }
  const std::vector<float> ref_extra = alone(extra);
  for (size_t r = 0; r < extra.size(); ++r, ++row)
    EXPECT_LE(rel_diff(out.logits.data() + row * vocab_, ref_extra.data() + r * vocab_, vocab_),
              1e-5);
  std::printf("%s: worst tree-vs-path relative error %.3g\n", GetParam().c_str(), worst);
}

INSTANTIATE_TEST_SUITE_P(Models, FlatBatch, ::testing::Values("stories260K", "llama_gqa", "qwen2"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace arbor
