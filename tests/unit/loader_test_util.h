// Helpers shared by the weight-loader tests: fixture paths, JSON fixtures, temp directories,
// byte-level file surgery for corruption tests, and "expect an arbor::Error mentioning ..." checks.
#pragma once

#include <gtest/gtest.h>
#include <cstdlib>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "engine/core/error.h"

namespace arbor::test {

inline std::string loader_data(const std::string& rel) {
  return std::string(ARBOR_TEST_DATA_DIR) + "/loader/" + rel;
}
inline std::string smollm2_path() {
  return std::string(ARBOR_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
}
inline std::string stories_path() {
  return std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.bin";
}

// Fails the test (rather than skipping) when a required file is absent.
inline bool require_file(const std::string& path) {
  if (std::filesystem::exists(path)) return true;
  ADD_FAILURE() << "required file is missing: " << path
                << " (fixtures: scripts/make_loader_fixtures.py; SmolLM2: "
                   "scripts/fetch_default_model.sh)";
  return false;
}

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

inline void write_bytes(const std::string& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

inline nlohmann::json read_json(const std::string& path) {
  return nlohmann::json::parse(read_bytes(path));
}

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir() {
    std::string tmpl = (std::filesystem::temp_directory_path() / "arbor_loader_XXXXXX").string();
    std::vector<char> buf(tmpl.begin(), tmpl.end());
    buf.push_back('\0');
    path_ = mkdtemp(buf.data());
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  std::string file(const std::string& name) const { return path_ + "/" + name; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// Copies a fixture directory (HF model) into `dst`.
inline void copy_dir(const std::string& src, const std::string& dst) {
  std::filesystem::create_directories(dst);
  for (const auto& e : std::filesystem::directory_iterator(src))
    std::filesystem::copy_file(e.path(), std::filesystem::path(dst) / e.path().filename());
}

// Runs `fn`, expects an arbor::Error with `code` whose message contains every needle.
inline void expect_error(const std::function<void()>& fn, ErrorCode code,
                         const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected arbor::Error (" << error_code_name(code) << "), nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(error_code_name(e.code()), std::string(error_code_name(code))) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message lacks \"" << n << "\": " << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "expected arbor::Error, got std::exception: " << e.what();
  }
}

// Overwrites bytes [offset, offset + patch.size()) of `bytes`.
inline void patch(std::string& bytes, size_t offset, const std::string& patch_bytes) {
  ASSERT_LE(offset + patch_bytes.size(), bytes.size());
  bytes.replace(offset, patch_bytes.size(), patch_bytes);
}

template <typename T>
std::string le_bytes(T v) {
  std::string s(sizeof(T), '\0');
  std::memcpy(s.data(), &v, sizeof(T));
  return s;
}

}  // namespace arbor::test
