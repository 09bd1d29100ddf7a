// GgufFile against the python `gguf` package: metadata values (GGUFReader), dequantized tensors
// of every storage type (gguf.quants.dequantize), the real SmolLM2 Q4_1 file, and corrupt files.
#include "engine/model/gguf_file.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "tests/unit/loader_test_util.h"

namespace arbor {
namespace {

using test::expect_error;
using test::loader_data;
using test::require_file;

void expect_close(float got, float want, const std::string& what) {
  const float tol = 1e-6f * std::max(1.0f, std::fabs(want));
  EXPECT_NEAR(got, want, tol) << what;
}

TEST(GgufFile, MetadataMatchesGgufReader) {
  const std::string path = loader_data("quants.gguf");
  ASSERT_TRUE(require_file(path));
  const auto expected = test::read_json(loader_data("quants_expected.json"));
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.path(), path);
  for (const auto& [key, want] : expected["metadata"].items()) {
    ASSERT_TRUE(f.metadata().contains(key)) << key;
    EXPECT_EQ(f.metadata()[key], want) << key << ": ours " << f.metadata()[key].dump();
  }
  // Type fidelity: unsigned stays unsigned (u64 above INT64_MAX), bools are bools.
  EXPECT_TRUE(f.metadata()["test.u64"].is_number_unsigned());
  EXPECT_EQ(f.metadata()["test.u64"].get<uint64_t>(), 9223372036854775813ull);
  EXPECT_TRUE(f.metadata()["test.bool"].is_boolean());
  EXPECT_EQ(f.alignment(), 64u);
  EXPECT_EQ(f.data_offset(), expected["data_offset"].get<uint64_t>());
}

TEST(GgufFile, DequantizesEveryTypeLikeTheGgufPackage) {
  const std::string path = loader_data("quants.gguf");
  ASSERT_TRUE(require_file(path));
  const auto expected = test::read_json(loader_data("quants_expected.json"));
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.tensors().size(), expected["tensors"].size());
  for (const auto& [name, want] : expected["tensors"].items()) {
    SCOPED_TRACE(name);
    const GgufFile::TensorInfo* info = f.find(name);
    ASSERT_NE(info, nullptr);
    EXPECT_EQ(info->name, name);
    EXPECT_EQ(info->ggml_type, want["ggml_type"].get<uint32_t>());
    EXPECT_EQ(ggml_type_name(info->ggml_type), want["type_name"].get<std::string>());
    EXPECT_EQ(info->dims, want["gguf_dims"].get<std::vector<int64_t>>());
    EXPECT_EQ(info->offset % f.alignment(), 0u);
    const HostTensor t = f.read_f32(name);
    EXPECT_EQ(t.shape, want["shape"].get<std::vector<int64_t>>());
    const auto values = want["values"].get<std::vector<float>>();
    ASSERT_EQ(t.data.size(), values.size());
    size_t mismatches = 0;
    for (size_t i = 0; i < values.size(); ++i) {
      const float tol = 1e-6f * std::max(1.0f, std::fabs(values[i]));
      if (!(std::fabs(t.data[i] - values[i]) <= tol) && mismatches++ < 5)
        ADD_FAILURE() << name << "[" << i << "]: ours " << t.data[i] << ", gguf " << values[i];
    }
    EXPECT_EQ(mismatches, 0u);
  }
}

TEST(GgufFile, UnknownTensorIsNotFound) {
  const std::string path = loader_data("quants.gguf");
  ASSERT_TRUE(require_file(path));
  const GgufFile f = GgufFile::open(path);
  EXPECT_EQ(f.find("nope"), nullptr);
  expect_error([&] { f.read_f32("nope"); }, ErrorCode::kNotFound, {path, "nope"});
}

TEST(GgufFile, MissingFileIsNotFound) {
  expect_error([] { GgufFile::open("/nonexistent/x.gguf"); }, ErrorCode::kNotFound,
               {"/nonexistent/x.gguf"});
}

