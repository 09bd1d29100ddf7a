// An owning fp32 tensor in host memory: the form every loader produces (weights are dequantized
// at load) and the CPU backend computes on. Row-major; shape[0] is the slowest dimension.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace arbor {

struct HostTensor {
  std::vector<int64_t> shape;
  std::vector<float> data;

  HostTensor() = default;
  explicit HostTensor(std::vector<int64_t> s) : shape(std::move(s)), data(numel_of(shape), 0.f) {}

  int64_t numel() const { return static_cast<int64_t>(data.size()); }
  bool empty() const { return data.empty(); }
  int64_t dim(int i) const { return shape.at(static_cast<size_t>(i)); }
  float* ptr() { return data.data(); }
  const float* ptr() const { return data.data(); }

  static int64_t numel_of(const std::vector<int64_t>& s) {
    int64_t n = 1;
    for (int64_t d : s) n *= d;
    return n;
  }
};

std::string shape_str(const std::vector<int64_t>& shape);

// Matrices (or bias vectors) stacked by rows, e.g. q|k|v into one fused projection; shape-only
// when every part is (dummy weights the backend fills itself). Missing bias parts (empty data,
// given `rows`) become zeros. The parts must have the same width (ARBOR_CHECK).
HostTensor stack_rows(const std::vector<const HostTensor*>& parts,
                      const std::vector<int64_t>& rows = {});

}  // namespace arbor
