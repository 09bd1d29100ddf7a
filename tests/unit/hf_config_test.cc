// config.json -> ModelConfig against what transformers.AutoConfig reports for the same files
// (recorded by scripts/make_loader_fixtures.py), plus the transformers 4 spelling and errors.
#include "engine/model/hf_config.h"

#include <gtest/gtest.h>

#include "tests/unit/loader_test_util.h"

namespace arbor {
namespace {

using nlohmann::json;
using test::expect_error;
using test::loader_data;

// Compares a ModelConfig with a config summary written by the fixture script.
void expect_config_matches(const ModelConfig& c, const json& want) {
  EXPECT_EQ(c.vocab_size, want["vocab_size"].get<int64_t>());
  EXPECT_EQ(c.hidden_size, want["hidden_size"].get<int64_t>());
  EXPECT_EQ(c.intermediate_size, want["intermediate_size"].get<int64_t>());
  EXPECT_EQ(c.num_layers, want["num_layers"].get<int64_t>());
  EXPECT_EQ(c.num_heads, want["num_heads"].get<int64_t>());
  EXPECT_EQ(c.num_kv_heads, want["num_kv_heads"].get<int64_t>());
  EXPECT_EQ(c.head_dim, want["head_dim"].get<int64_t>());
  EXPECT_DOUBLE_EQ(c.rms_norm_eps, want["rms_norm_eps"].get<double>());
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
  EXPECT_EQ(c.eos_token_id, want["eos_token_id"].get<int32_t>());
}

TEST(HfConfig, MatchesTransformersAutoConfig) {
  ASSERT_TRUE(test::require_file(loader_data("expected.json")));
  const json expected = test::read_json(loader_data("expected.json"))["models"];
  for (const auto& [name, model] : expected.items()) {
    SCOPED_TRACE(name);
    const ModelConfig c = load_hf_config(loader_data(name));
    expect_config_matches(c, model["config"]);
    EXPECT_EQ(c.architecture, model["config"]["model_type"].get<std::string>());
    EXPECT_EQ(c.attention_bias, c.architecture == "qwen2");
  }
}

TEST(HfConfig, Transformers4Spelling) {
  // Meta-Llama-3.1-8B's config.json as published (transformers 4.43).
  const json cfg = json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "attention_bias": false, "bos_token_id": 128000,
    "eos_token_id": [128001, 128008, 128009], "hidden_act": "silu", "hidden_size": 4096,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": false,
    "model_type": "llama", "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05,
    "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                     "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": false, "torch_dtype": "bfloat16",
    "vocab_size": 128256})");
  const ModelConfig c = parse_hf_config(cfg, "llama31.json");
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_DOUBLE_EQ(c.rope_theta, 500000.0);
  EXPECT_EQ(c.rope_scaling.type, "llama3");
  EXPECT_DOUBLE_EQ(c.rope_scaling.factor, 8.0);
  EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(c.bos_token_id, 128000);
  EXPECT_EQ(c.eos_token_id, 128001);
  EXPECT_FALSE(c.tie_embeddings);

  // Mistral-7B-v0.1: sliding window 4096 caps the context (full attention agrees below it).
  const json mistral = json::parse(R"({
    "architectures": ["MistralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
    "max_position_embeddings": 32768, "num_attention_heads": 32, "num_hidden_layers": 32,
    "num_key_value_heads": 8, "rms_norm_eps": 1e-05, "rope_theta": 10000.0,
    "sliding_window": 4096, "vocab_size": 32000, "bos_token_id": 1, "eos_token_id": 2})");
  const ModelConfig m = parse_hf_config(mistral, "mistral.json");
  EXPECT_EQ(m.architecture, "mistral");
  EXPECT_EQ(m.max_position, 4096);
  EXPECT_EQ(m.rope_scaling.type, "none");

  // Qwen2.5-0.5B: explicit linear scaling spelled with "type".
  json qwen = json::parse(R"({
    "architectures": ["Qwen2ForCausalLM"], "hidden_size": 896, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "num_attention_heads": 14, "num_hidden_layers": 24,
    "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "use_sliding_window": false, "tie_word_embeddings": true,
    "vocab_size": 151936, "bos_token_id": 151643, "eos_token_id": 151643,
    "rope_scaling": {"type": "linear", "factor": 2.0}})");
  const ModelConfig q = parse_hf_config(qwen, "qwen.json");
  EXPECT_TRUE(q.attention_bias);
  EXPECT_TRUE(q.tie_embeddings);
  EXPECT_EQ(q.head_dim, 64);
  EXPECT_EQ(q.rope_scaling.type, "linear");
  EXPECT_DOUBLE_EQ(q.rope_scaling.factor, 2.0);
}

TEST(HfConfig, RejectsWhatTheEngineCannotRun) {
  const json base = json::parse(R"({
    "architectures": ["LlamaForCausalLM"], "hidden_size": 64, "intermediate_size": 96,
    "num_attention_heads": 4, "num_hidden_layers": 2, "vocab_size": 100})");
  EXPECT_NO_THROW(parse_hf_config(base, "c.json"));
  auto with = [&](const char* patch) {
    json j = base;
    j.merge_patch(json::parse(patch));
    return j;
  };
  expect_error(
      [&] { parse_hf_config(with(R"({"architectures": ["GPT2LMHeadModel"]})"), "c.json"); },
      ErrorCode::kUnsupported, {"c.json", "GPT2LMHeadModel"});
  expect_error([&] { parse_hf_config(with(R"({"attention_bias": true})"), "c.json"); },
               ErrorCode::kUnsupported, {"c.json", "attention_bias"});
  expect_error([&] { parse_hf_config(with(R"({"mlp_bias": true})"), "c.json"); },
               ErrorCode::kUnsupported, {"mlp_bias"});
  expect_error([&] { parse_hf_config(with(R"({"hidden_act": "gelu"})"), "c.json"); },
               ErrorCode::kUnsupported, {"hidden_act", "gelu"});
  expect_error(
      [&] {
        parse_hf_config(with(R"({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}})"),
                        "c.json");
      },
      ErrorCode::kUnsupported, {"c.json", "yarn"});
  expect_error([&] { parse_hf_config(with(R"({"vocab_size": null})"), "c.json"); },
               ErrorCode::kCorruptData, {"c.json", "vocab_size"});
  expect_error([&] { parse_hf_config(with(R"({"hidden_size": "64"})"), "c.json"); },
               ErrorCode::kCorruptData, {"c.json", "hidden_size", "\"64\""});
  expect_error([&] { parse_hf_config(with(R"({"num_key_value_heads": 3})"), "c.json"); },
               ErrorCode::kCorruptData, {"c.json", "num_kv_heads 3"});
  expect_error([&] { parse_hf_config(with(R"({"hidden_size": 66})"), "c.json"); },
               ErrorCode::kCorruptData, {"c.json", "66", "num_attention_heads 4"});
  expect_error([&] { parse_hf_config(with(R"({"rope_scaling": {"rope_type": 3}})"), "c.json"); },
               ErrorCode::kCorruptData, {"c.json", "rope_type"});
}

TEST(HfConfig, MissingOrBrokenFiles) {
  test::TempDir tmp;
  expect_error([&] { load_hf_config(tmp.path()); }, ErrorCode::kNotFound,
               {tmp.path() + "/config.json"});
  test::write_bytes(tmp.file("config.json"), "{not json");
  expect_error([&] { load_hf_config(tmp.path()); }, ErrorCode::kCorruptData,
               {tmp.path() + "/config.json", "JSON"});
}

}  // namespace
}  // namespace arbor
