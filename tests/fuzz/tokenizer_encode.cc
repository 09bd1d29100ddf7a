// Fuzz target: arbitrary bytes -> Tokenizer::encode (with and without parse_special) -> decode,
// on SmolLM2's byte-level BPE and tok512's SentencePiece BPE. Invariants (engine/tokenizer/
// README.md): encoding never throws on any bytes and yields ids in the vocabulary; BOS first
// when asked for; decode never throws. Byte-level: the tokens' bytes joined are exactly the
// input less the bytes the vocabulary lacks (dropped by design), so decode round-trips every
// input that is valid UTF-8 once those are dropped. SentencePiece: decode round-trips valid
// UTF-8 that holds no literal "▁" (U+2581 is the space marker; SentencePiece itself maps it to
// a space) when special tokens are not parsed.
#include <array>
#include <memory>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"

namespace {

using arbor::Tokenizer;
using arbor::fuzz::escaped;
using arbor::fuzz::fail;

struct Fixture {
  std::unique_ptr<Tokenizer> byte_level;  // SmolLM2
  std::unique_ptr<Tokenizer> spm;         // tok512
  std::array<bool, 256> dropped{};        // bytes SmolLM2's vocabulary lacks
};
Fixture* fixture = nullptr;

void check_ids(const Tokenizer& tok, const std::vector<int32_t>& ids, std::string_view text) {
  for (int32_t id : ids) {
    if (id < 0 || id >= tok.vocab_size())
      fail("encode(\"" + escaped(text) + "\") gave id " + std::to_string(id) +
           " outside the vocabulary of " + std::to_string(tok.vocab_size()));
  }
}

// Encodes with parse_special off and on (BOS requested with it on); checks the ids and that
// decode accepts them. Returns the ids without BOS, by parse_special.
std::array<std::vector<int32_t>, 2> encode_both_ways(const Tokenizer& tok, std::string_view text) {
  std::array<std::vector<int32_t>, 2> out;
  for (bool parse_special : {false, true}) {
    std::vector<int32_t> ids = tok.encode(text, /*add_bos=*/parse_special, parse_special);
    check_ids(tok, ids, text);
    tok.decode(ids, /*skip_special=*/parse_special);
    if (parse_special && tok.spec().add_bos && tok.bos_id() >= 0) {
      if (ids.empty() || ids[0] != tok.bos_id())
        fail("encode(\"" + escaped(text) + "\", add_bos) does not start with BOS");
      ids.erase(ids.begin());
    }
    out[parse_special] = std::move(ids);
  }
  return out;
}

// kept: the input less the bytes the vocabulary lacks; ids: its encodings by parse_special.
void check_byte_level(const Tokenizer& tok, const std::string& kept,
                      const std::array<std::vector<int32_t>, 2>& ids) {
  for (const std::vector<int32_t>& encoded : ids) {
    std::string joined;
    for (int32_t id : encoded) joined += tok.token_bytes(id);
    if (joined != kept)
      fail("byte-level tokens of \"" + escaped(kept) + "\" spell \"" + escaped(joined) + "\"");
    if (arbor::fuzz::is_valid_utf8(kept)) {
      const std::string decoded = tok.decode(encoded, /*skip_special=*/false);
      if (decoded != kept)
        fail("byte-level decode(encode(\"" + escaped(kept) + "\")) is \"" + escaped(decoded) +
             "\"");
    }
  }
}

// ids: the encoding of input with parse_special off.
void check_spm(const Tokenizer& tok, std::string_view input, const std::vector<int32_t>& ids) {
  if (!arbor::fuzz::is_valid_utf8(input) || input.find("\xE2\x96\x81") != std::string::npos) return;
  const std::string decoded = tok.decode(ids, /*skip_special=*/false);
  if (decoded != input)
    fail("SentencePiece decode(encode(\"" + escaped(input) + "\")) is \"" + escaped(decoded) +
         "\"");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixture = new Fixture;
  fixture->byte_level = arbor::fuzz::load_smollm2_tokenizer();
  fixture->spm = arbor::fuzz::load_tok512_tokenizer();
  // A byte is dropped when, on its own, it encodes to nothing (README: "Byte-level
  // vocabularies may lack some bytes").
  for (int b = 0; b < 256; ++b) {
    const std::string one(1, static_cast<char>(b));
    fixture->dropped[static_cast<size_t>(b)] =
        fixture->byte_level->encode(one, /*add_bos=*/false, /*parse_special=*/false).empty();
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const Tokenizer& byte_level = *fixture->byte_level;
  std::string kept;
  for (char c : text)
    if (!fixture->dropped[static_cast<uint8_t>(c)]) kept.push_back(c);
  const auto byte_level_ids = encode_both_ways(byte_level, text);
  check_byte_level(
      byte_level, kept,
      kept.size() == text.size() ? byte_level_ids : encode_both_ways(byte_level, kept));
  check_spm(*fixture->spm, text, encode_both_ways(*fixture->spm, text)[0]);
  return 0;
}
