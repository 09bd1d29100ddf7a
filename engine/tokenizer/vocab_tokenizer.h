// The part of a Tokenizer common to both BPE kinds: the vocabulary, special / added tokens matched
// verbatim in text, BOS, and decoding. Subclasses (spm_tokenizer.cc, byte_level_tokenizer.cc)
// encode the text between special tokens and say what bytes a token stands for.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace arbor {

class VocabTokenizer : public Tokenizer {
 public:
  // Validates the parts of spec every kind uses (ids in range, sizes), naming bad values.
  explicit VocabTokenizer(TokenizerSpec spec);

  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;

  int32_t vocab_size() const override { return static_cast<int32_t>(spec_.tokens.size()); }
  int32_t bos_id() const override { return spec_.bos_id; }
  int32_t eos_id() const override { return spec_.eos_id; }
  bool is_special(int32_t id) const override;
  const TokenizerSpec& spec() const override { return spec_; }

 protected:
  // Appends the ids of a stretch of text that holds no special token. at_text_start: the
  // segment begins the encoded text (not after a special token).
  virtual void encode_segment(std::string_view segment, bool at_text_start,
                              std::vector<int32_t>* out) const = 0;

  TokenType type_of(int32_t id) const {
    return spec_.types.empty() ? TokenType::kNormal : spec_.types[static_cast<size_t>(id)];
  }
  // Throws kInvalidArgument for an id outside the vocabulary.
  void check_id(int32_t id) const;

  TokenizerSpec spec_;

 private:
  struct AddedToken {
    std::string text;
    int32_t id;
    bool special;  // matched only with parse_special (control / unknown tokens)
  };
  // Added tokens by first byte, longest first (leftmost-longest matching).
  std::array<std::vector<AddedToken>, 256> added_by_first_byte_;
};

std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerSpec spec);
std::unique_ptr<Tokenizer> make_byte_level_tokenizer(TokenizerSpec spec);

}  // namespace arbor
