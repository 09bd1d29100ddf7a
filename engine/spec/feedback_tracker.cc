#include "engine/spec/feedback_tracker.h"

#include "engine/core/error.h"

namespace arbor {

FeedbackTracker::FeedbackTracker(std::string proposer, FeedbackShape shape)
    : proposer_(std::move(proposer)), shape_(shape) {
  ARBOR_CHECK(shape_.vocab > 0);
}

std::string FeedbackTracker::where(RequestId request, const char* what) const {
  return proposer_ + " proposer: " + what + " for request " + std::to_string(request);
}

const FeedbackTracker::State& FeedbackTracker::get(RequestId request, const char* what) const {
  auto it = requests_.find(request);
  if (it == requests_.end())
    throw_error(ErrorCode::kInvalidArgument,
                where(request, what) + ", which was not begun (or has ended)");
  return it->second;
}

void FeedbackTracker::begin(RequestId request, std::span<const int32_t> prompt) {
  if (requests_.count(request))
    throw_error(ErrorCode::kInvalidArgument,
                where(request, "begin") + ", which is already open (end it first)");
  for (size_t i = 0; i < prompt.size(); ++i)
    if (prompt[i] < 0 || prompt[i] >= shape_.vocab)
      throw_error(ErrorCode::kInvalidArgument,
                  where(request, "begin") + ": prompt token " + std::to_string(i) + " is " +
                      std::to_string(prompt[i]) + ", outside the vocabulary of " +
                      std::to_string(shape_.vocab));
  State s;
  s.prompt.assign(prompt.begin(), prompt.end());
  requests_.emplace(request, std::move(s));
}

void FeedbackTracker::observe(const TargetFeedback& f) {
  const State& cs = get(f.request, "observe");
  State& s = requests_.at(f.request);
  const std::string at = where(f.request, "observe");
  const int64_t n = static_cast<int64_t>(f.tokens.size());
  const int32_t prompt_len = static_cast<int32_t>(cs.prompt.size());
  if (cs.first_start < 0) {
    if (f.start < 0 || f.start > prompt_len)
      throw_error(ErrorCode::kInvalidArgument,
                  at + ": the first feedback starts at position " + std::to_string(f.start) +
                      ", outside [0, " + std::to_string(prompt_len) + "] (the prompt length)");
  } else if (f.start != cs.end) {
    throw_error(ErrorCode::kInvalidArgument,
                at + ": feedback starts at position " + std::to_string(f.start) +
                    " but the previous one ended at " + std::to_string(cs.end) +
                    " (feedback must be contiguous)");
  }
  for (int64_t i = 0; i < n; ++i) {
    const int32_t t = f.tokens[i];
    const int64_t pos = f.start + i;
    if (t < 0 || t >= shape_.vocab)
      throw_error(ErrorCode::kInvalidArgument,
                  at + ": token " + std::to_string(t) + " at position " + std::to_string(pos) +
                      " is outside the vocabulary of " + std::to_string(shape_.vocab));
    if (pos < prompt_len && cs.prompt[pos] != t)
      throw_error(ErrorCode::kInvalidArgument,
                  at + ": token at position " + std::to_string(pos) + " is " + std::to_string(t) +
                      " but the prompt has " + std::to_string(cs.prompt[pos]));
  }
  if (n > 0 && cs.first_start >= 0 && cs.next_token >= 0 && f.tokens[0] != cs.next_token)
    throw_error(ErrorCode::kInvalidArgument, at + ": token at position " + std::to_string(f.start) +
                                                 " is " + std::to_string(f.tokens[0]) +
                                                 " but the previous feedback's next_token was " +
                                                 std::to_string(cs.next_token));
  const int64_t next_pos = f.start + n;
  if (f.next_token < -1 || f.next_token >= shape_.vocab)
    throw_error(ErrorCode::kInvalidArgument, at + ": next_token " + std::to_string(f.next_token) +
                                                 " is outside the vocabulary of " +
                                                 std::to_string(shape_.vocab) +
                                                 " (-1 = not known yet)");
  if (f.next_token >= 0 && next_pos < prompt_len && cs.prompt[next_pos] != f.next_token)
    throw_error(ErrorCode::kInvalidArgument, at + ": next_token " + std::to_string(f.next_token) +
                                                 " at position " + std::to_string(next_pos) +
                                                 " but the prompt has " +
                                                 std::to_string(cs.prompt[next_pos]));
  if (shape_.hidden_width > 0 && static_cast<int64_t>(f.hidden.size()) != n * shape_.hidden_width)
    throw_error(ErrorCode::kInvalidArgument,
                at + ": hidden holds " + std::to_string(f.hidden.size()) + " values, expected " +
                    std::to_string(n) + " rows x " + std::to_string(shape_.hidden_width));
  if (shape_.num_captured > 0) {
    if (static_cast<int32_t>(f.captured.size()) != shape_.num_captured)
      throw_error(ErrorCode::kInvalidArgument,
                  at + ": captured holds " + std::to_string(f.captured.size()) +
                      " layers, expected " + std::to_string(shape_.num_captured) +
                      " (capture_layers())");
    for (size_t c = 0; c < f.captured.size(); ++c)
      if (static_cast<int64_t>(f.captured[c].size()) != n * shape_.captured_width)
        throw_error(ErrorCode::kInvalidArgument,
                    at + ": captured[" + std::to_string(c) + "] holds " +
                        std::to_string(f.captured[c].size()) + " values, expected " +
                        std::to_string(n) + " rows x " + std::to_string(shape_.captured_width));
  }
  if (s.first_start < 0) s.first_start = f.start;
  s.end = static_cast<int32_t>(next_pos);
  s.next_token = f.next_token;
}

int32_t FeedbackTracker::root(RequestId request) const {
  const State& s = get(request, "propose");
  if (s.next_token < 0)
    throw_error(ErrorCode::kInvalidArgument,
                where(request, "propose") +
                    " before any feedback gave the next token (observe with next_token >= 0 "
                    "first)");
  return s.next_token;
}

int32_t FeedbackTracker::observed_end(RequestId request) const {
  return get(request, "query").end;
}

int32_t FeedbackTracker::first_start(RequestId request) const {
  return get(request, "query").first_start;
}

const std::vector<int32_t>& FeedbackTracker::prompt(RequestId request) const {
  return get(request, "query").prompt;
}

void FeedbackTracker::end(RequestId request) {
  get(request, "end");
  requests_.erase(request);
}

void FeedbackTracker::fork(RequestId src, RequestId dst) {
  const State& s = get(src, "fork");
  if (requests_.count(dst))
    throw_error(ErrorCode::kInvalidArgument,
                where(dst, "fork") + ", which is already open (end it first)");
  State copy = s;
  requests_.emplace(dst, std::move(copy));
}

void FeedbackTracker::check_budget(RequestId request, const TreeBudget& budget) const {
  if (budget.max_nodes < 1 || budget.max_depth < 0)
    throw_error(ErrorCode::kInvalidArgument,
                where(request, "propose") + ": tree budget max_nodes " +
                    std::to_string(budget.max_nodes) + ", max_depth " +
                    std::to_string(budget.max_depth) + " (need max_nodes >= 1, max_depth >= 0)");
}

}  // namespace arbor
