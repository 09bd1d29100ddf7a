// The engine side of backend sampling (engine/verify/device_verify.h): a TreeSampleBuilder batch
// run by the reference implementation (sample_trees_on_host) gives exactly verify()'s result on
// the same logits, and leaves each request's Rng exactly where verify() leaves it, for random
// trees (deterministic and sampled children), every sampling parameter, logit biases (greedy
// and sampled) and penalty contexts; several items share one batch. Malformed batches are
// rejected naming the field. The CUDA
// implementation is compared with this reference in tests/cuda/cuda_sampling_test.cc.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "engine/core/error.h"
#include "engine/verify/device_verify.h"
#include "tests/unit/verifier_test_util.h"

namespace arbor {
namespace {

SamplingParams variant(int v) {
  SamplingParams p;
  switch (v % 7) {
    case 0:
      p.temperature = 0.0f;
      break;
    case 1:
      p.temperature = 0.0f;
      p.repetition_penalty = 1.4f;
      p.frequency_penalty = 0.3f;
      break;
    case 2:
      p.temperature = 0.9f;
      break;
    case 3:
      p.top_k = 3;
      p.top_p = 0.8f;
      break;
    case 4:
      p.temperature = 1.3f;
      p.min_p = 0.2f;
      p.presence_penalty = 0.7f;
      break;
    case 5:
      p.temperature = 0.6f;
      p.repetition_penalty = 0.7f;
      p.top_p = 0.5f;
      break;
    default:
      p.top_k = 1;
      break;
  }
  // Every other cycle of the seven: the same parameters with a logit bias (an id all but banned,
  // the others moved both ways), so greedy and sampled items, with and without penalties, see
  // a bias.
  if ((v / 7) % 2 == 1) p.logit_bias = {{0, 1.5f}, {2, -100.0f}, {5, 0.75f}, {7, -2.0f}};
  return p;
}

// A random tree over `vocab` tokens rooted at `root`; with `sampled`, some nodes get a q row
// when they are added, and all their children are then independent draws from it.
DraftTree random_tree(std::mt19937& rng, int32_t vocab, int32_t root, bool sampled) {
  DraftTree t = DraftTree::root_only(root);
  const int n = 1 + static_cast<int>(rng() % 12);
  std::vector<int32_t> q_row(1, -1);
  for (int j = 1; j < n; ++j) {
    const int32_t parent = static_cast<int32_t>(rng() % static_cast<unsigned>(j));
    int32_t token = static_cast<int32_t>(rng() % static_cast<unsigned>(vocab));
    if (q_row[parent] >= 0) {
      const float* q = t.q.data() + static_cast<size_t>(q_row[parent]) * vocab;
      std::discrete_distribution<int32_t> d(q, q + vocab);
      token = d(rng);
    }
    t.parent.push_back(parent);
    t.token.push_back(token);
    int32_t row = -1;
    if (sampled && rng() % 2 == 0) {
      row = static_cast<int32_t>(t.q.size() / vocab);
      std::vector<float> w(static_cast<size_t>(vocab));
      float s = 0.f;
      for (float& x : w) s += (x = 0.05f + static_cast<float>(rng() % 100));
      for (float x : w) t.q.push_back(x / s);
    }
    q_row.push_back(row);
  }
  t.q_row = q_row;
  return t;
}

TEST(TreeSampling, BuilderAndHostReferenceEqualVerify) {
  std::mt19937 rng(123);
  const testing::ToyModel model{8, 2.5f, 7};
  int items = 0, accepted = 0, sampled_items = 0, biased_items = 0, bias_changed = 0;
  for (int round = 0; round < 60; ++round) {
    TreeSampleBuilder builder(model.vocab);
    std::vector<float> logits;  // rows of every item, in order
    struct Want {
      VerifyResult result;
      uint64_t next;
      Rng* rng;
    };
    std::vector<Want> want;
    std::vector<std::unique_ptr<Rng>> rngs;
    for (int i = 0; i < 5; ++i) {
      const SamplingParams params = variant(round * 5 + i);
      std::vector<int32_t> prompt, output;
      for (int k = 0; k < 6; ++k)
        prompt.push_back(static_cast<int32_t>(rng() % static_cast<unsigned>(model.vocab)));
      for (int k = 0; k < 4; ++k)
        output.push_back(static_cast<int32_t>(rng() % static_cast<unsigned>(model.vocab)));
      prompt.push_back(1000);  // an id >= vocab: ignored by the penalties, as by HF
      const DraftTree tree = random_tree(rng, model.vocab, output.back(), i % 2 == 0);
      std::vector<int32_t> committed = prompt;
      committed.insert(committed.end(), output.begin(), output.end());
      const std::vector<float> rows = testing::tree_logits(model, tree, committed);
      const int32_t first_row = static_cast<int32_t>(logits.size() / model.vocab);
      logits.insert(logits.end(), rows.begin(), rows.end());
      const uint64_t seed = rng();
      Rng direct(seed);
      const VerifyResult r =
          verify(tree, rows, model.vocab, Sampler(params), prompt, output, direct);
      rngs.push_back(std::make_unique<Rng>(seed));
      builder.add(tree, first_row, params, prompt, output, rngs.back().get());
      want.push_back({r, direct.next_u64(), rngs.back().get()});
      sampled_items += !params.greedy();
      if (!params.logit_bias.empty()) {
        // The bias matters here: without it verify() decides differently on some items.
        SamplingParams unbiased = params;
        unbiased.logit_bias.clear();
        Rng again(seed);
        const VerifyResult u =
            verify(tree, rows, model.vocab, Sampler(unbiased), prompt, output, again);
        bias_changed += u.accepted_nodes != r.accepted_nodes || u.bonus_token != r.bonus_token;
        ++biased_items;
      }
    }
    const TreeSampleBatch& b = builder.batch();
    ASSERT_EQ(b.bias_indptr.size(), static_cast<size_t>(builder.size()) + 1);
    for (int32_t i = 0; i < builder.size(); ++i)
      EXPECT_EQ(b.bias_indptr[i + 1] - b.bias_indptr[i],
                static_cast<int32_t>(variant(round * 5 + i).logit_bias.size()));
    TreeSampleResult out;
    sample_trees_on_host(logits, model.vocab, builder.batch(), &out);
    for (int32_t i = 0; i < builder.size(); ++i) {
      const VerifyResult got = builder.result(i, out);
      const Want& w = want[static_cast<size_t>(i)];
      EXPECT_EQ(got.accepted_nodes, w.result.accepted_nodes) << round << " " << i;
      EXPECT_EQ(got.accepted_tokens, w.result.accepted_tokens) << round << " " << i;
      EXPECT_EQ(got.bonus_token, w.result.bonus_token) << round << " " << i;
      EXPECT_EQ(got.children_tried, w.result.children_tried) << round << " " << i;
      EXPECT_EQ(w.rng->next_u64(), w.next) << "the Rng must end where verify() leaves it";
      accepted += got.num_accepted();
      ++items;
    }
  }
  EXPECT_GT(accepted, 20);
  EXPECT_GT(sampled_items, items / 2);
  EXPECT_GT(biased_items, items / 3);
  EXPECT_GT(bias_changed, biased_items / 4) << "the bias should change the outcome often";
}

TEST(TreeSampling, LogitBiasIdOutsideTheVocabularyIsRefused) {
  TreeSampleBuilder builder(10);
  const std::vector<int32_t> prompt = {1, 2, 3};
  Rng rng(1);
  SamplingParams p;
  p.logit_bias = {{4, 1.0f}, {10, 2.0f}};
  try {
    builder.add(DraftTree::root_only(3), 0, p, prompt, {}, &rng);
    ADD_FAILURE() << "id 10 accepted with vocab 10";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("logit_bias token id 10"), std::string::npos) << e.what();
  }
  EXPECT_EQ(builder.size(), 0) << "nothing added";
}

TEST(TreeSampling, WrongRootAndMalformedBatchesAreRejected) {
  TreeSampleBuilder builder(10);
  const std::vector<int32_t> prompt = {1, 2, 3};
  Rng rng(1);
  SamplingParams p;
  EXPECT_THROW(builder.add(DraftTree::root_only(4), 0, p, prompt, {}, &rng), Error);
  p.logit_bias = {{2, 1.5f}, {7, -3.0f}};
  builder.add(DraftTree{{-1, 0, 0}, {3, 5, 6}, {}, {}}, 0, p, prompt, {}, &rng);
  const TreeSampleBatch good = builder.batch();
  EXPECT_NO_THROW(validate_tree_sample_batch(good, 10, 3));
  auto expect_bad = [&](const std::string& needle, auto mutate, int64_t rows = 3) {
    TreeSampleBatch b = good;
    mutate(b);
    try {
      validate_tree_sample_batch(b, 10, rows);
      ADD_FAILURE() << needle << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_bad(
      "logits_row[2]", [](TreeSampleBatch&) {}, 2);
  expect_bad("token[1]", [](TreeSampleBatch& b) { b.token[1] = 10; });
  expect_bad("parent", [](TreeSampleBatch& b) { b.parent[2] = 2; });
  expect_bad("uniforms", [](TreeSampleBatch& b) {
    b.uniforms.pop_back();
    b.uniform_indptr.back()--;
  });
  expect_bad("temperature", [](TreeSampleBatch& b) { b.params[0].temperature = 0.0f; });
  expect_bad("q_row", [](TreeSampleBatch& b) { b.q_row = {0, -1, -1}; });
  expect_bad("node_indptr", [](TreeSampleBatch& b) { b.node_indptr.back() = 2; });
  expect_bad("parent_source_index has 2 entries for 3", [](TreeSampleBatch& b) {
    b.parent_source_index = {-1, 0};
  });
  expect_bad("parent_source_index without an int32 token_source", [](TreeSampleBatch& b) {
    b.parent_source_index = {-1, 0, 0};
  });
  expect_bad("bias_token[1] is 10", [](TreeSampleBatch& b) { b.bias_token[1] = 10; });
  expect_bad("bias_token[0] is -1", [](TreeSampleBatch& b) { b.bias_token[0] = -1; });
  expect_bad("bias_token of item 0 is not strictly ascending", [](TreeSampleBatch& b) {
    b.bias_token = {7, 2};
  });
  expect_bad("bias_value[0] is 150", [](TreeSampleBatch& b) { b.bias_value[0] = 150.0f; });
  expect_bad("bias_value[1] is nan", [](TreeSampleBatch& b) { b.bias_value[1] = std::nanf(""); });
  expect_bad("bias_value has 1 entries", [](TreeSampleBatch& b) { b.bias_value.pop_back(); });
  expect_bad("bias_indptr", [](TreeSampleBatch& b) { b.bias_indptr.back() = 1; });
  expect_bad("bias_indptr", [](TreeSampleBatch& b) { b.bias_indptr.clear(); });
  expect_bad(
      "logit bias entries, at most 1024",
      [](TreeSampleBatch& b) {
        b.bias_token.clear();
        b.bias_value.clear();
        for (int32_t t = 0; t < 1025; ++t) {
          b.bias_token.push_back(t);
          b.bias_value.push_back(0.5f);
        }
        b.bias_indptr = {0, 1025};
      },
      3);
  // An empty CSR means no bias at all (batches built before the bias existed).
  TreeSampleBatch no_bias = good;
  no_bias.bias_indptr.clear();
  no_bias.bias_token.clear();
  no_bias.bias_value.clear();
  EXPECT_NO_THROW(validate_tree_sample_batch(no_bias, 10, 3));
}

}  // namespace
}  // namespace arbor
