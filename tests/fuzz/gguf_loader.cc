// Fuzz target: an arbitrary file as a GGUF model (engine/model/gguf_file, gguf_model_loader and
// the GGUF tokenizer loader), as `arbor serve --model x.gguf` reads it. The bytes are written to
// an in-memory file; GgufFile::open parses it, every tensor is dequantized, the model config and
// the tokenizer (tokenizer.ggml.*) are built from its metadata and the tokenizer encodes and
// decodes a short text, then load_gguf_weights loads the whole model.
// Invariants: each step returns or throws arbor::Error (never kInternal, never another
// exception, no sanitizer report); memory stays bounded by a small multiple of the file size
// (scripts/fuzz.sh runs with -rss_limit_mb and -malloc_limit_mb, so a header that makes a
// loader allocate far beyond its file is a finding).
#include "engine/model/gguf_model_loader.h"
#include "engine/tokenizer/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

arbor::fuzz::MemFile* file = nullptr;

void use_tokenizer(const arbor::GgufFile& gguf) {
  const auto tok = arbor::Tokenizer::create(arbor::tokenizer_spec_from_gguf(gguf.metadata()));
  const std::vector<int32_t> ids = tok->encode("Hi there, 123 w\xC3\xB6rld!\n", true, true);
  tok->decode(ids, false);
  arbor::IncrementalDecoder decoder(*tok);
  for (int32_t id = 0; id < tok->vocab_size() && id < 64; ++id) decoder.push(id);
  decoder.finish();
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  file = new arbor::fuzz::MemFile;
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string& path = file->write(data, size);
  arbor::fuzz::accepts([&] {
    const arbor::GgufFile gguf = arbor::GgufFile::open(path);
    for (const arbor::GgufFile::TensorInfo& t : gguf.tensors())
      arbor::fuzz::accepts([&] { gguf.read_f32(t.name); });
    arbor::fuzz::accepts([&] { arbor::gguf_model_config(gguf); });
    arbor::fuzz::accepts([&] { use_tokenizer(gguf); });
  });
  arbor::fuzz::accepts([&] { arbor::load_gguf_weights(path); });
  return 0;
}
