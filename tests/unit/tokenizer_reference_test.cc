// Our tokenizers against the HF `tokenizers` library (and SentencePiece for tok512) on a corpus of
// English, CJK, emoji, code, whitespace runs, numbers, contractions and special-token strings.
// Expected ids and text come from scripts/make_tokenizer_fixtures.py.
#include <functional>
#include <memory>
#include <string>

#include <gtest/gtest.h>

#include "engine/model/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_loaders.h"
#include "tests/unit/tokenizer_test_util.h"

namespace arbor {
namespace {

using testing::escape;
using testing::ids_of;
using testing::kTokenizerData;

struct Source {
  const char* name;
  const char* cases_file;  // in tests/data/tokenizer
  std::function<TokenizerSpec()> load;
};

std::ostream& operator<<(std::ostream& os, const Source& s) {
  return os << s.name;
}

const Source kSources[] = {
    {"smollm2_gguf", "smollm2_cases.json",
     [] {
       if (!testing::file_exists(testing::kSmolLmGguf)) {
         ADD_FAILURE() << "missing " << testing::kSmolLmGguf
                       << " (scripts/fetch_default_model.sh downloads it)";
       }
       return tokenizer_spec_from_gguf(GgufFile::open(testing::kSmolLmGguf).metadata());
     }},
    {"bpe_gpt2", "bpe_gpt2_cases.json",
     [] { return load_hf_tokenizer(kTokenizerData + "/bpe_gpt2"); }},
    {"bpe_llama3", "bpe_llama3_cases.json",
     [] { return load_hf_tokenizer(kTokenizerData + "/bpe_llama3/tokenizer.json"); }},
    {"bpe_qwen2", "bpe_qwen2_cases.json",
     [] { return load_hf_tokenizer(kTokenizerData + "/bpe_qwen2"); }},
    {"bpe_smollm", "bpe_smollm_cases.json",
     [] { return load_hf_tokenizer(kTokenizerData + "/bpe_smollm"); }},
    // SentencePiece score order from llama2.c's file...
    {"tok512_llama2c", "tok512_cases.json",
     [] { return load_llama2c_tokenizer(testing::kTok512Path); }},
    // ...and HF merge-rank order from the converted tokenizer.json.
    {"tok512_hf", "tok512_cases.json",
     [] { return load_hf_tokenizer(kTokenizerData + "/tok512_hf"); }},
    // Metaspace pre-tokenizer instead of the legacy normalizer (transformers' legacy=False).
    {"tok512_metaspace_first", "tok512_metaspace_first_cases.json",
     [] { return load_hf_tokenizer(kTokenizerData + "/tok512_metaspace_first"); }},
    {"tok512_metaspace_always", "tok512_metaspace_always_cases.json",
     [] { return load_hf_tokenizer(kTokenizerData + "/tok512_metaspace_always"); }},
};

class TokenizerReferenceTest : public ::testing::TestWithParam<Source> {
 protected:
  void SetUp() override {
    fixture_ = testing::read_json(kTokenizerData + "/" + GetParam().cases_file);
    ASSERT_TRUE(fixture_.contains("cases")) << GetParam().cases_file;
    tokenizer_ = Tokenizer::create(GetParam().load());
  }