TEST(GgufFile, SmolLM2MetadataAndDequantizationMatchGgufPackage) {
  const std::string path = test::smollm2_path();
  ASSERT_TRUE(require_file(path));
  const auto expected = test::read_json(loader_data("expected.json"))["smollm2"];
  const GgufFile f = GgufFile::open(path);
  const auto& md = f.metadata();
  EXPECT_EQ(md["general.architecture"], "llama");
  EXPECT_EQ(md["llama.block_count"], 30);
  EXPECT_EQ(md["tokenizer.ggml.model"], "gpt2");
  EXPECT_EQ(md["tokenizer.ggml.tokens"].size(), 49152u);
  EXPECT_EQ(md["tokenizer.ggml.merges"].size(), 48900u);
  EXPECT_NE(md["tokenizer.chat_template"].get<std::string>().find("<|im_start|>"),
            std::string::npos);
  EXPECT_EQ(f.tensors().size(), expected["tensor_count"].get<size_t>());
  std::map<std::string, int> types;
  for (const auto& t : f.tensors()) types[ggml_type_name(t.ggml_type)]++;
  EXPECT_EQ(nlohmann::json(types), expected["tensor_types"]);

  for (const auto& [name, want] : expected["gguf_raw_samples"].items()) {
    SCOPED_TRACE(name);
    EXPECT_EQ(ggml_type_name(f.find(name)->ggml_type), want["type_name"].get<std::string>());
    const HostTensor t = f.read_f32(name);
    EXPECT_EQ(t.shape, want["shape"].get<std::vector<int64_t>>());
    const auto idx = want["flat_index"].get<std::vector<int64_t>>();
    const auto vals = want["values"].get<std::vector<float>>();
    for (size_t i = 0; i < idx.size(); ++i)
      expect_close(t.data[static_cast<size_t>(idx[i])], vals[i],
                   name + " flat " + std::to_string(idx[i]));
  }
}

// ---------------------------------------------------------------------------------------------
// Corrupt files: every failure is an arbor::Error naming the file; nothing reads out of bounds.

// File offset of the tensor-info record of `name` (the 8-byte length before the name).
size_t tensor_info_offset(const std::string& bytes, const std::string& name) {
  const std::string needle = test::le_bytes<uint64_t>(name.size()) + name;
  const size_t pos = bytes.find(needle);
  EXPECT_NE(pos, std::string::npos) << name;
  return pos;
}

TEST(GgufFileCorrupt, BadMagicAndVersion) {
  ASSERT_TRUE(require_file(loader_data("quants.gguf")));
  test::TempDir tmp;
  std::string bytes = test::read_bytes(loader_data("quants.gguf"));
  std::string bad = bytes;
  test::patch(bad, 0, "GGUX");
  test::write_bytes(tmp.file("magic.gguf"), bad);
  expect_error([&] { GgufFile::open(tmp.file("magic.gguf")); }, ErrorCode::kCorruptData,
               {tmp.file("magic.gguf"), "magic", "GGUF", "GGUX"});
  bad = bytes;
  test::patch(bad, 4, test::le_bytes<uint32_t>(7));
  test::write_bytes(tmp.file("version.gguf"), bad);
  expect_error([&] { GgufFile::open(tmp.file("version.gguf")); }, ErrorCode::kUnsupported,
               {tmp.file("version.gguf"), "version 7"});
  test::write_bytes(tmp.file("empty.gguf"), "");
  expect_error([&] { GgufFile::open(tmp.file("empty.gguf")); }, ErrorCode::kCorruptData,
               {tmp.file("empty.gguf"), "truncated"});
}

