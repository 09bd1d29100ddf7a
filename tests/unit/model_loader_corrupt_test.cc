// Robustness of load_model_weights: corrupted copies of valid fixtures (truncated files, bad
// magic/headers, header length beyond the file, missing tensors, wrong shapes, unsupported dtypes,
// data offsets past EOF) must each throw an arbor::Error naming the file, the tensor and
// expected vs found -- never crash or read out of bounds (run under ASan in CI).
#include <gtest/gtest.h>

#include <random>

#include "engine/model/model_loader.h"
#include "tests/unit/loader_test_util.h"

namespace arbor {
namespace {

using nlohmann::json;
using test::expect_error;
using test::le_bytes;
using test::loader_data;
using test::patch;
using test::require_file;

// ---------------------------------------------------------------------------------------------
// GGUF

size_t gguf_tensor_record(const std::string& bytes, const std::string& name) {
  const size_t pos = bytes.find(le_bytes<uint64_t>(name.size()) + name);
  EXPECT_NE(pos, std::string::npos) << name;
  return pos;
}

class GgufModelCorrupt : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(require_file(loader_data("llama.gguf")));
    bytes_ = test::read_bytes(loader_data("llama.gguf"));
    path_ = tmp_.file("model.gguf");
  }
  void write(const std::string& b) { test::write_bytes(path_, b); }
  void expect_load_error(ErrorCode code, std::vector<std::string> needles) {
    needles.push_back(path_);
    expect_error([&] { load_model_weights(path_); }, code, needles);
  }
  test::TempDir tmp_;
  std::string bytes_, path_;
};

TEST_F(GgufModelCorrupt, WrongShape) {
  std::string b = bytes_;
  const std::string name = "blk.0.attn_q.weight";  // GGUF dims [32 (in), 32 (out)]
  patch(b, gguf_tensor_record(b, name) + 8 + name.size() + 4 + 8, le_bytes<uint64_t>(16));
  write(b);
  expect_load_error(ErrorCode::kCorruptData, {name, "expected shape [32, 32]", "found [16, 32]"});
}

TEST_F(GgufModelCorrupt, MissingTensor) {
  std::string b = bytes_;
  const size_t rec = gguf_tensor_record(b, "blk.1.ffn_up.weight");
  patch(b, rec + 8, "blk.1.ffn_uX.weight");
  write(b);
  expect_load_error(ErrorCode::kNotFound,
                    {"missing tensor blk.1.ffn_up.weight", "expected shape [48, 32]"});
}

TEST_F(GgufModelCorrupt, UnsupportedDtype) {
  std::string b = bytes_;
  const std::string name = "output_norm.weight";  // 1-d F32
  patch(b, gguf_tensor_record(b, name) + 8 + name.size() + 4 + 8, le_bytes<uint32_t>(26));  // I32
  write(b);
  expect_load_error(ErrorCode::kUnsupported, {name, "I32"});
}

TEST_F(GgufModelCorrupt, TruncatedAndOffsetPastEof) {
  write(bytes_.substr(0, bytes_.size() - 1000));
  expect_load_error(ErrorCode::kCorruptData, {"output.weight", "past the end"});
  std::string b = bytes_;
  const std::string name = "blk.1.attn_v.weight";
  patch(b, gguf_tensor_record(b, name) + 8 + name.size() + 4 + 16 + 4,
        le_bytes<uint64_t>(1ull << 32));
  write(b);
  expect_load_error(ErrorCode::kCorruptData, {name, "past the end"});
}

TEST_F(GgufModelCorrupt, BadMagicAndMetadata) {
  std::string b = bytes_;
  patch(b, 0, "FUGG");
  write(b);
  expect_load_error(ErrorCode::kCorruptData, {"magic"});  // detected as GGUF by the extension

  b = bytes_;  // llama.block_count 2 -> 1: layer 1's tensors are unexpected
  const std::string key = "llama.block_count";
  const size_t pos = b.find(le_bytes<uint64_t>(key.size()) + key);
  ASSERT_NE(pos, std::string::npos);
  patch(b, pos + 8 + key.size() + 4, le_bytes<uint32_t>(1));
  write(b);
  expect_load_error(ErrorCode::kUnsupported, {"unexpected tensor blk.1."});

  b = bytes_;  // an unsupported architecture
  const std::string arch = "general.architecture";
  const size_t apos = b.find(le_bytes<uint64_t>(arch.size()) + arch);
  patch(b, apos + 8 + arch.size() + 4 + 8, "gpt2x");
  write(b);
  expect_load_error(ErrorCode::kUnsupported, {"gpt2x", "expected llama or qwen2"});
}

