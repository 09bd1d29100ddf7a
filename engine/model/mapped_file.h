// A whole file mapped read-only into memory, shared by the checkpoint readers (GGUF,
// safetensors, llama2.c). Readers bound-check every offset against size() before touching data().
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace arbor {

class MappedFile {
 public:
  // Maps `path`; throws kNotFound (missing, unreadable, not a regular file). `what` names the
  // format in messages ("GGUF file").
  static std::shared_ptr<const MappedFile> open(const std::string& path, const std::string& what);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }  // nullptr for an empty file
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

  // True when [offset, offset + length) lies inside the file (overflow-safe).
  bool contains(uint64_t offset, uint64_t length) const {
    return offset <= size_ && length <= size_ - offset;
  }

 private:
  MappedFile() = default;
  std::string path_;
  const uint8_t* data_ = nullptr;  // the whole file, read-only
  uint64_t size_ = 0;              // bytes
};

}  // namespace arbor
