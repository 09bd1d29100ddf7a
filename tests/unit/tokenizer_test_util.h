// Helpers shared by the tokenizer tests: reading the committed reference fixtures
// (tests/data/tokenizer, made by scripts/make_tokenizer_fixtures.py) and printing byte strings.
#pragma once

#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

namespace arbor::testing {

inline const std::string kTokenizerData = std::string(ARBOR_TEST_DATA_DIR) + "/tokenizer";
inline const std::string kTok512Path =
    std::string(ARBOR_SHARED_DIR) + "/models/stories260K/tok512.bin";
inline const std::string kSmolLmGguf =
    std::string(ARBOR_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";

// Reads a JSON file; a missing file fails the test with the path (never skips).
inline nlohmann::json read_json(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    ADD_FAILURE() << "missing file " << path
                  << " (regenerate with scripts/make_tokenizer_fixtures.py)";
    return nlohmann::json::object();
  }
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  return nlohmann::json::parse(text);
}

inline bool file_exists(const std::string& path) {
  return std::ifstream(path).good();
}

// A byte string with non-printable bytes escaped, for failure messages.
inline std::string escape(const std::string& s) {
  static const char* kHex = "0123456789abcdef";
  std::string out;
  for (unsigned char c : s) {
    if (c == '\n') {
      out += "\\n";
    } else if (c >= 0x20 && c < 0x7f && c != '\\') {
      out.push_back(static_cast<char>(c));
    } else {
      out += "\\x";
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 15]);
    }
  }
  return out;
}

inline std::string from_hex(const std::string& hex) {
  std::string out;
  for (size_t i = 0; i + 1 < hex.size(); i += 2) {
    out.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  }
  return out;
}

// An independent well-formedness check (Unicode Table 3-7), so the decoder's output is not
// judged by the decoder's own validator.
inline bool is_valid_utf8(const std::string& s) {
  size_t i = 0;
  const auto at = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  while (i < s.size()) {
    const unsigned char b = at(i);
    size_t n;
    unsigned char lo = 0x80, hi = 0xBF;
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      n = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      n = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      n = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + n > s.size()) return false;
    if (at(i + 1) < lo || at(i + 1) > hi) return false;
    for (size_t k = 2; k < n; ++k) {
      if (at(i + k) < 0x80 || at(i + k) > 0xBF) return false;
    }
    i += n;
  }
  return true;
}

inline std::vector<int32_t> ids_of(const nlohmann::json& j) {
  return j.get<std::vector<int32_t>>();
}

}  // namespace arbor::testing
