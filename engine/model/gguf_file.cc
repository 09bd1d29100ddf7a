#include "engine/model/gguf_file.h"

#include <algorithm>
#include <cstring>
#include <limits>
#include <thread>

#include "engine/core/error.h"

namespace arbor {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF" little-endian
constexpr int kMaxDims = 4;                  // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;

enum GgufValueType : uint32_t {
  kU8 = 0,
  kI8 = 1,
  kU16 = 2,
  kI16 = 3,
  kU32 = 4,
  kI32 = 5,
  kF32 = 6,
  kBool = 7,
  kString = 8,
  kArray = 9,
  kU64 = 10,
  kI64 = 11,
  kF64 = 12,
};

// Smallest encoded size of one value of a type (for bounding array counts before allocating).
uint64_t min_value_size(uint32_t type) {
  switch (type) {
    case kU8:
    case kI8:
    case kBool:
      return 1;
    case kU16:
    case kI16:
      return 2;
    case kU32:
    case kI32:
    case kF32:
      return 4;
    case kU64:
    case kI64:
    case kF64:
    case kString:
      return 8;
    case kArray:
      return 12;
    default:
      return 0;
  }
}

// Sequential bound-checked reader over the mapped header.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, uint64_t size)
      : path_(path), data_(data), size_(size) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return size_ - pos_; }

  const uint8_t* take(uint64_t n, const std::string& what) {
    if (n > remaining())
      throw_error(ErrorCode::kCorruptData, path_ + ": truncated GGUF: reading " + what + " needs " +
                                               std::to_string(n) + " bytes at offset " +
                                               std::to_string(pos_) + ", file size is " +
                                               std::to_string(size_));
    const uint8_t* p = data_ + pos_;
    pos_ += n;
    return p;
  }
  template <typename T>
  T read(const std::string& what) {
    T v;
    std::memcpy(&v, take(sizeof(T), what), sizeof(T));
    return v;
  }
  std::string read_string(const std::string& what) {
    const uint64_t len = read<uint64_t>(what + " length");
    const uint8_t* p = take(len, what);
    return std::string(reinterpret_cast<const char*>(p), len);
  }

 private:
  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

nlohmann::json read_value(Cursor& cur, uint32_t type, const std::string& path,
                          const std::string& key, int depth) {
  switch (type) {
    case kU8:
      return cur.read<uint8_t>(key);
    case kI8:
      return cur.read<int8_t>(key);
    case kU16:
      return cur.read<uint16_t>(key);
    case kI16:
      return cur.read<int16_t>(key);
    case kU32:
      return cur.read<uint32_t>(key);
    case kI32:
      return cur.read<int32_t>(key);
    case kF32:
      return static_cast<double>(cur.read<float>(key));
    case kU64:
      return cur.read<uint64_t>(key);
    case kI64:
      return cur.read<int64_t>(key);
    case kF64:
      return cur.read<double>(key);
    case kBool: {
      const uint8_t b = cur.read<uint8_t>(key);
      if (b > 1)
        throw_error(
            ErrorCode::kCorruptData,
            path + ": metadata " + key + ": bool value must be 0 or 1, found " + std::to_string(b));
      return b != 0;
    }
    case kString:
      return cur.read_string(key);
    case kArray: {
      if (depth >= kMaxArrayDepth)
        throw_error(ErrorCode::kCorruptData, path + ": metadata " + key +
                                                 ": arrays nested deeper than " +
                                                 std::to_string(kMaxArrayDepth));
      const uint32_t elem_type = cur.read<uint32_t>(key + " array type");
      const uint64_t count = cur.read<uint64_t>(key + " array length");
      const uint64_t elem_min = min_value_size(elem_type);
      if (elem_min == 0)
        throw_error(ErrorCode::kCorruptData, path + ": metadata " + key +
                                                 ": unknown array element type " +
                                                 std::to_string(elem_type));
      if (count > cur.remaining() / elem_min)
        throw_error(ErrorCode::kCorruptData,
                    path + ": metadata " + key + ": array of " + std::to_string(count) +
                        " elements needs at least " + std::to_string(elem_min) +
                        " bytes each, only " + std::to_string(cur.remaining()) +
                        " bytes remain in the file");
      nlohmann::json arr = nlohmann::json::array();
      arr.get_ref<nlohmann::json::array_t&>().reserve(count);
      for (uint64_t i = 0; i < count; ++i)
        arr.push_back(read_value(cur, elem_type, path, key, depth + 1));
      return arr;
    }
    default:
      throw_error(ErrorCode::kCorruptData,
                  path + ": metadata " + key + ": unknown value type " + std::to_string(type));
  }
}