// Found by tests/fuzz/gguf_loader (a 10 KiB input in a one-hour local run): a block_count of
// 1.5 billion made assemble_weights allocate the per-layer structs for every claimed layer
// (about 900 GB) before reading the first layer's tensors. Layers are now read one at a time,
// so the load fails at the first missing tensor.
TEST_F(GgufModelCorrupt, HugeBlockCountFailsAtTheFirstMissingLayer) {
  std::string b = bytes_;
  const std::string key = "llama.block_count";
  const size_t pos = b.find(le_bytes<uint64_t>(key.size()) + key);
  ASSERT_NE(pos, std::string::npos);
  patch(b, pos + 8 + key.size() + 4, le_bytes<uint32_t>(0x5E000001));
  write(b);
  expect_load_error(ErrorCode::kNotFound, {"missing tensor blk.2."});
}

TEST_F(GgufModelCorrupt, EveryTruncationAndRandomCorruptionThrowsCleanly) {
  for (size_t len = 0; len < bytes_.size(); len += 251) {
    write(bytes_.substr(0, len));
    expect_error([&] { load_model_weights(path_); }, ErrorCode::kCorruptData, {path_});
  }
  std::mt19937 rng(99);
  const size_t header = bytes_.find("token_embd.weight") + 64;
  for (int trial = 0; trial < 300; ++trial) {
    std::string b = bytes_;
    for (int k = 0; k < 3; ++k) b[rng() % header] = static_cast<char>(rng() & 0xff);
    write(b);
    try {
      load_model_weights(path_);
    } catch (const Error&) {
    }
  }
}

// ---------------------------------------------------------------------------------------------
// Hugging Face safetensors

// Rewrites the JSON header of a safetensors file, keeping the data section.
std::string rewrite_header(const std::string& bytes, const std::function<void(json&)>& edit) {
  uint64_t n;
  std::memcpy(&n, bytes.data(), 8);
  json header = json::parse(bytes.substr(8, n));
  edit(header);
  const std::string h = header.dump();
  return le_bytes<uint64_t>(h.size()) + h + bytes.substr(8 + n);
}

class HfModelCorrupt : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(require_file(loader_data("llama_hf/model.safetensors")));
    dir_ = tmp_.file("model");
    test::copy_dir(loader_data("llama_hf"), dir_);
    st_ = dir_ + "/model.safetensors";
    bytes_ = test::read_bytes(st_);
    config_ = test::read_json(dir_ + "/config.json");
  }
  void expect_load_error(ErrorCode code, std::vector<std::string> needles) {
    expect_error([&] { load_model_weights(dir_); }, code, needles);
  }
  void write_config(const json& j) { test::write_bytes(dir_ + "/config.json", j.dump()); }
  test::TempDir tmp_;
  std::string dir_, st_, bytes_;
  json config_;
};

TEST_F(HfModelCorrupt, TruncatedFile) {
  test::write_bytes(st_, bytes_.substr(0, bytes_.size() - 100));
  expect_load_error(ErrorCode::kCorruptData, {st_, "tensor ", "data_offsets", "truncated"});
  test::write_bytes(st_, bytes_.substr(0, 5));
  expect_load_error(ErrorCode::kCorruptData, {st_, "truncated"});
}

TEST_F(HfModelCorrupt, HeaderLengthBeyondFileAndBadHeader) {
  std::string b = bytes_;
  patch(b, 0, le_bytes<uint64_t>(bytes_.size()));
  test::write_bytes(st_, b);
  expect_load_error(ErrorCode::kCorruptData,
                    {st_, "header length " + std::to_string(bytes_.size()), "past the end"});
  b = bytes_;
  patch(b, 8, "GGUF");
  test::write_bytes(st_, b);
  expect_load_error(ErrorCode::kCorruptData, {st_, "not a JSON object"});
}

TEST_F(HfModelCorrupt, WrongShapeAgainstConfig) {
  config_["intermediate_size"] = 40;
  write_config(config_);
  expect_load_error(ErrorCode::kCorruptData, {st_, "model.layers.0.mlp.gate_proj.weight",
                                              "expected shape [40, 32]", "found [48, 32]"});
}

TEST_F(HfModelCorrupt, MissingTensor) {
  test::write_bytes(st_, rewrite_header(bytes_, [](json& h) {
                      h["model.norX.weight"] = h["model.norm.weight"];
                      h.erase("model.norm.weight");
                    }));
  expect_load_error(ErrorCode::kNotFound,
                    {st_, "missing tensor model.norm.weight", "expected shape [32]"});
}

