#include "engine/tokenizer/pre_tokenizer.h"

#include "engine/core/error.h"
#include "engine/tokenizer/unicode.h"

namespace arbor {
namespace {

using unicode::Utf8Char;

// A view of one piece's characters; positions past the end have no class, so the regex
// lookahead (?!\S) sees the piece end as the end of text (HF splits each piece separately).
class Chars {
 public:
  Chars(const Utf8Char* chars, size_t n) : chars_(chars), n_(n) {}
  size_t size() const { return n_; }
  uint32_t cp(size_t i) const { return i < n_ ? chars_[i].cp : 0; }
  uint8_t flags(size_t i) const {
    if (i >= n_ || chars_[i].cp == unicode::kInvalidCodepoint) return 0;
    return unicode::codepoint_flags(chars_[i].cp);
  }
  bool letter(size_t i) const { return flags(i) & unicode::kLetter; }
  bool number(size_t i) const { return flags(i) & unicode::kNumber; }
  bool space(size_t i) const { return flags(i) & unicode::kWhitespace; }
  // [^\s\p{L}\p{N}]
  bool other(size_t i) const { return i < n_ && flags(i) == 0; }
  bool crlf(size_t i) const { return cp(i) == '\r' || cp(i) == '\n'; }

 private:
  const Utf8Char* chars_;
  size_t n_;
};

// Lower-cases the letters of the English contractions; with case_insensitive, also their
// Unicode case-fold partners (U+017F LATIN SMALL LETTER LONG S folds to 's').
uint32_t contraction_letter(uint32_t cp, bool case_insensitive) {
  if (!case_insensitive) return cp;
  if (cp >= 'A' && cp <= 'Z') return cp - 'A' + 'a';
  if (cp == 0x17F) return 's';
  return cp;
}

// Length (in chars) of 's|'t|'re|'ve|'m|'ll|'d at i, or 0.
size_t contraction_at(const Chars& c, size_t i, bool case_insensitive) {
  if (c.cp(i) != '\'' || i + 1 >= c.size()) return 0;
  const uint32_t a = contraction_letter(c.cp(i + 1), case_insensitive);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (i + 2 >= c.size()) return 0;
  const uint32_t b = contraction_letter(c.cp(i + 2), case_insensitive);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// The whitespace alternatives shared by all patterns: \s+(?!\S)|\s+ at i (c.space(i)).
size_t trailing_space_run(const Chars& c, size_t i) {
  size_t k = i;
  while (c.space(k)) ++k;
  if (k == c.size()) return k - i;  // the run ends the text: take it all
  if (k - 1 > i) return k - 1 - i;  // leave the last space to prefix the next word
  return 1;
}

// Length of the next gpt2 piece at i.
size_t gpt2_piece(const Chars& c, size_t i) {
  if (size_t len = contraction_at(c, i, false)) return len;
  size_t j = c.cp(i) == ' ' ? i + 1 : i;  // the optional leading space
  if (c.letter(j)) {
    while (c.letter(j)) ++j;
    return j - i;
  }
  if (c.number(j)) {
    while (c.number(j)) ++j;
    return j - i;
  }
  if (c.other(j)) {
    while (c.other(j)) ++j;
    return j - i;
  }
  if (c.space(i)) return trailing_space_run(c, i);
  return 1;  // unreachable: every character is a letter, number, space or other
}

// Length of the next llama3 (max_digits 3) or qwen2 (max_digits 1) piece at i.
size_t llama3_piece(const Chars& c, size_t i, size_t max_digits) {
  if (size_t len = contraction_at(c, i, true)) return len;
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!c.crlf(i) && !c.letter(i) && !c.number(i) && c.letter(i + 1)) {
    size_t j = i + 1;
    while (c.letter(j)) ++j;
    return j - i;
  }
  if (c.letter(i)) {
    size_t j = i;
    while (c.letter(j)) ++j;
    return j - i;
  }
  // \p{N}{1,max_digits}
  if (c.number(i)) {
    size_t j = i;
    while (c.number(j) && j - i < max_digits) ++j;
    return j - i;
  }
  //  ?[^\s\p{L}\p{N}]+[\r\n]*
  size_t j = c.cp(i) == ' ' ? i + 1 : i;
  if (c.other(j)) {
    while (c.other(j)) ++j;
    while (c.crlf(j)) ++j;
    return j - i;
  }
  if (c.space(i)) {
    // \s*[\r\n]+ : up to and including the last line break of the whitespace run
    size_t k = i;
    size_t end = 0;
    while (c.space(k)) {
      if (c.crlf(k)) end = k + 1;
      ++k;
    }
    if (end > 0) return end - i;
    return trailing_space_run(c, i);
  }
  return 1;
}

}  // namespace

const std::vector<std::string>& PreTokenizer::known_names() {
  static const std::vector<std::string> kNames = {"gpt2", "smollm", "llama3", "qwen2"};
  return kNames;
}

bool PreTokenizer::is_known(const std::string& name) {
  for (const std::string& n : known_names()) {
    if (n == name) return true;
  }
  return false;
}

PreTokenizer PreTokenizer::from_name(const std::string& name) {
  if (name == "gpt2") return PreTokenizer({Stage::kGpt2});
  if (name == "smollm") return PreTokenizer({Stage::kDigits, Stage::kGpt2});
  if (name == "llama3") return PreTokenizer({Stage::kLlama3});
  if (name == "qwen2") return PreTokenizer({Stage::kQwen2});
  throw_error(ErrorCode::kUnsupported, "unknown byte-level pre-tokenizer '" + name +
                                           "' (known: gpt2, smollm, llama3, qwen2)");
}

std::vector<std::pair<uint32_t, uint32_t>> PreTokenizer::split(std::string_view text) const {
  const std::vector<Utf8Char> chars = unicode::split_utf8(text);
  // Pieces as character index ranges.
  std::vector<std::pair<size_t, size_t>> pieces;
  if (!chars.empty()) pieces.emplace_back(0, chars.size());
  for (Stage stage : stages_) {
    std::vector<std::pair<size_t, size_t>> next;
    next.reserve(pieces.size() * 2);
    for (const auto& [begin, end] : pieces) {
      const Chars c(chars.data() + begin, end - begin);
      size_t i = 0;
      while (i < c.size()) {
        size_t len = 0;
        switch (stage) {
          case Stage::kDigits:
            if (c.number(i)) {
              len = 1;
            } else {
              while (i + len < c.size() && !c.number(i + len)) ++len;
            }
            break;
          case Stage::kGpt2:
            len = gpt2_piece(c, i);
            break;
          case Stage::kLlama3:
            len = llama3_piece(c, i, 3);
            break;
          case Stage::kQwen2:
            len = llama3_piece(c, i, 1);
            break;
        }
        ARBOR_CHECK(len > 0 && i + len <= c.size(), "pre-tokenizer made no progress");
        next.emplace_back(begin + i, begin + i + len);
        i += len;
      }
    }
    pieces = std::move(next);
  }
  std::vector<std::pair<uint32_t, uint32_t>> ranges;
  ranges.reserve(pieces.size());
  for (const auto& [begin, end] : pieces) {
    ranges.emplace_back(chars[begin].offset, chars[end - 1].offset + chars[end - 1].len);
  }
  return ranges;
}

}  // namespace arbor