std::string dims_str(const std::vector<int64_t>& dims) {
  return shape_str(dims);
}

}  // namespace

GgufFile GgufFile::open(const std::string& path) {
  GgufFile f;
  f.path_ = path;

  auto mapping = MappedFile::open(path, "GGUF file");

  Cursor cur(path, mapping->data(), mapping->size());
  const uint32_t magic = cur.read<uint32_t>("magic");
  if (magic != kGgufMagic) {
    char found[5] = {0};
    std::memcpy(found, &magic, 4);
    for (int i = 0; i < 4; ++i)
      if (found[i] < 32 || found[i] > 126) found[i] = '?';
    throw_error(ErrorCode::kCorruptData,
                path + ": bad magic: expected \"GGUF\", found \"" + std::string(found) + "\"");
  }
  f.version_ = cur.read<uint32_t>("version");
  if (f.version_ != 2 && f.version_ != 3)
    throw_error(
        ErrorCode::kUnsupported,
        path + ": GGUF version " + std::to_string(f.version_) +
            " is not supported (expected 2 or 3" +
            ((f.version_ & 0xffff) == 0 ? "; big-endian GGUF files are not supported)" : ")"));
  const uint64_t n_tensors = cur.read<uint64_t>("tensor count");
  const uint64_t n_kv = cur.read<uint64_t>("metadata count");
  // Each KV takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info at least 8 + 4
  // + 4 + 8 bytes. Bounding the counts by the file size keeps a corrupt header from allocating.
  if (n_kv > cur.remaining() / 13)
    throw_error(ErrorCode::kCorruptData, path + ": metadata count " + std::to_string(n_kv) +
                                             " cannot fit in a file of " +
                                             std::to_string(mapping->size()) + " bytes");
  if (n_tensors > cur.remaining() / 24)
    throw_error(ErrorCode::kCorruptData, path + ": tensor count " + std::to_string(n_tensors) +
                                             " cannot fit in a file of " +
                                             std::to_string(mapping->size()) + " bytes");

  auto metadata = std::make_shared<nlohmann::json>(nlohmann::json::object());
  for (uint64_t i = 0; i < n_kv; ++i) {
    const std::string key = cur.read_string("metadata key #" + std::to_string(i));
    const uint32_t type = cur.read<uint32_t>("type of metadata " + key);
    if (metadata->contains(key))
      throw_error(ErrorCode::kCorruptData, path + ": duplicate metadata key " + key);
    (*metadata)[key] = read_value(cur, type, path, key, 0);
  }
  if (metadata->contains("general.alignment")) {
    // Metadata strings are raw bytes, not necessarily UTF-8: dump() must replace, not throw.
    const auto& a = (*metadata)["general.alignment"];
    const uint64_t align = a.is_number_unsigned() ? a.get<uint64_t>() : 0;
    if (align == 0 || (align & (align - 1)) != 0)
      throw_error(ErrorCode::kCorruptData,
                  path + ": general.alignment must be a power of two, found " +
                      a.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace));
    f.alignment_ = align;
  }

  auto tensors = std::make_shared<std::vector<TensorInfo>>();
  auto index = std::make_shared<std::unordered_map<std::string, size_t>>();
  tensors->reserve(n_tensors);
  for (uint64_t i = 0; i < n_tensors; ++i) {
    TensorInfo t;
    t.name = cur.read_string("name of tensor #" + std::to_string(i));
    const uint32_t n_dims = cur.read<uint32_t>("dimension count of tensor " + t.name);
    if (n_dims == 0 || n_dims > kMaxDims)
      throw_error(ErrorCode::kCorruptData, path + ": tensor " + t.name + ": dimension count " +
                                               std::to_string(n_dims) + " is not in [1, " +
                                               std::to_string(kMaxDims) + "]");
    int64_t numel = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const uint64_t ne = cur.read<uint64_t>("dimensions of tensor " + t.name);
      if (ne > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) ||
          (ne != 0 && static_cast<uint64_t>(numel) >
                          static_cast<uint64_t>(std::numeric_limits<int64_t>::max()) / ne))
        throw_error(ErrorCode::kCorruptData, path + ": tensor " + t.name + ": dimension " +
                                                 std::to_string(ne) +
                                                 " overflows the element count");
      t.dims.push_back(static_cast<int64_t>(ne));
      numel *= static_cast<int64_t>(ne);
    }
    t.ggml_type = cur.read<uint32_t>("type of tensor " + t.name);
    t.offset = cur.read<uint64_t>("data offset of tensor " + t.name);
    int64_t block_elems = 0, block_bytes = 0;
    if (ggml_type_block(t.ggml_type, &block_elems, &block_bytes)) {
      if (t.dims[0] % block_elems != 0)
        throw_error(ErrorCode::kCorruptData,
                    path + ": tensor " + t.name + " of type " + ggml_type_name(t.ggml_type) +
                        ": row length " + std::to_string(t.dims[0]) +
                        " is not a multiple of the block size " + std::to_string(block_elems));
      const uint64_t blocks = static_cast<uint64_t>(numel / block_elems);
      if (blocks > std::numeric_limits<uint64_t>::max() / static_cast<uint64_t>(block_bytes))
        throw_error(ErrorCode::kCorruptData, path + ": tensor " + t.name +
                                                 ": byte size overflows, dims " + dims_str(t.dims));
      t.nbytes = blocks * static_cast<uint64_t>(block_bytes);
    }
    if (index->count(t.name))
      throw_error(ErrorCode::kCorruptData, path + ": duplicate tensor name " + t.name);
    index->emplace(t.name, tensors->size());
    tensors->push_back(std::move(t));
  }

  // The tensor data section starts at the next multiple of the alignment.
  const uint64_t header_end = cur.pos();
  f.data_offset_ = (header_end + f.alignment_ - 1) / f.alignment_ * f.alignment_;
  for (const TensorInfo& t : *tensors) {
    if (t.offset % f.alignment_ != 0)
      throw_error(ErrorCode::kCorruptData,
                  path + ": tensor " + t.name + ": data offset " + std::to_string(t.offset) +
                      " is not a multiple of the alignment " + std::to_string(f.alignment_));
    const uint64_t avail = mapping->size() >= f.data_offset_ ? mapping->size() - f.data_offset_ : 0;
    if (t.offset > avail || t.nbytes > avail - t.offset)
      throw_error(ErrorCode::kCorruptData,
                  path + ": tensor " + t.name + ": data [" +
                      std::to_string(f.data_offset_ + t.offset) + ", " +
                      std::to_string(f.data_offset_ + t.offset + t.nbytes) +
                      ") extends past the end of the file (" + std::to_string(mapping->size()) +
                      " bytes); the file is truncated or the offset is corrupt");
  }

  f.mapping_ = std::move(mapping);
  f.metadata_ = std::move(metadata);
  f.tensors_ = std::move(tensors);
  f.index_ = std::move(index);
  return f;
}

