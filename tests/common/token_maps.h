// Test support: a token map (engine/draft/eagle_checkpoint.h, load_token_map /
// restrict_draft_vocab) that is a non-contiguous draft vocabulary in another order than the
// target's ids.
#pragma once

#include <cstdint>
#include <vector>

namespace arbor::test {

// Every third id of a `vocab`-token vocabulary, highest first.
inline std::vector<int32_t> every_third_descending(int64_t vocab) {
  std::vector<int32_t> ids;
  for (int64_t id = vocab - 1; id >= 0; id -= 3) ids.push_back(static_cast<int32_t>(id));
  return ids;
}

}  // namespace arbor::test
