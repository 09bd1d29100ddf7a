// Greedy decoding from argmax ids (ForwardRequest::argmax_only): Backend::argmax_rows on the CPU
// reference against engine/sampling's argmax() (ties, -0 vs +0, -inf, NaN / +inf rows), and
// verify_greedy_argmax() against verify() on the same logits: random trees over logits full of
// deliberate ties, every VerifyMode, bad rows at matched and unmatched nodes.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cpu/cpu_backend.h"
#include "engine/core/error.h"
#include "engine/sampling/logits_processors.h"
#include "engine/sampling/sampler.h"
#include "engine/verify/verifier.h"

namespace arbor {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();
constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();

// argmax() of a row, or -1 where it throws (the contract of argmax_rows).
int32_t host_argmax(std::span<const float> row) {
  try {
    return argmax(row);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    return -1;
  }
}

// [rows, cols] logits drawn from a handful of values, so most rows have tied maxima; some rows
// get -0/+0 ties, -inf entries, an all -inf row, a NaN or a +inf.
std::vector<float> tied_logits(std::mt19937& gen, int64_t rows, int64_t cols, bool specials) {
  std::vector<float> x(static_cast<size_t>(rows * cols));
  for (float& v : x) v = static_cast<float>(static_cast<int>(gen() % 4)) - 2.0f;
  if (!specials) return x;
  for (int64_t r = 0; r < rows; ++r) {
    float* row = x.data() + r * cols;
    switch (gen() % 8) {
      case 0:  // max is a +-0 tie
        for (int64_t c = 0; c < cols; ++c) row[c] = (gen() % 2) ? 0.0f : -0.0f;
        row[gen() % cols] = -1.0f;
        break;
      case 1:  // -inf entries, the rest tied
        for (int64_t c = 0; c < cols; ++c) row[c] = (gen() % 3) ? -kInf : 1.5f;
        break;
      case 2:
        for (int64_t c = 0; c < cols; ++c) row[c] = -kInf;
        break;
      case 3:
        row[gen() % cols] = kNaN;
        break;
      case 4:
        row[gen() % cols] = kInf;
        break;
      default:
        break;
    }
  }
  return x;
}

TEST(ArgmaxRows, CpuMatchesHostArgmaxWithTies) {
  std::mt19937 gen(5);
  CpuBackend backend(1);
  int32_t rejected = 0, tied = 0;
  for (int64_t cols : {1, 2, 3, 7, 64, 257, 1000}) {
    const int64_t rows = 1 + static_cast<int64_t>(gen() % 40);
    const std::vector<float> x = tied_logits(gen, rows, cols, true);
    backend.reset_scratch();
    const Tensor t = backend.scratch(rows, cols);
    backend.upload(x.data(), t);
    std::vector<int32_t> ids = {123};
    backend.argmax_rows(t, &ids);
    ASSERT_EQ(ids.size(), static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r) {
      const std::span<const float> row(x.data() + r * cols, static_cast<size_t>(cols));
      const int32_t want = host_argmax(row);
      EXPECT_EQ(ids[static_cast<size_t>(r)], want) << "cols " << cols << " row " << r;
      rejected += want < 0;
      if (want >= 0) tied += std::count(row.begin(), row.end(), row[want]) > 1;
    }
  }
  EXPECT_GT(rejected, 5);  // the special rows were exercised
  EXPECT_GT(tied, 20);
}

// A random tree whose children often carry their parent row's argmax (so paths match deeply),
// with duplicate siblings.
DraftTree random_tree(std::mt19937& gen, int32_t size, int32_t vocab, int32_t root,
                      const std::vector<float>& logits) {
  DraftTree tree = DraftTree::root_only(root);
  for (int32_t i = 1; i < size; ++i) {
    const int32_t p = std::uniform_int_distribution<int32_t>(std::max(0, i - 4), i - 1)(gen);
    const std::span<const float> row(logits.data() + static_cast<size_t>(p) * vocab,
                                     static_cast<size_t>(vocab));
    const int32_t best = host_argmax(row);
    tree.parent.push_back(p);
    tree.token.push_back(best >= 0 && gen() % 10 < 7 ? best : static_cast<int32_t>(gen() % vocab));
  }
  return tree;
}

// verify()'s result, or the kInvalidArgument it throws (as a marker result).
VerifyResult verify_or_error(const std::function<VerifyResult()>& call, std::string* error) {
  try {
    return call();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    *error = "error";
    return {};
  }
}

TEST(VerifyGreedyArgmax, EqualsVerifyOnLogitsWithTies) {
  std::mt19937 gen(17);
  SamplingParams params;
  params.temperature = 0.0f;
  const Sampler sampler(params);
  CpuBackend backend(1);
  int64_t accepted = 0, errors = 0, trials = 0;
  for (VerifyMode mode : {VerifyMode::kGreedy, VerifyMode::kRejection, VerifyMode::kTypical}) {
    for (int32_t trial = 0; trial < 400; ++trial) {
      const int32_t vocab = 2 + static_cast<int32_t>(gen() % 6);
      const int32_t size = 1 + static_cast<int32_t>(gen() % 40);
      const std::vector<float> logits = tied_logits(gen, size, vocab, trial % 4 == 0);
      const std::vector<int32_t> prompt = {static_cast<int32_t>(gen() % vocab), 1 % vocab};
      const DraftTree tree = random_tree(gen, size, vocab, prompt.back(), logits);
      backend.reset_scratch();
      const Tensor t = backend.scratch(size, vocab);
      backend.upload(logits.data(), t);
      std::vector<int32_t> ids;
      backend.argmax_rows(t, &ids);

      std::string from_logits_error, from_ids_error;
      Rng rng(trial);
      const Rng before = rng;
      const VerifyResult want = verify_or_error(
          [&] { return verify(tree, logits, vocab, sampler, prompt, {}, rng, {mode}); },
          &from_logits_error);
      const VerifyResult got = verify_or_error(
          [&] { return verify_greedy_argmax(tree, ids, vocab, prompt, {}); }, &from_ids_error);
      ASSERT_EQ(from_ids_error, from_logits_error) << "trial " << trial;
      EXPECT_EQ(got.accepted_nodes, want.accepted_nodes) << "trial " << trial;
      EXPECT_EQ(got.accepted_tokens, want.accepted_tokens) << "trial " << trial;
      EXPECT_EQ(got.bonus_token, want.bonus_token) << "trial " << trial;
      EXPECT_EQ(got.children_tried, want.children_tried) << "trial " << trial;
      Rng copy = before;
      EXPECT_EQ(rng.next_u64(), copy.next_u64());
      accepted += got.num_accepted();
      errors += !from_ids_error.empty();
      ++trials;
    }
  }
  EXPECT_GT(accepted, 2 * trials);  // deep acceptance exercised
  EXPECT_GT(errors, 10);            // bad rows on matched nodes exercised
  EXPECT_LT(errors, trials / 4);
}

TEST(VerifyGreedyArgmax, RejectsInconsistentArguments) {
  const DraftTree tree{{-1, 0}, {3, 1}, {}, {}};
  const std::vector<int32_t> prompt = {0, 3};
  const std::vector<int32_t> ids = {1, 2};
  EXPECT_NO_THROW(verify_greedy_argmax(tree, ids, 4, prompt, {}));
  auto message = [&](auto&& call) {
    try {
      call();
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      return std::string(e.what());
    }
    return std::string("no error");
  };
  const std::vector<int32_t> short_ids = {1};
  EXPECT_NE(message([&] {
              verify_greedy_argmax(tree, short_ids, 4, prompt, {});
            }).find("1 argmax ids for 2 tree nodes"),
            std::string::npos);
  const std::vector<int32_t> other = {2};
  EXPECT_NE(message([&] {
              verify_greedy_argmax(tree, ids, 4, prompt, other);
            }).find("end with 2 but the tree's root token is 3"),
            std::string::npos);
  const std::vector<int32_t> bad_root = {-1, 2};
  EXPECT_NE(message([&] {
              verify_greedy_argmax(tree, bad_root, 4, prompt, {});
            }).find("tree node 0 have no argmax"),
            std::string::npos);
}

}  // namespace
}  // namespace arbor