TEST(GgufFileCorrupt, EveryTruncationOfTheHeaderThrows) {
  ASSERT_TRUE(require_file(loader_data("quants.gguf")));
  test::TempDir tmp;
  const std::string bytes = test::read_bytes(loader_data("quants.gguf"));
  const uint64_t data_offset = GgufFile::open(loader_data("quants.gguf")).data_offset();
  const std::string path = tmp.file("t.gguf");
  for (size_t len = 0; len < bytes.size(); len += (len < data_offset ? 1 : 97)) {
    test::write_bytes(path, bytes.substr(0, len));
    try {
      GgufFile::open(path);
      ADD_FAILURE() << "truncated to " << len << " bytes but opened";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kCorruptData) << len << ": " << e.what();
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << e.what();
    }
  }
}

TEST(GgufFileCorrupt, TensorDataPastEndNamesTheTensor) {
  ASSERT_TRUE(require_file(loader_data("quants.gguf")));
  test::TempDir tmp;
  const std::string bytes = test::read_bytes(loader_data("quants.gguf"));
  // Truncated inside the data section (the file ends with 32 bytes of padding): the last tensor
  // (t_f32_3d) runs past EOF.
  test::write_bytes(tmp.file("short.gguf"), bytes.substr(0, bytes.size() - 40));
  expect_error(
      [&] { GgufFile::open(tmp.file("short.gguf")); }, ErrorCode::kCorruptData,
      {tmp.file("short.gguf"), "t_f32_3d", "past the end", std::to_string(bytes.size() - 40)});
  // An offset field pointing far beyond the file.
  std::string bad = bytes;
  const size_t rec = tensor_info_offset(bad, "t_q4_1");
  const size_t offset_field = rec + 8 + 6 + 4 + 2 * 8 + 4;  // name, n_dims, dims, type
  test::patch(bad, offset_field, test::le_bytes<uint64_t>(1ull << 40));
  test::write_bytes(tmp.file("offset.gguf"), bad);
  expect_error([&] { GgufFile::open(tmp.file("offset.gguf")); }, ErrorCode::kCorruptData,
               {tmp.file("offset.gguf"), "t_q4_1", "past the end"});
  // An offset that wraps around when added to the data section start.
  test::patch(bad, offset_field, test::le_bytes<uint64_t>(~0ull - 63));
  test::write_bytes(tmp.file("wrap.gguf"), bad);
  expect_error([&] { GgufFile::open(tmp.file("wrap.gguf")); }, ErrorCode::kCorruptData,
               {tmp.file("wrap.gguf"), "t_q4_1"});
}

TEST(GgufFileCorrupt, HugeCountsAndLengthsAreRejectedBeforeAllocating) {
  ASSERT_TRUE(require_file(loader_data("quants.gguf")));
  test::TempDir tmp;
  const std::string bytes = test::read_bytes(loader_data("quants.gguf"));
  std::string bad = bytes;
  test::patch(bad, 8, test::le_bytes<uint64_t>(1ull << 60));  // tensor count
  test::write_bytes(tmp.file("a.gguf"), bad);
  expect_error([&] { GgufFile::open(tmp.file("a.gguf")); }, ErrorCode::kCorruptData,
               {tmp.file("a.gguf"), "tensor count"});
  bad = bytes;
  test::patch(bad, 16, test::le_bytes<uint64_t>(1ull << 60));  // metadata count
  test::write_bytes(tmp.file("b.gguf"), bad);
  expect_error([&] { GgufFile::open(tmp.file("b.gguf")); }, ErrorCode::kCorruptData,
               {tmp.file("b.gguf"), "metadata count"});
  // The length of test.string_array (type 9, element type 8, then the uint64 count).
  bad = bytes;
  const std::string key = "test.string_array";
  const size_t pos = bad.find(test::le_bytes<uint64_t>(key.size()) + key);
  ASSERT_NE(pos, std::string::npos);
  test::patch(bad, pos + 8 + key.size() + 4 + 4, test::le_bytes<uint64_t>(1ull << 62));
  test::write_bytes(tmp.file("c.gguf"), bad);
  expect_error([&] { GgufFile::open(tmp.file("c.gguf")); }, ErrorCode::kCorruptData,
               {tmp.file("c.gguf"), key});
}

