#include <cctype>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string_view>

#include "engine/core/error.h"
#include "engine/tokenizer/tokenizer_loaders.h"

namespace arbor {
namespace {

bool is_byte_piece(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return false;
  return std::isxdigit(static_cast<unsigned char>(piece[3])) &&
         std::isxdigit(static_cast<unsigned char>(piece[4]));
}

}  // namespace

TokenizerSpec load_llama2c_tokenizer(const std::string& path, int32_t vocab_size) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorCode::kNotFound, path + ": cannot open llama2.c tokenizer");
  const std::string data((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  size_t pos = 0;
  // The next n bytes, checked against the file before anything is allocated for them.
  auto take = [&](size_t n, const std::string& what) {
    if (data.size() - pos < n) {
      throw_error(ErrorCode::kCorruptData, path + ": truncated at byte " + std::to_string(pos) +
                                               " reading " + what + " (needs " + std::to_string(n) +
                                               " bytes, " + std::to_string(data.size() - pos) +
                                               " left)");
    }
    const std::string_view bytes(data.data() + pos, n);
    pos += n;
    return bytes;
  };
  auto read_bytes = [&](void* dst, size_t n, const std::string& what) {
    std::memcpy(dst, take(n, what).data(), n);
  };
  int32_t max_token_length = 0;
  read_bytes(&max_token_length, 4, "max_token_length");
  if (max_token_length <= 0) {
    throw_error(ErrorCode::kCorruptData, path + ": max_token_length is " +
                                             std::to_string(max_token_length) +
                                             ", expected a positive value");
  }

  TokenizerSpec spec;
  spec.kind = TokenizerKind::kSentencePieceBpe;
  spec.add_bos = true;
  spec.add_space_prefix = true;
  while (vocab_size < 0 ? pos < data.size()
                        : spec.tokens.size() < static_cast<size_t>(vocab_size)) {
    const std::string what = "token " + std::to_string(spec.tokens.size());
    float score = 0;
    int32_t len = 0;
    read_bytes(&score, 4, what + " score");
    read_bytes(&len, 4, what + " length");
    if (len < 0 || len > max_token_length) {
      throw_error(ErrorCode::kCorruptData, path + ": " + what + " has length " +
                                               std::to_string(len) + ", expected 0.." +
                                               std::to_string(max_token_length));
    }
    std::string piece(take(static_cast<size_t>(len), what + " bytes"));

    const auto id = static_cast<int32_t>(spec.tokens.size());
    TokenType type = TokenType::kNormal;
    if (piece == "\n<s>\n") {
      piece = "<s>";
      type = TokenType::kControl;
      spec.bos_id = id;
    } else if (piece == "\n</s>\n") {
      piece = "</s>";
      type = TokenType::kControl;
      spec.eos_id = id;
    } else if (piece == "<unk>") {
      type = TokenType::kUnknown;
      spec.unk_id = id;
    } else if (is_byte_piece(piece)) {
      type = TokenType::kByte;
    } else {
      // llama2.c stores SentencePiece's "▁" as a plain space.
      std::string escaped;
      for (char c : piece) {
        if (c == ' ') {
          escaped += "\xE2\x96\x81";
        } else {
          escaped.push_back(c);
        }
      }
      piece = std::move(escaped);
    }
    spec.tokens.push_back(std::move(piece));
    spec.scores.push_back(score);
    spec.types.push_back(type);
  }
  if (spec.tokens.empty()) throw_error(ErrorCode::kCorruptData, path + ": no tokens");
  return spec;
}

}  // namespace arbor
