// The largest tree a request may draft in one step: what the scheduler grants and the verifier
// checks.
#pragma once

#include <cstdint>

namespace arbor {

struct TreeBudget {
  int32_t max_nodes = 64;  // total nodes including the root
  int32_t max_depth = 8;   // edges below the root
};

}  // namespace arbor
