// Test support: builds StepInputs for several sequences whose blocks are handed out from a
// simple counter in a deliberately scrambled order (so paging is exercised), without the KV
// cache manager. Used by forward-pass tests that compare against outside references.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <random>
#include <vector>

#include "engine/backend/backend.h"
#include "engine/verify/tree_mask.h"

namespace arbor::testing {

class DirectBatch {
 public:
  DirectBatch(int64_t num_blocks, int64_t block_size, uint64_t seed = 1)
      : block_size_(block_size), free_(static_cast<size_t>(num_blocks)) {
    std::iota(free_.begin(), free_.end(), 0);
    std::mt19937_64 rng(seed);
    std::shuffle(free_.begin(), free_.end(), rng);
  }

  int add_sequence() {
    seqs_.push_back({});
    return static_cast<int>(seqs_.size()) - 1;
  }
  int64_t committed(int seq) const { return seqs_[seq].committed; }

  struct Chunk {
    int seq;
    std::vector<int32_t> tokens;  // appended after the committed prefix
    bool want_all_logits;         // logits for every row, else only the last
    // Tree chunk when non-empty: parent[i] of each token (parent[0] = -1); such a chunk is
    // scored with the packed ancestor mask and not committed.
    std::vector<int32_t> parents = {};
  };

  // One step over several sequences' chunks; commits the causal chunks.
  StepInputs step(const std::vector<Chunk>& chunks) {
    StepInputs s;
    s.qo_indptr.push_back(0);
    s.mask_indptr.push_back(0);
    int32_t max_blocks = 0;
    for (const Chunk& c : chunks) {
      Seq& q = seqs_[c.seq];
      const int64_t end = q.committed + static_cast<int64_t>(c.tokens.size());
      while (static_cast<int64_t>(q.blocks.size()) * block_size_ < end) {
        q.blocks.push_back(free_.back());
        free_.pop_back();
      }
      max_blocks = std::max<int32_t>(max_blocks, static_cast<int32_t>(q.blocks.size()));
    }
    s.max_blocks_per_request = max_blocks;
    for (const Chunk& c : chunks) {
      Seq& q = seqs_[c.seq];
      const int32_t row0 = s.num_tokens();
      const bool tree = !c.parents.empty();
      const std::vector<int32_t> depth =
          tree ? tree_depths(c.parents) : std::vector<int32_t>(c.tokens.size(), 0);
      for (size_t i = 0; i < c.tokens.size(); ++i) {
        const int64_t logical = q.committed + static_cast<int64_t>(i);
        s.token_ids.push_back(c.tokens[i]);
        s.positions.push_back(static_cast<int32_t>(tree ? q.committed + depth[i] : logical));
        s.slot_mapping.push_back(q.blocks[logical / block_size_] * block_size_ +
                                 logical % block_size_);
        if (c.want_all_logits || i + 1 == c.tokens.size())
          s.logits_rows.push_back(row0 + static_cast<int32_t>(i));
      }
      s.qo_indptr.push_back(s.num_tokens());
      if (tree) {
        const std::vector<uint32_t> mask = pack_ancestor_mask(c.parents);
        s.tree_mask.insert(s.tree_mask.end(), mask.begin(), mask.end());
      }
      s.mask_indptr.push_back(static_cast<int32_t>(s.tree_mask.size()));
      s.committed_len.push_back(static_cast<int32_t>(q.committed));
      for (int32_t b = 0; b < max_blocks; ++b)
        s.block_tables.push_back(b < static_cast<int32_t>(q.blocks.size()) ? q.blocks[b] : -1);
      if (!tree) q.committed += static_cast<int64_t>(c.tokens.size());
    }
    return s;
  }

 private:
  struct Seq {
    std::vector<int32_t> blocks;
    int64_t committed = 0;
  };
  int64_t block_size_;
  std::vector<int32_t> free_;
  std::vector<Seq> seqs_;
};

}  // namespace arbor::testing
