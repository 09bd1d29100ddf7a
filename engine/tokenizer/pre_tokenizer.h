// Pre-tokenizers of byte-level BPE: split text into the pieces that merges stay within. Hand-
// written equivalents (as in llama.cpp's unicode.cpp) of the regexes HF tokenizers runs, so no
// regex engine is needed and invalid UTF-8 cannot break them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace arbor {

class PreTokenizer {
 public:
  // One splitting pass; a pre-tokenizer is a sequence of them, each refining the pieces of the
  // previous one (HF pre_tokenizers.Sequence).
  enum class Stage {
    kDigits,  // every \p{N} its own piece (HF Digits(individual_digits=True))
    kGpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
    kLlama3,  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|
              //  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
    kQwen2,   // as kLlama3 with \p{N} (single digits) for \p{N}{1,3}
  };

  // Named pre-tokenizers: "gpt2" {kGpt2}, "smollm" {kDigits, kGpt2} (StarCoder / SmolLM2),
  // "llama3" {kLlama3}, "qwen2" {kQwen2}. Throws kUnsupported naming an unknown one.
  static PreTokenizer from_name(const std::string& name);
  static bool is_known(const std::string& name);
  static const std::vector<std::string>& known_names();

  explicit PreTokenizer(std::vector<Stage> stages) : stages_(std::move(stages)) {}

  // Byte ranges [begin, end) of the pieces, in order, covering all of text. Invalid UTF-8
  // bytes are characters of no class (like punctuation).
  std::vector<std::pair<uint32_t, uint32_t>> split(std::string_view text) const;

 private:
  std::vector<Stage> stages_;
};

}  // namespace arbor
