#include "engine/tokenizer/byte_level_alphabet.h"

#include <array>

#include "engine/tokenizer/unicode.h"

namespace arbor {
namespace {

struct Alphabet {
  std::array<uint32_t, 256> byte_to_cp{};
  std::array<int16_t, 512> cp_to_byte{};  // every alphabet code point is < 0x144

  Alphabet() {
    cp_to_byte.fill(-1);
    uint32_t next_extra = 0;
    for (uint32_t b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      byte_to_cp[b] = printable ? b : 256 + next_extra++;
      cp_to_byte[byte_to_cp[b]] = static_cast<int16_t>(b);
    }
  }
};

const Alphabet& alphabet() {
  static const Alphabet kAlphabet;
  return kAlphabet;
}

}  // namespace

uint32_t byte_to_alphabet_codepoint(uint8_t b) {
  return alphabet().byte_to_cp[b];
}

std::string bytes_to_alphabet(std::string_view bytes) {
  std::string out;
  out.reserve(bytes.size() * 2);
  for (char c : bytes) unicode::append_utf8(alphabet().byte_to_cp[static_cast<uint8_t>(c)], &out);
  return out;
}

std::optional<std::string> alphabet_to_bytes(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (const unicode::Utf8Char& ch : unicode::split_utf8(text)) {
    if (ch.cp >= alphabet().cp_to_byte.size() || alphabet().cp_to_byte[ch.cp] < 0) {
      return std::nullopt;
    }
    out.push_back(static_cast<char>(alphabet().cp_to_byte[ch.cp]));
  }
  return out;
}

}  // namespace arbor
