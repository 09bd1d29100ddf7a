// API key checks shared by the HTTP and gRPC front ends.
#pragma once

#include <cstddef>
#include <string_view>

namespace arbor {

// Constant-time comparison of a presented secret with the expected one: the time taken depends
// on the presented value's length only, so it tells nothing about the expected value, its
// length included (a length mismatch is folded into the result, not returned early).
inline bool same_secret(std::string_view given, std::string_view expected) {
  if (expected.empty()) return false;
  unsigned char diff = given.size() != expected.size() ? 1 : 0;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ expected[i % expected.size()]);
  return diff == 0;
}

}  // namespace arbor
