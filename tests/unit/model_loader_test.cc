// load_model_weights on every format, checked against outside references: safetensors samples
// (python safetensors), transformers' config and GGUF dequantization + un-permutation for
// SmolLM2, numpy + transformers' reverse permutation for stories260K, and cross-format equality
// of one tiny model exported to HF, GGUF (validated by transformers) and llama2.c.
#include "engine/model/model_loader.h"

#include <gtest/gtest.h>

#include <cmath>
#include <regex>

#include "engine/core/dtype.h"
#include "engine/model/gguf_model_loader.h"
#include "engine/model/weight_assembly.h"
#include "tests/unit/loader_test_util.h"

namespace arbor {
namespace {

using nlohmann::json;
using test::loader_data;
using test::require_file;

json expected_fixtures() {
  return test::read_json(loader_data("expected.json"));
}

// The ModelWeights tensor that an HF tensor name refers to.
const HostTensor& by_hf_name(const ModelWeights& w, const std::string& name) {
  if (name == "model.embed_tokens.weight") return w.embed;
  if (name == "model.norm.weight") return w.final_norm;
  if (name == "lm_head.weight") return w.lm_head;
  static const std::regex re(R"(model\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(name, m, re)) throw std::runtime_error("unknown name " + name);
  const LayerWeights& l = w.layers.at(std::stoul(m[1]));
  const std::string rest = m[2];
  const std::map<std::string, const HostTensor*> fields = {
      {"input_layernorm.weight", &l.attn_norm},
      {"self_attn.q_proj.weight", &l.wq},
      {"self_attn.k_proj.weight", &l.wk},
      {"self_attn.v_proj.weight", &l.wv},
      {"self_attn.q_proj.bias", &l.bq},
      {"self_attn.k_proj.bias", &l.bk},
      {"self_attn.v_proj.bias", &l.bv},
      {"self_attn.o_proj.weight", &l.wo},
      {"post_attention_layernorm.weight", &l.ffn_norm},
      {"mlp.gate_proj.weight", &l.w_gate},
      {"mlp.up_proj.weight", &l.w_up},
      {"mlp.down_proj.weight", &l.w_down}};
  return *fields.at(rest);
}

int64_t flat_index(const std::vector<int64_t>& shape, const std::vector<int64_t>& index) {
  int64_t flat = 0;
  for (size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + index[d];
  return flat;
}

void expect_config(const ModelConfig& c, const json& want) {
  EXPECT_EQ(c.vocab_size, want["vocab_size"].get<int64_t>());
  EXPECT_EQ(c.hidden_size, want["hidden_size"].get<int64_t>());
  EXPECT_EQ(c.intermediate_size, want["intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.num_layers, want["num_layers"].get<int64_t>());
  EXPECT_EQ(c.num_heads, want["num_heads"].get<int64_t>());
  EXPECT_EQ(c.num_kv_heads, want["num_kv_heads"].get<int64_t>());
  EXPECT_EQ(c.head_dim, want["head_dim"].get<int64_t>());
  EXPECT_FLOAT_EQ(static_cast<float>(c.rms_norm_eps), want["rms_norm_eps"].get<float>());
  EXPECT_DOUBLE_EQ(c.rope_theta, want["rope_theta"].get<double>());
  const std::string rope_type = want["rope_type"];
  EXPECT_EQ(c.rope_scaling.type, rope_type == "default" ? "none" : rope_type);
  if (rope_type == "llama3") {
    EXPECT_DOUBLE_EQ(c.rope_scaling.factor, want["rope_factor"].get<double>());
    EXPECT_DOUBLE_EQ(c.rope_scaling.low_freq_factor, want["rope_low_freq_factor"].get<double>());
    EXPECT_DOUBLE_EQ(c.rope_scaling.high_freq_factor, want["rope_high_freq_factor"].get<double>());
    EXPECT_EQ(c.rope_scaling.original_max_position,
              want["rope_original_max_position"].get<int64_t>());
  }
  EXPECT_EQ(c.max_position, want["max_position"].get<int64_t>());
  EXPECT_EQ(c.tie_embeddings, want["tie_embeddings"].get<bool>());
  EXPECT_EQ(c.bos_token_id, want["bos_token_id"].get<int32_t>());
}

void expect_all_equal(const ModelWeights& a, const ModelWeights& b) {
  auto same = [](const HostTensor& x, const HostTensor& y, const std::string& what) {
    EXPECT_EQ(x.shape, y.shape) << what;
    EXPECT_TRUE(x.data == y.data) << what << " differs";
  };
  same(a.embed, b.embed, "embed");
  same(a.final_norm, b.final_norm, "final_norm");
  same(a.lm_head, b.lm_head, "lm_head");
  ASSERT_EQ(a.layers.size(), b.layers.size());
  for (size_t i = 0; i < a.layers.size(); ++i) {
    const LayerWeights &x = a.layers[i], &y = b.layers[i];
    const std::string p = "layer " + std::to_string(i) + " ";
    same(x.attn_norm, y.attn_norm, p + "attn_norm");
    same(x.wq, y.wq, p + "wq");
    same(x.wk, y.wk, p + "wk");
    same(x.wv, y.wv, p + "wv");
    same(x.bq, y.bq, p + "bq");
    same(x.bk, y.bk, p + "bk");
    same(x.bv, y.bv, p + "bv");
    same(x.wo, y.wo, p + "wo");
    same(x.ffn_norm, y.ffn_norm, p + "ffn_norm");
    same(x.w_gate, y.w_gate, p + "w_gate");
    same(x.w_up, y.w_up, p + "w_up");
    same(x.w_down, y.w_down, p + "w_down");
  }
}

TEST(ModelLoader, DetectsFormats) {
  EXPECT_EQ(detect_checkpoint_format(loader_data("llama_hf")), CheckpointFormat::kHuggingFace);
  EXPECT_EQ(detect_checkpoint_format(loader_data("llama_hf/config.json")),
            CheckpointFormat::kHuggingFace);
  EXPECT_EQ(detect_checkpoint_format(loader_data("llama.gguf")), CheckpointFormat::kGguf);
  EXPECT_EQ(detect_checkpoint_format(loader_data("llama_v0.bin")), CheckpointFormat::kLlama2c);
  test::TempDir tmp;  // GGUF magic without the extension
  test::write_bytes(tmp.file("model.bin"), test::read_bytes(loader_data("llama.gguf")));
  EXPECT_EQ(detect_checkpoint_format(tmp.file("model.bin")), CheckpointFormat::kGguf);
  test::expect_error([&] { detect_checkpoint_format(tmp.file("nope")); }, ErrorCode::kNotFound,
                     {tmp.file("nope")});
  test::expect_error([&] { load_model_weights(tmp.path()); }, ErrorCode::kNotFound,
                     {tmp.path(), "config.json"});
}

// Every HF fixture: config as transformers reads it, tensor values as safetensors reads them.
TEST(ModelLoader, HuggingFaceModelsMatchSafetensorsAndTransformers) {
  ASSERT_TRUE(require_file(loader_data("expected.json")));
  const json expected = expected_fixtures()["models"];
  for (const auto& [name, model] : expected.items()) {
    SCOPED_TRACE(name);
    const ModelWeights w = load_model_weights(loader_data(name));
    expect_config(w.config, model["config"]);
    EXPECT_EQ(w.config.eos_token_id, model["config"]["eos_token_id"].get<int32_t>());
    for (const auto& [tensor, want] : model["tensors"].items()) {
      if (tensor == "lm_head.weight" && w.config.tie_embeddings) continue;
      const HostTensor& t = by_hf_name(w, tensor);
      const auto idx = want["flat_index"].get<std::vector<int64_t>>();
      const auto vals = want["values"].get<std::vector<float>>();
      for (size_t i = 0; i < idx.size(); ++i)
        EXPECT_EQ(t.data.at(static_cast<size_t>(idx[i])), vals[i]) << tensor << " " << idx[i];
    }
  }
}

// The same tiny Llama (GQA, llama3 rope scaling, untied) as HF fp32, HF bf16 shards, GGUF with
// Meta-permuted Q/K and rope_freqs, and llama2.c v0/v1: every copy loads to the same weights.
TEST(ModelLoader, OneModelInEveryFormatLoadsIdentically) {
  ASSERT_TRUE(require_file(loader_data("llama.gguf")));
  const ModelWeights hf = load_model_weights(loader_data("llama_hf"));
  const json cfg = expected_fixtures()["models"]["llama_hf"]["config"];

  const ModelWeights gguf = load_model_weights(loader_data("llama.gguf"));
  expect_config(gguf.config, cfg);  // incl. llama3 scaling recovered from rope_freqs
  EXPECT_EQ(gguf.config.eos_token_id, 2);
  expect_all_equal(hf, gguf);

  for (const char* file : {"llama_v0.bin", "llama_v1.bin"}) {
    SCOPED_TRACE(file);
    const ModelWeights l2c = load_model_weights(loader_data(file));
    EXPECT_EQ(l2c.config.num_kv_heads, 2);
    EXPECT_EQ(l2c.config.max_position, 128);
    EXPECT_FALSE(l2c.config.tie_embeddings);
    EXPECT_EQ(l2c.config.rope_scaling.type, "none");  // llama2.c has no rope scaling
    expect_all_equal(hf, l2c);
  }

  // bf16 shards: every value is the fp32 value rounded to bf16.
  const ModelWeights bf16 = load_model_weights(loader_data("llama_hf_sharded_bf16"));
  ASSERT_EQ(bf16.layers[1].w_down.data.size(), hf.layers[1].w_down.data.size());
  for (size_t i = 0; i < hf.layers[1].w_down.data.size(); ++i)
    ASSERT_EQ(bf16.layers[1].w_down.data[i], bf16_to_f32(f32_to_bf16(hf.layers[1].w_down.data[i])));
}

TEST(ModelLoader, Qwen2GgufMatchesHuggingFace) {
  ASSERT_TRUE(require_file(loader_data("qwen2.gguf")));
  const ModelWeights hf = load_model_weights(loader_data("qwen2_hf_f16"));
  const ModelWeights gguf = load_model_weights(loader_data("qwen2.gguf"));
  EXPECT_EQ(gguf.config.architecture, "qwen2");
  EXPECT_TRUE(gguf.config.attention_bias);
  EXPECT_TRUE(gguf.config.tie_embeddings);
  EXPECT_TRUE(gguf.lm_head.empty());
  EXPECT_EQ(&gguf.output_weight(), &gguf.embed);
  expect_config(gguf.config, expected_fixtures()["models"]["qwen2_hf_f16"]["config"]);
  EXPECT_EQ(gguf.config.eos_token_id, 6);  // config.json's id (the GGUF has no generation config)
  expect_all_equal(hf, gguf);              // qwen2 GGUF Q/K are not permuted
}

TEST(ModelLoader, Stories260K) {
  ASSERT_TRUE(require_file(test::stories_path()));
  const json want = expected_fixtures()["stories260K"];
  std::vector<std::pair<std::string, double>> stages;
  const ModelWeights w = load_model_weights(
      test::stories_path(), [&](const std::string& s, double f) { stages.emplace_back(s, f); });
  const ModelConfig& c = w.config;
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.hidden_size, 64);
  EXPECT_EQ(c.intermediate_size, 172);
  EXPECT_EQ(c.num_layers, 5);
  EXPECT_EQ(c.num_heads, 8);
  EXPECT_EQ(c.num_kv_heads, 4);
  EXPECT_EQ(c.head_dim, 8);
  EXPECT_EQ(c.vocab_size, 512);
  EXPECT_EQ(c.max_position, 512);
  EXPECT_TRUE(c.tie_embeddings);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_id, 2);
  EXPECT_DOUBLE_EQ(c.rope_theta, 10000.0);
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, 1e-5);
  EXPECT_EQ(want["config"]["vocab_size"], c.vocab_size);
  EXPECT_EQ(want["config"]["n_kv_heads"], c.num_kv_heads);
  for (const auto& [name, s] : want["hf_samples"].items()) {
    const HostTensor& t = by_hf_name(w, name);
    EXPECT_EQ(t.shape, s["shape"].get<std::vector<int64_t>>()) << name;
    const auto idx = s["index"].get<std::vector<std::vector<int64_t>>>();
    const auto vals = s["values"].get<std::vector<float>>();
    for (size_t i = 0; i < idx.size(); ++i)
      EXPECT_EQ(t.data[static_cast<size_t>(flat_index(t.shape, idx[i]))], vals[i]) << name;
  }
  ASSERT_FALSE(stages.empty());
  for (size_t i = 1; i < stages.size(); ++i)
    EXPECT_LE(stages[i - 1].second, stages[i].second + 1e-12) << stages[i].first;
  EXPECT_EQ(stages.back().second, 1.0);
}

// SmolLM2-135M-Instruct Q4_1: config and dequantized, un-permuted weights as transformers
// (AutoConfig / AutoModelForCausalLM with gguf_file=) produces them.
TEST(ModelLoader, SmolLM2GgufMatchesTransformers) {
  ASSERT_TRUE(require_file(test::smollm2_path()));
  const json want = expected_fixtures()["smollm2"];
  const ModelWeights w = load_model_weights(test::smollm2_path());
  expect_config(w.config, want["config"]);
  EXPECT_EQ(w.config.eos_token_id, want["config"]["eos_token_id"].get<int32_t>());
  EXPECT_EQ(w.config.architecture, "llama");
  EXPECT_FALSE(w.config.attention_bias);
  EXPECT_TRUE(w.lm_head.empty());
  size_t compared = 0;
  for (const auto& [name, s] : want["hf_samples"].items()) {
    SCOPED_TRACE(name);
    const HostTensor& t = by_hf_name(w, name);
    ASSERT_EQ(t.shape, s["shape"].get<std::vector<int64_t>>());
    const auto idx = s["index"].get<std::vector<std::vector<int64_t>>>();
    const auto vals = s["values"].get<std::vector<float>>();
    for (size_t i = 0; i < idx.size(); ++i, ++compared) {
      const float got = t.data[static_cast<size_t>(flat_index(t.shape, idx[i]))];
      EXPECT_NEAR(got, vals[i], 1e-6f * std::max(1.0f, std::fabs(vals[i])))
          << "[" << idx[i][0] << (idx[i].size() > 1 ? ", " + std::to_string(idx[i][1]) : "") << "]";
    }
  }
  EXPECT_GT(compared, 400u);
}

TEST(ModelLoader, MetaToHfRopeRowsFollowsTheDocumentedPermutation) {
  // 2 heads of head_dim 4, one column: Meta rows (0,1,2,3) of a head become HF rows (0,2,1,3).
  HostTensor meta({8, 1});
  for (int i = 0; i < 8; ++i) meta.data[i] = static_cast<float>(i);
  const HostTensor hf = meta_to_hf_rope_rows(meta, 2, 4);
  EXPECT_EQ(hf.data, (std::vector<float>{0, 2, 1, 3, 4, 6, 5, 7}));
}

}  // namespace
}  // namespace arbor
