// Speculation is lossless. Greedy: for every proposer (n-gram, Medusa, EAGLE-1/2, EAGLE-3) and
// several trees (chain, mc_sim_7b_63, dynamic EAGLE-2 trees of different sizes), a batch of
// mixed requests (speculating and not, prompts ending near a block boundary, greedy requests
// with a logit bias, one sampled request beside them) produces exactly the tokens of plain
// greedy decoding; a +100 bias makes both emit only the biased token. Heads: random
// weights (worst-case acceptance: nearly every draft token is rejected) on stories260K and on a
// tiny random Llama, and trained heads on stories260K when present.
#include <gtest/gtest.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/draft/eagle_checkpoint.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/runner/generator.h"
#include "engine/spec/proposer_factory.h"
#include "tests/common/token_maps.h"

namespace arbor {
namespace {

struct SpecCase {
  std::string name;
  std::string model;   // "stories260K" or a tests/data/models/ name
  std::string method;  // ngram | medusa | eagle | eagle3
  std::string heads;   // directory under tests/data/ ("" for ngram)
  std::string tree = "mc_sim_7b_63";
  int32_t total_tokens = 60, depth = 5, top_k = 10;
  int32_t pad_trees = -1;  // EngineConfig::pad_trees (-1: only with step graphs, so not here)
  // Medusa's heads on a CPU backend of their own: the trees' tokens stay in its memory, which
  // the model's backend reads (DraftTree::device), not on the host.
  bool draft_backend = false;
  // EAGLE-1/2 with a token map (SpecConfig::token_map): "trained" = the 256 ids of the trained
  // stories260K EAGLE-3 head's d2t (the ids its training replies used), "thirds" = every third
  // id of the vocabulary, highest first; "" = none.
  std::string token_map = {};
};

// The token map file of a case, written under the test's temporary directory.
std::string write_token_map(const SpecCase& c, int64_t vocab) {
  std::vector<int32_t> ids;
  if (c.token_map == "trained") {
    const EagleWeights e3 = load_eagle_checkpoint(
        std::string(ARBOR_TEST_DATA_DIR) + "/heads/stories260K/eagle3", EagleVersion::kEagle3);
    for (size_t i = 0; i < e3.d2t.size(); ++i)
      ids.push_back(static_cast<int32_t>(static_cast<int64_t>(i) + e3.d2t[i]));
  } else {
    ids = test::every_third_descending(vocab);
  }
  const std::string path = ::testing::TempDir() + "/" + c.name + "_token_map.json";
  std::ofstream(path) << nlohmann::json(ids).dump();
  return path;
}

std::string model_path(const std::string& name) {
  if (name == "stories260K")
    return std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  return std::string(ARBOR_TEST_DATA_DIR) + "/models/" + name;
}

const ModelWeights& weights_of(const std::string& name) {
  static std::map<std::string, ModelWeights> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, load_model_weights(model_path(name))).first;
  return it->second;
}

constexpr int32_t kForcedToken = 42;  // biased_requests' last request: logit_bias +100 on it

// Prompts of lengths around the 16-token block boundary, with repeats (n-gram matches).
std::vector<GenerationRequest> mixed_requests(int64_t vocab) {
  std::vector<GenerationRequest> reqs;
  const std::vector<int> lengths = {15, 16, 17, 31, 32, 5};
  uint32_t x = 12345;
  for (size_t i = 0; i < lengths.size(); ++i) {
    GenerationRequest r;
    r.prompt.push_back(1);
    std::vector<int32_t> motif;
    for (int k = 0; k < 5; ++k) {
      x = x * 1664525u + 1013904223u;
      motif.push_back(static_cast<int32_t>(3 + (x >> 8) % (vocab - 3)));
    }
    while (static_cast<int>(r.prompt.size()) < lengths[i])
      r.prompt.push_back(motif[r.prompt.size() % motif.size()]);
    r.sampling.temperature = 0;
    r.max_tokens = 48;
    r.ignore_eos = true;
    r.speculate = (i != 2);  // one request decodes plainly in the same batches
    reqs.push_back(r);
  }
  GenerationRequest sampled = reqs[0];
  sampled.sampling.temperature = 0.8f;
  sampled.sampling.seed = 7;
  reqs.push_back(sampled);
  return reqs;
}

// Greedy requests with a logit bias (not the raw argmax: sampled and verified on the backend,
// not argmax_only) beside two of mixed_requests' own: the prompt's motif banned and a few other
// tokens pushed up (request 2); a bias with a repetition penalty (3); +100 on kForcedToken (4).
// Batches of their own, so that mixed_requests' steps (and their tree padding) stay as they are.
std::vector<GenerationRequest> biased_requests(int64_t vocab) {
  const std::vector<GenerationRequest> mixed = mixed_requests(vocab);
  std::vector<GenerationRequest> reqs = {mixed[2], mixed[4]};
  GenerationRequest biased = mixed[3];
  const std::set<int32_t> motif(mixed[3].prompt.begin() + 1, mixed[3].prompt.end());
  for (int32_t t : motif) biased.sampling.logit_bias.emplace_back(t, -100.0f);
  for (int32_t t : {5, 9, static_cast<int32_t>(vocab) - 2})
    if (!motif.count(t)) biased.sampling.logit_bias.emplace_back(t, 2.0f);
  std::sort(biased.sampling.logit_bias.begin(), biased.sampling.logit_bias.end());
  reqs.push_back(biased);
  GenerationRequest biased_penalised = mixed[1];
  biased_penalised.sampling.logit_bias = {{7, 3.0f}, {11, -1.0f}};
  biased_penalised.sampling.repetition_penalty = 1.3f;
  reqs.push_back(biased_penalised);
  GenerationRequest forced = mixed[0];  // +100: the biased token every time
  forced.sampling.logit_bias = {{kForcedToken, 100.0f}};
  reqs.push_back(forced);
  return reqs;
}

class SpecLossless : public ::testing::TestWithParam<SpecCase> {};

TEST_P(SpecLossless, GreedyEqualsPlainGreedy) {
  const SpecCase& c = GetParam();
  const ModelWeights& w = weights_of(c.model);
  SpecConfig sc;
  sc.method = parse_spec_method(c.method);
  if (!c.heads.empty()) {
    sc.head_path = std::string(ARBOR_TEST_DATA_DIR) + "/" + c.heads;
    ASSERT_TRUE(std::filesystem::exists(sc.head_path)) << "missing heads " << sc.head_path;
  }
  sc.tree = c.tree;
  sc.total_tokens = c.total_tokens;
  sc.depth = c.depth;
  sc.top_k = c.top_k;
  if (!c.token_map.empty()) sc.token_map = write_token_map(c, w.config.vocab_size);
  auto proposer = make_proposer(sc, w, c.draft_backend ? make_cpu_backend(1) : nullptr);
  ASSERT_NE(proposer, nullptr);

  const auto reqs = mixed_requests(w.config.vocab_size);
  GeneratorConfig gc;
  gc.num_blocks = 256;
  gc.block_size = 16;
  gc.max_step_tokens = 96;  // prefill chunks share steps with verify trees

  auto plain_backend = make_cpu_backend(1);
  LlamaModel plain_model(*plain_backend, w);
  Generator plain(plain_model, gc);
  const auto expect = plain.run(reqs);

  auto spec_backend = make_cpu_backend(1);
  LlamaModel spec_model(*spec_backend, w);
  gc.pad_trees = c.pad_trees;
  Generator spec(spec_model, gc, proposer.get());
  const auto got = spec.run(reqs);
  EXPECT_EQ(spec.kv().stats().used_blocks, 0);
  if (c.pad_trees == 1) {  // the padding happened: more tree nodes than the same run without
    gc.pad_trees = 0;
    auto unpadded_backend = make_cpu_backend(1);
    LlamaModel unpadded_model(*unpadded_backend, w);
    Generator unpadded(unpadded_model, gc, proposer.get());
    unpadded.run(reqs);
    EXPECT_GT(spec.stats().tree_tokens, unpadded.stats().tree_tokens) << c.name;
  }

  AcceptanceStats total;
  for (size_t i = 0; i < reqs.size(); ++i) {
    if (reqs[i].sampling.temperature == 0)
      EXPECT_EQ(got[i].tokens, expect[i].tokens) << c.name << " request " << i;
    else
      EXPECT_EQ(got[i].tokens.size(), expect[i].tokens.size());
    if (reqs[i].speculate) {
      total.steps += got[i].acceptance.steps;
      total.emitted += got[i].acceptance.emitted;
    }
  }

  // Greedy with a logit bias, in batches of their own: all of them, then those without
  // penalties (with nothing else in the step that needs more than the raw argmax, that step
  // would be argmax_only if a bias were ignored there).
  gc.pad_trees = c.pad_trees;
  const auto biased = biased_requests(w.config.vocab_size);
  std::vector<GenerationRequest> unpenalised = biased;
  unpenalised.erase(unpenalised.begin() + 3);
  std::vector<GenerationResult> biased_tokens;
  for (const auto& batch : {biased, unpenalised}) {
    Generator plain_run(plain_model, gc), spec_run(spec_model, gc, proposer.get());
    const auto want = plain_run.run(batch), have = spec_run.run(batch);
    for (size_t i = 0; i < batch.size(); ++i) {
      EXPECT_EQ(batch[i].sampling.temperature, 0.0f);
      EXPECT_EQ(have[i].tokens, want[i].tokens) << c.name << " biased request " << i;
      EXPECT_EQ(have[i].tokens.size(), 48u);
    }
    EXPECT_EQ(want.back().tokens, std::vector<int32_t>(48, kForcedToken)) << "+100, plain";
    EXPECT_EQ(have.back().tokens, std::vector<int32_t>(48, kForcedToken)) << "+100, spec";
    if (biased_tokens.empty()) biased_tokens = have;
  }
  // The ban holds: the motif request emits none of its banned tokens, and the bias changed what
  // greedy decoding emits (reqs[3] is the same request without the bias).
  for (const auto& [t, bias] : biased[2].sampling.logit_bias) {
    if (bias == -100.0f) {
      EXPECT_EQ(std::count(biased_tokens[2].tokens.begin(), biased_tokens[2].tokens.end(), t), 0)
          << "banned token " << t;
    }
  }
  EXPECT_NE(biased_tokens[2].tokens, expect[3].tokens);
  std::printf("%s: %.3f tokens per verify step over %lld steps\n", c.name.c_str(),
              total.mean_emitted_per_step(), static_cast<long long>(total.steps));
  EXPECT_GE(total.mean_emitted_per_step(), 1.0);
}

// A drafter reading the target's final hidden states, or EAGLE-3's capture layers (their
// residual streams side by side in a row), gets, in decode / verify steps, only the rows of the
// accepted paths (ForwardRequest::path_hidden, gathered where the sampling runs) instead of
// every tree row's: the same rows, so the same drafts. The trained stories260K heads (long
// accepted paths) draft from them; with backend sampling off every row's features are
// downloaded and the feedback picks the path's rows itself. Same tokens, same acceptance per
// request (a wrong row would change the drafts, so what they accept).
TEST(SpecFeedback, PathHiddenRowsFeedTheSameDrafts) {
  const ModelWeights& w = weights_of("stories260K");
  for (const auto& [method, heads] :
       std::vector<std::pair<std::string, std::string>>{{"medusa", "heads/stories260K/medusa"},
                                                        {"eagle", "heads/stories260K/eagle"},
                                                        {"eagle3", "heads/stories260K/eagle3"}}) {
    SpecConfig sc;
    sc.method = parse_spec_method(method);
    sc.head_path = std::string(ARBOR_TEST_DATA_DIR) + "/" + heads;
    std::vector<GenerationRequest> reqs;
    for (int32_t i = 0; i < 4; ++i) {
      GenerationRequest r;
      r.prompt = {1, 403 + i, 407, 261 + 3 * i};
      r.max_tokens = 64;
      r.ignore_eos = true;
      r.speculate = true;
      r.sampling.temperature = i == 3 ? 0.8f : 0.0f;  // one sampled request, seeded
      r.sampling.seed = 7;
      reqs.push_back(r);
    }
    std::vector<std::vector<GenerationResult>> runs;
    std::vector<int64_t> path_steps;
    for (bool backend_sampling : {true, false}) {
      auto proposer = make_proposer(sc, w);
      auto backend = make_cpu_backend(1);
      LlamaModel model(*backend, w);
      GeneratorConfig gc;
      gc.num_blocks = 256;
      gc.backend_sampling = backend_sampling;
      Generator gen(model, gc, proposer.get());
      runs.push_back(gen.run(reqs));
      path_steps.push_back(gen.stats().path_feedback_steps);
    }
    EXPECT_GT(path_steps[0], 10) << method;
    EXPECT_EQ(path_steps[1], 0) << method;
    double emitted = 0, steps = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(runs[0][i].tokens, runs[1][i].tokens) << method << " request " << i;
      EXPECT_EQ(runs[0][i].acceptance.steps, runs[1][i].acceptance.steps) << method << " " << i;
      EXPECT_EQ(runs[0][i].acceptance.emitted, runs[1][i].acceptance.emitted) << method << " " << i;
      emitted += static_cast<double>(runs[0][i].acceptance.emitted);
      steps += static_cast<double>(runs[0][i].acceptance.steps);
    }
    std::printf("%s: %.2f tokens per verify step from path rows\n", method.c_str(),
                emitted / steps);
    EXPECT_GT(emitted / steps, 1.5) << method;  // the trained heads draft from real features
  }
}