TEST(GgufFileCorrupt, UnsupportedTensorTypeNamesTensorAndType) {
  ASSERT_TRUE(require_file(loader_data("quants.gguf")));
  test::TempDir tmp;
  std::string bad = test::read_bytes(loader_data("quants.gguf"));
  const size_t rec = tensor_info_offset(bad, "t_f32");
  const size_t type_field = rec + 8 + 5 + 4 + 2 * 8;
  test::patch(bad, type_field, test::le_bytes<uint32_t>(kGgmlI32));  // same byte size as F32
  test::write_bytes(tmp.file("i32.gguf"), bad);
  const GgufFile f = GgufFile::open(tmp.file("i32.gguf"));
  expect_error([&] { f.read_f32("t_f32"); }, ErrorCode::kUnsupported,
               {tmp.file("i32.gguf"), "t_f32", "I32"});
  test::patch(bad, type_field, test::le_bytes<uint32_t>(99));
  test::write_bytes(tmp.file("t99.gguf"), bad);
  const GgufFile g = GgufFile::open(tmp.file("t99.gguf"));
  expect_error([&] { g.read_f32("t_f32"); }, ErrorCode::kUnsupported,
               {tmp.file("t99.gguf"), "t_f32", "type99"});
}

// Found while writing tests/fuzz/gguf_loader (a review of what else than arbor::Error its error
// paths can throw; the input below, crafted by hand, crashed the target): a general.alignment
// that is a string of invalid UTF-8 made the error message's json::dump() throw nlohmann's
// type_error, which no caller expects (`arbor serve` would have died on it). The input is
// tests/fuzz/corpus/gguf_loader/alignment_invalid_utf8.gguf.
TEST(GgufFileCorrupt, NonUtf8AlignmentIsCorruptDataNotAJsonError) {
  test::TempDir tmp;
  const std::string key = "general.alignment";
  std::string bytes = "GGUF" + test::le_bytes<uint32_t>(3) + test::le_bytes<uint64_t>(0) +
                      test::le_bytes<uint64_t>(1) + test::le_bytes<uint64_t>(key.size()) + key +
                      test::le_bytes<uint32_t>(8) + test::le_bytes<uint64_t>(2) + "\xFF\xFE";
  test::write_bytes(tmp.file("align.gguf"), bytes);
  expect_error([&] { GgufFile::open(tmp.file("align.gguf")); }, ErrorCode::kCorruptData,
               {tmp.file("align.gguf"), "general.alignment must be a power of two",
                "\xEF\xBF\xBD\xEF\xBF\xBD"});
}

// Random byte flips in the header: open() and read_f32() either succeed or throw arbor::Error.
TEST(GgufFileCorrupt, RandomHeaderCorruptionNeverCrashes) {
  ASSERT_TRUE(require_file(loader_data("quants.gguf")));
  test::TempDir tmp;
  const std::string bytes = test::read_bytes(loader_data("quants.gguf"));
  const uint64_t header = GgufFile::open(loader_data("quants.gguf")).data_offset();
  std::mt19937 rng(1234);
  int errors = 0;
  for (int trial = 0; trial < 400; ++trial) {
    std::string bad = bytes;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) bad[rng() % header] = static_cast<char>(rng() & 0xff);
    const std::string path = tmp.file("fuzz.gguf");
    test::write_bytes(path, bad);
    try {
      const GgufFile f = GgufFile::open(path);
      for (const auto& t : f.tensors()) {
        try {
          f.read_f32(t.name);
        } catch (const Error&) {
          ++errors;
        }
      }
    } catch (const Error&) {
      ++errors;
    }
  }
  EXPECT_GT(errors, 0);
}

}  // namespace
}  // namespace arbor
