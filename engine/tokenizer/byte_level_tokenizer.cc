// Byte-level BPE (GPT-2, Llama 3, Qwen2, SmolLM2): the text is split by the pre-tokenizer, each
// piece's bytes start as single-byte tokens, and ranked merges join adjacent tokens. Vocabulary
// and merges are written in the GPT-2 byte-to-unicode alphabet; this class works on raw bytes.
#include <unordered_map>

#include "engine/core/error.h"
#include "engine/tokenizer/bpe_merge.h"
#include "engine/tokenizer/byte_level_alphabet.h"
#include "engine/tokenizer/pre_tokenizer.h"
#include "engine/tokenizer/vocab_tokenizer.h"

namespace arbor {
namespace {

class ByteLevelTokenizer final : public VocabTokenizer {
 public:
  explicit ByteLevelTokenizer(TokenizerSpec spec)
      : VocabTokenizer(std::move(spec)),
        pre_tokenizer_(PreTokenizer::from_name(spec_.pre_tokenizer)) {
    const size_t n = spec_.tokens.size();
    token_bytes_.resize(n);
    byte_ids_.fill(-1);
    std::unordered_map<std::string, int32_t> text_to_id;  // alphabet text -> id, for merges
    for (size_t i = n; i-- > 0;) text_to_id[spec_.tokens[i]] = static_cast<int32_t>(i);
    for (size_t i = 0; i < n; ++i) {
      const auto id = static_cast<int32_t>(i);
      const TokenType type = type_of(id);
      const std::string& text = spec_.tokens[i];
      const bool verbatim = type == TokenType::kControl || type == TokenType::kUserDefined ||
                            type == TokenType::kUnknown;
      std::optional<std::string> bytes;
      if (!verbatim) bytes = alphabet_to_bytes(text);
      // Like HF's ByteLevel decoder: a token with a character outside the alphabet is its text.
      token_bytes_[i] = bytes ? *std::move(bytes) : text;
      if (verbatim) continue;
      bytes_to_id_.emplace(token_bytes_[i], id);  // the first of duplicates wins
      if (token_bytes_[i].size() == 1) {
        int32_t& slot = byte_ids_[static_cast<uint8_t>(token_bytes_[i][0])];
        if (slot < 0) slot = id;
      }
    }
    for (size_t rank = 0; rank < spec_.merges.size(); ++rank) {
      const std::string& merge = spec_.merges[rank];
      const size_t sep = merge.find(' ');
      if (sep == std::string::npos || merge.find(' ', sep + 1) != std::string::npos) {
        throw_error(ErrorCode::kCorruptData, "tokenizer merge " + std::to_string(rank) + " '" +
                                                 merge +
                                                 "': expected two pieces separated by one space");
      }
      const std::string left = merge.substr(0, sep), right = merge.substr(sep + 1);
      auto a = text_to_id.find(left), b = text_to_id.find(right), m = text_to_id.find(left + right);
      if (a == text_to_id.end() || b == text_to_id.end() || m == text_to_id.end()) {
        throw_error(ErrorCode::kCorruptData, "tokenizer merge " + std::to_string(rank) + " '" +
                                                 merge + "' uses a piece not in the vocabulary");
      }
      // The first rank of a repeated merge wins, as in HF tokenizers.
      merges_.emplace(pair_key(a->second, b->second),
                      std::make_pair(static_cast<int32_t>(rank), m->second));
    }
  }

  std::string token_bytes(int32_t id) const override {
    check_id(id);
    return token_bytes_[static_cast<size_t>(id)];
  }

 protected:
  void encode_segment(std::string_view segment, bool /*at_text_start*/,
                      std::vector<int32_t>* out) const override {
    std::vector<BpeSymbol> symbols;
    for (const auto& [begin, end] : pre_tokenizer_.split(segment)) {
      const std::string_view piece = segment.substr(begin, end - begin);
      if (spec_.ignore_merges) {
        if (auto it = bytes_to_id_.find(std::string(piece)); it != bytes_to_id_.end()) {
          out->push_back(it->second);
          continue;
        }
      }
      symbols.clear();
      for (size_t k = 0; k < piece.size(); ++k) {
        const int32_t id = byte_ids_[static_cast<uint8_t>(piece[k])];
        // A byte the vocabulary lacks (SmolLM2 has no 0x04, 0xC0, 0xF1, 0xFF ...) is dropped, as
        // HF tokenizers (unk_token null) and llama.cpp do; the unknown token of such vocabularies
        // is often <|endoftext|>, which must not appear inside a prompt.
        if (id < 0) continue;
        BpeSymbol s;
        s.id = id;
        s.start = static_cast<uint32_t>(k);
        s.len = 1;
        s.prev = static_cast<int32_t>(symbols.size()) - 1;
        s.next = static_cast<int32_t>(symbols.size()) + 1;
        symbols.push_back(s);
      }
      if (symbols.empty()) continue;
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
  }

 private:
  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  PreTokenizer pre_tokenizer_;
  std::vector<std::string> token_bytes_;                  // id -> raw bytes
  std::unordered_map<std::string, int32_t> bytes_to_id_;  // raw bytes -> id (non-special)
  std::array<int32_t, 256> byte_ids_{};                   // byte -> single-byte token, or -1
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_level_tokenizer(TokenizerSpec spec) {
  return std::make_unique<ByteLevelTokenizer>(std::move(spec));
}

}  // namespace arbor
