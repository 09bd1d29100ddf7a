// The plain-decoding step loop on stories260K: requests batched together produce exactly what
// they produce alone (greedy), also when KV memory is so short that requests are preempted and
// recomputed, and when prompts share a cached prefix; seeded sampling is reproducible; no KV
// block is left in use afterwards; bad requests are rejected with a clear error.
#include <gtest/gtest.h>

#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/model/llama_model.h"
#include "engine/runner/generator.h"
#include "engine/runner/model_bundle.h"

namespace arbor {
namespace {

class GeneratorTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    bundle_ = new ModelBundle(
        load_model_bundle(std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.bin"));
  }
  static void TearDownTestSuite() { delete bundle_; }

  std::vector<GenerationResult> run(const std::vector<GenerationRequest>& reqs, GeneratorConfig cfg,
                                    int32_t* preemptions = nullptr) {
    auto backend = make_cpu_backend(1);
    LlamaModel model(*backend, bundle_->weights);
    Generator gen(model, cfg);
    auto res = gen.run(reqs);
    const KvCacheStats st = gen.kv().stats();
    EXPECT_EQ(st.used_blocks, 0) << "KV blocks leaked";
    EXPECT_EQ(st.free_blocks, cfg.num_blocks);
    EXPECT_EQ(st.num_sequences, 0);
    gen.kv().check_invariants();
    if (preemptions) {
      *preemptions = 0;
      for (auto& r : res) *preemptions += r.preemptions;
    }
    return res;
  }

  GenerationRequest greedy_req(const std::string& text, int32_t n) {
    GenerationRequest r;
    r.prompt = bundle_->tokenizer->encode(text, true, false);
    r.sampling.temperature = 0;
    r.max_tokens = n;
    r.ignore_eos = true;
    return r;
  }

  static ModelBundle* bundle_;
};
ModelBundle* GeneratorTest::bundle_ = nullptr;

const std::vector<std::string> kPrompts = {
    "Once upon a time", "Lily and Ben went to the park. They saw a big dog", "The sun",
    "Tom had a red ball. He liked to throw it high in the sky. One day the ball", "A little bird"};

TEST_F(GeneratorTest, BatchedEqualsAloneAndSurvivesPreemption) {
  std::vector<GenerationRequest> reqs;
  for (const auto& p : kPrompts) reqs.push_back(greedy_req(p, 40));
  GeneratorConfig roomy;
  roomy.num_blocks = 128;
  roomy.block_size = 16;
  std::vector<std::vector<int32_t>> alone;
  for (const auto& r : reqs) alone.push_back(run({r}, roomy)[0].tokens);

  const auto together = run(reqs, roomy);
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(together[i].tokens, alone[i]) << "request " << i;
    EXPECT_EQ(together[i].finish_reason, "length");
  }

