#include "engine/model/safetensors_file.h"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/dtype.h"
#include "engine/core/error.h"

namespace arbor {
namespace {

constexpr uint64_t kMaxHeaderBytes = 100ull << 20;  // the format's own limit is 100 MB

// Bytes per element of a safetensors dtype; 0 when unknown.
uint64_t dtype_bytes(const std::string& dtype) {
  if (dtype == "F64" || dtype == "I64" || dtype == "U64") return 8;
  if (dtype == "F32" || dtype == "I32" || dtype == "U32") return 4;
  if (dtype == "F16" || dtype == "BF16" || dtype == "I16" || dtype == "U16") return 2;
  if (dtype == "I8" || dtype == "U8" || dtype == "BOOL" || dtype == "F8_E4M3" || dtype == "F8_E5M2")
    return 1;
  return 0;
}

nlohmann::json read_json_file(const std::string& path, const std::string& what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorCode::kNotFound, path + ": cannot open " + what);
  std::stringstream ss;
  ss << in.rdbuf();
  nlohmann::json j = nlohmann::json::parse(ss.str(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw_error(ErrorCode::kCorruptData, path + ": " + what + " is not JSON");
  return j;
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  f.file_ = MappedFile::open(path, "safetensors file");
  const uint64_t size = f.file_->size();
  if (size < 8)
    throw_error(ErrorCode::kCorruptData,
                path + ": truncated safetensors file: " + std::to_string(size) +
                    " bytes, too small for the 8-byte header length");
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | f.file_->data()[i];
  if (header_len > size - 8)
    throw_error(ErrorCode::kCorruptData,
                path + ": safetensors header length " + std::to_string(header_len) +
                    " extends past the end of the file (" + std::to_string(size) + " bytes)");
  if (header_len > kMaxHeaderBytes)
    throw_error(ErrorCode::kCorruptData, path + ": safetensors header length " +
                                             std::to_string(header_len) + " exceeds the " +
                                             std::to_string(kMaxHeaderBytes) + "-byte limit");
  f.data_offset_ = 8 + header_len;
  const uint64_t data_size = size - f.data_offset_;
  const char* header_begin = reinterpret_cast<const char*>(f.file_->data() + 8);
  nlohmann::json header = nlohmann::json::parse(header_begin, header_begin + header_len, nullptr,
                                                /*allow_exceptions=*/false);
  if (header.is_discarded() || !header.is_object())
    throw_error(ErrorCode::kCorruptData,
                path + ": safetensors header is not a JSON object (bad magic or corrupt header)");

  auto tensors = std::make_shared<std::map<std::string, TensorInfo>>();
  for (const auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    const std::string where = path + ": tensor " + name;
    if (!entry.is_object() || !entry.contains("dtype") || !entry["dtype"].is_string() ||
        !entry.contains("shape") || !entry["shape"].is_array() || !entry.contains("data_offsets") ||
        !entry["data_offsets"].is_array() || entry["data_offsets"].size() != 2 ||
        !entry["data_offsets"][0].is_number_unsigned() ||
        !entry["data_offsets"][1].is_number_unsigned())
      throw_error(ErrorCode::kCorruptData,
                  where +
                      ": header entry must have dtype, shape and data_offsets [begin, end], "
                      "found " +
                      entry.dump());
    TensorInfo t;
    t.name = name;
    t.dtype = entry["dtype"].get<std::string>();
    uint64_t numel = 1;
    for (const auto& d : entry["shape"]) {
      if (!d.is_number_unsigned())
        throw_error(
            ErrorCode::kCorruptData,
            where + ": shape must hold non-negative integers, found " + entry["shape"].dump());
      const uint64_t v = d.get<uint64_t>();
      if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (v != 0 && numel > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / v))
        throw_error(ErrorCode::kCorruptData,
                    where + ": shape " + entry["shape"].dump() + " overflows the element count");
      numel *= v;
      t.shape.push_back(static_cast<int64_t>(v));
    }
    t.begin = entry["data_offsets"][0].get<uint64_t>();
    t.end = entry["data_offsets"][1].get<uint64_t>();
    if (t.begin > t.end || t.end > data_size)
      throw_error(ErrorCode::kCorruptData,
                  where + ": data_offsets [" + std::to_string(t.begin) + ", " +
                      std::to_string(t.end) + "] are outside the data section of " +
                      std::to_string(data_size) +
                      " bytes; the file is truncated or the header is corrupt");
    const uint64_t elem = dtype_bytes(t.dtype);
    if (elem != 0 &&
        (numel > std::numeric_limits<uint64_t>::max() / elem || numel * elem != t.end - t.begin))
      throw_error(ErrorCode::kCorruptData, where + ": shape " + shape_str(t.shape) + " of " +
                                               t.dtype + " needs " + std::to_string(numel) + " x " +
                                               std::to_string(elem) + " bytes, data_offsets span " +
                                               std::to_string(t.end - t.begin));
    tensors->emplace(name, std::move(t));
  }
  f.tensors_ = std::move(tensors);
  return f;
}

const SafetensorsFile::TensorInfo* SafetensorsFile::find(const std::string& name) const {
  auto it = tensors_->find(name);
  return it == tensors_->end() ? nullptr : &it->second;
}

HostTensor SafetensorsFile::read_f32(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw_error(ErrorCode::kNotFound, path() + ": tensor " + name + " not found");
  if (t->dtype != "F32" && t->dtype != "F16" && t->dtype != "BF16")
    throw_error(ErrorCode::kUnsupported, path() + ": tensor " + name + " has dtype " + t->dtype +
                                             ", expected F32, F16 or BF16");
  ARBOR_CHECK(file_->contains(data_offset_ + t->begin, t->end - t->begin));
  HostTensor out(t->shape);
  const uint8_t* src = file_->data() + data_offset_ + t->begin;
  const int64_t n = out.numel();
  float* dst = out.ptr();
  if (t->dtype == "F32") {
    std::memcpy(dst, src, static_cast<size_t>(n) * 4);
  } else {
    const bool is_bf16 = t->dtype == "BF16";
    for (int64_t i = 0; i < n; ++i) {
      const uint16_t h = static_cast<uint16_t>(src[2 * i] | (src[2 * i + 1] << 8));
      dst[i] = is_bf16 ? bf16_to_f32(h) : f16_to_f32(h);
    }
  }
  return out;
}

std::vector<int64_t> SafetensorsFile::read_i64(const std::string& name) const {
  const TensorInfo* t = find(name);
  if (!t) throw_error(ErrorCode::kNotFound, path() + ": tensor " + name + " not found");
  if (t->dtype != "I64" && t->dtype != "I32")
    throw_error(ErrorCode::kUnsupported,
                path() + ": tensor " + name + " has dtype " + t->dtype + ", expected I64 or I32");
  ARBOR_CHECK(file_->contains(data_offset_ + t->begin, t->end - t->begin));
  const size_t n = static_cast<size_t>(HostTensor::numel_of(t->shape));
  const size_t width = t->dtype == "I64" ? 8 : 4;
  ARBOR_CHECK(t->end - t->begin == n * width);
  const uint8_t* src = file_->data() + data_offset_ + t->begin;
  std::vector<int64_t> out(n);
  for (size_t i = 0; i < n; ++i) {
    if (width == 8) {
      std::memcpy(&out[i], src + 8 * i, 8);
    } else {
      int32_t v;
      std::memcpy(&v, src + 4 * i, 4);
      out[i] = v;
    }
  }
  return out;
}

SafetensorsCheckpoint SafetensorsCheckpoint::open_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  SafetensorsCheckpoint ck;
  const fs::path index_path = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single_path = fs::path(dir) / "model.safetensors";
  if (fs::exists(index_path)) {
    ck.source_ = index_path.string();
    const nlohmann::json index = read_json_file(ck.source_, "safetensors index");
    if (!index.is_object() || !index.contains("weight_map") || !index["weight_map"].is_object())
      throw_error(ErrorCode::kCorruptData, ck.source_ + ": missing object \"weight_map\"");
    std::map<std::string, size_t> shard_index;  // file name -> index into shards_
    for (const auto& [name, file] : index["weight_map"].items()) {
      if (!file.is_string())
        throw_error(ErrorCode::kCorruptData,
                    ck.source_ + ": weight_map entry for " + name + " is not a file name");
      const std::string shard = file.get<std::string>();
      if (shard.empty() || shard.find('/') != std::string::npos || shard == "." || shard == "..")
        throw_error(ErrorCode::kCorruptData, ck.source_ + ": weight_map entry for " + name +
                                                 " names \"" + shard +
                                                 "\", expected a file in the same directory");
      auto it = shard_index.find(shard);
      if (it == shard_index.end()) {
        ck.shards_.push_back(SafetensorsFile::open((fs::path(dir) / shard).string()));
        it = shard_index.emplace(shard, ck.shards_.size() - 1).first;
      }
      if (!ck.shards_[it->second].find(name))
        throw_error(ErrorCode::kCorruptData, ck.source_ + ": weight_map puts tensor " + name +
                                                 " in " + ck.shards_[it->second].path() +
                                                 ", which has no such tensor");
      ck.shard_of_[name] = it->second;
    }
  } else if (fs::exists(single_path)) {
    ck.source_ = single_path.string();
    ck.shards_.push_back(SafetensorsFile::open(ck.source_));
    for (const auto& [name, info] : ck.shards_[0].tensors()) ck.shard_of_[name] = 0;
  } else {
    throw_error(ErrorCode::kNotFound,
                dir + ": no model.safetensors or model.safetensors.index.json");
  }
  return ck;
}

const SafetensorsFile::TensorInfo& SafetensorsCheckpoint::info(const std::string& name) const {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end())
    throw_error(ErrorCode::kNotFound, source_ + ": tensor " + name + " not found");
  return *shards_[it->second].find(name);
}

HostTensor SafetensorsCheckpoint::read_f32(const std::string& name) const {
  auto it = shard_of_.find(name);
  if (it == shard_of_.end())
    throw_error(ErrorCode::kNotFound, source_ + ": tensor " + name + " not found");
  return shards_[it->second].read_f32(name);
}

const std::string& SafetensorsCheckpoint::file_of(const std::string& name) const {
  auto it = shard_of_.find(name);
  return it == shard_of_.end() ? source_ : shards_[it->second].path();
}

std::vector<std::string> SafetensorsCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, shard] : shard_of_) out.push_back(name);
  return out;
}

}  // namespace arbor
