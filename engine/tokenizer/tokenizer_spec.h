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
  kControl = 3,       // special: <s>, </s>, <|im_start|> ...
  kUserDefined = 4,   // added tokens matched verbatim in text
  kUnused = 5,
  kByte = 6,          // <0xAB> byte-fallback pieces
};

struct TokenizerSpec {
  TokenizerKind kind = TokenizerKind::kSentencePieceBpe;
  std::vector<std::string> tokens;  // id -> piece, in the model's own alphabet
  std::vector<float> scores;        // SentencePiece merge scores (empty for byte-level)
  std::vector<TokenType> types;     // id -> type (empty: all normal)
  std::vector<std::string> merges;  // byte-level BPE merges "a b", rank = index
  // Pre-tokenizer for byte-level BPE: "gpt2", "llama3", "qwen2", "smollm" ... or a raw regex
  // string from tokenizer.json (recognised patterns only).
  std::string pre_tokenizer = "gpt2";
  int32_t bos_id = -1;  // -1: none
  int32_t eos_id = -1;
  int32_t unk_id = -1;
  int32_t pad_id = -1;
  bool add_bos = true;        // prepend BOS when encoding a prompt
  bool add_space_prefix = true;  // SentencePiece "add dummy prefix"
  std::string chat_template;  // Jinja source, may be empty
};

}  // namespace arbor
