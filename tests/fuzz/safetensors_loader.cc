// Fuzz target: an arbitrary file as a Hugging Face safetensors checkpoint
// (engine/model/safetensors_file, hf_model_loader). The bytes become model.safetensors in a
// scratch directory beside a fixed config.json (a tiny Llama: hidden 8, 1 layer, 2 heads, 1 KV
// head, vocab 16; scripts/make_fuzz_corpus.py writes seeds of that shape): SafetensorsFile::open
// parses it and every tensor is read (read_f32 and read_i64), then load_hf_weights loads the
// directory as a model.
// Invariants: each step returns or throws arbor::Error (never kInternal, never another
// exception, no sanitizer report); memory stays bounded by a small multiple of the file size
// (-rss_limit_mb / -malloc_limit_mb in scripts/fuzz.sh).
#include <fstream>

#include "engine/model/hf_model_loader.h"
#include "engine/model/safetensors_file.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

namespace fs = std::filesystem;

constexpr char kConfig[] = R"({
  "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": 8,
  "intermediate_size": 16, "num_hidden_layers": 1, "num_attention_heads": 2,
  "num_key_value_heads": 1, "vocab_size": 16, "max_position_embeddings": 64,
  "rms_norm_eps": 1e-05, "rope_theta": 10000.0, "tie_word_embeddings": false,
  "bos_token_id": 1, "eos_token_id": 2
})";

std::string* dir = nullptr;

void write_file(const std::string& path, const char* data, size_t size) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(data, static_cast<std::streamsize>(size));
  if (!out) arbor::fuzz::fail("cannot write " + path);
}

void remove_dir() {
  std::error_code ec;
  fs::remove_all(*dir, ec);
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // /dev/shm keeps the per-input write in memory where it exists.
  const fs::path base = fs::exists("/dev/shm") ? fs::path("/dev/shm") : fs::temp_directory_path();
  std::string tmpl = (base / "arbor_fuzz_st_XXXXXX").string();
  if (!mkdtemp(tmpl.data())) arbor::fuzz::fail("mkdtemp failed");
  dir = new std::string(tmpl);
  std::atexit(remove_dir);
  write_file(*dir + "/config.json", kConfig, sizeof kConfig - 1);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = *dir + "/model.safetensors";
  write_file(path, reinterpret_cast<const char*>(data), size);
  arbor::fuzz::accepts([&] {
    const arbor::SafetensorsFile st = arbor::SafetensorsFile::open(path);
    for (const auto& entry : st.tensors()) {
      const std::string& name = entry.first;  // clang 14 cannot capture structured bindings
      arbor::fuzz::accepts([&] { st.read_f32(name); });
      arbor::fuzz::accepts([&] { st.read_i64(name); });
    }
  });
  arbor::fuzz::accepts([&] { arbor::load_hf_weights(*dir); });
  return 0;
}
