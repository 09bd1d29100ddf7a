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
  // [T] or empty: row t's id is StepInputs::token_source[token_index[t]] where >= 0 (a
  // drafter's tokens left on the backend; tokens[t] is then a placeholder).
  std::vector<int64_t> token_index;
  // [T] or empty: row t's parent is StepInputs::token_source[parent_index[t]] where >= 0 (a
  // drafter's tree shape left on the device; parents then holds a placeholder tree).
  std::vector<int64_t> parent_index;
};

class BatchBuilder {
 public:
  // Fills `step` for `items` (in order). Each item's sequence must hold a reservation of
  // exactly tokens.size() tokens. Returns, per item, the first index into step.logits_rows.
  // step.token_source_index is filled when an item has a token_index (token_source is the
  // caller's to set).
  static std::vector<int32_t> build(const KvCacheManager& kv, const std::vector<StepItem>& items,
                                    StepInputs* step);
};

}  // namespace arbor
