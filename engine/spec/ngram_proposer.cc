#include "engine/spec/ngram_proposer.h"

#include <algorithm>
#include <numeric>

#include "engine/core/error.h"

namespace arbor {

void NgramOptions::validate() const {
  auto bad = [](const std::string& field, int32_t v, const std::string& need) {
    throw_error(ErrorCode::kInvalidArgument,
                "n-gram option " + field + " is " + std::to_string(v) + ", " + need);
  };
  if (min_ngram < 1) bad("min_ngram", min_ngram, "need >= 1");
  if (max_ngram < min_ngram)
    bad("max_ngram", max_ngram, "need >= min_ngram (" + std::to_string(min_ngram) + ")");
  if (max_depth < 1) bad("max_depth", max_depth, "need >= 1");
  if (max_nodes < 1) bad("max_nodes", max_nodes, "need >= 1");
  if (max_occurrences < 1) bad("max_occurrences", max_occurrences, "need >= 1");
}

NgramProposer::NgramProposer(const NgramOptions& options, int64_t vocab_size)
    : options_(options), tracker_("ngram", FeedbackShape{vocab_size, 0, 0, 0}) {
  options_.validate();
}

void NgramProposer::begin(RequestId request, std::span<const int32_t> prompt) {
  tracker_.begin(request, prompt);
  history_[request].assign(prompt.begin(), prompt.end());
}

void NgramProposer::observe(const TargetFeedback& feedback) {
  tracker_.observe(feedback);
  std::vector<int32_t>& h = history_.at(feedback.request);
  // Positions inside the prompt were checked against it; later ones extend the history.
  for (size_t i = 0; i < feedback.tokens.size(); ++i) {
    const size_t pos = static_cast<size_t>(feedback.start) + i;
    if (pos >= h.size()) h.push_back(feedback.tokens[i]);
  }
}

bool NgramProposer::fork(RequestId src, RequestId dst) {
  tracker_.fork(src, dst);
  history_[dst] = history_.at(src);
  return true;
}

DraftTree NgramProposer::propose(RequestId request, const TreeBudget& budget) {
  tracker_.check_budget(request, budget);
  const int32_t root = tracker_.root(request);
  const std::vector<int32_t>& h = history_.at(request);
  // Everything observed so far plus the root (prompt tokens past the observed end are excluded:
  // the root stands at observed_end).
  const size_t end = static_cast<size_t>(tracker_.observed_end(request));
  std::vector<int32_t> sequence(h.begin(), h.begin() + std::min(end, h.size()));
  sequence.push_back(root);
  return propose_for(sequence, options_, budget);
}

void NgramProposer::end(RequestId request) {
  tracker_.end(request);
  history_.erase(request);
}

DraftTree NgramProposer::propose_for(std::span<const int32_t> s, const NgramOptions& options,
                                     const TreeBudget& budget) {
  ARBOR_CHECK(!s.empty());
  const int64_t m = static_cast<int64_t>(s.size());
  DraftTree tree = DraftTree::root_only(s.back());
  const int32_t max_depth = std::min(options.max_depth, budget.max_depth);
  const int32_t max_nodes = std::min(options.max_nodes, budget.max_nodes);
  if (max_depth < 1 || max_nodes < 2) return tree;

  // Occurrences j (most recent first) with s[j, j+n) == s[m-n, m) and a continuation s[j+n].
  std::vector<int64_t> starts;
  int64_t n = 0;
  for (int64_t len = std::min<int64_t>(options.max_ngram, m - 1); len >= options.min_ngram; --len) {
    for (int64_t j = m - len - 1; j >= 0; --j) {
      if (std::equal(s.begin() + j, s.begin() + j + len, s.begin() + (m - len))) {
        starts.push_back(j);
        if (static_cast<int32_t>(starts.size()) == options.max_occurrences) break;
      }
    }
    if (!starts.empty()) {
      n = len;
      break;
    }
  }
  if (starts.empty()) return tree;

  // Trie of the continuations s[j+n, j+n+max_depth).
  struct Node {
    int32_t token, parent, depth, count;
    int64_t last;  // most recent occurrence passing through (larger = more recent)
    std::vector<int32_t> children;
  };
  std::vector<Node> trie = {{s.back(), -1, 0, 0, -1, {}}};
  for (int64_t j : starts) {
    int32_t at = 0;
    for (int64_t p = j + n; p < std::min(m, j + n + max_depth); ++p) {
      int32_t next = -1;
      for (int32_t c : trie[at].children)
        if (trie[c].token == s[p]) next = c;
      if (next < 0) {
        next = static_cast<int32_t>(trie.size());
        trie.push_back({s[p], at, trie[at].depth + 1, 0, -1, {}});
        trie[at].children.push_back(next);
      }
      trie[next].count += 1;
      trie[next].last = std::max(trie[next].last, j);
      at = next;
    }
  }
  // Rank: count desc, recency desc, depth asc. A parent's count and recency are never below its
  // child's and its depth is smaller, so it ranks first: the best prefix of the ranking is a tree.
  std::vector<int32_t> order(trie.size() - 1);
  std::iota(order.begin(), order.end(), 1);
  std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const Node &x = trie[a], &y = trie[b];
    if (x.count != y.count) return x.count > y.count;
    if (x.last != y.last) return x.last > y.last;
    if (x.depth != y.depth) return x.depth < y.depth;
    return a < b;
  });
  order.resize(std::min<size_t>(order.size(), static_cast<size_t>(max_nodes - 1)));
  std::vector<int32_t> node_of(trie.size(), -1);
  node_of[0] = 0;
  for (int32_t t : order) {
    const int32_t parent = node_of[trie[t].parent];
    ARBOR_CHECK(parent >= 0, "n-gram trie: node ranked before its parent");
    node_of[t] = tree.size();
    tree.parent.push_back(parent);
    tree.token.push_back(trie[t].token);
  }
  return tree;
}

}  // namespace arbor
