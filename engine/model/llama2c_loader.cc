#include "engine/model/llama2c_loader.h"

#include <cstring>
#include <map>

#include "engine/core/error.h"
#include "engine/model/mapped_file.h"

namespace arbor {
namespace {

constexpr uint32_t kVersion1Magic = 0x616b3432;  // "ak42", export.py version >= 1
constexpr uint64_t kVersion1HeaderBytes = 256;
constexpr int32_t kMaxHeaderValue = 1 << 24;  // far above any llama2.c model; rules out garbage

struct Array {
  std::string label;           // llama2.c name for messages: "wq of layer 3"
  std::vector<int64_t> shape;  // row-major
  uint64_t offset = 0;         // byte offset in the file
};

// The checkpoint's arrays exposed under HF tensor names, so the generic assembly checks shapes
// and un-permutes Q/K.
class Llama2cSource : public TensorSource {
 public:
  Llama2cSource(std::shared_ptr<const MappedFile> file, std::map<std::string, Array> arrays)
      : file_(std::move(file)), arrays_(std::move(arrays)) {}
  bool contains(const std::string& name) const override { return arrays_.count(name) != 0; }
  std::vector<int64_t> shape(const std::string& name) const override {
    return arrays_.at(name).shape;
  }
  HostTensor read_f32(const std::string& name) const override {
    const Array& a = arrays_.at(name);
    HostTensor t(a.shape);
    const uint64_t bytes = static_cast<uint64_t>(t.numel()) * 4;
    ARBOR_CHECK(file_->contains(a.offset, bytes), a.label + " outside the file");
    std::memcpy(t.ptr(), file_->data() + a.offset, bytes);
    return t;
  }
  std::string file_of(const std::string&) const override { return file_->path(); }
  std::vector<std::string> names() const override {
    std::vector<std::string> out;
    for (const auto& [name, a] : arrays_) out.push_back(name);
    return out;
  }

 private:
  std::shared_ptr<const MappedFile> file_;
  std::map<std::string, Array> arrays_;  // HF name -> location
};

// Lays arrays out one after another and checks each against the file size.
class Layout {
 public:
  Layout(const MappedFile& file, uint64_t start) : file_(file), pos_(start) {}

  void add(std::map<std::string, Array>* arrays, const std::string& hf_name,
           const std::string& label, std::vector<int64_t> shape) {
    const uint64_t bytes = 4 * static_cast<uint64_t>(HostTensor::numel_of(shape));
    check(label, shape, bytes);
    if (arrays) (*arrays)[hf_name] = Array{label, shape, pos_};
    pos_ += bytes;
  }
  void skip(const std::string& label, std::vector<int64_t> shape) {
    add(nullptr, "", label, std::move(shape));
  }
  uint64_t pos() const { return pos_; }

