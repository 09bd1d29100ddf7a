// Safetensors checkpoints: one file (8-byte header length, JSON header, raw data) or a set of
// shards listed by model.safetensors.index.json. F32/F16/BF16 tensors are read as fp32; every
// header field and data range is validated against the file before use.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "engine/core/host_tensor.h"
#include "engine/model/mapped_file.h"

namespace arbor {

class SafetensorsFile {
 public:
  struct TensorInfo {
    std::string name;
    std::string dtype;           // as written in the header: "F32", "BF16", "I64", ...
    std::vector<int64_t> shape;  // row-major
    uint64_t begin = 0;          // byte range relative to the data section
    uint64_t end = 0;
  };

  // Parses the header; throws kNotFound / kCorruptData naming the file and the offending field.
  static SafetensorsFile open(const std::string& path);

  const std::map<std::string, TensorInfo>& tensors() const { return *tensors_; }
  const TensorInfo* find(const std::string& name) const;
  // fp32 copy of an F32/F16/BF16 tensor; kNotFound for an unknown name, kUnsupported for
  // other dtypes.
  HostTensor read_f32(const std::string& name) const;
  // Integer tensor (I64 or I32) as int64 values, row-major (EAGLE-3's d2t); kNotFound /
  // kUnsupported as above.
  std::vector<int64_t> read_i64(const std::string& name) const;
  const std::string& path() const { return file_->path(); }

 private:
  std::shared_ptr<const MappedFile> file_;
  uint64_t data_offset_ = 0;  // file offset of the data section (8 + header length)
  std::shared_ptr<const std::map<std::string, TensorInfo>> tensors_;
};

// The tensors of a Hugging Face model directory: model.safetensors, or the shards named by
// model.safetensors.index.json (which wins when both exist).
class SafetensorsCheckpoint {
 public:
  static SafetensorsCheckpoint open_dir(const std::string& dir);

  bool contains(const std::string& name) const { return shard_of_.count(name) != 0; }
  const SafetensorsFile::TensorInfo& info(const std::string& name) const;
  HostTensor read_f32(const std::string& name) const;
  // The file that holds `name` (for messages).
  const std::string& file_of(const std::string& name) const;
  std::vector<std::string> names() const;
  const std::string& source() const { return source_; }  // index or single-file path

 private:
  std::string source_;
  std::vector<SafetensorsFile> shards_;
  std::map<std::string, size_t> shard_of_;  // tensor name -> index into shards_
};

}  // namespace arbor
