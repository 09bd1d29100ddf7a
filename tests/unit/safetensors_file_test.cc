// Safetensors reading against the python `safetensors` library: single-file fp32, sharded bf16
// (model.safetensors.index.json) and f16 checkpoints written by transformers, plus corrupt files.
#include "engine/model/safetensors_file.h"

#include <gtest/gtest.h>

#include "tests/unit/loader_test_util.h"

namespace arbor {
namespace {

using test::expect_error;
using test::loader_data;
using test::require_file;

void check_against_safetensors_library(const std::string& model) {
  SCOPED_TRACE(model);
  const std::string dir = loader_data(model);
  ASSERT_TRUE(require_file(dir + "/config.json"));
  const auto expected = test::read_json(loader_data("expected.json"))["models"][model]["tensors"];
  const SafetensorsCheckpoint ck = SafetensorsCheckpoint::open_dir(dir);
  EXPECT_EQ(ck.names().size(), expected.size());
  for (const auto& [name, want] : expected.items()) {
    SCOPED_TRACE(name);
    ASSERT_TRUE(ck.contains(name));
    EXPECT_EQ(ck.file_of(name), dir + "/" + want["file"].get<std::string>());
    const HostTensor t = ck.read_f32(name);
    EXPECT_EQ(t.shape, ck.info(name).shape);
    const auto idx = want["flat_index"].get<std::vector<int64_t>>();
    const auto vals = want["values"].get<std::vector<float>>();
    for (size_t i = 0; i < idx.size(); ++i)
      EXPECT_EQ(t.data[static_cast<size_t>(idx[i])], vals[i]) << "flat index " << idx[i];
    double sum = 0;
    for (float v : t.data) sum += v;
    EXPECT_NEAR(sum, want["sum"].get<double>(), 1e-9 * std::max(1.0, std::fabs(sum)));
  }
}

TEST(Safetensors, SingleFileF32) {
  check_against_safetensors_library("llama_hf");
}
TEST(Safetensors, ShardedBf16) {
  check_against_safetensors_library("llama_hf_sharded_bf16");
  const auto ck = SafetensorsCheckpoint::open_dir(loader_data("llama_hf_sharded_bf16"));
  EXPECT_EQ(ck.source(), loader_data("llama_hf_sharded_bf16") + "/model.safetensors.index.json");
  EXPECT_EQ(ck.info("model.norm.weight").dtype, "BF16");
}
TEST(Safetensors, SingleFileF16) {
  check_against_safetensors_library("qwen2_hf_f16");
}

TEST(Safetensors, DirectoryWithoutWeightsIsNotFound) {
  test::TempDir tmp;
  expect_error([&] { SafetensorsCheckpoint::open_dir(tmp.path()); }, ErrorCode::kNotFound,
               {tmp.path(), "model.safetensors"});
}

// Builds a safetensors file from a header string and `data_bytes` zero bytes.
std::string make_file(const std::string& header, size_t data_bytes) {
  return test::le_bytes<uint64_t>(header.size()) + header + std::string(data_bytes, '\0');
}

TEST(SafetensorsCorrupt, HeaderProblemsNameFileAndTensor) {
  test::TempDir tmp;
  const std::string p = tmp.file("m.safetensors");
  auto open_expect = [&](const std::string& bytes, ErrorCode code,
                         std::vector<std::string> needles) {
    test::write_bytes(p, bytes);
    needles.push_back(p);
    expect_error([&] { SafetensorsFile::open(p); }, code, needles);
  };
  open_expect("", ErrorCode::kCorruptData, {"truncated"});
  open_expect("abc", ErrorCode::kCorruptData, {"truncated", "3 bytes"});
  open_expect(test::le_bytes<uint64_t>(1000) + "{}", ErrorCode::kCorruptData,
              {"header length 1000", "past the end"});
  open_expect(test::le_bytes<uint64_t>(~0ull) + "{}", ErrorCode::kCorruptData, {"header length"});
  open_expect(make_file("PK\x03\x04 not json", 0), ErrorCode::kCorruptData, {"not a JSON"});
  open_expect(make_file("[1, 2]", 0), ErrorCode::kCorruptData, {"not a JSON object"});
  open_expect(make_file(R"({"w": {"dtype": "F32", "shape": [2, 3]}})", 24), ErrorCode::kCorruptData,
              {"tensor w", "data_offsets"});
  open_expect(make_file(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [0, 24]}})", 20),
              ErrorCode::kCorruptData, {"tensor w", "[0, 24]", "20 bytes", "truncated"});
  open_expect(make_file(R"({"w": {"dtype": "F32", "shape": [2, 3], "data_offsets": [8, 4]}})", 24),
              ErrorCode::kCorruptData, {"tensor w", "[8, 4]"});
  open_expect(make_file(R"({"w": {"dtype": "F32", "shape": [2, 4], "data_offsets": [0, 24]}})", 24),
              ErrorCode::kCorruptData, {"tensor w", "[2, 4]", "8 x 4", "span 24"});
  open_expect(
      make_file(R"({"w": {"dtype": "F32", "shape": [-2, 3], "data_offsets": [0, 24]}})", 24),
      ErrorCode::kCorruptData, {"tensor w", "shape"});
  open_expect(make_file(R"({"w": {"dtype": "F32", "shape": [4294967296, 4294967296, 16],
                                  "data_offsets": [0, 24]}})",
                        24),
              ErrorCode::kCorruptData, {"tensor w", "overflow"});
}

