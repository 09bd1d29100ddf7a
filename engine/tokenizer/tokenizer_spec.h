// Plain data describing a tokenizer, independent of the file it came from (llama2.c tok512.bin,
// GGUF `tokenizer.ggml.*` metadata, HF tokenizer.json). Loaders fill it; Tokenizer::create
// builds the matching algorithm.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace arbor {

enum class TokenizerKind {
  kSentencePieceBpe,  // score-ordered merges, "▁" for space, byte fallback <0xXX>
  kByteLevelBpe,      // GPT-2 byte-to-unicode alphabet, ranked merges, regex pre-tokenizer
};

// Per-token type, as GGUF's tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  kUndefined = 0,
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,      // special: <s>, </s>, <|im_start|> ...
  kUserDefined = 4,  // added tokens matched verbatim in text
  kUnused = 5,
  kByte = 6,  // <0xAB> byte-fallback pieces
};

// Where SentencePiece-style BPE puts the dummy-prefix "▁" (with add_space_prefix).
enum class SpacePrefixMode {
  // Before every stretch of text between special tokens: SentencePiece, llama.cpp, and HF's
  // legacy Prepend("▁") normalizer.
  kEverySegment,
  // HF Metaspace prepend_scheme "first": only at the start of the text, unless it already
  // starts with a space.
  kMetaspaceFirst,
  // HF Metaspace prepend_scheme "always": every stretch that does not start with a space.
  kMetaspaceAlways,
};

struct TokenizerSpec {
  TokenizerKind kind = TokenizerKind::kSentencePieceBpe;
  std::vector<std::string> tokens;  // id -> piece, in the model's own alphabet
  std::vector<float> scores;        // SentencePiece merge scores (empty for byte-level)
  std::vector<TokenType> types;     // id -> type (empty: all normal)
  // BPE merges "a b" (pieces in the model's alphabet), rank = index. Byte-level BPE needs them;
  // for SentencePiece-style BPE they replace score order when present (HF tokenizer.json).
  std::vector<std::string> merges;
  // Pre-tokenizer for byte-level BPE: "gpt2", "smollm" (digits split one by one, then gpt2),
  // "llama3", "qwen2" (see pre_tokenizer.h). Loaders map tokenizer.json regexes and GGUF
  // tokenizer.ggml.pre values onto these names.
  std::string pre_tokenizer = "gpt2";
  // A pre-token that is already a vocabulary entry is kept whole (HF BPE ignore_merges, Llama 3).
  bool ignore_merges = false;
  int32_t bos_id = -1;  // -1: none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = true;  // prepend BOS when encoding a prompt
  // SentencePiece "add dummy prefix": a "▁" before the text (where: space_prefix_mode);
  // decoding drops the first token's leading space.
  bool add_space_prefix = true;
  SpacePrefixMode space_prefix_mode = SpacePrefixMode::kEverySegment;
  std::string chat_template;  // Jinja source, may be empty
};

}  // namespace arbor
