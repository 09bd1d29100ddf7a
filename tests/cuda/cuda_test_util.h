// Test support for the GPU suite: random inputs (never zeros), 16-bit rounding so the CPU
// reference sees exactly the values the GPU stores, NaN poisoning, error metrics, and paths
// that work both in the build tree and on the device machine (where the repository is copied).
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/core/dtype.h"

namespace arbor::testing {

inline std::vector<float> random_vector(std::mt19937& rng, size_t n, float scale = 1.f) {
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) {
    x = d(rng);
    if (x == 0.f) x = scale * 0.5f;  // never zeros
  }
  return v;
}

inline float round_bf16(float x) {
  return bf16_to_f32(f32_to_bf16(x));
}

inline uint16_t f32_to_f16_bits(float f) {
  // Round-to-nearest-even float -> IEEE half (normal range is all the tests use).
  uint32_t x;
  std::memcpy(&x, &f, 4);
  const uint32_t sign = (x >> 16) & 0x8000u;
  int32_t exp = static_cast<int32_t>((x >> 23) & 0xff) - 127 + 15;
  uint32_t mant = x & 0x7fffffu;
  if (exp <= 0) return static_cast<uint16_t>(sign);  // flush tiny values (not used)
  if (exp >= 31) return static_cast<uint16_t>(sign | 0x7c00u);
  uint32_t h = sign | (static_cast<uint32_t>(exp) << 10) | (mant >> 13);
  const uint32_t rest = mant & 0x1fffu;
  if (rest > 0x1000u || (rest == 0x1000u && (h & 1u))) ++h;
  return static_cast<uint16_t>(h);
}
inline float round_f16(float x) {
  return f16_to_f32(f32_to_f16_bits(x));
}

inline void round_all(std::vector<float>* v, DType t) {
  for (auto& x : *v) x = t == DType::kF16 ? round_f16(x) : round_bf16(x);
}

// max |a - b| / max |b|: the relative error the tolerances are stated in.
inline double max_rel_error(const std::vector<float>& got, const std::vector<float>& ref) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    md = std::max(md, std::fabs(static_cast<double>(got[i]) - ref[i]));
    mr = std::max(mr, std::fabs(static_cast<double>(ref[i])));
  }
  return md / std::max(mr, 1e-30);
}

// ||a - b||^2 / ||b||^2 (llama.cpp's NMSE).
inline double nmse(const std::vector<float>& got, const std::vector<float>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double d = static_cast<double>(got[i]) - ref[i];
    num += d * d;
    den += static_cast<double>(ref[i]) * ref[i];
  }
  return num / std::max(den, 1e-300);
}

inline size_t count_non_finite(const std::vector<float>& v) {
  size_t n = 0;
  for (float x : v) n += std::isfinite(x) ? 0 : 1;
  return n;
}

inline std::vector<float> nan_vector(size_t n) {
  return std::vector<float>(n, std::numeric_limits<float>::quiet_NaN());
}

inline bool have_gpu() {
  static const bool ok = [] {
    try {
      CudaBackend b(CudaBackendOptions{});
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }();
  return ok;
}

#define ARBOR_REQUIRE_GPU()              \
  do {                                   \
    if (!::arbor::testing::have_gpu()) { \
      GTEST_SKIP() << "no CUDA device";  \
    }                                    \
  } while (0)

// tests/data: $ARBOR_TEST_DATA_DIR, else ./tests/data (the suite runs from the repository root
// on the device machine), else the source tree this binary was built from.
inline std::string test_data_dir() {
  if (const char* e = std::getenv("ARBOR_TEST_DATA_DIR")) return e;
  if (std::filesystem::exists("tests/data/models")) return "tests/data";
  return ARBOR_TEST_DATA_DIR;
}

// stories260K: $ARBOR_STORIES260K, else the shared models folder.
inline std::string stories260k_path() {
  if (const char* e = std::getenv("ARBOR_STORIES260K")) return e;
  return std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.bin";
}

// SmolLM2-135M-Instruct GGUF (93 MB, staged on the device machine in parts; see
// scripts/run_gpu_suite.sh): ARBOR_SMOLLM2_GGUF, else the repository's models/ copy.
inline std::string smollm2_path() {
  if (const char* e = std::getenv("ARBOR_SMOLLM2_GGUF")) return e;
  return std::string(ARBOR_TEST_DATA_DIR) + "/../../models/SmolLM2-135M-Instruct.Q4_1.gguf";
}

}  // namespace arbor::testing