  // 12 blocks of 8 tokens for 5 requests of up to ~60 tokens each: must preempt.
  GeneratorConfig tight;
  tight.num_blocks = 12;
  tight.block_size = 8;
  tight.max_step_tokens = 20;  // prefill in chunks too
  int32_t preemptions = 0;
  const auto squeezed = run(reqs, tight, &preemptions);
  EXPECT_GT(preemptions, 0);
  for (size_t i = 0; i < reqs.size(); ++i) EXPECT_EQ(squeezed[i].tokens, alone[i]) << i;
}

TEST_F(GeneratorTest, SharedPrefixIsCachedAndChangesNothing) {
  const std::string common =
      "Once upon a time there was a girl named Lily. She had a cat and a dog and a big garden.";
  GenerationRequest a = greedy_req(common + " One day", 24);
  GenerationRequest b = greedy_req(common + " The cat", 24);
  GeneratorConfig cfg;
  cfg.num_blocks = 64;
  cfg.block_size = 4;
  cfg.max_running = 1;  // b starts after a finished, so a's full prompt blocks are cached
  const auto res = run({a, b}, cfg);
  EXPECT_EQ(res[0].cached_prompt_tokens, 0);
  EXPECT_GE(res[1].cached_prompt_tokens, 16);
  cfg.prefix_caching = false;
  const auto plain = run({a, b}, cfg);
  EXPECT_EQ(plain[1].cached_prompt_tokens, 0);
  EXPECT_EQ(res[0].tokens, plain[0].tokens);
  EXPECT_EQ(res[1].tokens, plain[1].tokens);
}

TEST_F(GeneratorTest, SeededSamplingIsReproducible) {
  GenerationRequest r = greedy_req("Once upon a time", 48);
  r.sampling.temperature = 1.0f;
  r.sampling.top_p = 0.95f;
  r.sampling.seed = 1234;
  GeneratorConfig cfg;
  const auto x = run({r, r}, cfg);
  const auto y = run({r}, cfg);
  EXPECT_EQ(x[0].tokens, y[0].tokens);
  EXPECT_EQ(x[1].tokens, y[0].tokens);
  r.sampling.seed = 99;
  const auto z = run({r}, cfg);
  EXPECT_NE(z[0].tokens, y[0].tokens);
}

TEST_F(GeneratorTest, StopsAtStopToken) {
  // llama2.c story models end a story by starting the next one with BOS (run.c stops there).
  GenerationRequest r = greedy_req("Once upon a time", 400);
  r.ignore_eos = false;
  r.stop_token_ids = {bundle_->tokenizer->bos_id()};
  GeneratorConfig cfg;
  const auto res = run({r}, cfg);
  ASSERT_EQ(res[0].finish_reason, "stop");
  EXPECT_EQ(res[0].tokens.back(), bundle_->tokenizer->bos_id());
  EXPECT_LT(res[0].tokens.size(), 400u);
}

TEST_F(GeneratorTest, RejectsBadRequests) {
  auto backend = make_cpu_backend(1);
  LlamaModel model(*backend, bundle_->weights);
  Generator gen(model, GeneratorConfig{});
  GenerationRequest empty;
  auto expect_error = [&](const GenerationRequest& r, const std::string& needle) {
    try {
      gen.run({r});
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  expect_error(empty, "no prompt");
  GenerationRequest bad_id = greedy_req("hi", 4);
  bad_id.prompt.push_back(100000);
  expect_error(bad_id, "100000");
  GenerationRequest bad_n = greedy_req("hi", 0);
  expect_error(bad_n, "max_tokens");
  GenerationRequest bad_t = greedy_req("hi", 4);
  bad_t.sampling.temperature = -1;
  expect_error(bad_t, "temperature");
  GenerationRequest huge = greedy_req("hi", 1 << 20);
  expect_error(huge, "KV");
  // Still serves after the errors.
  EXPECT_EQ(gen.run({greedy_req("hi", 3)})[0].tokens.size(), 3u);
}

}  // namespace
}  // namespace arbor

namespace arbor {
namespace {

// stories260K greedy from BOS alone tells the story of a girl named Lily; the first 200 tokens
// are exactly transformers' (tests/data/golden/stories260K.json, greedy_tokens).
TEST_F(GeneratorTest, StoriesGreedyFromBosIsTheLilyStory) {
  const nlohmann::json g = nlohmann::json::parse(
      std::ifstream(std::string(ARBOR_TEST_DATA_DIR) + "/golden/stories260K.json"));
  const auto expect = g["greedy_tokens"].get<std::vector<int32_t>>();
  GenerationRequest r;
  r.prompt = {bundle_->tokenizer->bos_id()};
  r.sampling.temperature = 0;
  r.max_tokens = static_cast<int32_t>(expect.size());
  r.ignore_eos = true;
  const auto res = run({r}, GeneratorConfig{});
  EXPECT_EQ(res[0].tokens, expect);
  const std::string text = bundle_->tokenizer->decode(res[0].tokens, true);
  EXPECT_NE(text.find("little girl named Lily"), std::string::npos) << text;
}

}  // namespace
}  // namespace arbor
