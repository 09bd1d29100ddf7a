// Incremental detokenization: characters split over byte tokens are held until complete, the
// SentencePiece dummy-prefix space is dropped once per stream, bad bytes become U+FFFD, and bad
// ids are refused. Expected text comes from the reference fixtures or is spelled out.
#include <memory>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/model/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_loaders.h"
#include "tests/unit/tokenizer_test_util.h"

namespace arbor {
namespace {

using testing::escape;

std::unique_ptr<Tokenizer> tok512() {
  return Tokenizer::create(load_llama2c_tokenizer(testing::kTok512Path));
}

// tok512 byte pieces <0xXX> are ids 3 + XX (README of stories260K).
int32_t byte_piece(int byte) {
  return 3 + byte;
}

TEST(IncrementalDecoderTest, EmojiSplitOverByteTokensIsHeldUntilComplete) {
  auto tokenizer = tok512();
  IncrementalDecoder decoder(*tokenizer);
  const std::string emoji = "\xF0\x9F\x98\x80";  // U+1F600, not in tok512's vocabulary
  EXPECT_EQ(decoder.push(byte_piece(0xF0)), "");
  EXPECT_EQ(decoder.push(byte_piece(0x9F)), "");
  EXPECT_EQ(decoder.push(byte_piece(0x98)), "");
  EXPECT_EQ(decoder.push(byte_piece(0x80)), emoji);
  EXPECT_EQ(decoder.finish(), "");
  // And the encoder produces exactly those byte pieces after the dummy prefix "▁".
  const std::vector<int32_t> ids = tokenizer->encode(emoji, false, false);
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(tokenizer->token_bytes(ids[0]), " ");
  EXPECT_EQ(ids[4], byte_piece(0x80));
}

TEST(IncrementalDecoderTest, DummyPrefixSpaceDroppedOncePerStream) {
  auto tokenizer = tok512();
  const std::vector<int32_t> ids = tokenizer->encode("Once upon a time", true, false);
  ASSERT_EQ(ids[0], tokenizer->bos_id());
  IncrementalDecoder decoder(*tokenizer);
  std::string first_stream;
  for (int32_t id : ids) first_stream += decoder.push(id);
  first_stream += decoder.finish();
  EXPECT_EQ(first_stream, "Once upon a time");
  std::string second_stream;  // finish() starts a new stream
  for (int32_t id : ids) second_stream += decoder.push(id);
  EXPECT_EQ(second_stream + decoder.finish(), "Once upon a time");
}

// Streaming a completion after its prompt: the continuation is the reference decoding of the
// whole text minus the prompt's, leading space included.
TEST(IncrementalDecoderTest, ContinuationKeepsItsLeadingSpace) {
  auto tokenizer = tok512();
  const nlohmann::json fixture = testing::read_json(testing::kTokenizerData + "/tok512_cases.json");
  int checked = 0;
  for (const auto& c : fixture["cases"]) {
    const std::vector<int32_t> ids = testing::ids_of(c["ids"]);
    const std::string full = c["decoded"];
    if (ids.size() < 4 || c["ids"] != c["ids_special"]) continue;
    const size_t split = ids.size() / 2;
    const std::string prompt =
        tokenizer->decode(std::vector<int32_t>(ids.begin(), ids.begin() + split), false);
    if (full.compare(0, prompt.size(), prompt) != 0) continue;  // split inside a character
    IncrementalDecoder decoder(*tokenizer, false, /*at_text_start=*/false);
    std::string continuation;
    for (size_t i = split; i < ids.size(); ++i) continuation += decoder.push(ids[i]);
    continuation += decoder.finish();
    EXPECT_EQ(escape(prompt + continuation), escape(full));
    ++checked;
  }
  EXPECT_GT(checked, 20);
}

TEST(IncrementalDecoderTest, BadBytesBecomeReplacementCharacters) {
  auto tokenizer = tok512();
  IncrementalDecoder decoder(*tokenizer);
  EXPECT_EQ(decoder.push(byte_piece(0xE2)), "");
  EXPECT_EQ(decoder.push(byte_piece(0x82)), "");
  // "▁a" (id 261) ends the sequence: SentencePiece writes one U+FFFD per bad byte piece.
  EXPECT_EQ(decoder.push(261), "\uFFFD\uFFFD a");
  // A truncated character at the end of the stream.
  EXPECT_EQ(decoder.push(byte_piece(0xE4)), "");
  EXPECT_EQ(decoder.finish(), "\uFFFD");
}

TEST(IncrementalDecoderTest, SpecialTokensSkippedOrSpelled) {
  auto tokenizer = tok512();
  const std::vector<int32_t> ids = {tokenizer->bos_id(), 261, tokenizer->eos_id()};
  IncrementalDecoder skipping(*tokenizer, true);
  std::string text;
  for (int32_t id : ids) text += skipping.push(id);
  EXPECT_EQ(text + skipping.finish(), "a");
  IncrementalDecoder spelling(*tokenizer, false);
  text.clear();
  for (int32_t id : ids) text += spelling.push(id);
  EXPECT_EQ(text + spelling.finish(), "<s> a</s>");  // as HF decodes it
}

TEST(IncrementalDecoderTest, IdsOutsideTheVocabularyAreRefused) {
  auto tokenizer = tok512();
  IncrementalDecoder decoder(*tokenizer);
  for (int32_t id : {-1, 512, 1 << 30}) {
    try {
      decoder.push(id);
      FAIL() << "expected an error for id " << id;
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::to_string(id)), std::string::npos) << e.what();
    }
  }
  EXPECT_THROW(tokenizer->decode({1, 600}, false), Error);
  EXPECT_THROW(tokenizer->token_bytes(-3), Error);
}

