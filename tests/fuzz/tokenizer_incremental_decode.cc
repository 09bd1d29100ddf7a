// Fuzz target: bytes as token ids -> IncrementalDecoder, the detokenizer the server streams with
// (server/engine_service.cc: one per choice, push per token, finish at a natural end).
// Input: byte 0 picks the tokenizer (SmolLM2 byte-level or tok512 SentencePiece), skip_special,
// at_text_start and where the decoder is reused for a second stream (after finish()); then
// little-endian uint16 ids, taken mod the vocabulary, except values >= 65000, which become ids
// outside it (negative or past the end).
// Invariants (engine/tokenizer/tokenizer.h): every chunk push() or finish() returns is valid
// UTF-8 (no chunk ends mid-character); the chunks of a stream joined equal Tokenizer::decode of
// its ids; an id outside the vocabulary throws kInvalidArgument and changes nothing; a stream
// that continues earlier text (at_text_start false) decodes as if a token "a" preceded it.
#include <memory>
#include <string>
#include <vector>

#include "tests/fuzz/fuzz_util.h"

namespace {

using arbor::ErrorCode;
using arbor::IncrementalDecoder;
using arbor::Tokenizer;
using arbor::fuzz::escaped;
using arbor::fuzz::fail;

struct Fixture {
  std::unique_ptr<Tokenizer> tokenizers[2];  // SmolLM2, tok512
  int32_t letter_a[2] = {-1, -1};            // the id of the text "a" in each
};
Fixture* fixture = nullptr;

std::string ids_str(const std::vector<int32_t>& ids) {
  std::string s = "[";
  for (size_t i = 0; i < ids.size() && i < 64; ++i) s += (i ? ", " : "") + std::to_string(ids[i]);
  return s + (ids.size() > 64 ? ", ...]" : "]");
}

void check_chunk(const std::string& chunk, const std::vector<int32_t>& ids) {
  if (!arbor::fuzz::is_valid_utf8(chunk))
    fail("IncrementalDecoder returned a chunk that is not UTF-8: \"" + escaped(chunk) + "\" (ids " +
         ids_str(ids) + ")");
}

// Pushes every id (exactly those outside the vocabulary must throw); returns the joined chunks
// and the ids that were accepted.
std::string stream(IncrementalDecoder& decoder, int32_t vocab, const std::vector<int32_t>& ids,
                   std::vector<int32_t>* good_ids) {
  std::string text;
  for (int32_t id : ids) {
    std::string chunk;
    bool threw = false;
    try {
      chunk = decoder.push(id);
    } catch (const arbor::Error& e) {
      if (e.code() != ErrorCode::kInvalidArgument)
        fail(std::string("push threw an unexpected error: ") + e.what());
      threw = true;
    }
    if (threw != (id < 0 || id >= vocab))
      fail("push(" + std::to_string(id) + ") " + (threw ? "threw" : "did not throw") +
           " for a vocabulary of " + std::to_string(vocab));
    if (threw) continue;
    good_ids->push_back(id);
    check_chunk(chunk, ids);
    text += chunk;
  }
  const std::string tail = decoder.finish();
  check_chunk(tail, ids);
  return text + tail;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixture = new Fixture;
  fixture->tokenizers[0] = arbor::fuzz::load_smollm2_tokenizer();
  fixture->tokenizers[1] = arbor::fuzz::load_tok512_tokenizer();
  for (int t = 0; t < 2; ++t) {
    const Tokenizer& tok = *fixture->tokenizers[t];
    for (int32_t id = 0; id < tok.vocab_size(); ++id) {
      if (!tok.is_special(id) && tok.token_bytes(id) == "a") {
        fixture->letter_a[t] = id;
        break;
      }
    }
    if (fixture->letter_a[t] < 0) fail("no token \"a\" in tokenizer " + std::to_string(t));
  }
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const uint8_t mode = data[0];
  const int which = mode & 1;
  const bool skip_special = (mode & 2) != 0;
  const bool at_text_start = (mode & 4) != 0;
  const Tokenizer& tok = *fixture->tokenizers[which];
  const int32_t vocab = tok.vocab_size();

  std::vector<int32_t> ids;
  for (size_t i = 1; i + 1 < size; i += 2) {
    const uint32_t v = data[i] | (static_cast<uint32_t>(data[i + 1]) << 8);
    if (v >= 65000) {
      const int32_t off = static_cast<int32_t>(v - 65000);
      ids.push_back(off % 2 ? -1 - off / 2 : vocab + off / 2);
    } else {
      ids.push_back(static_cast<int32_t>(v % static_cast<uint32_t>(vocab)));
    }
  }
  // The decoder is reused for a second stream after finish(), as its contract allows.
  const size_t split = ids.empty() ? 0 : (mode >> 3) % (ids.size() + 1);
  const std::vector<int32_t> first(ids.begin(), ids.begin() + static_cast<long>(split));
  const std::vector<int32_t> second(ids.begin() + static_cast<long>(split), ids.end());

  IncrementalDecoder decoder(tok, skip_special, at_text_start);
  std::vector<int32_t> good_first, good_second;
  const std::string text_first = stream(decoder, vocab, first, &good_first);
  const std::string text_second = stream(decoder, vocab, second, &good_second);

  std::string expected_first;
  if (at_text_start) {
    expected_first = tok.decode(good_first, skip_special);
  } else {
    std::vector<int32_t> with_a = {fixture->letter_a[which]};
    with_a.insert(with_a.end(), good_first.begin(), good_first.end());
    expected_first = tok.decode(with_a, skip_special).substr(1);
  }
  if (text_first != expected_first)
    fail("IncrementalDecoder (at_text_start " + std::to_string(at_text_start) + ", skip_special " +
         std::to_string(skip_special) + ") gave \"" + escaped(text_first) + "\", decode gave \"" +
         escaped(expected_first) + "\" for ids " + ids_str(good_first));
  const std::string expected_second = tok.decode(good_second, skip_special);
  if (text_second != expected_second)
    fail("IncrementalDecoder after finish() gave \"" + escaped(text_second) + "\", decode gave \"" +
         escaped(expected_second) + "\" for ids " + ids_str(good_second));
  return 0;
}
