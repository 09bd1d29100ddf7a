#include "engine/runner/batch_builder.h"

#include <algorithm>

#include "engine/backend/tree_sampling.h"
#include "engine/core/error.h"
#include "engine/verify/tree_mask.h"

namespace arbor {

std::vector<int32_t> BatchBuilder::build(const KvCacheManager& kv,
                                         const std::vector<StepItem>& items, StepInputs* step) {
  *step = StepInputs{};
  StepInputs& s = *step;
  int32_t width = 0;
  for (const StepItem& it : items)
    width = std::max<int32_t>(width, static_cast<int32_t>(kv.block_table(it.seq).size()));
  s.max_blocks_per_request = width;
  s.qo_indptr.push_back(0);
  s.mask_indptr.push_back(0);
  std::vector<int32_t> first_logit_row;
  for (const StepItem& it : items) {
    const int32_t t = static_cast<int32_t>(it.tokens.size());
    const int32_t committed = kv.committed_len(it.seq);
    ARBOR_CHECK(kv.reserved_len(it.seq) == t, "sequence " + std::to_string(it.seq) + " reserved " +
                                                  std::to_string(kv.reserved_len(it.seq)) +
                                                  " tokens, step has " + std::to_string(t));
    const bool tree = !it.parents.empty();
    ARBOR_CHECK(!tree || static_cast<int32_t>(it.parents.size()) == t);
    const std::vector<int32_t> depth = tree ? tree_depths(it.parents) : std::vector<int32_t>();
    const std::vector<int64_t> slots = kv.slots(it.seq, committed, t);
    first_logit_row.push_back(static_cast<int32_t>(s.logits_rows.size()));
    const int32_t row0 = s.num_tokens();
    append_source_index(&s.token_source_index, it.token_index, static_cast<size_t>(row0),
                        static_cast<size_t>(t));
    append_source_index(&s.parent_source_index, it.parent_index, static_cast<size_t>(row0),
                        static_cast<size_t>(t));
    for (int32_t i = 0; i < t; ++i) {
      s.token_ids.push_back(it.tokens[i]);
      s.positions.push_back(committed + (tree ? depth[i] : i));
      s.slot_mapping.push_back(slots[i]);
      if (it.all_logits || i + 1 == t) s.logits_rows.push_back(row0 + i);
    }
    s.qo_indptr.push_back(s.num_tokens());
    if (tree && t > 1) {
      const std::vector<uint32_t> mask = pack_ancestor_mask(it.parents);
      s.tree_mask.insert(s.tree_mask.end(), mask.begin(), mask.end());
    }
    s.mask_indptr.push_back(static_cast<int32_t>(s.tree_mask.size()));
    s.committed_len.push_back(committed);
    kv.append_block_table(it.seq, width, &s.block_tables);
  }
  return first_logit_row;
}

}  // namespace arbor
