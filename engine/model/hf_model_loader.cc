#include "engine/model/hf_model_loader.h"

#include "engine/model/hf_config.h"
#include "engine/model/safetensors_file.h"

namespace arbor {
namespace {

class SafetensorsSource : public TensorSource {
 public:
  explicit SafetensorsSource(SafetensorsCheckpoint ck) : ck_(std::move(ck)) {}
  bool contains(const std::string& name) const override { return ck_.contains(name); }
  std::vector<int64_t> shape(const std::string& name) const override {
    return ck_.info(name).shape;
  }
  HostTensor read_f32(const std::string& name) const override { return ck_.read_f32(name); }
  std::string file_of(const std::string& name) const override { return ck_.file_of(name); }
  std::vector<std::string> names() const override { return ck_.names(); }

 private:
  SafetensorsCheckpoint ck_;
};

}  // namespace

ModelWeights load_hf_weights(const std::string& dir, const LoadProgress& progress) {
  if (progress) progress("reading config", 0.0);
  const ModelConfig config = load_hf_config(dir);
  const SafetensorsSource source(SafetensorsCheckpoint::open_dir(dir));
  AssembleOptions options;
  options.naming = WeightNaming::kHuggingFace;
  options.meta_rope_layout = false;
  options.ignored_suffixes = {"rotary_emb.inv_freq"};  // a buffer older checkpoints saved
  options.progress = progress;
  return assemble_weights(config, source, options);
}

}  // namespace arbor
