// A parsed GGUF file (v2/v3): metadata key/values as JSON, tensor infos, and lazy access to
// tensor data through a read-only memory map. Used by the GGUF model loader and the tokenizer
// (which reads tokenizer.ggml.* from metadata()). Every offset and length is bound-checked.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/core/host_tensor.h"
#include "engine/model/ggml_quants.h"
#include "engine/model/mapped_file.h"

namespace arbor {

class GgufFile {
 public:
  struct TensorInfo {
    std::string name;
    uint32_t ggml_type = 0;
    std::vector<int64_t> dims;  // GGUF order, ne[0] fastest
    uint64_t offset = 0;        // bytes from the start of the tensor data section
    uint64_t nbytes = 0;        // stored size in bytes (0 for a type of unknown block size)
  };

  // Parses the header, metadata and tensor infos; throws arbor::Error (kNotFound, kCorruptData,
  // kUnsupported) naming the file and the offending field. Tensor data are read lazily.
  static GgufFile open(const std::string& path);

  // Every key/value: integers, floats, bools and strings as JSON scalars, arrays as JSON arrays
  // (e.g. metadata()["tokenizer.ggml.tokens"]). Strings are kept as raw bytes.
  const nlohmann::json& metadata() const { return *metadata_; }
  const std::vector<TensorInfo>& tensors() const { return *tensors_; }
  const TensorInfo* find(const std::string& name) const;

  // The tensor dequantized to fp32, shape in row-major order (the reverse of GGUF dims).
  // Throws kNotFound for an unknown name and kUnsupported for a type without a dequantizer.
  HostTensor read_f32(const std::string& name) const;
  // The stored bytes of a tensor (valid while this GgufFile or a copy of it lives).
  const uint8_t* tensor_data(const TensorInfo& info) const;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }  // file offset of the tensor data section

 private:
  std::string path_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::shared_ptr<const MappedFile> mapping_;  // the whole file, shared between copies
  std::shared_ptr<const nlohmann::json> metadata_;
  std::shared_ptr<const std::vector<TensorInfo>> tensors_;
  std::shared_ptr<const std::unordered_map<std::string, size_t>> index_;  // name -> tensors_ index
};

}  // namespace arbor
