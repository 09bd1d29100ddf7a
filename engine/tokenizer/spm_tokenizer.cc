// SentencePiece-style BPE: spaces written as U+2581 "▁", an optional dummy-prefix "▁", merges of
// adjacent pieces (by the merged piece's score as SentencePiece does, or by merge rank for
// tokenizer.json files, as HF tokenizers does), and characters outside the vocabulary spelled
// with <0xXX> byte pieces.
#include <cstdio>
#include <unordered_map>

#include "engine/core/error.h"
#include "engine/tokenizer/bpe_merge.h"
#include "engine/tokenizer/unicode.h"
#include "engine/tokenizer/vocab_tokenizer.h"

namespace arbor {
namespace {

constexpr std::string_view kSpace = "\xE2\x96\x81";  // U+2581 LOWER ONE EIGHTH BLOCK

// 0..255 for a "<0xAB>" piece, else -1.
int parse_byte_piece(const std::string& piece) {
  if (piece.size() != 6 || piece.compare(0, 3, "<0x") != 0 || piece[5] != '>') return -1;
  int value = 0;
  for (size_t i = 3; i < 5; ++i) {
    const char c = piece[i];
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

std::string replace_all(std::string_view text, std::string_view from, std::string_view to) {
  std::string out;
  out.reserve(text.size() + text.size() / 4);
  size_t i = 0;
  while (i < text.size()) {
    if (text.substr(i, from.size()) == from) {
      out.append(to);
      i += from.size();
    } else {
      out.push_back(text[i++]);
    }
  }
  return out;
}

class SpmTokenizer final : public VocabTokenizer {
 public:
  explicit SpmTokenizer(TokenizerSpec spec) : VocabTokenizer(std::move(spec)) {
    const size_t n = spec_.tokens.size();
    byte_ids_.fill(-1);
    for (size_t i = 0; i < n; ++i) {
      const auto id = static_cast<int32_t>(i);
      const std::string& piece = spec_.tokens[i];
      const TokenType type = type_of(id);
      const int byte = parse_byte_piece(piece);
      if (byte >= 0 && (type == TokenType::kByte || spec_.types.empty())) {
        if (byte_ids_[static_cast<size_t>(byte)] < 0) byte_ids_[static_cast<size_t>(byte)] = id;
        byte_of_id_.emplace(id, static_cast<char>(byte));
        continue;
      }
      if (type == TokenType::kNormal || type == TokenType::kUndefined ||
          type == TokenType::kUserDefined) {
        piece_to_id_.emplace(piece, id);  // the first of duplicate pieces wins
      }
    }
    if (!spec_.merges.empty()) {
      std::unordered_map<std::string, int32_t> any_id;  // merges may also name byte pieces
      for (size_t i = n; i-- > 0;) any_id[spec_.tokens[i]] = static_cast<int32_t>(i);
      auto id_of = [&](const std::string& piece) {
        auto it = piece_to_id_.find(piece);
        if (it != piece_to_id_.end()) return it->second;
        auto any = any_id.find(piece);
        return any == any_id.end() ? -1 : any->second;
      };
      for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
        const std::string& merge = spec_.merges[rank];
        const size_t sep = merge.find(' ');
        if (sep == std::string::npos || merge.find(' ', sep + 1) != std::string::npos) {
          throw_error(ErrorCode::kCorruptData, "tokenizer merge " + std::to_string(rank) + " '" +
                                                   merge +
                                                   "': expected two pieces separated by "
                                                   "one space");
        }
        const std::string left = merge.substr(0, sep), right = merge.substr(sep + 1);
        const int32_t a = id_of(left), b = id_of(right), merged = id_of(left + right);
        if (a < 0 || b < 0 || merged < 0) {
          throw_error(ErrorCode::kCorruptData, "tokenizer merge " + std::to_string(rank) + " '" +
                                                   merge + "' uses a piece not in the vocabulary");
        }
        merges_.emplace(pair_key(a, b), std::make_pair(static_cast<int32_t>(rank), merged));
      }
    } else if (spec_.scores.size() != n) {
      throw_error(ErrorCode::kInvalidArgument,
                  "SentencePiece tokenizer spec: " + std::to_string(n) + " tokens but " +
                      std::to_string(spec_.scores.size()) + " scores (and no merges)");
    }
  }

  std::string token_bytes(int32_t id) const override {
    check_id(id);
    if (auto it = byte_of_id_.find(id); it != byte_of_id_.end()) return std::string(1, it->second);
    return replace_all(spec_.tokens[static_cast<size_t>(id)], kSpace, " ");
  }

 protected:
  void encode_segment(std::string_view segment, bool at_text_start,
                      std::vector<int32_t>* out) const override {
    std::string text = replace_all(segment, " ", kSpace);
    if (spec_.add_space_prefix) {
      const bool starts_with_space = text.compare(0, kSpace.size(), kSpace) == 0;
      bool prefix = true;
      switch (spec_.space_prefix_mode) {
        case SpacePrefixMode::kEverySegment:
          break;
        case SpacePrefixMode::kMetaspaceFirst:
          prefix = at_text_start && !starts_with_space;
          break;
        case SpacePrefixMode::kMetaspaceAlways:
          prefix = !starts_with_space;
          break;
      }
      if (prefix) text.insert(0, kSpace);
    }
    if (!spec_.merges.empty()) {
      encode_by_rank(text, out);
    } else {
      encode_by_score(text, out);
    }
  }

 private:
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // The bytes of a character outside the vocabulary as byte pieces (unk where one is missing).
  void append_byte_fallback(std::string_view bytes, std::vector<int32_t>* out) const {
    for (char c : bytes) {
      const int32_t id = byte_ids_[static_cast<uint8_t>(c)];
      if (id >= 0) {
        out->push_back(id);
      } else if (spec_.unk_id >= 0) {
        out->push_back(spec_.unk_id);
      } else {
        char hex[8];
        std::snprintf(hex, sizeof(hex), "0x%02X", static_cast<unsigned>(static_cast<uint8_t>(c)));
        throw_error(ErrorCode::kInvalidArgument,
                    std::string("cannot encode byte ") + hex +
                        ": the tokenizer has neither its byte piece nor an unknown token");
      }
    }
  }

  // SentencePiece: start from characters, merge the pair whose merged piece has the highest
  // score; characters outside the vocabulary end as byte pieces.
  void encode_by_score(const std::string& text, std::vector<int32_t>* out) const {
    std::vector<BpeSymbol> symbols;
    for (const unicode::Utf8Char& ch : unicode::split_utf8(text)) {
      BpeSymbol s;
      auto it = piece_to_id_.find(std::string(text, ch.offset, ch.len));
      s.id = it == piece_to_id_.end() ? -1 : it->second;
      s.start = ch.offset;
      s.len = ch.len;
      s.prev = static_cast<int32_t>(symbols.size()) - 1;
      s.next = static_cast<int32_t>(symbols.size()) + 1;
      symbols.push_back(s);
    }
    if (symbols.empty()) return;
    symbols.back().next = -1;
    std::string merged;
    bpe_merge(symbols, [&](const BpeSymbol& left, const BpeSymbol& right) {
      merged.assign(text, left.start, left.len + right.len);
      auto it = piece_to_id_.find(merged);
      if (it == piece_to_id_.end()) return BpeMerge{};
      return BpeMerge{true, -static_cast<double>(spec_.scores[static_cast<size_t>(it->second)]),
                      it->second};
    });
    for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
      const BpeSymbol& s = symbols[static_cast<size_t>(i)];
      if (s.id >= 0) {
        out->push_back(s.id);
      } else {
        append_byte_fallback(std::string_view(text).substr(s.start, s.len), out);
      }
    }
  }

  // HF tokenizers' BPE with byte_fallback: characters outside the vocabulary become byte pieces
  // first, then ranked merges of token pairs.
  void encode_by_rank(const std::string& text, std::vector<int32_t>* out) const {
    if (spec_.ignore_merges) {
      if (auto it = piece_to_id_.find(text); it != piece_to_id_.end()) {
        out->push_back(it->second);
        return;
      }
    }
    std::vector<BpeSymbol> symbols;
    auto add = [&](int32_t id, uint32_t start, uint32_t len) {
      BpeSymbol s;
      s.id = id;
      s.start = start;
      s.len = len;
      s.prev = static_cast<int32_t>(symbols.size()) - 1;
      s.next = static_cast<int32_t>(symbols.size()) + 1;
      symbols.push_back(s);
    };
    for (const unicode::Utf8Char& ch : unicode::split_utf8(text)) {
      auto it = piece_to_id_.find(std::string(text, ch.offset, ch.len));
      if (it != piece_to_id_.end()) {
        add(it->second, ch.offset, ch.len);
        continue;
      }
      bool all_bytes = true;
      for (uint32_t k = 0; k < ch.len; ++k) {
        all_bytes = all_bytes && byte_ids_[static_cast<uint8_t>(text[ch.offset + k])] >= 0;
      }
      if (all_bytes) {
        for (uint32_t k = 0; k < ch.len; ++k) {
          add(byte_ids_[static_cast<uint8_t>(text[ch.offset + k])], ch.offset + k, 1);
        }
      } else if (spec_.unk_id >= 0) {
        add(spec_.unk_id, ch.offset, ch.len);
      }  // else HF drops the character; so do we
    }
    if (symbols.empty()) return;
    symbols.back().next = -1;
    bpe_merge(symbols, [&](const BpeSymbol& left, const BpeSymbol& right) {
      auto it = merges_.find(pair_key(left.id, right.id));
      if (it == merges_.end()) return BpeMerge{};
      return BpeMerge{true, static_cast<double>(it->second.first), it->second.second};
    });
    for (int32_t i = 0; i >= 0; i = symbols[static_cast<size_t>(i)].next) {
      out->push_back(symbols[static_cast<size_t>(i)].id);
    }
  }

  std::unordered_map<std::string, int32_t> piece_to_id_;  // mergeable pieces (normal, user)
  std::array<int32_t, 256> byte_ids_{};                   // byte -> <0xXX> piece id, or -1
  std::unordered_map<int32_t, char> byte_of_id_;          // <0xXX> piece id -> byte
  // (left id, right id) -> (rank, merged id), for specs with merges
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_spm_tokenizer(TokenizerSpec spec) {
  return std::make_unique<SpmTokenizer>(std::move(spec));
}

}  // namespace arbor