TEST(SafetensorsCorrupt, UnsupportedDtypeNamesTensorAndDtype) {
  test::TempDir tmp;
  const std::string p = tmp.file("m.safetensors");
  test::write_bytes(p, make_file(R"({"__metadata__": {"format": "pt"},
                      "ids": {"dtype": "I64", "shape": [3], "data_offsets": [0, 24]}})",
                                 24));
  const SafetensorsFile f = SafetensorsFile::open(p);
  expect_error([&] { f.read_f32("ids"); }, ErrorCode::kUnsupported,
               {p, "ids", "I64", "expected F32, F16 or BF16"});
  expect_error([&] { f.read_f32("nope"); }, ErrorCode::kNotFound, {p, "nope"});
}

TEST(SafetensorsCorrupt, EveryTruncationThrows) {
  const std::string src = loader_data("qwen2_hf_f16/model.safetensors");
  ASSERT_TRUE(require_file(src));
  const std::string bytes = test::read_bytes(src);
  test::TempDir tmp;
  const std::string p = tmp.file("m.safetensors");
  for (size_t len = 0; len < bytes.size(); len += 131) {
    test::write_bytes(p, bytes.substr(0, len));
    expect_error([&] { SafetensorsFile::open(p); }, ErrorCode::kCorruptData, {p});
  }
}

TEST(SafetensorsCorrupt, ShardIndexProblems) {
  ASSERT_TRUE(require_file(loader_data("llama_hf_sharded_bf16/model.safetensors.index.json")));
  test::TempDir tmp;
  const std::string dir = tmp.file("m");
  test::copy_dir(loader_data("llama_hf_sharded_bf16"), dir);
  const std::string index_path = dir + "/model.safetensors.index.json";
  const std::string index = test::read_bytes(index_path);

  std::filesystem::remove(dir + "/model-00002-of-00002.safetensors");
  expect_error([&] { SafetensorsCheckpoint::open_dir(dir); }, ErrorCode::kNotFound,
               {dir + "/model-00002-of-00002.safetensors"});
  test::copy_dir(loader_data("llama_hf_sharded_bf16"), tmp.file("m2"));

  auto j = nlohmann::json::parse(index);
  const std::string moved = "model.norm.weight";
  const std::string home = j["weight_map"][moved];
  j["weight_map"][moved] = home == "model-00001-of-00002.safetensors"
                               ? "model-00002-of-00002.safetensors"
                               : "model-00001-of-00002.safetensors";
  test::write_bytes(tmp.file("m2") + "/model.safetensors.index.json", j.dump());
  expect_error([&] { SafetensorsCheckpoint::open_dir(tmp.file("m2")); }, ErrorCode::kCorruptData,
               {moved, "no such tensor"});

  j["weight_map"][moved] = "../../etc/passwd";
  test::write_bytes(tmp.file("m2") + "/model.safetensors.index.json", j.dump());
  expect_error([&] { SafetensorsCheckpoint::open_dir(tmp.file("m2")); }, ErrorCode::kCorruptData,
               {moved, "same directory"});

  test::write_bytes(tmp.file("m2") + "/model.safetensors.index.json", "{\"weight_map\": 3}");
  expect_error([&] { SafetensorsCheckpoint::open_dir(tmp.file("m2")); }, ErrorCode::kCorruptData,
               {"weight_map"});
}

}  // namespace
}  // namespace arbor