  nlohmann::json fixture_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

TEST_P(TokenizerReferenceTest, EncodeMatchesReference) {
  int checked = 0;
  for (const auto& c : fixture_["cases"]) {
    const std::string text = c["text"];
    SCOPED_TRACE("text: \"" + escape(text) + "\"");
    EXPECT_EQ(tokenizer_->encode(text, false, false), ids_of(c["ids"])) << "parse_special=false";
    EXPECT_EQ(tokenizer_->encode(text, false, true), ids_of(c["ids_special"]))
        << "parse_special=true";
    if (c.contains("ids_bos")) {
      EXPECT_EQ(tokenizer_->encode(text, true, true), ids_of(c["ids_bos"])) << "add_bos";
    } else {
      // These references add no BOS (add_bos_token false / no BOS template).
      EXPECT_EQ(tokenizer_->encode(text, true, true), ids_of(c["ids_special"])) << "add_bos";
    }
    if (c.contains("ids_sentencepiece")) {
      EXPECT_EQ(tokenizer_->encode(text, false, false), ids_of(c["ids_sentencepiece"]))
          << "SentencePiece reference";
    }
    ++checked;
  }
  EXPECT_GT(checked, 40);
}

TEST_P(TokenizerReferenceTest, DecodeMatchesReference) {
  for (const auto& c : fixture_["cases"]) {
    SCOPED_TRACE("text: \"" + escape(c["text"]) + "\"");
    const std::vector<int32_t> ids = ids_of(c["ids_special"]);
    EXPECT_EQ(escape(tokenizer_->decode(ids, false)), escape(c["decoded"]));
    EXPECT_EQ(escape(tokenizer_->decode(ids, true)), escape(c["decoded_skip_special"]));
  }
  for (const auto& c : fixture_["decode_cases"]) {
    const std::vector<int32_t> ids = ids_of(c["ids"]);
    SCOPED_TRACE("ids: " + c["ids"].dump());
    EXPECT_EQ(escape(tokenizer_->decode(ids, c["skip_special"])), escape(c["decoded"]));
  }
}

// Streaming: the chunks are always valid UTF-8 and join to the reference decoding.
TEST_P(TokenizerReferenceTest, IncrementalDecodeMatchesReference) {
  auto check = [&](const std::vector<int32_t>& ids, bool skip_special, const std::string& want) {
    IncrementalDecoder decoder(*tokenizer_, skip_special);
    std::string joined;
    for (int32_t id : ids) {
      const std::string chunk = decoder.push(id);
      EXPECT_TRUE(testing::is_valid_utf8(chunk)) << "chunk \"" << escape(chunk) << "\"";
      joined += chunk;
    }
    const std::string tail = decoder.finish();
    EXPECT_TRUE(testing::is_valid_utf8(tail));
    joined += tail;
    EXPECT_EQ(escape(joined), escape(want)) << "skip_special=" << skip_special;
  };
  for (const auto& c : fixture_["cases"]) {
    SCOPED_TRACE("text: \"" + escape(c["text"]) + "\"");
    check(ids_of(c["ids_special"]), false, c["decoded"]);
    check(ids_of(c["ids_special"]), true, c["decoded_skip_special"]);
  }
  for (const auto& c : fixture_["decode_cases"]) {
    SCOPED_TRACE("ids: " + c["ids"].dump());
    check(ids_of(c["ids"]), c["skip_special"], c["decoded"]);
  }
}

// Invalid UTF-8 in the text to encode goes through byte fallback / the byte alphabet, and
// decodes back to the bytes with Python's U+FFFD repair.
TEST_P(TokenizerReferenceTest, InvalidUtf8RoundTrips) {
  ASSERT_TRUE(fixture_.contains("bad_utf8"));
  for (const auto& c : fixture_["bad_utf8"]) {
    const std::string bytes = testing::from_hex(c["hex"]);
    SCOPED_TRACE("bytes: \"" + escape(bytes) + "\"");
    std::vector<int32_t> ids;
    ASSERT_NO_THROW(ids = tokenizer_->encode(bytes, false, true));
    EXPECT_EQ(escape(tokenizer_->decode(ids, false)), escape(c["decoded"]));
  }
}

INSTANTIATE_TEST_SUITE_P(References, TokenizerReferenceTest, ::testing::ValuesIn(kSources),
                         [](const ::testing::TestParamInfo<Source>& info) {
                           return std::string(info.param.name);
                         });

// The two tok512 readings (llama2.c scores, HF merges) agree with each other and with
// SentencePiece on every corpus text; the fixture records where HF and SentencePiece differ.
TEST(Tok512Reference, HfAndSentencePieceAgreeOnTheCorpus) {
  const nlohmann::json fixture = testing::read_json(kTokenizerData + "/tok512_cases.json");
  EXPECT_EQ(fixture["hf_sentencepiece_disagreements"].size(), 0u)
      << fixture["hf_sentencepiece_disagreements"].dump();
}

// SentencePiece's own decoding of byte pieces and control tokens, where it differs from HF's
// LlamaConverter decoder: our decode follows HF (documented in tokenizer.h).
TEST(Tok512Reference, DecodeAgreesWithSentencePieceOnSkippedSpecials) {
  const nlohmann::json fixture = testing::read_json(kTokenizerData + "/tok512_cases.json");
  auto tokenizer = Tokenizer::create(load_llama2c_tokenizer(testing::kTok512Path));
  int compared = 0;
  for (const auto& c : fixture["decode_cases"]) {
    if (!c["skip_special"] || c["decoded"] != c["decoded_sentencepiece"]) continue;
    EXPECT_EQ(escape(tokenizer->decode(ids_of(c["ids"]), true)), escape(c["decoded_sentencepiece"]))
        << c["ids"].dump();
    ++compared;
  }
  EXPECT_GE(compared, 3);
}

}  // namespace
}  // namespace arbor
