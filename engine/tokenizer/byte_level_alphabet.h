// The GPT-2 byte-to-unicode alphabet of byte-level BPE: each of the 256 bytes is written as one
// printable code point (printable Latin-1 bytes as themselves, the rest as U+0100 + n), so
// vocabularies and merges are text. Converts between raw bytes and that text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace arbor {

// The code point that stands for byte b.
uint32_t byte_to_alphabet_codepoint(uint8_t b);
// Raw bytes -> alphabet text (UTF-8).
std::string bytes_to_alphabet(std::string_view bytes);
// Alphabet text -> raw bytes; nullopt when some character is not in the alphabet.
std::optional<std::string> alphabet_to_bytes(std::string_view text);

}  // namespace arbor
