#include "engine/tokenizer/vocab_tokenizer.h"

#include <algorithm>

#include "engine/core/error.h"

namespace arbor {

namespace {

void check_optional_id(const char* field, int32_t id, size_t vocab) {
  if (id < -1 || id >= static_cast<int64_t>(vocab)) {
    throw_error(ErrorCode::kInvalidArgument,
                std::string("tokenizer spec: ") + field + " is " + std::to_string(id) +
                    ", expected -1 or an id below " + std::to_string(vocab));
  }
}

}  // namespace

VocabTokenizer::VocabTokenizer(TokenizerSpec spec) : spec_(std::move(spec)) {
  const size_t n = spec_.tokens.size();
  if (n == 0) throw_error(ErrorCode::kInvalidArgument, "tokenizer spec: no tokens");
  if (n > static_cast<size_t>(INT32_MAX)) {
    throw_error(ErrorCode::kInvalidArgument,
                "tokenizer spec: " + std::to_string(n) + " tokens is too many");
  }
  if (!spec_.types.empty() && spec_.types.size() != n) {
    throw_error(ErrorCode::kInvalidArgument,
                "tokenizer spec: " + std::to_string(n) + " tokens but " +
                    std::to_string(spec_.types.size()) + " token types");
  }
  check_optional_id("bos_id", spec_.bos_id, n);
  check_optional_id("eos_id", spec_.eos_id, n);
  check_optional_id("unk_id", spec_.unk_id, n);
  check_optional_id("pad_id", spec_.pad_id, n);

  for (size_t id = 0; id < n; ++id) {
    const TokenType type = type_of(static_cast<int32_t>(id));
    const std::string& text = spec_.tokens[id];
    if (text.empty()) continue;
    const bool special = type == TokenType::kControl || type == TokenType::kUnknown;
    if (special || type == TokenType::kUserDefined) {
      added_by_first_byte_[static_cast<uint8_t>(text[0])].push_back(
          {text, static_cast<int32_t>(id), special});
    }
  }
  for (auto& bucket : added_by_first_byte_) {
    std::stable_sort(bucket.begin(), bucket.end(), [](const AddedToken& a, const AddedToken& b) {
      return a.text.size() > b.text.size();
    });
  }
}

void VocabTokenizer::check_id(int32_t id) const {
  if (id < 0 || id >= vocab_size()) {
    throw_error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                 " is outside the vocabulary [0, " +
                                                 std::to_string(vocab_size()) + ")");
  }
}

bool VocabTokenizer::is_special(int32_t id) const {
  if (id < 0 || id >= vocab_size()) return false;
  const TokenType type = type_of(id);
  return type == TokenType::kControl || type == TokenType::kUnknown;
}

std::vector<int32_t> VocabTokenizer::encode(std::string_view text, bool add_bos,
                                            bool parse_special) const {
  std::vector<int32_t> ids;
  ids.reserve(text.size() / 3 + 2);
  if (add_bos && spec_.add_bos && spec_.bos_id >= 0) ids.push_back(spec_.bos_id);
  size_t segment_start = 0;
  size_t i = 0;
  while (i < text.size()) {
    const AddedToken* match = nullptr;
    for (const AddedToken& token : added_by_first_byte_[static_cast<uint8_t>(text[i])]) {
      if ((parse_special || !token.special) && text.substr(i, token.text.size()) == token.text) {
        match = &token;
        break;
      }
    }
    if (match == nullptr) {
      ++i;
      continue;
    }
    if (i > segment_start) {
      encode_segment(text.substr(segment_start, i - segment_start), segment_start == 0, &ids);
    }
    ids.push_back(match->id);
    i += match->text.size();
    segment_start = i;
  }
  if (text.size() > segment_start) {
    encode_segment(text.substr(segment_start), segment_start == 0, &ids);
  }
  return ids;
}

std::string VocabTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  IncrementalDecoder decoder(*this, skip_special);
  std::string text;
  for (int32_t id : ids) text += decoder.push(id);
  text += decoder.finish();
  return text;
}

}  // namespace arbor
