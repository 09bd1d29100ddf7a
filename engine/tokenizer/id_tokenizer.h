// The tokenizer of a model that has none (dummy:... random-weight models): requests bring token
// ids, and generated ids come back as text " <id>" so that streams carry something per token.
// Encoding text is refused with a message that says to send token ids.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "engine/tokenizer/tokenizer.h"

namespace arbor {

class IdTokenizer : public Tokenizer {
 public:
  // model_name names the model in the refusal message; bos_id / eos_id (-1: none) are the
  // model's special ids, omitted by decode with skip_special.
  IdTokenizer(std::string model_name, int32_t vocab_size, int32_t bos_id, int32_t eos_id);

  // Throws kInvalidArgument: this model takes token-id prompts only.
  std::vector<int32_t> encode(std::string_view text, bool add_bos,
                              bool parse_special) const override;
  // " <id>" ("<bos>" / "<eos>" for the special ids). Throws kInvalidArgument outside the vocab.
  std::string token_bytes(int32_t id) const override;
  std::string decode(const std::vector<int32_t>& ids, bool skip_special) const override;

  int32_t vocab_size() const override { return vocab_size_; }
  int32_t bos_id() const override { return spec_.bos_id; }
  int32_t eos_id() const override { return spec_.eos_id; }
  bool is_special(int32_t id) const override;
  const TokenizerSpec& spec() const override { return spec_; }

 private:
  std::string model_name_;
  int32_t vocab_size_;
  TokenizerSpec spec_;  // no tokens, no chat template, add_bos false
};

}  // namespace arbor
