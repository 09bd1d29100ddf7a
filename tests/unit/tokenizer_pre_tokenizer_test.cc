// The hand-written pre-tokenizers against the regex engine of HF tokenizers
// (tests/data/tokenizer/pretokenize_cases.json), plus coverage properties on invalid UTF-8.
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/unicode.h"
#include "tests/unit/tokenizer_test_util.h"

namespace arbor {
namespace {

using testing::escape;

std::vector<std::string> pieces_of(const PreTokenizer& pre, const std::string& text) {
  std::vector<std::string> pieces;
  for (const auto& [begin, end] : pre.split(text))
    pieces.push_back(text.substr(begin, end - begin));
  return pieces;
}

std::string join_escaped(const std::vector<std::string>& pieces) {
  std::string out;
  for (const std::string& p : pieces) out += "[" + escape(p) + "]";
  return out;
}

TEST(PreTokenizerTest, MatchesHfRegexSplits) {
  const nlohmann::json fixture =
      testing::read_json(testing::kTokenizerData + "/pretokenize_cases.json");
  int checked = 0;
  for (const auto& c : fixture["cases"]) {
    const std::string name = c["pre_tokenizer"], text = c["text"];
    const std::vector<std::string> want = c["pieces"];
    EXPECT_EQ(join_escaped(pieces_of(PreTokenizer::from_name(name), text)), join_escaped(want))
        << name << " on \"" << escape(text) << "\"";
    ++checked;
  }
  EXPECT_GT(checked, 150);
}

TEST(PreTokenizerTest, UnknownNameIsRefused) {
  try {
    PreTokenizer::from_name("falcon");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("falcon"), std::string::npos) << e.what();
  }
}

// Random bytes (mostly invalid UTF-8): pieces are non-empty, in order, and cover every byte.
TEST(PreTokenizerTest, PiecesCoverInvalidUtf8) {
  std::mt19937 rng(1234);
  static const char kAlphabet[] = "ab 1\n\t'\xc3\xa9\xe2\x96\x81\xf0\x9f\x98\x80\x80\xff";
  const std::string alphabet(kAlphabet, sizeof(kAlphabet) - 1);
  for (const std::string& name : PreTokenizer::known_names()) {
    const PreTokenizer pre = PreTokenizer::from_name(name);
    for (int trial = 0; trial < 300; ++trial) {
      std::string text;
      const int len = static_cast<int>(rng() % 40);
      for (int i = 0; i < len; ++i) {
        text.push_back(trial % 2 ? static_cast<char>(rng() & 0xff)
                                 : alphabet[rng() % alphabet.size()]);
      }
      uint32_t expected_begin = 0;
      for (const auto& [begin, end] : pre.split(text)) {
        ASSERT_EQ(begin, expected_begin) << name << " \"" << escape(text) << "\"";
        ASSERT_GT(end, begin);
        expected_begin = end;
      }
      ASSERT_EQ(expected_begin, text.size()) << name << " \"" << escape(text) << "\"";
    }
  }
}

// Spot checks of the generated tables (the full table is checked against tokenizers' regex
// engine by scripts/gen_unicode_tables.py --verify).
TEST(UnicodeTablesTest, ClassesOfKnownCodePoints) {
  using namespace unicode;
  EXPECT_EQ(codepoint_flags('A'), kLetter);
  EXPECT_EQ(codepoint_flags(0x4E2D), kLetter);  // 中
  EXPECT_EQ(codepoint_flags('7'), kNumber);
  EXPECT_EQ(codepoint_flags(0x0663), kNumber);  // ARABIC-INDIC DIGIT THREE
  EXPECT_EQ(codepoint_flags(0x2155), kNumber);  // VULGAR FRACTION ONE FIFTH (No)
  EXPECT_EQ(codepoint_flags(0x3000), kWhitespace);
  EXPECT_EQ(codepoint_flags(0x85), kWhitespace);
  EXPECT_EQ(codepoint_flags(0x1C), 0);    // str.isspace() but not White_Space
  EXPECT_EQ(codepoint_flags(0x200B), 0);  // ZERO WIDTH SPACE is Cf
  EXPECT_EQ(codepoint_flags(0x1F600), 0);
  EXPECT_EQ(codepoint_flags(0x10FFFF), 0);
  for (size_t i = 1; i < kNumCodepointRanges; ++i) {
    ASSERT_GT(kCodepointRanges[i].first, kCodepointRanges[i - 1].last) << i;
  }
}

TEST(UnicodeTest, LossyRepairMatchesPythonReplace) {
  using unicode::InvalidUtf8;
  auto repair = [](const std::string& bytes, InvalidUtf8 policy) {
    std::string out;
    EXPECT_EQ(unicode::append_utf8_lossy(bytes, true, policy, &out), bytes.size());
    return out;
  };
  // Python: b"...".decode("utf-8", "replace")
  EXPECT_EQ(repair("ok\xed\xa0\x80ok", InvalidUtf8::kMaximalSubpart), "ok\uFFFD\uFFFD\uFFFDok");
  EXPECT_EQ(repair("\xe2\x82"
                   "a",
                   InvalidUtf8::kMaximalSubpart),
            "\uFFFD"
            "a");
  EXPECT_EQ(repair("\xf0\x9f\x98", InvalidUtf8::kMaximalSubpart), "\uFFFD");
  EXPECT_EQ(repair("\xc0\xaf", InvalidUtf8::kMaximalSubpart), "\uFFFD\uFFFD");
  EXPECT_EQ(repair("\xf4\x90\x80\x80", InvalidUtf8::kMaximalSubpart), "\uFFFD\uFFFD\uFFFD\uFFFD");
  EXPECT_EQ(repair("\xe2\x82"
                   "a",
                   InvalidUtf8::kPerByte),
            "\uFFFD\uFFFD"
            "a");
  // An incomplete tail is held back unless final.
  std::string out;
  EXPECT_EQ(unicode::append_utf8_lossy("a\xf0\x9f", false, InvalidUtf8::kMaximalSubpart, &out), 1u);
  EXPECT_EQ(out, "a");
}

}  // namespace
}  // namespace arbor
