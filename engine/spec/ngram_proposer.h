// Prompt-lookup (n-gram) proposer, no weights: finds earlier occurrences of the current suffix
// (the last n tokens of prompt + output, root included) for n from max_ngram down to min_ngram,
// stops at the first n that has any, and proposes what followed those occurrences. Different
// continuations become branches: the trie of continuations, nodes ranked by how many occurrences
// pass through them, then by the most recent one, and the best nodes kept within the budget
// (a parent always ranks before its children). Deterministic (q = one-hot).
#pragma once

#include <unordered_map>

#include "engine/spec/feedback_tracker.h"
#include "engine/spec/proposer.h"

namespace arbor {

struct NgramOptions {
  int32_t min_ngram = 1;         // shortest suffix matched
  int32_t max_ngram = 4;         // longest suffix matched (tried first)
  int32_t max_depth = 8;         // longest continuation proposed (tree depth)
  int32_t max_nodes = 64;        // tree nodes including the root
  int32_t max_occurrences = 64;  // most recent occurrences used
  void validate() const;         // kInvalidArgument naming the field
};

class NgramProposer final : public Proposer {
 public:
  NgramProposer(const NgramOptions& options, int64_t vocab_size);

  std::string name() const override { return "ngram"; }
  bool varying_tree_sizes() const override { return true; }
  void begin(RequestId request, std::span<const int32_t> prompt) override;
  void observe(const TargetFeedback& feedback) override;
  DraftTree propose(RequestId request, const TreeBudget& budget) override;
  void end(RequestId request) override;
  bool fork(RequestId src, RequestId dst) override;

  // The proposal for a token sequence whose last token is the root (pure; used by propose()).
  static DraftTree propose_for(std::span<const int32_t> sequence, const NgramOptions& options,
                               const TreeBudget& budget);

 private:
  NgramOptions options_;
  FeedbackTracker tracker_;
  std::unordered_map<RequestId, std::vector<int32_t>> history_;  // committed tokens per request
};

}  // namespace arbor