// SmolLM2: every chunk of a streamed multilingual text is valid UTF-8 and the chunks join to the
// text (byte-level BPE is lossless on valid UTF-8).
TEST(IncrementalDecoderTest, SmolLmStreamsMultilingualTextLosslessly) {
  ASSERT_TRUE(testing::file_exists(testing::kSmolLmGguf)) << "missing " << testing::kSmolLmGguf;
  auto tokenizer =
      Tokenizer::create(tokenizer_spec_from_gguf(GgufFile::open(testing::kSmolLmGguf).metadata()));
  const std::string text =
      "\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C \xF0\x9F\xA4\x96\xF0\x9F\xA7\xA0 caf\xC3\xA9 "
      "\xED\x95\x9C\xEA\xB5\xAD\xEC\x96\xB4\n\tcode();  ";
  const std::vector<int32_t> ids = tokenizer->encode(text, false, false);
  IncrementalDecoder decoder(*tokenizer);
  std::string joined;
  int empty_chunks = 0;
  for (int32_t id : ids) {
    const std::string chunk = decoder.push(id);
    ASSERT_TRUE(testing::is_valid_utf8(chunk)) << escape(chunk);
    empty_chunks += chunk.empty();
    joined += chunk;
  }
  joined += decoder.finish();
  EXPECT_EQ(escape(joined), escape(text));
  EXPECT_GT(empty_chunks, 0) << "some CJK / emoji characters should span several tokens";
}

// Random byte strings: encoding never fails, and the tokens spell the bytes back exactly
// (after SentencePiece's dummy-prefix space).
TEST(TokenizerRobustnessTest, RandomBytesEncodeLosslessly) {
  auto spm = tok512();
  auto byte_level = Tokenizer::create(load_hf_tokenizer(testing::kTokenizerData + "/bpe_llama3"));
  uint32_t state = 42;
  auto next = [&] {
    state = state * 1664525u + 1013904223u;
    return state >> 24;
  };
  for (int trial = 0; trial < 300; ++trial) {
    std::string text;
    const int len = static_cast<int>(next() % 50);
    for (int i = 0; i < len; ++i) text.push_back(static_cast<char>(next()));
    for (const Tokenizer* t : {spm.get(), byte_level.get()}) {
      std::vector<int32_t> ids;
      ASSERT_NO_THROW(ids = t->encode(text, false, false)) << escape(text);
      std::string spelled;
      for (int32_t id : ids) spelled += t->token_bytes(id);
      const bool spm_kind = t->spec().kind == TokenizerKind::kSentencePieceBpe;
      const std::string want = spm_kind && !text.empty() ? " " + text : text;
      ASSERT_EQ(escape(spelled), escape(want));
      ASSERT_TRUE(testing::is_valid_utf8(t->decode(ids, false)));
    }
  }
}

}  // namespace
}  // namespace arbor
