// What the libFuzzer targets share: the files they load once (paths from environment variables
// with defaults in the repository), fuzz bytes as a file the loaders can open, an independent
// UTF-8 check for invariants, and the rule for exceptions: arbor::Error is the documented way to
// reject input, except kInternal (a failed ARBOR_CHECK, i.e. input that got past validation);
// anything else escaping a target reaches std::terminate and libFuzzer reports a crash.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "engine/core/error.h"
#include "engine/model/gguf_file.h"
#include "engine/tokenizer/tokenizer.h"
#include "engine/tokenizer/tokenizer_loaders.h"

namespace arbor::fuzz {

// Reports a broken invariant: libFuzzer saves the input as crash-<sha1> on abort.
[[noreturn]] inline void fail(const std::string& what) {
  std::fprintf(stderr, "\n==fuzz== invariant violated: %s\n", what.c_str());
  std::fflush(stderr);
  std::abort();
}

// ARBOR_FUZZ_VERBOSE=1 prints every rejection (to see how far a seed gets).
inline bool verbose() {
  static const bool on = std::getenv("ARBOR_FUZZ_VERBOSE") != nullptr;
  return on;
}

// Runs f; an arbor::Error other than kInternal is a clean rejection (returns false).
template <typename F>
bool accepts(F&& f) {
  try {
    f();
    return true;
  } catch (const Error& e) {
    if (e.code() == ErrorCode::kInternal) fail(std::string("internal error: ") + e.what());
    if (verbose()) std::fprintf(stderr, "rejected (%s): %s\n", error_code_name(e.code()), e.what());
    return false;
  }
}

// $name, or fallback when unset or empty.
inline std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

// Aborts start-up with a message naming the missing file and the variable that overrides it.
inline std::string require_file(const std::string& path, const char* env_name, const char* hint) {
  if (!std::filesystem::exists(path)) {
    std::fprintf(stderr, "fuzz target: %s not found (set %s; %s)\n", path.c_str(), env_name, hint);
    std::exit(1);
  }
  return path;
}

// SmolLM2-135M-Instruct (byte-level BPE, ChatML template): $ARBOR_FUZZ_SMOLLM2, by default
// models/SmolLM2-135M-Instruct.Q4_1.gguf in the repository (scripts/fetch_default_model.sh).
inline std::string smollm2_path() {
  return require_file(
      env_or("ARBOR_FUZZ_SMOLLM2", ARBOR_FUZZ_MODELS_DIR "/SmolLM2-135M-Instruct.Q4_1.gguf"),
      "ARBOR_FUZZ_SMOLLM2", "run scripts/fetch_default_model.sh");
}

// llama2.c tok512 (SentencePiece-style BPE with byte fallback): $ARBOR_FUZZ_TOK512, by default
// shared/models/stories260K/tok512.bin beside the checkout.
inline std::string tok512_path() {
  return require_file(
      env_or("ARBOR_FUZZ_TOK512", ARBOR_FUZZ_SHARED_DIR "/models/stories260K/tok512.bin"),
      "ARBOR_FUZZ_TOK512", "the shared/ folder beside the checkout has it");
}

inline TokenizerSpec smollm2_tokenizer_spec() {
  return tokenizer_spec_from_gguf(GgufFile::open(smollm2_path()).metadata());
}

// The two tokenizer kinds the server runs: byte-level (SmolLM2) and SentencePiece (tok512).
inline std::unique_ptr<Tokenizer> load_smollm2_tokenizer() {
  return Tokenizer::create(smollm2_tokenizer_spec());
}
inline std::unique_ptr<Tokenizer> load_tok512_tokenizer() {
  return Tokenizer::create(load_llama2c_tokenizer(tok512_path()));
}

// The fuzz input as a file for loaders that take a path: an in-memory file (memfd), opened
// again through /proc/self/fd. Rewritten for every input, never touches the disk.
class MemFile {
 public:
  MemFile() : fd_(memfd_create("arbor_fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) fail("memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;

  const std::string& write(const uint8_t* data, size_t size) {
    if (ftruncate(fd_, 0) != 0) fail("ftruncate failed");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (n <= 0) fail("pwrite to the memfd failed");
      done += static_cast<size_t>(n);
    }
    return path_;
  }
  const std::string& path() const { return path_; }

 private:
  int fd_;
  std::string path_;
};

// Well-formed UTF-8 (Unicode Table 3-7: no overlongs, surrogates or code points past U+10FFFF),
// written here independently of engine/tokenizer/unicode.h, which the targets test.
inline bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b = static_cast<uint8_t>(s[i]);
    size_t len;
    uint8_t lo = 0x80, hi = 0xBF;  // bounds of the second byte
    if (b < 0x80) {
      ++i;
      continue;
    } else if (b >= 0xC2 && b <= 0xDF) {
      len = 2;
    } else if (b >= 0xE0 && b <= 0xEF) {
      len = 3;
      if (b == 0xE0) lo = 0xA0;
      if (b == 0xED) hi = 0x9F;
    } else if (b >= 0xF0 && b <= 0xF4) {
      len = 4;
      if (b == 0xF0) lo = 0x90;
      if (b == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (i + len > s.size()) return false;
    const auto second = static_cast<uint8_t>(s[i + 1]);
    if (second < lo || second > hi) return false;
    for (size_t k = 2; k < len; ++k) {
      if ((static_cast<uint8_t>(s[i + k]) & 0xC0) != 0x80) return false;
    }
    i += len;
  }
  return true;
}

// For messages: the bytes as a C++ string literal body ("\x04a\n").
inline std::string escaped(std::string_view s, size_t max_len = 200) {
  std::string out;
  for (size_t i = 0; i < s.size() && i < max_len; ++i) {
    const auto c = static_cast<uint8_t>(s[i]);
    if (c >= 0x20 && c < 0x7F && c != '\\' && c != '"') {
      out.push_back(static_cast<char>(c));
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", c);
      out += buf;
    }
  }
  if (s.size() > max_len) out += "...";
  return out;
}

}  // namespace arbor::fuzz