 private:
  void check(const std::string& label, const std::vector<int64_t>& shape, uint64_t bytes) const {
    if (!file_.contains(pos_, bytes))
      throw_error(ErrorCode::kCorruptData,
                  file_.path() + ": truncated llama2.c checkpoint: tensor " + label + " " +
                      shape_str(shape) + " needs bytes [" + std::to_string(pos_) + ", " +
                      std::to_string(pos_ + bytes) + "), the file has " +
                      std::to_string(file_.size()) + " bytes");
  }
  const MappedFile& file_;
  uint64_t pos_;
};

int32_t read_i32(const MappedFile& f, uint64_t offset) {
  int32_t v;
  std::memcpy(&v, f.data() + offset, 4);
  return v;
}

}  // namespace

ModelWeights load_llama2c_weights(const std::string& path, const LoadProgress& progress) {
  if (progress) progress("reading header", 0.0);
  auto file = MappedFile::open(path, "llama2.c checkpoint");
  if (file->size() < 28)
    throw_error(ErrorCode::kCorruptData,
                path + ": truncated llama2.c checkpoint: " + std::to_string(file->size()) +
                    " bytes, the header alone needs 28");
  uint32_t magic;
  std::memcpy(&magic, file->data(), 4);
  const bool v1 = magic == kVersion1Magic;
  uint64_t header_bytes = 28;
  uint64_t params_at = 0;
  bool shared = false;
  if (v1) {
    if (file->size() < kVersion1HeaderBytes)
      throw_error(ErrorCode::kCorruptData,
                  path + ": truncated llama2.c checkpoint: " + std::to_string(file->size()) +
                      " bytes, the version 1 header needs 256");
    const int32_t version = read_i32(*file, 4);
    if (version != 1)
      throw_error(ErrorCode::kUnsupported,
                  path + ": llama2.c checkpoint version " + std::to_string(version) +
                      " is not supported (expected the legacy format or version 1, fp32)");
    header_bytes = kVersion1HeaderBytes;
    params_at = 8;
    shared = file->data()[36] != 0;
  }
  const char* names[7] = {"dim",        "hidden_dim", "n_layers", "n_heads",
                          "n_kv_heads", "vocab_size", "seq_len"};
  int32_t h[7];
  for (int i = 0; i < 7; ++i) h[i] = read_i32(*file, params_at + 4 * static_cast<uint64_t>(i));
  if (!v1) {
    shared = h[5] > 0;  // the legacy format marks an untied classifier by a negative vocab
    if (h[5] < 0 && h[5] != INT32_MIN) h[5] = -h[5];
  }
  for (int i = 0; i < 7; ++i)
    if (h[i] <= 0 || h[i] > kMaxHeaderValue)
      throw_error(ErrorCode::kCorruptData, path + ": not a llama2.c checkpoint: header field " +
                                               names[i] + " is " + std::to_string(h[i]) +
                                               ", expected a value in [1, " +
                                               std::to_string(kMaxHeaderValue) + "]");
  const int64_t dim = h[0], hidden = h[1], layers = h[2], heads = h[3], kv_heads = h[4],
                vocab = h[5], seq_len = h[6];
  if (dim % heads != 0 || heads % kv_heads != 0 || (dim / heads) % 2 != 0)
    throw_error(ErrorCode::kCorruptData,
                path + ": not a llama2.c checkpoint: dim " + std::to_string(dim) + ", n_heads " +
                    std::to_string(heads) + ", n_kv_heads " + std::to_string(kv_heads) +
                    " need dim % n_heads == 0, n_heads % n_kv_heads == 0 and an even head size");

  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = vocab;
  c.hidden_size = dim;
  c.intermediate_size = hidden;
  c.num_layers = layers;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = dim / heads;
  c.rms_norm_eps = 1e-5;
  c.rope_theta = 10000.0;
  c.max_position = seq_len;
  c.tie_embeddings = shared;
  c.attention_bias = false;
  c.bos_token_id = 1;
  c.eos_token_id = 2;
  c.validate(path);

  const int64_t q_rows = heads * c.head_dim, kv_rows = kv_heads * c.head_dim;
  std::map<std::string, Array> arrays;
  Layout lay(*file, header_bytes);
  auto hf = [](const char* role, int layer) {
    return weight_tensor_name(WeightNaming::kHuggingFace, role, layer);
  };
  auto per_layer = [&](const char* role, const char* label, std::vector<int64_t> shape) {
    for (int l = 0; l < layers; ++l)
      lay.add(&arrays, hf(role, l), std::string(label) + " of layer " + std::to_string(l), shape);
  };
  auto embedding = [&] {
    lay.add(&arrays, hf("embed", -1), "token_embedding_table", {vocab, dim});
  };
  if (v1) {  // export.py version1_export order
    per_layer("attn_norm", "rms_att_weight", {dim});
    per_layer("ffn_norm", "rms_ffn_weight", {dim});
    lay.add(&arrays, hf("final_norm", -1), "rms_final_weight", {dim});
    embedding();
  } else {  // run.c memory_map_weights order
    embedding();
    per_layer("attn_norm", "rms_att_weight", {dim});
  }
  per_layer("wq", "wq", {q_rows, dim});
  per_layer("wk", "wk", {kv_rows, dim});
  per_layer("wv", "wv", {kv_rows, dim});
  per_layer("wo", "wo", {dim, q_rows});
  if (!v1) per_layer("ffn_norm", "rms_ffn_weight", {dim});
  per_layer("w_gate", "w1", {hidden, dim});
  per_layer("w_down", "w2", {dim, hidden});
  per_layer("w_up", "w3", {hidden, dim});
  if (!v1) {
    lay.add(&arrays, hf("final_norm", -1), "rms_final_weight", {dim});
    lay.skip("freq_cis_real", {seq_len, c.head_dim / 2});
    lay.skip("freq_cis_imag", {seq_len, c.head_dim / 2});
  }
  if (!shared) lay.add(&arrays, hf("lm_head", -1), "wcls", {vocab, dim});
  if (lay.pos() != file->size())
    throw_error(ErrorCode::kCorruptData,
                path + ": llama2.c checkpoint size mismatch: the header (dim " +
                    std::to_string(dim) + ", " + std::to_string(layers) + " layers, vocab " +
                    std::to_string(vocab) + (shared ? ", tied" : ", untied") + ") implies " +
                    std::to_string(lay.pos()) + " bytes, found " + std::to_string(file->size()));

  const Llama2cSource source(file, std::move(arrays));
  AssembleOptions options;
  options.naming = WeightNaming::kHuggingFace;
  options.meta_rope_layout = true;  // llama2.c rotates adjacent pairs
  options.progress = progress;
  return assemble_weights(c, source, options);
}

}  // namespace arbor
