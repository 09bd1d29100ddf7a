// Helpers shared by the proposer tests: fixture paths (tests/data/spec/random, written by
// scripts/spec_heads_reference.py), target models, a target forward that returns the features
// proposers read, a safetensors writer for malformed-checkpoint tests, and tree comparison.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/model/safetensors_file.h"
#include "engine/verify/draft_tree.h"
#include "tests/common/direct_batch.h"
#include "tests/unit/loader_test_util.h"

namespace arbor::test {

inline std::string spec_fixture(const std::string& name) {
  return std::string(ARBOR_TEST_DATA_DIR) + "/spec/random/" + name;
}

inline std::string target_path(const std::string& name) {
  if (name == "stories260K")
    return std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.bin";
  return std::string(ARBOR_TEST_DATA_DIR) + "/models/" + name;
}

// Fails (not skips) when the fixture is missing.
inline nlohmann::json spec_reference(const std::string& name) {
  const std::string path = spec_fixture(name) + "/reference.json";
  if (!std::filesystem::exists(path))
    throw std::runtime_error("missing fixture " + path +
                             " (regenerate with scripts/spec_heads_reference.py)");
  return read_json(path);
}

inline const ModelWeights& target_weights(const std::string& name) {
  static std::map<std::string, ModelWeights> cache;
  auto it = cache.find(name);
  if (it == cache.end()) it = cache.emplace(name, load_model_weights(target_path(name))).first;
  return it->second;
}

struct TargetRun {
  std::vector<float> hidden;                 // [n, hidden] final-norm
  std::vector<std::vector<float>> captured;  // per capture layer [n, hidden]
};

// Our own target forward over `tokens` (one causal prefill).
inline TargetRun run_target(const std::string& name, const std::vector<int32_t>& tokens,
                            const std::vector<int32_t>& capture = {}) {
  auto backend = make_cpu_backend(1);
  LlamaModel model(*backend, target_weights(name));
  backend->allocate_kv(model.kv_shape(64, 16));
  ::arbor::testing::DirectBatch batch(64, 16);
  const int seq = batch.add_sequence();
  ForwardOutput out;
  ForwardRequest want;
  want.final_hidden = true;
  want.capture_layers = capture;
  model.forward(batch.step({{seq, tokens, false}}), &out, want);
  return {out.hidden, out.captured};
}

inline std::vector<float> flat_rows(const nlohmann::json& rows) {
  std::vector<float> out;
  for (const auto& r : rows)
    for (const auto& v : r) out.push_back(v.get<float>());
  return out;
}

// max |a - b| / max |b|.
inline double rel_error(const float* ours, const float* ref, size_t n) {
  double md = 0, mr = 0;
  for (size_t i = 0; i < n; ++i) {
    md = std::max(md, std::fabs(double(ours[i]) - ref[i]));
    mr = std::max(mr, std::fabs(double(ref[i])));
  }
  return md / std::max(mr, 1e-30);
}

inline void expect_tree(const DraftTree& tree, const std::vector<int32_t>& tokens,
                        const std::vector<int32_t>& parents, const std::string& what) {
  EXPECT_EQ(tree.token, tokens) << what;
  EXPECT_EQ(tree.parent, parents) << what;
  EXPECT_TRUE(tree.q_row.empty()) << what << ": proposals should be deterministic";
}

// Every tensor of a safetensors file as fp32 (integer tensors: values in .data, dtype kept).
struct StTensor {
  std::string dtype = "F32";  // F32 | I64
  std::vector<int64_t> shape;
  std::vector<float> f32;
  std::vector<int64_t> i64;
};
using StMap = std::map<std::string, StTensor>;

inline StMap read_safetensors(const std::string& path) {
  const SafetensorsFile st = SafetensorsFile::open(path);
  StMap out;
  for (const auto& [name, info] : st.tensors()) {
    StTensor t;
    t.shape = info.shape;
    if (info.dtype == "I64" || info.dtype == "I32") {
      t.dtype = "I64";
      t.i64 = st.read_i64(name);
    } else if (info.dtype == "BOOL") {
      continue;  // t2d: not read by the engine
    } else {
      t.f32 = st.read_f32(name).data;
    }
    out[name] = std::move(t);
  }
  return out;
}

inline void write_safetensors(const std::string& path, const StMap& tensors) {
  nlohmann::json header = nlohmann::json::object();
  std::string data;
  for (const auto& [name, t] : tensors) {
    const size_t begin = data.size();
    if (t.dtype == "I64")
      data.append(reinterpret_cast<const char*>(t.i64.data()), t.i64.size() * 8);
    else
      data.append(reinterpret_cast<const char*>(t.f32.data()), t.f32.size() * 4);
    header[name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  std::string h = header.dump();
  while (h.size() % 8) h += ' ';
  std::string bytes = le_bytes<uint64_t>(h.size()) + h + data;
  write_bytes(path, bytes);
}

}  // namespace arbor::test
