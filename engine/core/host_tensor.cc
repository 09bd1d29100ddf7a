#include "engine/core/host_tensor.h"

#include "engine/core/error.h"

namespace arbor {

std::string shape_str(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

HostTensor stack_rows(const std::vector<const HostTensor*>& parts,
                      const std::vector<int64_t>& rows) {
  HostTensor out;
  bool any_data = false;
  for (const HostTensor* p : parts) any_data = any_data || !p->data.empty();
  int64_t total = 0, cols = -1;
  for (size_t i = 0; i < parts.size(); ++i) {
    const HostTensor& p = *parts[i];
    const int64_t r = p.shape.empty() ? rows.at(i) : p.shape[0];
    const int64_t c = p.shape.size() >= 2 ? p.shape[1] : 1;
    ARBOR_CHECK(cols < 0 || c == cols, "stacking weights of different widths");
    cols = c;
    total += r;
    if (any_data) {
      if (p.data.empty())
        out.data.insert(out.data.end(), static_cast<size_t>(r * c), 0.0f);
      else
        out.data.insert(out.data.end(), p.data.begin(), p.data.end());
    }
  }
  out.shape =
      parts[0]->shape.size() >= 2 ? std::vector<int64_t>{total, cols} : std::vector<int64_t>{total};
  return out;
}

}  // namespace arbor