std::vector<SpecCase> cases() {
  std::vector<SpecCase> v;
  for (const std::string model : {"stories260K", "llama_gqa"}) {
    v.push_back({model + "_ngram", model, "ngram", ""});
    v.push_back({model + "_ngram_padded", model, "ngram", "", "", 60, 5, 10, 1});
    // The stories260K random heads are 3 (mc_sim_7b_63 needs 4): a Medusa-1 product tree.
    v.push_back({model + "_medusa_tree", model, "medusa", "spec/random/medusa_" + model,
                 model == "stories260K" ? "product-4-3-2" : "mc_sim_7b_63"});
    v.push_back(
        {model + "_medusa_chain", model, "medusa", "spec/random/medusa_" + model, "chain-3"});
    v.push_back({model + "_eagle_60", model, "eagle", "spec/random/eagle_" + model});
    v.push_back(
        {model + "_eagle_small", model, "eagle", "spec/random/eagle_" + model, "", 8, 3, 2});
    v.push_back({model + "_eagle3", model, "eagle3", "spec/random/eagle3_" + model});
    v.push_back({model + "_eagle_token_map", model, "eagle", "spec/random/eagle_" + model, "", 60,
                 5, 10, -1, false, "thirds"});
  }
  // Trained heads (scripts/train_medusa.py, scripts/train_eagle.py): high acceptance, so long
  // accepted paths and compaction of deep nodes are exercised.
  v.push_back({"stories260K_trained_medusa", "stories260K", "medusa", "heads/stories260K/medusa",
               "mc_sim_7b_63"});
  v.push_back({"stories260K_trained_eagle", "stories260K", "eagle", "heads/stories260K/eagle"});
  v.push_back({"stories260K_trained_eagle_token_map", "stories260K", "eagle",
               "heads/stories260K/eagle", "", 60, 5, 10, -1, false, "trained"});
  // Medusa's tokens left on its heads' backend, read there by the step.
  v.push_back({"llama_gqa_medusa_tree_tokens_on_draft_backend", "llama_gqa", "medusa",
               "spec/random/medusa_llama_gqa", "mc_sim_7b_63", 60, 5, 10, -1, true});
  v.push_back({"stories260K_trained_medusa_tokens_on_draft_backend", "stories260K", "medusa",
               "heads/stories260K/medusa", "mc_sim_7b_63", 60, 5, 10, -1, true});
  return v;
}

