// Fuzz target: an arbitrary file as a llama2.c checkpoint (engine/model/llama2c_loader) and as a
// llama2.c tokenizer.bin (engine/tokenizer/llama2c_tokenizer_loader), the two files
// `arbor serve --model model.bin` reads. The bytes are written to an in-memory file and loaded
// both ways; a tokenizer that loads is built and encodes and decodes a short text.
// Invariants: each load returns or throws arbor::Error (never kInternal, never another
// exception, no sanitizer report); memory stays bounded by a small multiple of the file size
// (-rss_limit_mb / -malloc_limit_mb in scripts/fuzz.sh).
#include "engine/model/llama2c_loader.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

arbor::fuzz::MemFile* file = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  file = new arbor::fuzz::MemFile;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = file->write(data, size);
  arbor::fuzz::accepts([&] { arbor::load_llama2c_weights(path); });
  for (int32_t vocab_size : {-1, 512}) {
    arbor::fuzz::accepts([&] {
      const auto tok = arbor::Tokenizer::create(arbor::load_llama2c_tokenizer(path, vocab_size));
      tok->decode(tok->encode("Once upon a time, \xE2\x96\x81 caf\xC3\xA9 \xFF", true, true),
                  false);
    });
  }
  return 0;
}
