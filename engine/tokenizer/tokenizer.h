// Text <-> token ids. One interface over SentencePiece-style BPE and byte-level BPE; construct
// from a TokenizerSpec (see the loaders in tokenizer_loaders.h). Encoding never fails on
// invalid UTF-8: stray bytes go through byte fallback (SentencePiece) or the byte alphabet.
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

  // Throws kInvalidArgument / kCorruptData / kUnsupported naming what is wrong with the spec.
  static std::unique_ptr<Tokenizer> create(TokenizerSpec spec);

  // Encodes text. add_bos prepends BOS when the tokenizer has one and spec.add_bos is set;
  // parse_special matches special token strings ("<|im_start|>") to their ids, longest first;
  // user-defined (non-special added) tokens are matched always, as HF tokenizers does.
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
  // Control and unknown tokens (HF special added tokens): omitted by decode with skip_special.
  virtual bool is_special(int32_t id) const = 0;
  virtual const TokenizerSpec& spec() const = 0;
};

// Incremental detokenizer: feed ids one at a time, get back only complete UTF-8 text; bytes of
// a character split across tokens are held until the character completes. The pieces joined
// equal Tokenizer::decode of the whole sequence: SentencePiece's dummy-prefix space is dropped
// from the first token that has text, and bytes that can never form UTF-8 become U+FFFD (one
// per byte for SentencePiece byte pieces, one per maximal bad subpart for byte-level BPE, as
// SentencePiece and HF's ByteLevel decoder do).
class IncrementalDecoder {
 public:
  // at_text_start false: the ids continue earlier text (a prompt), so the first token keeps
  // its leading space ("Once upon a" + " time" for a completion).
  explicit IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special = true,
                              bool at_text_start = true);
  // Returns the newly completed text (possibly empty). Throws kInvalidArgument for an id
  // outside the vocabulary.
  std::string push(int32_t id);
  // Flushes what is left at end of stream (incomplete bytes become U+FFFD); the decoder can
  // then start a new stream (at the start of a text).
  std::string finish();

 private:
  const Tokenizer& tokenizer_;
  bool skip_special_;
  bool strip_first_space_;  // SentencePiece with add_space_prefix
  bool first_ = true;       // no token with text seen yet
  std::string pending_;     // bytes of an incomplete UTF-8 character
};

}  // namespace arbor
