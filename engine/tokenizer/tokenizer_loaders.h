// Loaders that turn a tokenizer file into a TokenizerSpec: llama2.c tokenizer.bin, HF
// tokenizer.json (+ tokenizer_config.json), and GGUF tokenizer.ggml.* metadata. Each throws
// arbor::Error naming the file and field when the input is missing, malformed or unsupported.
#pragma once

#include <cstdint>
#include <string>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer_spec.h"

namespace arbor {

// llama2.c tokenizer.bin (e.g. tok512.bin): int32 max_token_length, then per token float32
// score, int32 length, bytes. Spaces become "▁"; "\n<s>\n" / "\n</s>\n" are named <s> / </s>
// (BOS / EOS), "<unk>" is the unknown token, <0xXX> pieces are byte fallback. vocab_size -1
// reads tokens until the end of the file; otherwise exactly that many must be present.
TokenizerSpec load_llama2c_tokenizer(const std::string& path, int32_t vocab_size = -1);

// HF tokenizers tokenizer.json (a directory holding it, or the file itself): model type BPE,
// either byte-level (ByteLevel pre-tokenizer, alone or after Digits / a Split with a known
// regex) or SentencePiece-style (Prepend/Replace normalizer or Metaspace, byte_fallback).
// tokenizer_config.json (and chat_template.jinja) beside it give chat_template, bos/eos/unk/pad
// tokens and add_bos_token.
TokenizerSpec load_hf_tokenizer(const std::string& dir_or_file);

// GGUF metadata as GgufFile::metadata() returns it: tokenizer.ggml.model "llama" (SentencePiece
// BPE with scores) or "gpt2" (byte-level BPE with merges), tokens, token_type, tokenizer.ggml.pre,
// special token ids, add_bos_token, add_space_prefix, tokenizer.chat_template.
TokenizerSpec tokenizer_spec_from_gguf(const nlohmann::json& metadata);

}  // namespace arbor