const GgufFile::TensorInfo* GgufFile::find(const std::string& name) const {
  auto it = index_->find(name);
  return it == index_->end() ? nullptr : &(*tensors_)[it->second];
}

const uint8_t* GgufFile::tensor_data(const TensorInfo& info) const {
  ARBOR_CHECK(info.offset + info.nbytes <= mapping_->size() - data_offset_);
  return mapping_->data() + data_offset_ + info.offset;
}

HostTensor GgufFile::read_f32(const std::string& name) const {
  const TensorInfo* info = find(name);
  if (!info) throw_error(ErrorCode::kNotFound, path_ + ": tensor " + name + " not found");
  int64_t block_elems = 0, block_bytes = 0;
  if (!ggml_type_block(info->ggml_type, &block_elems, &block_bytes))
    throw_error(ErrorCode::kUnsupported, path_ + ": tensor " + name + " has ggml type " +
                                             ggml_type_name(info->ggml_type) +
                                             ", which this loader cannot dequantize");
  if (!ggml_can_dequantize(info->ggml_type))
    throw_error(ErrorCode::kUnsupported, path_ + ": tensor " + name + " has ggml type " +
                                             ggml_type_name(info->ggml_type) +
                                             ", which cannot be converted to fp32");
  std::vector<int64_t> shape(info->dims.rbegin(), info->dims.rend());
  HostTensor out(shape);
  // Large tensors (embeddings, MLP weights of big models) are dequantized on several threads,
  // each taking a contiguous range of whole blocks.
  const uint8_t* src = tensor_data(*info);
  const int64_t blocks = out.numel() / block_elems;
  constexpr int64_t kBlocksPerThreadMin = 1 << 15;
  const int64_t threads = std::clamp<int64_t>(blocks / kBlocksPerThreadMin, 1,
                                              std::max(1u, std::thread::hardware_concurrency()));
  auto run = [&](int64_t first, int64_t last) {
    ggml_dequantize(info->ggml_type, src + first * block_bytes, (last - first) * block_elems,
                    out.ptr() + first * block_elems);
  };
  if (threads == 1) {
    run(0, blocks);
  } else {
    std::vector<std::thread> pool;
    for (int64_t t = 0; t < threads; ++t)
      pool.emplace_back(run, blocks * t / threads, blocks * (t + 1) / threads);
    for (auto& th : pool) th.join();
  }
  return out;
}

}  // namespace arbor
