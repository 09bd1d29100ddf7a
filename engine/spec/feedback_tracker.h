// Per-request bookkeeping shared by every proposer: which requests are open, which positions
// have been observed, and the root of the next tree. Checks the begin/observe/propose/end
// contract of proposer.h in one place, with messages naming the request and the values.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "engine/spec/proposer.h"

namespace arbor {

// What a proposer requires of TargetFeedback beyond tokens.
struct FeedbackShape {
  int64_t vocab = 0;         // token ids must lie in [0, vocab)
  int64_t hidden_width = 0;  // > 0: hidden must be [n, hidden_width]
  int32_t num_captured = 0;  // > 0: captured must hold this many [n, captured_width] spans
  int64_t captured_width = 0;
};

class FeedbackTracker {
 public:
  FeedbackTracker(std::string proposer, FeedbackShape shape);

  // kInvalidArgument when the request is already open or a prompt token is out of range.
  void begin(RequestId request, std::span<const int32_t> prompt);
  // Checks `feedback` against the request and advances it. The first feedback may start
  // anywhere in [0, prompt length] (a prefix served from the cache is never observed); later
  // ones continue where the previous ended. Tokens at prompt positions must be the prompt's,
  // and tokens[0] must equal the previous feedback's next_token when that was given.
  void observe(const TargetFeedback& feedback);
  // The root of the next tree: the last feedback's next_token. kInvalidArgument when the
  // request is not open or no feedback has given a next token yet.
  int32_t root(RequestId request) const;
  // One past the last observed position (0 before the first feedback).
  int32_t observed_end(RequestId request) const;
  // Start of the request's first feedback, -1 before it.
  int32_t first_start(RequestId request) const;
  const std::vector<int32_t>& prompt(RequestId request) const;
  // kInvalidArgument when the request is not open.
  void end(RequestId request);
  // `dst` becomes a copy of `src` (kInvalidArgument when src is not open or dst is).
  void fork(RequestId src, RequestId dst);
  bool is_open(RequestId request) const { return requests_.count(request) != 0; }
  const std::string& proposer() const { return proposer_; }

  // kInvalidArgument unless budget.max_nodes >= 1 and budget.max_depth >= 0.
  void check_budget(RequestId request, const TreeBudget& budget) const;

 private:
  struct State {
    std::vector<int32_t> prompt;
    int32_t first_start = -1;
    int32_t end = 0;
    int32_t next_token = -1;
  };
  const State& get(RequestId request, const char* what) const;
  std::string where(RequestId request, const char* what) const;

  std::string proposer_;
  FeedbackShape shape_;
  std::unordered_map<RequestId, State> requests_;
};

}  // namespace arbor
