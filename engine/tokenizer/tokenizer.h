// Text <-> token ids. One interface over SentencePiece-style BPE and byte-level BPE; construct
// from a TokenizerSpec (see the loaders in tokenizer_loaders.h).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer_spec.h"

namespace arbor {

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  static std::unique_ptr<Tokenizer> create(TokenizerSpec spec);

  // Encodes text. add_bos prepends BOS when the tokenizer has one and spec.add_bos is set;
  // parse_special matches special/added token strings ("<|im_start|>") to their ids.
  virtual std::vector<int32_t> encode(std::string_view text, bool add_bos,
                                      bool parse_special) const = 0;
  // The raw bytes one token stands for (byte-fallback and byte-level tokens decoded). May be a
  // partial UTF-8 sequence.
  virtual std::string token_bytes(int32_t id) const = 0;
  // Decodes a whole sequence (special tokens omitted when skip_special).
  virtual std::string decode(const std::vector<int32_t>& ids, bool skip_special) const = 0;

  virtual int32_t vocab_size() const = 0;
  virtual int32_t bos_id() const = 0;
  virtual int32_t eos_id() const = 0;
  virtual bool is_special(int32_t id) const = 0;
  virtual const TokenizerSpec& spec() const = 0;
};

// Incremental detokenizer: feed ids one at a time, get back only complete UTF-8 text; bytes of
// a character split across tokens are held until the character completes.
class IncrementalDecoder {
 public:
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = true);
  // Returns the newly completed text (possibly empty).
  std::string push(int32_t id);
  // Flushes what is left at end of stream (incomplete bytes become U+FFFD).
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool first_ = true;
  std::string pending_;
};

}  // namespace arbor
