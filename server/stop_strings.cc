#include "server/stop_strings.h"

#include <algorithm>

namespace arbor {

StopStrings::StopStrings(std::vector<std::string> stops) : stops_(std::move(stops)) {
  fail_.reserve(stops_.size());
  for (const std::string& s : stops_) {
    // fail[i]: length of the longest proper prefix of s[0..i] that is also its suffix.
    std::vector<int32_t> fail(s.size(), 0);
    for (size_t i = 1, k = 0; i < s.size(); ++i) {
      while (k > 0 && s[i] != s[k]) k = static_cast<size_t>(fail[k - 1]);
      if (s[i] == s[k]) ++k;
      fail[i] = static_cast<int32_t>(k);
    }
    fail_.push_back(std::move(fail));
  }
}

StopStrings::Scan StopStrings::scan(std::string_view text) const {
  Scan out;
  for (size_t k = 0; k < stops_.size(); ++k) {
    const std::string& s = stops_[k];
    if (s.empty()) continue;  // refused by check_request(); never matches here
    const std::vector<int32_t>& fail = fail_[k];
    size_t j = 0;  // characters of s matched by the text's current suffix
    bool found = false;
    // Past the best cut so far, an occurrence cannot start earlier.
    const size_t end = out.cut == std::string_view::npos
                           ? text.size()
                           : std::min(text.size(), out.cut + s.size() - 1);
    for (size_t i = 0; i < end; ++i) {
      while (j > 0 && text[i] != s[j]) j = static_cast<size_t>(fail[j - 1]);
      if (text[i] == s[j]) ++j;
      if (j == s.size()) {
        out.cut = std::min(out.cut, i + 1 - s.size());
        found = true;
        break;
      }
    }
    if (!found && end == text.size()) out.keep = std::max(out.keep, j);
  }
  if (out.cut != std::string_view::npos) out.keep = 0;
  return out;
}

}  // namespace arbor
