// Stop strings matched in linear time. The engine loop scans each choice's held-back text every
// step; with std::string::find and a naive suffix check, 16 stops of 256 bytes over adversarial
// text (which logit_bias makes easy to force) cost O(held x stop) per stop, per choice, per step
// on the engine thread. Knuth-Morris-Pratt tables make a scan O(held + stop) per stop.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace arbor {

class StopStrings {
 public:
  StopStrings() = default;
  explicit StopStrings(std::vector<std::string> stops);

  bool empty() const { return stops_.empty(); }

  struct Scan {
    size_t cut = std::string_view::npos;  // start of the earliest occurrence of any stop
    size_t keep = 0;  // without one: the longest suffix of the text that begins some stop
  };
  Scan scan(std::string_view text) const;

 private:
  std::vector<std::string> stops_;
  std::vector<std::vector<int32_t>> fail_;  // per stop: KMP failure function
};

}  // namespace arbor
