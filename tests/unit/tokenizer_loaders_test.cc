// The tokenizer loaders: what they read from tok512.bin, tokenizer.json + tokenizer_config.json
// and GGUF metadata (compared with the files' documentation and Python's gguf reader), and the
// errors they give for missing, malformed or unsupported input.
#include <sys/resource.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/model/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_loaders.h"
#include "tests/unit/tokenizer_test_util.h"

namespace arbor {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// Runs f, expecting an arbor::Error with `code` whose message contains `needle`.
template <typename F>
void expect_error(F&& f, ErrorCode code, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "expected an error mentioning '" << needle << "'";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

class TempDir {
 public:
  TempDir() {
    path_ = fs::temp_directory_path() /
            ("arbor_tok_" + std::to_string(::getpid()) + "_" + std::to_string(counter_++));
    fs::create_directories(path_);
  }
  ~TempDir() { fs::remove_all(path_); }
  std::string write(const std::string& name, const std::string& content) const {
    const fs::path p = path_ / name;
    std::ofstream(p, std::ios::binary) << content;
    return p.string();
  }
  std::string path() const { return path_.string(); }

 private:
  static inline int counter_ = 0;
  fs::path path_;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// --- llama2.c ------------------------------------------------------------------------------

// Values from the stories260K README (format) and the file itself as Python reads it.
TEST(Llama2cTokenizerLoaderTest, ReadsTok512) {
  const TokenizerSpec spec = load_llama2c_tokenizer(testing::kTok512Path);
  ASSERT_EQ(spec.tokens.size(), 512u);
  EXPECT_EQ(spec.kind, TokenizerKind::kSentencePieceBpe);
  EXPECT_EQ(spec.tokens[0], "<unk>");
  EXPECT_EQ(spec.tokens[1], "<s>");
  EXPECT_EQ(spec.tokens[2], "</s>");
  EXPECT_EQ(spec.unk_id, 0);
  EXPECT_EQ(spec.bos_id, 1);
  EXPECT_EQ(spec.eos_id, 2);
  EXPECT_EQ(spec.types[1], TokenType::kControl);
  EXPECT_EQ(spec.tokens[3], "<0x00>");
  EXPECT_EQ(spec.types[258], TokenType::kByte);
  EXPECT_EQ(spec.tokens[259], "\xE2\x96\x81t");  // stored as " t"
  EXPECT_EQ(spec.types[259], TokenType::kNormal);
  EXPECT_FLOAT_EQ(spec.scores[260], -1.0f);  // "he"
  EXPECT_TRUE(spec.add_bos);
  EXPECT_TRUE(spec.add_space_prefix);
  EXPECT_EQ(load_llama2c_tokenizer(testing::kTok512Path, 300).tokens.size(), 300u);
}

TEST(Llama2cTokenizerLoaderTest, Errors) {
  expect_error([] { load_llama2c_tokenizer("/nonexistent/tok.bin"); }, ErrorCode::kNotFound,
               "/nonexistent/tok.bin");
  TempDir dir;
  const std::string full = read_file(testing::kTok512Path);
  ASSERT_EQ(full.size(), 6227u);
  const std::string truncated = dir.write("truncated.bin", full.substr(0, 1000));
  expect_error([&] { load_llama2c_tokenizer(truncated); }, ErrorCode::kCorruptData, "truncated");
  expect_error([&] { load_llama2c_tokenizer(testing::kTok512Path, 600); }, ErrorCode::kCorruptData,
               "token 512");
  std::string bad_length = full;
  const int32_t huge = 1 << 20;
  std::memcpy(bad_length.data() + 8, &huge, 4);  // token 0's length
  const std::string bad = dir.write("bad_length.bin", bad_length);
  expect_error([&] { load_llama2c_tokenizer(bad); }, ErrorCode::kCorruptData, "length 1048576");
}

// Found by tests/fuzz/llama2c_loader: a 16-byte file claiming a 2 GiB token made the loader
// allocate (and zero) the 2 GiB before noticing the file ends. The length is now checked against
// the file first; peak RSS must not grow by anything near the claimed size.
TEST(Llama2cTokenizerLoaderTest, HugeTokenLengthInATinyFileAllocatesNothing) {
  TempDir dir;
  const int32_t huge = INT32_MAX;
  std::string bytes(16, '\0');
  std::memcpy(bytes.data(), &huge, 4);      // max_token_length
  std::memcpy(bytes.data() + 8, &huge, 4);  // token 0's length; 4 bytes follow
  const std::string path = dir.write("huge_token.bin", bytes);
  struct rusage before;
  getrusage(RUSAGE_SELF, &before);
  expect_error([&] { load_llama2c_tokenizer(path); }, ErrorCode::kCorruptData,
               "token 0 bytes (needs 2147483647 bytes, 4 left)");
  struct rusage after;
  getrusage(RUSAGE_SELF, &after);
  EXPECT_LT(after.ru_maxrss - before.ru_maxrss, 256 * 1024) << "KiB of peak RSS added";
}

// --- HF tokenizer.json ---------------------------------------------------------------------

TEST(HfTokenizerLoaderTest, ReadsTokenizerConfigBesideTokenizerJson) {
  const std::string dir = testing::kTokenizerData + "/tok512_hf";
  const json config = testing::read_json(dir + "/tokenizer_config.json");
  const TokenizerSpec spec = load_hf_tokenizer(dir);
  EXPECT_EQ(spec.kind, TokenizerKind::kSentencePieceBpe);
  EXPECT_EQ(spec.tokens.size(), 512u);
  EXPECT_EQ(spec.tokens[spec.bos_id], config["bos_token"]);
  EXPECT_EQ(spec.tokens[spec.eos_id], config["eos_token"]);
  EXPECT_EQ(spec.tokens[spec.unk_id], config["unk_token"]);
  EXPECT_EQ(spec.pad_id, -1);
  EXPECT_TRUE(spec.add_bos);
  EXPECT_EQ(spec.chat_template, config["chat_template"]);
  EXPECT_EQ(spec.types[3], TokenType::kByte);
  EXPECT_EQ(spec.types[1], TokenType::kControl);
  EXPECT_EQ(spec.types[0], TokenType::kUnknown);
}

TEST(HfTokenizerLoaderTest, MapsPreTokenizersToNames) {
  const std::pair<const char*, const char*> expected[] = {{"bpe_gpt2", "gpt2"},
                                                          {"bpe_llama3", "llama3"},
                                                          {"bpe_qwen2", "qwen2"},
                                                          {"bpe_smollm", "smollm"}};
  for (const auto& [dir, name] : expected) {
    const TokenizerSpec spec = load_hf_tokenizer(testing::kTokenizerData + "/" + dir);
    EXPECT_EQ(spec.kind, TokenizerKind::kByteLevelBpe) << dir;
    EXPECT_EQ(spec.pre_tokenizer, name) << dir;
    EXPECT_FALSE(spec.add_bos) << dir;
    EXPECT_EQ(spec.ignore_merges, std::string(dir) == "bpe_llama3") << dir;
    const json j = testing::read_json(testing::kTokenizerData + "/" + dir + "/tokenizer.json");
    EXPECT_EQ(spec.merges.size(), j["model"]["merges"].size()) << dir;
    EXPECT_EQ(spec.tokens.size(), j["model"]["vocab"].size() + 1) << dir;  // + [[user_token]]
    EXPECT_EQ(spec.types.back(), TokenType::kUserDefined) << dir;
  }
}

// Variants of a committed tokenizer.json with one field changed.
class HfTokenizerErrorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    base_ = testing::read_json(testing::kTokenizerData + "/bpe_llama3/tokenizer.json");
  }
  std::string write(const json& j) { return dir_.write("tokenizer.json", j.dump()); }

  json base_;
  TempDir dir_;
};

TEST_F(HfTokenizerErrorTest, UnknownSplitRegexIsNamed) {
  json j = base_;
  j["pre_tokenizer"]["pretokenizers"][0]["pattern"]["Regex"] = "\\p{L}+|\\p{N}{1,4}";
  const std::string path = write(j);
  expect_error([&] { load_hf_tokenizer(path); }, ErrorCode::kUnsupported, "\\p{N}{1,4}");
}

TEST_F(HfTokenizerErrorTest, UnsupportedModelAndPreTokenizers) {
  json j = base_;
  j["model"]["type"] = "WordPiece";
  std::string path = write(j);
  expect_error([&] { load_hf_tokenizer(path); }, ErrorCode::kUnsupported, "WordPiece");
  j = base_;
  j["pre_tokenizer"] = {{"type", "Whitespace"}};
  path = write(j);
  expect_error([&] { load_hf_tokenizer(path); }, ErrorCode::kUnsupported, "Whitespace");
  j = base_;
  j["normalizer"] = {{"type", "Lowercase"}};
  path = write(j);
  expect_error([&] { load_hf_tokenizer(path); }, ErrorCode::kUnsupported, "Lowercase");
}

TEST_F(HfTokenizerErrorTest, MalformedFiles) {
  expect_error([&] { load_hf_tokenizer(dir_.path() + "/missing"); }, ErrorCode::kNotFound,
               "missing");
  const std::string broken = dir_.write("broken.json", "{\"model\": ");
  expect_error([&] { load_hf_tokenizer(broken); }, ErrorCode::kCorruptData, "not valid JSON");
  json j = base_;
  j["model"]["vocab"].erase("a");
  std::string path = write(j);
  expect_error([&] { load_hf_tokenizer(path); }, ErrorCode::kCorruptData, "no token has id");
  j = base_;
  j["model"]["merges"].push_back(json::array({"zz", "qq"}));
  path = write(j);
  expect_error([&] { Tokenizer::create(load_hf_tokenizer(path)); }, ErrorCode::kCorruptData,
               "zz qq");
}

TEST_F(HfTokenizerErrorTest, MergesAsPairsOrStrings) {
  // tokenizers saves [a, b] pairs; older files have "a b" strings. Both read the same.
  json j = base_;
  for (auto& m : j["model"]["merges"]) m = m[0].get<std::string>() + " " + m[1].get<std::string>();
  const TokenizerSpec from_strings = load_hf_tokenizer(write(j));
  const TokenizerSpec from_pairs =
      load_hf_tokenizer(testing::kTokenizerData + "/bpe_llama3/tokenizer.json");
  EXPECT_EQ(from_strings.merges, from_pairs.merges);
}

// --- GGUF ----------------------------------------------------------------------------------

TEST(GgufTokenizerLoaderTest, ReadsSmolLmMetadataAsPythonGgufDoes) {
  ASSERT_TRUE(testing::file_exists(testing::kSmolLmGguf)) << "missing " << testing::kSmolLmGguf;
  const json want =
      testing::read_json(testing::kTokenizerData + "/smollm2_cases.json")["gguf_spec"];
  const TokenizerSpec spec =
      tokenizer_spec_from_gguf(GgufFile::open(testing::kSmolLmGguf).metadata());
  EXPECT_EQ(spec.kind, TokenizerKind::kByteLevelBpe);
  EXPECT_EQ(spec.tokens.size(), want["vocab_size"].get<size_t>());
  EXPECT_EQ(spec.merges.size(), want["num_merges"].get<size_t>());
  std::vector<int> control;
  for (size_t i = 0; i < spec.types.size(); ++i) {
    if (spec.types[i] == TokenType::kControl) control.push_back(static_cast<int>(i));
  }
  EXPECT_EQ(control, want["control_ids"].get<std::vector<int>>());
  EXPECT_EQ(spec.bos_id, want["bos_id"]);
  EXPECT_EQ(spec.eos_id, want["eos_id"]);
  EXPECT_EQ(spec.unk_id, want["unk_id"]);
  EXPECT_EQ(spec.pad_id, want["pad_id"]);
  EXPECT_EQ(spec.add_bos, want["add_bos"]);
  EXPECT_EQ(spec.pre_tokenizer, want["pre"]);
  EXPECT_EQ(spec.chat_template, want["chat_template"]);
  EXPECT_FALSE(spec.ignore_merges);
}

// tok512 written as GGUF 'llama' metadata (as llama.cpp's converter would) encodes like the
// HF / SentencePiece references.
TEST(GgufTokenizerLoaderTest, LlamaModelMetadataEncodesLikeSentencePiece) {
  const TokenizerSpec tok512 = load_llama2c_tokenizer(testing::kTok512Path);
  json md = json::object();
  md["tokenizer.ggml.model"] = "llama";
  md["tokenizer.ggml.tokens"] = tok512.tokens;
  md["tokenizer.ggml.scores"] = tok512.scores;
  json types = json::array();
  for (TokenType t : tok512.types) types.push_back(static_cast<int>(t));
  md["tokenizer.ggml.token_type"] = types;
  md["tokenizer.ggml.bos_token_id"] = 1;
  md["tokenizer.ggml.eos_token_id"] = 2;
  auto tokenizer = Tokenizer::create(tokenizer_spec_from_gguf(md));
  EXPECT_TRUE(tokenizer->spec().add_bos);
  const json fixture = testing::read_json(testing::kTokenizerData + "/tok512_cases.json");
  for (const auto& c : fixture["cases"]) {
    EXPECT_EQ(tokenizer->encode(c["text"].get<std::string>(), false, false),
              testing::ids_of(c["ids_sentencepiece"]))
        << testing::escape(c["text"]);
  }
}

TEST(GgufTokenizerLoaderTest, Errors) {
  json md = json::object();
  md["tokenizer.ggml.model"] = "bert";
  md["tokenizer.ggml.tokens"] = json::array({"a", "b"});
  expect_error([&] { tokenizer_spec_from_gguf(md); }, ErrorCode::kUnsupported, "'bert'");
  md["tokenizer.ggml.model"] = "gpt2";
  md["tokenizer.ggml.merges"] = json::array();
  md["tokenizer.ggml.pre"] = "falcon";
  expect_error([&] { tokenizer_spec_from_gguf(md); }, ErrorCode::kUnsupported, "'falcon'");
  md["tokenizer.ggml.pre"] = "llama-bpe";
  EXPECT_EQ(tokenizer_spec_from_gguf(md).pre_tokenizer, "llama3");
  md["tokenizer.ggml.token_type"] = json::array({1});
  expect_error([&] { tokenizer_spec_from_gguf(md); }, ErrorCode::kCorruptData,
               "tokenizer.ggml.token_type has 1 entries, expected 2");
  md.erase("tokenizer.ggml.token_type");
  md["tokenizer.ggml.eos_token_id"] = 7;
  expect_error([&] { tokenizer_spec_from_gguf(md); }, ErrorCode::kCorruptData,
               "tokenizer.ggml.eos_token_id is 7");
  md.erase("tokenizer.ggml.eos_token_id");
  md["tokenizer.ggml.model"] = "llama";  // needs scores
  expect_error([&] { tokenizer_spec_from_gguf(md); }, ErrorCode::kCorruptData,
               "tokenizer.ggml.scores");
  md.erase("tokenizer.ggml.tokens");
  expect_error([&] { tokenizer_spec_from_gguf(md); }, ErrorCode::kCorruptData,
               "tokenizer.ggml.tokens");
}

TEST(TokenizerCreateTest, RejectsInconsistentSpecs) {
  TokenizerSpec spec = load_llama2c_tokenizer(testing::kTok512Path);
  spec.scores.pop_back();
  expect_error([&] { Tokenizer::create(spec); }, ErrorCode::kInvalidArgument, "511 scores");
  spec = load_llama2c_tokenizer(testing::kTok512Path);
  spec.bos_id = 512;
  expect_error([&] { Tokenizer::create(spec); }, ErrorCode::kInvalidArgument, "bos_id is 512");
  spec = load_llama2c_tokenizer(testing::kTok512Path);
  spec.kind = TokenizerKind::kByteLevelBpe;
  spec.pre_tokenizer = "bloom";
  expect_error([&] { Tokenizer::create(spec); }, ErrorCode::kUnsupported, "'bloom'");
}

}  // namespace
}  // namespace arbor
