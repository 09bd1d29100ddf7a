// Dummy models ("dummy:llama-3-8b"): the presets' shapes against the published parameter
// counts, shape-only weights, host random fill, the IdTokenizer's refusal of text, and the tiny
// preset generating on the CPU backend.
#include "engine/model/dummy_weights.h"

#include <gtest/gtest.h>

#include <cmath>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/model/llama_model.h"
#include "engine/runner/generator.h"
#include "engine/runner/model_bundle.h"
#include "engine/tokenizer/id_tokenizer.h"

namespace arbor {
namespace {

int64_t parameter_count(const ModelWeights& w) {
  return host_weight_bytes(w) / 4;
}

TEST(DummyModel, PresetsHaveThePublishedShapes) {
  // Meta's model cards: Llama-3-8B 8,030,261,248 parameters, Llama-3-70B 70,553,706,496.
  const ModelWeights w8 = dummy_model_weights("dummy:llama-3-8b");
  EXPECT_EQ(parameter_count(w8), 8030261248);
  EXPECT_EQ(w8.config.num_layers, 32);
  EXPECT_EQ(w8.config.hidden_size, 4096);
  EXPECT_EQ(w8.config.num_heads, 32);
  EXPECT_EQ(w8.config.num_kv_heads, 8);
  EXPECT_EQ(w8.config.head_dim, 128);
  EXPECT_EQ(w8.config.intermediate_size, 14336);
  EXPECT_EQ(w8.config.vocab_size, 128256);
  EXPECT_EQ(w8.config.rope_scaling.type, "llama3");
  EXPECT_FALSE(w8.config.tie_embeddings);

  const ModelWeights w70 = dummy_model_weights("llama-3-70b");  // the prefix is optional
  EXPECT_EQ(parameter_count(w70), 70553706496);
  EXPECT_EQ(w70.config.num_layers, 80);
  EXPECT_EQ(w70.config.hidden_size, 8192);
  EXPECT_EQ(w70.config.num_heads, 64);
  EXPECT_EQ(w70.config.num_kv_heads, 8);
  EXPECT_EQ(w70.config.intermediate_size, 28672);
  EXPECT_EQ(w70.layers.size(), 80u);
  EXPECT_EQ(w70.layers[0].wq.shape, (std::vector<int64_t>{8192, 8192}));
  EXPECT_EQ(w70.layers[0].wk.shape, (std::vector<int64_t>{1024, 8192}));
  EXPECT_EQ(w70.layers[0].w_down.shape, (std::vector<int64_t>{8192, 28672}));
  EXPECT_EQ(w70.lm_head.shape, (std::vector<int64_t>{128256, 8192}));

  for (const std::string& name : dummy_model_presets())
    EXPECT_NO_THROW(dummy_model_config(name)) << name;
}

TEST(DummyModel, WeightsAreShapesOnly) {
  const ModelWeights w = dummy_model_weights("dummy:llama-3-8b");
  EXPECT_TRUE(w.embed.data.empty());
  EXPECT_TRUE(w.lm_head.data.empty());
  for (const LayerWeights& l : w.layers) {
    EXPECT_TRUE(l.wq.data.empty());
    EXPECT_TRUE(l.w_gate.data.empty());
    EXPECT_TRUE(l.bq.shape.empty());  // no attention bias
  }
}

TEST(DummyModel, UnknownPresetNamesThePresets) {
  EXPECT_TRUE(is_dummy_model_path("dummy:llama-3-8b"));
  EXPECT_FALSE(is_dummy_model_path("models/dummy.gguf"));
  try {
    dummy_model_config("dummy:llama-9");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    const std::string msg = e.what();
    EXPECT_NE(msg.find("llama-9"), std::string::npos) << msg;
    EXPECT_NE(msg.find("llama-3-8b, llama-3-70b, tiny"), std::string::npos) << msg;
  }
  EXPECT_THROW(load_model_bundle("dummy:llama-9"), Error);
}

TEST(DummyModel, HostFillIsDeterministicAndScaled) {
  ModelWeights a = dummy_model_weights("dummy:tiny");
  ModelWeights b = dummy_model_weights("dummy:tiny");
  fill_random_host_weights(&a, 7);
  fill_random_host_weights(&b, 7);
  EXPECT_EQ(a.layers[1].w_up.data, b.layers[1].w_up.data);
  // Matrices uniform in +-sqrt(3 / in): variance 1 / in; norm vectors in 1 +- 0.1.
  const HostTensor& down = a.layers[0].w_down;  // [64, 192]
  ASSERT_EQ(down.numel(), 64 * 192);
  const float bound = std::sqrt(3.0f / 192);
  double sum_sq = 0;
  for (float x : down.data) {
    EXPECT_LE(std::fabs(x), bound);
    sum_sq += double(x) * x;
  }
  EXPECT_NEAR(sum_sq / down.numel() * 192, 1.0, 0.1);
  for (float x : a.final_norm.data) EXPECT_NEAR(x, 1.0f, 0.1f);
  EXPECT_EQ(host_weight_bytes(a), parameter_count(a) * 4);
}

TEST(DummyModel, BundleHasAnIdTokenizerThatRefusesText) {
  const ModelBundle b = load_model_bundle("dummy:tiny");
  ASSERT_TRUE(b.tokenizer);
  const Tokenizer& tok = *b.tokenizer;
  EXPECT_EQ(tok.vocab_size(), 512);
  EXPECT_EQ(b.stop_token_ids, (std::vector<int32_t>{2}));
  EXPECT_FALSE(tok.spec().add_bos);
  EXPECT_TRUE(tok.spec().chat_template.empty());
  try {
    tok.encode("hello", true, true);
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("send the prompt as token ids"), std::string::npos)
        << e.what();
    EXPECT_NE(std::string(e.what()).find("dummy:tiny"), std::string::npos) << e.what();
  }
  EXPECT_EQ(tok.token_bytes(17), " 17");
  EXPECT_EQ(tok.decode({1, 17, 300, 2}, /*skip_special=*/true), " 17 300");
  EXPECT_EQ(tok.decode({1, 17}, /*skip_special=*/false), "<bos> 17");
  EXPECT_THROW(tok.token_bytes(512), Error);
  // Every generated token streams some text.
  IncrementalDecoder dec(tok);
  EXPECT_EQ(dec.push(5), " 5");
  EXPECT_EQ(dec.push(6), " 6");
}

TEST(DummyModel, TinyPresetGeneratesOnTheCpu) {
  ModelWeights w = dummy_model_weights("dummy:tiny");
  fill_random_host_weights(&w, 1);
  auto backend = make_cpu_backend(1);
  LlamaModel model(*backend, w);
  GeneratorConfig gc;
  gc.block_size = 16;
  gc.num_blocks = 16;
  gc.max_running = 2;
  Generator gen(model, gc);
  std::vector<GenerationRequest> reqs(2);
  for (int i = 0; i < 2; ++i) {
    reqs[i].prompt = {3, 100, 200, static_cast<int32_t>(300 + i)};
    reqs[i].sampling.temperature = 0;
    reqs[i].max_tokens = 12;
    reqs[i].ignore_eos = true;
  }
  const auto results = gen.run(reqs);
  ASSERT_EQ(results.size(), 2u);
  for (const auto& r : results) {
    ASSERT_EQ(r.tokens.size(), 12u);
    for (int32_t id : r.tokens) {
      EXPECT_GE(id, 0);
      EXPECT_LT(id, 512);
    }
  }
}

}  // namespace
}  // namespace arbor
