// StepInputs key paths (the EAGLE draft's tree rows on the backend): a causal request whose keys
// from key_path_base on are read through its path attends exactly as the same request with
// those keys copied into place (CPU backend, bit for bit), and malformed paths are refused with
// the field named.
#include <gtest/gtest.h>

#include <random>

#include "engine/backend/cpu/cpu_backend.h"
#include "tests/unit/loader_test_util.h"

namespace arbor {
namespace {

constexpr int64_t kHeadDim = 4, kBlock = 4;

StepInputs one_row(int32_t committed) {
  StepInputs s;
  s.token_ids = {0};
  s.positions = {committed};
  s.slot_mapping = {0};
  s.qo_indptr = {0, 1};
  s.committed_len = {committed};
  s.block_tables = {0, 1, 2};
  s.max_blocks_per_request = 3;
  s.mask_indptr = {0, 0};
  return s;
}

std::vector<float> attend(CpuBackend& b, const StepInputs& step, const std::vector<float>& q) {
  b.set_step(step);
  b.reset_scratch();
  const Tensor qt = b.scratch(1, kHeadDim), out = b.scratch(1, kHeadDim);
  b.upload(q.data(), qt);
  b.paged_tree_attention(0, qt, 1, out);
  std::vector<float> o(kHeadDim);
  b.download(out, o.data());
  return o;
}

TEST(KeyPaths, PathReadsEqualTheSameKeysCopiedIntoPlace) {
  CpuBackend b(1);
  b.allocate_kv({1, 3, kBlock, 1, kHeadDim});
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  // Twelve slots of random K/V.
  StepInputs fill;
  fill.qo_indptr = {0, 12};
  fill.committed_len = {0};
  fill.block_tables = {0, 1, 2};
  fill.max_blocks_per_request = 3;
  fill.mask_indptr = {0, 0};
  for (int32_t i = 0; i < 12; ++i) {
    fill.token_ids.push_back(0);
    fill.positions.push_back(i);
    fill.slot_mapping.push_back(i);
  }
  b.set_step(fill);
  b.reset_scratch();
  std::vector<float> kv(12 * kHeadDim);
  const Tensor k = b.scratch(12, kHeadDim), v = b.scratch(12, kHeadDim);
  for (const Tensor& t : {k, v}) {
    for (float& x : kv) x = u(rng);
    b.upload(kv.data(), t);
  }
  b.write_kv(0, k, v);
  std::vector<float> q(kHeadDim);
  for (float& x : q) x = u(rng);

  // Six keys: 0..2 in place, then keys 3..5 read at 3 + {4, 1, 6} = slots 7, 4, 9.
  StepInputs paths = one_row(5);
  paths.key_path_base = {3};
  paths.key_path_indptr = {0, 4};  // room for one more entry than the keys need
  paths.key_path = {4, 1, 6, 0};
  paths.key_path_span = 9;
  const std::vector<float> via_paths = attend(b, paths, q);
  b.copy_kv({7, 4, 9}, {3, 4, 5});
  const std::vector<float> in_place = attend(b, one_row(5), q);
  EXPECT_EQ(via_paths, in_place);
  // The path matters: reading other slots gives another result.
  paths.key_path = {5, 1, 6, 0};
  EXPECT_NE(attend(b, paths, q), in_place);
}

TEST(KeyPaths, MalformedPathsAreRefused) {
  CpuBackend b(1);
  b.allocate_kv({1, 3, kBlock, 1, kHeadDim});
  StepInputs s = one_row(5);
  s.key_path_base = {3};
  s.key_path_indptr = {0, 3};
  s.key_path = {0, 1, 9};
  s.key_path_span = 9;
  test::expect_error([&] { b.set_step(s); }, ErrorCode::kInvalidArgument,
                     {"key_path[2] = 9", "key_path_span 9"});
  s.key_path = {0, 1};
  s.key_path_indptr = {0, 2};
  test::expect_error([&] { b.set_step(s); }, ErrorCode::kInvalidArgument,
                     {"request 0: key path of 2 entries from key 3 for 6 keys"});
  s.key_path = {0, 1, 2};
  s.key_path_indptr = {0, 3};
  s.key_path_span = 10;  // from key 3 past the table's 12 keys
  test::expect_error([&] { b.set_step(s); }, ErrorCode::kInvalidArgument,
                     {"key path span 10 from key 3", "12 keys"});
  s.key_path_span = 9;
  s.mask_indptr = {0, 1};
  s.tree_mask = {1u};
  test::expect_error([&] { b.set_step(s); }, ErrorCode::kInvalidArgument, {"key path"});
}

}  // namespace
}  // namespace arbor
