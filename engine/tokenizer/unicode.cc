#include "engine/tokenizer/unicode.h"

#include <algorithm>

namespace arbor::unicode {

uint8_t codepoint_flags(uint32_t cp) {
  const CodepointRange* end = kCodepointRanges + kNumCodepointRanges;
  // First range whose last >= cp.
  const CodepointRange* it = std::lower_bound(
      kCodepointRanges, end, cp, [](const CodepointRange& r, uint32_t c) { return r.last < c; });
  if (it == end || it->first > cp) return 0;
  return it->flags;
}

int utf8_sequence_length(std::string_view bytes) {
  if (bytes.empty()) return 0;
  const auto b0 = static_cast<uint8_t>(bytes[0]);
  if (b0 < 0x80) return 1;
  int need;
  uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 2;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 3;
    if (b0 == 0xE0) lo = 0xA0;  // no overlong forms
    if (b0 == 0xED) hi = 0x9F;  // no surrogates
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 4;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;  // nothing above U+10FFFF
  } else {
    return 0;
  }
  const int have = static_cast<int>(std::min<size_t>(bytes.size(), static_cast<size_t>(need)));
  for (int i = 1; i < have; ++i) {
    const auto b = static_cast<uint8_t>(bytes[static_cast<size_t>(i)]);
    const uint8_t min = i == 1 ? lo : 0x80, max = i == 1 ? hi : 0xBF;
    if (b < min || b > max) return 0;
  }
  return have == need ? need : -have;
}

static uint32_t decode_sequence(std::string_view s, int len) {
  const auto b = [&](int i) { return static_cast<uint32_t>(static_cast<uint8_t>(s[i])); };
  switch (len) {
    case 1:
      return b(0);
    case 2:
      return ((b(0) & 0x1F) << 6) | (b(1) & 0x3F);
    case 3:
      return ((b(0) & 0x0F) << 12) | ((b(1) & 0x3F) << 6) | (b(2) & 0x3F);
    default:
      return ((b(0) & 0x07) << 18) | ((b(1) & 0x3F) << 12) | ((b(2) & 0x3F) << 6) | (b(3) & 0x3F);
  }
}

std::vector<Utf8Char> split_utf8(std::string_view text) {
  std::vector<Utf8Char> chars;
  chars.reserve(text.size());
  size_t i = 0;
  while (i < text.size()) {
    const int len = utf8_sequence_length(text.substr(i));
    if (len > 0) {
      chars.push_back({decode_sequence(text.substr(i), len), static_cast<uint32_t>(i),
                       static_cast<uint32_t>(len)});
      i += static_cast<size_t>(len);
    } else {
      chars.push_back({kInvalidCodepoint, static_cast<uint32_t>(i), 1});
      ++i;
    }
  }
  return chars;
}

void append_utf8(uint32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

size_t append_utf8_lossy(std::string_view bytes, bool final, InvalidUtf8 policy, std::string* out) {
  size_t i = 0;
  while (i < bytes.size()) {
    const std::string_view rest = bytes.substr(i);
    const int len = utf8_sequence_length(rest);
    if (len > 0) {
      out->append(rest.substr(0, static_cast<size_t>(len)));
      i += static_cast<size_t>(len);
      continue;
    }
    if (len < 0 && !final) break;  // may still complete
    // A bad subpart: the valid prefix (at least the first byte) that cannot complete.
    size_t bad = 1;
    if (len < 0) {
      bad = static_cast<size_t>(-len);
    } else {
      while (bad < rest.size() && utf8_sequence_length(rest.substr(0, bad + 1)) < 0) ++bad;
    }
    const size_t replacements = policy == InvalidUtf8::kPerByte ? bad : 1;
    for (size_t r = 0; r < replacements; ++r) append_utf8(kReplacementCharacter, out);
    i += bad;
  }
  return i;
}

}  // namespace arbor::unicode
