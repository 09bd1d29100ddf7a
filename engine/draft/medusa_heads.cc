#include "engine/draft/medusa_heads.h"

#include <filesystem>
#include <map>
#include <regex>

#include "engine/core/error.h"
#include "engine/core/host_math.h"
#include "engine/model/safetensors_file.h"

namespace arbor {

namespace {

struct ParsedName {
  int head = -1;
  int index = -1;
  std::string kind;  // "linear.weight" | "linear.bias" | "weight"
};

bool parse_name(const std::string& name, ParsedName* out) {
  static const std::regex re(
      R"(^(?:medusa_head\.)?(\d{1,4})\.(\d{1,4})\.(linear\.weight|linear\.bias|weight)$)");
  std::smatch m;
  if (!std::regex_match(name, m, re)) return false;
  out->head = std::stoi(m[1].str());
  out->index = std::stoi(m[2].str());
  out->kind = m[3].str();
  return true;
}

void check_shape(const std::string& source, const std::string& name, const HostTensor& t,
                 const std::vector<int64_t>& want) {
  if (t.shape != want)
    throw_error(ErrorCode::kCorruptData, source + ": tensor " + name + ": expected shape " +
                                             shape_str(want) + ", found " + shape_str(t.shape));
}

}  // namespace

bool MedusaHeads::uses_base_lm_head() const {
  for (const MedusaHead& h : heads)
    if (h.lm_head.empty()) return true;
  return false;
}

MedusaHeads load_medusa_heads(const std::string& path, const HostTensor& base_lm_head) {
  namespace fs = std::filesystem;
  std::string file = path;
  if (fs::is_directory(path)) file = (fs::path(path) / "medusa_lm_head.safetensors").string();
  if (!fs::exists(file))
    throw_error(ErrorCode::kNotFound,
                "Medusa heads: " + file +
                    " not found (convert a medusa_lm_head.pt with scripts/convert_medusa_pt.py)");
  if (base_lm_head.shape.size() != 2)
    throw_error(ErrorCode::kInvalidArgument,
                "Medusa heads: base LM head has shape " + shape_str(base_lm_head.shape));
  const SafetensorsFile st = SafetensorsFile::open(file);
  MedusaHeads out;
  out.source = file;
  out.vocab_size = base_lm_head.shape[0];
  out.hidden_size = base_lm_head.shape[1];
  const int64_t h = out.hidden_size;

  // head -> index -> kind -> tensor name
  std::map<int, std::map<int, std::map<std::string, std::string>>> found;
  for (const auto& [name, info] : st.tensors()) {
    ParsedName p;
    if (!parse_name(name, &p))
      throw_error(ErrorCode::kCorruptData,
                  file + ": unexpected tensor " + name +
                      " (Medusa heads hold {i}.{l}.linear.weight/bias and {i}.{L}.weight)");
    found[p.head][p.index][p.kind] = name;
  }
  if (found.empty()) throw_error(ErrorCode::kCorruptData, file + ": holds no Medusa head tensors");
  int expected_head = 0;
  for (const auto& [head, layers] : found) {
    if (head != expected_head)
      throw_error(ErrorCode::kCorruptData, file + ": head " + std::to_string(expected_head) +
                                               " is missing (found head " + std::to_string(head) +
                                               ")");
    ++expected_head;
    MedusaHead mh;
    int expected_index = 0;
    for (const auto& [index, kinds] : layers) {
      const std::string prefix = std::to_string(head) + "." + std::to_string(index) + ".";
      if (index != expected_index)
        throw_error(ErrorCode::kCorruptData,
                    file + ": head " + std::to_string(head) + " has no tensors at index " +
                        std::to_string(expected_index) + " (found " + std::to_string(index) + ")");
      ++expected_index;
      if (!mh.lm_head.empty())
        throw_error(ErrorCode::kCorruptData, file + ": head " + std::to_string(head) +
                                                 " has tensors after its LM head (" +
                                                 kinds.begin()->second + ")");
      if (kinds.count("weight")) {
        if (kinds.size() != 1)
          throw_error(ErrorCode::kCorruptData,
                      file + ": index " + prefix + " holds both an LM head and a ResBlock");
        const std::string& name = kinds.at("weight");
        mh.lm_head = st.read_f32(name);
        check_shape(file, name, mh.lm_head, {out.vocab_size, h});
        continue;
      }
      for (const char* kind : {"linear.weight", "linear.bias"})
        if (!kinds.count(kind))
          throw_error(ErrorCode::kCorruptData,
                      file + ": tensor " + prefix + kind + " is missing (ResBlock " + prefix + ")");
      const std::string& wname = kinds.at("linear.weight");
      const std::string& bname = kinds.at("linear.bias");
      mh.res_weight.push_back(st.read_f32(wname));
      check_shape(file, wname, mh.res_weight.back(), {h, h});
      mh.res_bias.push_back(st.read_f32(bname));
      check_shape(file, bname, mh.res_bias.back(), {h});
    }
    out.heads.push_back(std::move(mh));
  }
  if (out.uses_base_lm_head()) out.base_lm_head = base_lm_head;
  return out;
}

std::vector<std::vector<float>> medusa_head_logits(const MedusaHeads& heads,
                                                   std::span<const float> hidden, int64_t rows) {
  const int64_t h = heads.hidden_size;
  ARBOR_CHECK(static_cast<int64_t>(hidden.size()) == rows * h);
  std::vector<std::vector<float>> logits(heads.heads.size());
  std::vector<float> x, y(static_cast<size_t>(rows * h));
  for (size_t i = 0; i < heads.heads.size(); ++i) {
    const MedusaHead& head = heads.heads[i];
    x.assign(hidden.begin(), hidden.end());
    for (size_t l = 0; l < head.res_weight.size(); ++l) {
      host_math::linear(x.data(), rows, h, head.res_weight[l].ptr(), h, head.res_bias[l].ptr(),
                        y.data());
      host_math::silu_inplace(y.data(), rows * h);
      for (size_t k = 0; k < x.size(); ++k) x[k] += y[k];
    }
    const HostTensor& lm = head.lm_head.empty() ? heads.base_lm_head : head.lm_head;
    logits[i].resize(static_cast<size_t>(rows * heads.vocab_size));
    host_math::linear(x.data(), rows, h, lm.ptr(), heads.vocab_size, nullptr, logits[i].data());
  }
  return logits;
}

}  // namespace arbor