// Tree tokens left on the drafter's backend (EngineConfig::device_tree_tokens, Medusa's heads on
// a CPU backend the model's CPU backend reads) give exactly the run with them brought to the host
// after drafting: the same tokens for greedy and seeded sampled requests (the same uniforms
// consumed; a request with logprobs beside them), the same tree tokens and acceptance.
TEST(SpecDeviceTokens, TokensLeftOnTheDraftBackendGiveTheSameRun) {
  const ModelWeights& w = weights_of("stories260K");
  SpecConfig sc;
  sc.method = SpecMethod::kMedusa;
  sc.head_path = std::string(ARBOR_TEST_DATA_DIR) + "/heads/stories260K/medusa";
  sc.tree = "mc_sim_7b_63";
  std::vector<GenerationRequest> reqs = mixed_requests(w.config.vocab_size);
  for (uint64_t seed : {11u, 12u}) {
    GenerationRequest r = reqs[1];
    r.sampling.temperature = 0.7f;
    r.sampling.seed = seed;
    reqs.push_back(r);
  }
  reqs[3].logprobs = 2;
  std::vector<std::vector<GenerationResult>> runs;
  std::vector<EngineStats> stats;
  for (bool on_device : {true, false}) {
    auto proposer = make_proposer(sc, w, make_cpu_backend(1));
    GeneratorConfig gc;
    gc.num_blocks = 256;
    gc.block_size = 16;
    gc.max_step_tokens = 96;
    gc.device_tree_tokens = on_device;
    auto backend = make_cpu_backend(1);
    LlamaModel model(*backend, w);
    Generator gen(model, gc, proposer.get());
    runs.push_back(gen.run(reqs));
    stats.push_back(gen.stats());
  }
  for (size_t i = 0; i < reqs.size(); ++i) {
    EXPECT_EQ(runs[0][i].tokens, runs[1][i].tokens) << "request " << i;
    EXPECT_EQ(runs[0][i].acceptance.emitted, runs[1][i].acceptance.emitted) << "request " << i;
  }
  EXPECT_EQ(stats[0].tree_tokens, stats[1].tree_tokens);
  EXPECT_GT(stats[0].device_token_steps, stats[0].steps / 2);  // the tokens stayed there
  EXPECT_EQ(stats[1].device_token_steps, 0);
  EXPECT_GT(stats[0].acceptance.mean_emitted_per_step(), 1.5);  // trained heads: real drafts
}

INSTANTIATE_TEST_SUITE_P(Proposers, SpecLossless, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace arbor
