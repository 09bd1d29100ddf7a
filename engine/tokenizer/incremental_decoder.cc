#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/unicode.h"

namespace arbor {
namespace {

unicode::InvalidUtf8 policy_of(const Tokenizer& tokenizer) {
  return tokenizer.spec().kind == TokenizerKind::kSentencePieceBpe
             ? unicode::InvalidUtf8::kPerByte
             : unicode::InvalidUtf8::kMaximalSubpart;
}

}  // namespace

IncrementalDecoder::IncrementalDecoder(const Tokenizer& tokenizer, bool skip_special,
                                       bool at_text_start)
    : tokenizer_(tokenizer),
      skip_special_(skip_special),
      strip_first_space_(tokenizer.spec().kind == TokenizerKind::kSentencePieceBpe &&
                         tokenizer.spec().add_space_prefix),
      first_(at_text_start) {}

std::string IncrementalDecoder::push(int32_t id) {
  std::string bytes = tokenizer_.token_bytes(id);  // throws for a bad id
  if (skip_special_ && tokenizer_.is_special(id)) return {};
  if (bytes.empty()) return {};
  if (first_) {
    first_ = false;
    if (strip_first_space_ && bytes[0] == ' ') bytes.erase(0, 1);
  }
  pending_ += bytes;
  std::string text;
  const size_t consumed = unicode::append_utf8_lossy(pending_, false, policy_of(tokenizer_), &text);
  pending_.erase(0, consumed);
  return text;
}

std::string IncrementalDecoder::finish() {
  std::string text;
  unicode::append_utf8_lossy(pending_, true, policy_of(tokenizer_), &text);
  pending_.clear();
  first_ = true;
  return text;
}

}  // namespace arbor