TEST_F(HfModelCorrupt, UnsupportedDtype) {
  test::write_bytes(st_, rewrite_header(bytes_, [](json& h) {
                      h["model.layers.1.self_attn.k_proj.weight"]["dtype"] = "I32";
                    }));
  expect_load_error(ErrorCode::kUnsupported,
                    {st_, "model.layers.1.self_attn.k_proj.weight", "I32", "expected F32"});
}

TEST_F(HfModelCorrupt, DataOffsetPastEof) {
  const uint64_t header_len = [&] {
    uint64_t n;
    std::memcpy(&n, bytes_.data(), 8);
    return n;
  }();
  const uint64_t data_size = bytes_.size() - 8 - header_len;
  test::write_bytes(st_, rewrite_header(bytes_, [&](json& h) {
                      h["model.norm.weight"]["data_offsets"] = {data_size, data_size + 128};
                    }));
  expect_load_error(ErrorCode::kCorruptData,
                    {st_, "model.norm.weight", std::to_string(data_size + 128), "outside"});
}

TEST_F(HfModelCorrupt, ExtraLayerAndUnsupportedArchitecture) {
  config_["num_hidden_layers"] = 1;
  write_config(config_);
  expect_load_error(ErrorCode::kUnsupported, {st_, "unexpected tensor model.layers.1."});
  config_["num_hidden_layers"] = 2;
  config_["architectures"] = {"PhiForCausalLM"};
  write_config(config_);
  expect_load_error(ErrorCode::kUnsupported, {dir_ + "/config.json", "PhiForCausalLM"});
}

// ---------------------------------------------------------------------------------------------
// llama2.c

class Llama2cCorrupt : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(require_file(loader_data("llama_v0.bin")));
    bytes_ = test::read_bytes(loader_data("llama_v0.bin"));
    path_ = tmp_.file("model.bin");
  }
  void expect_load_error(const std::string& b, ErrorCode code, std::vector<std::string> needles) {
    test::write_bytes(path_, b);
    needles.push_back(path_);
    expect_error([&] { load_model_weights(path_); }, code, needles);
  }
  test::TempDir tmp_;
  std::string bytes_, path_;
};

TEST_F(Llama2cCorrupt, Truncated) {
  // Layout: header 28, embedding 64x32 floats, 2 rms_att rows, then wq of layers 0 and 1.
  const size_t wq1 = 28 + 4 * (64 * 32 + 2 * 32 + 32 * 32) + 100;
  expect_load_error(bytes_.substr(0, wq1), ErrorCode::kCorruptData,
                    {"truncated", "wq of layer 1", "[32, 32]", std::to_string(wq1) + " bytes"});
  expect_load_error(bytes_.substr(0, 27), ErrorCode::kCorruptData, {"truncated", "28"});
  expect_load_error(bytes_.substr(0, bytes_.size() - 4), ErrorCode::kCorruptData,
                    {"truncated", "wcls"});
  for (size_t len = 0; len < bytes_.size(); len += 509) {
    test::write_bytes(path_, bytes_.substr(0, len));
    expect_error([&] { load_model_weights(path_); }, ErrorCode::kCorruptData, {path_});
  }
}

TEST_F(Llama2cCorrupt, BadHeaderAndSize) {
  std::string b = bytes_;
  patch(b, 0, le_bytes<int32_t>(-5));
  expect_load_error(b, ErrorCode::kCorruptData, {"not a llama2.c checkpoint", "dim is -5"});
  b = bytes_;
  patch(b, 12, le_bytes<int32_t>(5));  // n_heads 5 does not divide dim 32
  expect_load_error(b, ErrorCode::kCorruptData, {"n_heads 5"});
  b = bytes_;
  patch(b, 8, le_bytes<int32_t>(1 << 30));  // n_layers
  expect_load_error(b, ErrorCode::kCorruptData, {"n_layers"});
  expect_load_error(
      bytes_ + "xxxx", ErrorCode::kCorruptData,
      {"size mismatch", std::to_string(bytes_.size()), std::to_string(bytes_.size() + 4)});
  b = bytes_;  // the legacy header with a positive vocab (tied) no longer matches the size
  patch(b, 20, le_bytes<int32_t>(64));
  expect_load_error(b, ErrorCode::kCorruptData, {"size mismatch", "tied"});
  std::string v1 = test::read_bytes(loader_data("llama_v1.bin"));
  patch(v1, 4, le_bytes<int32_t>(2));
  expect_load_error(v1, ErrorCode::kUnsupported, {"version 2"});
}

}  // namespace
}  // namespace arbor
