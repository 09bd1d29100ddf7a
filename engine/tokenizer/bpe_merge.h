// The merge loop shared by SentencePiece-style and byte-level BPE: repeatedly merge the adjacent
// pair with the best priority (lowest value; leftmost on ties) until no pair can merge. What a
// pair is worth comes from the caller: merge rank (HF / GPT-2) or minus the merged piece's score
// (SentencePiece).
#pragma once

#include <cstdint>
#include <queue>
#include <vector>

namespace arbor {

// One symbol of a word being merged: a byte span of the (normalized) text and its token id
// (-1 while the span is no token, e.g. a SentencePiece character outside the vocabulary).
struct BpeSymbol {
  int32_t id = -1;
  uint32_t start = 0;  // byte offset in the text
  uint32_t len = 0;    // bytes; 0 once merged into its left neighbour
  int32_t prev = -1;   // index of the left neighbour, -1 at the start
  int32_t next = -1;   // index of the right neighbour, -1 at the end
};

// What merging two neighbours gives: `priority` (lower merges first) and the new id.
struct BpeMerge {
  bool possible = false;
  double priority = 0;
  int32_t id = -1;
};

// Merges `symbols` (initially a chain: symbol i's neighbours are i-1 and i+1) in place.
// pair_fn(const BpeSymbol& left, const BpeSymbol& right) -> BpeMerge. Afterwards the surviving
// symbols are those with len > 0, in chain order from index 0.
template <typename PairFn>
void bpe_merge(std::vector<BpeSymbol>& symbols, PairFn&& pair_fn) {
  struct Candidate {
    double priority;
    int32_t left;
    int32_t right;
    uint32_t len;  // left.len + right.len when proposed: a stale candidate no longer matches
    int32_t id;
  };
  struct Worse {
    bool operator()(const Candidate& a, const Candidate& b) const {
      if (a.priority != b.priority) return a.priority > b.priority;
      return a.left > b.left;  // symbol index order is text order
    }
  };
  std::priority_queue<Candidate, std::vector<Candidate>, Worse> queue;
  auto propose = [&](int32_t left, int32_t right) {
    if (left < 0 || right < 0) return;
    const BpeMerge m = pair_fn(symbols[left], symbols[right]);
    if (m.possible) {
      queue.push({m.priority, left, right, symbols[left].len + symbols[right].len, m.id});
    }
  };
  for (size_t i = 0; i + 1 < symbols.size(); ++i) {
    propose(static_cast<int32_t>(i), static_cast<int32_t>(i + 1));
  }
  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    BpeSymbol& left = symbols[c.left];
    BpeSymbol& right = symbols[c.right];
    if (left.len == 0 || right.len == 0 || left.next != c.right || left.len + right.len != c.len) {
      continue;  // one side has changed since the pair was proposed
    }
    left.len += right.len;
    left.id = c.id;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = c.left;
    right.len = 0;
    propose(left.prev, c.left);
    propose(c.left, left.next);
  }
}

}  // namespace arbor
