// Flattens one step's work (prefill chunks, decode tokens, speculation trees of several
// requests) into the StepInputs the Backend consumes: token ids, positions, slot mapping,
// qo_indptr, block tables, packed tree masks and the rows that need logits. Pure logic over the
// KV cache manager's block tables; the reservations must already be applied.
#pragma once

#include <cstdint>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/kv_cache/kv_cache_manager.h"

namespace arbor {

struct StepItem {
  SeqId seq = -1;
  std::vector<int32_t> tokens;   // [T] new tokens at logical committed_len + t
  std::vector<int32_t> parents;  // [T] tree parents (parents[0] = -1), empty = causal chunk
  bool all_logits = false;       // logits for every row (trees), else only the last row
};

class BatchBuilder {
 public:
  // Fills `step` for `items` (in order). Each item's sequence must hold a reservation of
  // exactly tokens.size() tokens. Returns, per item, the first index into step.logits_rows.
  static std::vector<int32_t> build(const KvCacheManager& kv, const std::vector<StepItem>& items,
                                    StepInputs* step);
};

}  // namespace arbor
