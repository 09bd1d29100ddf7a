// Batch invariance of the CUDA backend (CudaBackendOptions::batch_invariant, on by default):
// bit-for-bit equal results for a token row whatever else shares its step.
//   * linear: M rows at once == each row alone == random subsets in random order, M up to 512,
//     for each batch-invariant GEMM (cuBLASLt fixed algorithm with the chain GEMM at 1-16 rows,
//     own kernel, chunked kernel), and the chain GEMM == cuBLASLt;
//   * attention: a request's rows alone == in a mixed batch (prefill chunk, decode, other
//     trees), and a tree node's row == the same query decoded (T = 1) after its ancestor path
//     was committed as a causal chain;
//   * model level (cuda_model_test.cc): greedy with speculation == plain greedy, batch == alone.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/core/error.h"
#include "engine/verify/tree_mask.h"
#include "tests/common/direct_batch.h"
#include "tests/cuda/cuda_test_util.h"

namespace arbor {
namespace {

using testing::DirectBatch;

bool bitwise_equal(const float* a, const float* b, size_t n) {
  return std::memcmp(a, b, n * sizeof(float)) == 0;
}

class CudaLinearInvariance : public ::testing::TestWithParam<int> {};

TEST_P(CudaLinearInvariance, RowsIndependentOfBatch) {
  ARBOR_REQUIRE_GPU();
  CudaBackendOptions o;
  o.batch_invariant = true;
  o.batch_invariant_gemm = GetParam();
  CudaBackend b(o);
  std::mt19937 rng(7);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {4096, 4096}, {1024, 4096}, {14336, 4096}, {4096, 14336}, {512, 172}, {96, 1024}};
  constexpr int64_t kMaxRows = 512;
  int checked_subsets = 0;
  for (auto [o_feat, k] : shapes) {
    HostTensor w({o_feat, k});
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    for (auto& x : w.data) x = d(rng) * std::sqrt(3.f / static_cast<float>(k));
    const Tensor wt = b.upload_weight(w);
    const std::vector<float> x = testing::random_vector(rng, static_cast<size_t>(kMaxRows * k));
    b.reset_scratch();
    Tensor xs = b.scratch(kMaxRows, k), ys = b.scratch(kMaxRows, o_feat);
    b.upload(x.data(), xs);
    b.linear(xs, wt, Tensor{}, ys);
    std::vector<float> full(static_cast<size_t>(kMaxRows * o_feat));
    b.download(ys, full.data());
    // The values themselves: rows against a double-precision product of the bf16-rounded
    // inputs (each GEMM sums in its own order; fp32 accumulation over K terms).
    double max_err = 0, max_ref = 0;
    for (int64_t r : {int64_t{0}, int64_t{37}, kMaxRows - 1})
      for (int64_t oo = 0; oo < o_feat; oo += std::max<int64_t>(1, o_feat / 97)) {
        double ref = 0;
        for (int64_t kk = 0; kk < k; ++kk)
          ref += static_cast<double>(testing::round_bf16(x[r * k + kk])) *
                 testing::round_bf16(w.data[oo * k + kk]);
        max_err = std::max(max_err, std::abs(ref - full[r * o_feat + oo]));
        max_ref = std::max(max_ref, std::abs(ref));
      }
    EXPECT_LT(max_err, 1e-4 * std::max(1.0, max_ref) * std::sqrt(static_cast<double>(k)))
        << "gemm " << GetParam() << " out " << o_feat << " in " << k;
    // Subsets: single rows, then random subsets of many sizes in random order.
    std::vector<std::vector<int64_t>> subsets;
    for (int64_t r : {0, 1, 63, 64, 255, 511}) subsets.push_back({r});
    for (int64_t m : {2, 3, 7, 16, 31, 64, 100, 255, 257, 511}) {
      std::vector<int64_t> all(kMaxRows);
      for (int64_t i = 0; i < kMaxRows; ++i) all[i] = i;
      std::shuffle(all.begin(), all.end(), rng);
      subsets.push_back({all.begin(), all.begin() + m});
    }
    for (const auto& sub : subsets) {
      const int64_t m = static_cast<int64_t>(sub.size());
      std::vector<float> xsub(static_cast<size_t>(m * k));
      for (int64_t i = 0; i < m; ++i) std::copy_n(x.begin() + sub[i] * k, k, xsub.begin() + i * k);
      b.reset_scratch();
      Tensor xm = b.scratch(m, k), ym = b.scratch(m, o_feat);
      b.upload(xsub.data(), xm);
      b.linear(xm, wt, Tensor{}, ym);
      std::vector<float> got(static_cast<size_t>(m * o_feat));
      b.download(ym, got.data());
      int bad_rows = 0;
      for (int64_t i = 0; i < m; ++i)
        bad_rows += !bitwise_equal(got.data() + i * o_feat, full.data() + sub[i] * o_feat,
                                   static_cast<size_t>(o_feat));
      EXPECT_EQ(bad_rows, 0) << "gemm " << GetParam() << " out " << o_feat << " in " << k << ": "
                             << bad_rows << " of " << m << " rows differ from the " << kMaxRows
                             << "-row launch";
      ++checked_subsets;
    }
    if (GetParam() == 0)
      std::printf("  linear out %lld in %lld: %s\n", static_cast<long long>(o_feat),
                  static_cast<long long>(k), b.batch_invariant_gemm_algo(o_feat, k).c_str());
  }
  std::printf("  batch-invariant gemm %d: %d subsets x %zu shapes checked bitwise\n", GetParam(),
              checked_subsets / static_cast<int>(shapes.size()), shapes.size());
}

// The chain GEMM (kernels/gemm/chain_gemm.h) that takes the 1-16-row launches of the cuBLASLt
// path must give cuBLASLt's bits: every row of launches of 1..16 rows against the same rows
// computed by cuBLASLt alone (a backend with chain_gemm_max_rows = 0), on ragged shapes (O not
// a multiple of the CTA's 32 rows, K not a multiple of the k per stage). Without tuning the
// backend takes the chain kernel wherever its first-use check finds it bitwise equal, so the
// test also asserts that it was taken where cuBLASLt runs its usual chain.
TEST(CudaChainGemm, EqualsCublasLt) {
  ARBOR_REQUIRE_GPU();
  CudaBackendOptions o;
  o.batch_invariant = true;
  o.tune_invariant_gemm = false;
  o.chain_gemm_max_rows = 16;  // both kernel variants (<= 8 and 9-16 token rows)
  CudaBackendOptions ref_o = o;
  ref_o.chain_gemm_max_rows = 0;
  CudaBackend b(o), ref(ref_o);
  std::mt19937 rng(11);
  const std::vector<std::pair<int64_t, int64_t>> shapes = {
      {4096, 4096}, {1000, 4640}, {1536, 576}, {96, 1024}, {49, 272}, {6144, 4096}};
  for (auto [o_feat, k] : shapes) {
    HostTensor w({o_feat, k});
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    for (auto& x : w.data) x = d(rng) * std::sqrt(3.f / static_cast<float>(k));
    const Tensor wt = b.upload_weight(w), wr = ref.upload_weight(w);
    for (int64_t m : {1, 2, 5, 8, 9, 13, 16}) {
      const std::vector<float> x = testing::random_vector(rng, static_cast<size_t>(m * k));
      std::vector<float> got(static_cast<size_t>(m * o_feat)), want(got.size());
      for (CudaBackend* be : {&b, &ref}) {
        be->reset_scratch();
        Tensor xs = be->scratch(m, k), ys = be->scratch(m, o_feat);
        be->upload(x.data(), xs);
        be->linear(xs, be == &b ? wt : wr, Tensor{}, ys);
        be->download(ys, (be == &b ? got : want).data());
      }
      int bad_rows = 0;
      for (int64_t i = 0; i < m; ++i)
        bad_rows += !bitwise_equal(got.data() + i * o_feat, want.data() + i * o_feat,
                                   static_cast<size_t>(o_feat));
      EXPECT_EQ(bad_rows, 0) << "out " << o_feat << " in " << k << ", " << m << " rows";
    }
    // For 49 x 272 cuBLASLt's first candidate is another kernel (algo 24 on the H100) that sums
    // in another order: the check finds that and the launches stay on cuBLASLt (still equal).
    const std::string algo = b.batch_invariant_gemm_algo(o_feat, k);
    std::printf("  out %lld in %lld: %s\n", static_cast<long long>(o_feat),
                static_cast<long long>(k), algo.c_str());
    if (o_feat != 49) {
      EXPECT_NE(algo.find("chain GEMM at <= 16 rows"), std::string::npos)
          << "out " << o_feat << " in " << k << ": " << algo;
    }
    EXPECT_EQ(ref.batch_invariant_gemm_algo(o_feat, k).find("chain"), std::string::npos);
  }
}

INSTANTIATE_TEST_SUITE_P(
    Gemm, CudaLinearInvariance, ::testing::Values(0, 1, 2), [](const auto& info) {
      return std::string(info.param == 0 ? "cublaslt" : info.param == 1 ? "own_kernel" : "chunked");
    });

// Attention at the op level: one layer, K/V and Q uploaded directly (a token's K/V and Q are
// a function of (sequence data id, logical position) so two sequences can hold identical data).
struct AttnCase {
  int64_t head_dim;
  int attention_kernel;  // CudaBackendOptions::attention_kernel
  int tree_groups = 2;   // CudaBackendOptions::attention_tree_groups (2: always group)
};

class CudaAttentionInvariance : public ::testing::TestWithParam<AttnCase> {
 protected:
  static constexpr int64_t kBlocks = 1024, kBlock = 16, kHq = 8, kHkv = 2;

  void SetUp() override {
    ARBOR_REQUIRE_GPU();
    CudaBackendOptions o;
    o.batch_invariant = true;
    o.attention_kernel = GetParam().attention_kernel;
    o.attention_tree_groups = GetParam().tree_groups;
    try {
      b_ = std::make_unique<CudaBackend>(o);
    } catch (const Error& e) {
      GTEST_SKIP() << e.what();
    }
    d_ = GetParam().head_dim;
    b_->allocate_kv({1, kBlocks, kBlock, kHkv, d_});
  }

  // Deterministic pseudo-random row for (data id, position, salt).
  std::vector<float> row(int data, int64_t pos, int salt, int64_t width) const {
    std::mt19937 rng(static_cast<uint32_t>(data * 1000003 + pos * 7919 + salt * 104729));
    return testing::random_vector(rng, static_cast<size_t>(width));
  }

  // Runs one step: per token, (data id, logical key position) of its K/V and Q; returns out.
  std::vector<float> run(const StepInputs& step, const std::vector<std::pair<int, int64_t>>& ids) {
    const int64_t n = step.num_tokens();
    const int64_t qw = kHq * d_, kw = kHkv * d_;
    std::vector<float> q, k, v;
    for (auto [data, pos] : ids) {
      for (float x : row(data, pos, 0, qw)) q.push_back(x);
      for (float x : row(data, pos, 1, kw)) k.push_back(x);
      for (float x : row(data, pos, 2, kw)) v.push_back(x);
    }
    b_->reset_scratch();
    b_->set_step(step);
    Tensor tq = b_->scratch(n, qw), tk = b_->scratch(n, kw), tv = b_->scratch(n, kw),
           to = b_->scratch(n, qw);
    b_->upload(q.data(), tq);
    b_->upload(k.data(), tk);
    b_->upload(v.data(), tv);
    b_->write_kv(0, tk, tv);
    b_->paged_tree_attention(0, tq, kHq, to);
    std::vector<float> out(static_cast<size_t>(n * qw));
    b_->download(to, out.data());
    return out;
  }

  std::unique_ptr<CudaBackend> b_;
  int64_t d_ = 0;
};

std::vector<int32_t> tokens(size_t n) {
  return std::vector<int32_t>(n, 5);
}

// Chunk ids: logical positions committed..committed+T-1 of `data` (tree nodes: data's own
// node numbering, position = 100000 + node so tree data differs from the prefix).
std::vector<std::pair<int, int64_t>> causal_ids(int data, int64_t committed, size_t t) {
  std::vector<std::pair<int, int64_t>> ids;
  for (size_t i = 0; i < t; ++i) ids.push_back({data, committed + static_cast<int64_t>(i)});
  return ids;
}
std::vector<std::pair<int, int64_t>> tree_ids(int data, size_t t) {
  std::vector<std::pair<int, int64_t>> ids;
  for (size_t i = 0; i < t; ++i) ids.push_back({data, 100000 + static_cast<int64_t>(i)});
  return ids;
}

TEST_P(CudaAttentionInvariance, RequestAloneEqualsMixedBatchAndTreeRowEqualsChainDecode) {
  std::mt19937 rng(11);
  DirectBatch batch(kBlocks, kBlock, 5);
  const int64_t qw = kHq * d_;
  // Prefixes: request 0 (700 keys, a tree on top), 1 (100, a prefill chunk), 2 (1500, decode),
  // 3 (300, another tree); 4 holds request 0's prefix again for the chain decodes.
  const std::vector<int64_t> prefix = {700, 100, 1500, 300, 700};
  const std::vector<int> data = {1, 2, 3, 4, 1};
  std::vector<int> seq;
  for (size_t i = 0; i < prefix.size(); ++i) {
    seq.push_back(batch.add_sequence());
    for (int64_t done = 0; done < prefix[i];) {  // prefill in chunks of up to 512
      const int64_t t = std::min<int64_t>(512, prefix[i] - done);
      run(batch.step({{seq[i], tokens(static_cast<size_t>(t)), false}}),
          causal_ids(data[i], done, static_cast<size_t>(t)));
      done += t;
    }
  }
  auto random_parents = [&](int t) {
    std::vector<int32_t> par(t, -1);
    for (int n = 1; n < t; ++n)
      par[n] = std::uniform_int_distribution<int>(std::max(0, n - 6), n - 1)(rng);
    return par;
  };
  const std::vector<int32_t> parents0 = random_parents(40), parents3 = random_parents(17);

  // Request 0's tree alone.
  const auto alone = run(batch.step({{seq[0], tokens(parents0.size()), true, parents0}}),
                         tree_ids(data[0], parents0.size()));
  // Tensor-core kernels score the tree's nodes in groups that share the prefix reads when
  // the option is on (one CTA per node otherwise); the generic path has no work items.
  const int groups = b_->last_attention_tree_groups();
  if (GetParam().tree_groups > 0 && d_ >= 64) {
    EXPECT_GT(groups, 0);
  } else {
    EXPECT_EQ(groups, 0);
  }
  // The same tree in a mixed batch: a prefill chunk, the tree, a decode row, another tree.
  std::vector<std::pair<int, int64_t>> ids = causal_ids(data[1], prefix[1], 37);
  const size_t row0 = ids.size();
  for (auto id : tree_ids(data[0], parents0.size())) ids.push_back(id);
  ids.push_back({data[2], prefix[2]});
  for (auto id : tree_ids(data[3], parents3.size())) ids.push_back(id);
  const auto mixed = run(batch.step({{seq[1], tokens(37), false},
                                     {seq[0], tokens(parents0.size()), true, parents0},
                                     {seq[2], tokens(1), false},
                                     {seq[3], tokens(parents3.size()), true, parents3}}),
                         ids);
  int differ = 0;
  for (size_t i = 0; i < parents0.size(); ++i)
    differ += !bitwise_equal(alone.data() + i * qw, mixed.data() + (row0 + i) * qw,
                             static_cast<size_t>(qw));
  EXPECT_EQ(differ, 0) << differ << " of " << parents0.size()
                       << " tree rows differ between alone and mixed batch";

  // Tree rows vs plain decode: for a few nodes, commit the ancestor path on sequence 4 as a
  // causal chain (same K/V data), decode the node (T = 1), compare with the tree row. Each node
  // gets a fresh copy of the prefix (sequence 4 is re-created).
  const std::vector<int32_t> depth = tree_depths(parents0);
  int chains = 0, chain_equal = 0;
  for (int node : {0, 1, 2, 5, 9, 17, 23, 30, 39}) {
    std::vector<int32_t> path;
    for (int n = node; n >= 0; n = parents0[n]) path.insert(path.begin(), n);
    const int s = batch.add_sequence();
    for (int64_t done = 0; done < prefix[0];) {
      const int64_t t = std::min<int64_t>(512, prefix[0] - done);
      run(batch.step({{s, tokens(static_cast<size_t>(t)), false}}),
          causal_ids(data[0], done, static_cast<size_t>(t)));
      done += t;
    }
    for (size_t k = 0; k < path.size(); ++k) {  // one decode step per path node
      const auto out = run(batch.step({{s, tokens(1), false}}),
                           {{data[0], 100000 + static_cast<int64_t>(path[k])}});
      if (k + 1 == path.size()) {
        ++chains;
        const bool eq =
            bitwise_equal(out.data(), alone.data() + node * qw, static_cast<size_t>(qw));
        chain_equal += eq;
        EXPECT_TRUE(eq) << "tree node " << node << " (depth " << depth[node]
                        << ") differs from its chain decode";
      }
    }
  }

  // Prefill rows vs decode rows: a causal chunk of 64 tokens after request 3's prefix (256
  // rows per kv head: 128-row tiles on the wgmma path) against the same tokens decoded one per
  // step (4-row tiles) on a fresh copy of that prefix.
  constexpr int64_t kChunk = 64;
  auto fresh_prefix = [&] {
    const int s = batch.add_sequence();
    run(batch.step({{s, tokens(static_cast<size_t>(prefix[3])), false}}),
        causal_ids(data[3], 0, static_cast<size_t>(prefix[3])));
    return s;
  };
  const int s_chunk = fresh_prefix();
  const auto chunk =
      run(batch.step({{s_chunk, tokens(kChunk), false}}), causal_ids(data[3], prefix[3], kChunk));
  const bool chunk_wide = b_->last_attention_wide();
  if (GetParam().attention_kernel == 3) {  // (automatic: 8-tile splits are too short for it)
    EXPECT_TRUE(chunk_wide);
  }
  const int s_decode = fresh_prefix();
  int decode_equal = 0;
  for (int64_t i = 0; i < kChunk; ++i) {
    const auto out = run(batch.step({{s_decode, tokens(1), false}}), {{data[3], prefix[3] + i}});
    decode_equal += bitwise_equal(out.data(), chunk.data() + i * qw, static_cast<size_t>(qw));
  }
  EXPECT_EQ(decode_equal, kChunk) << "prefill rows that differ from their decode";
  std::printf(
      "  attention d%lld kernel %d tree groups %d (%d work items): tree rows alone == mixed "
      "batch: %zu/%zu; tree row == chain decode: %d/%d; prefill row%s == decode: %d/%lld\n",
      static_cast<long long>(d_), GetParam().attention_kernel, GetParam().tree_groups, groups,
      parents0.size() - differ, parents0.size(), chain_equal, chains, chunk_wide ? " (wide)" : "",
      decode_equal, static_cast<long long>(kChunk));
}

INSTANTIATE_TEST_SUITE_P(Kernels, CudaAttentionInvariance,
                         ::testing::Values(AttnCase{64, 1}, AttnCase{64, 2}, AttnCase{128, 1},
                                           AttnCase{128, 2}, AttnCase{16, 0}, AttnCase{64, 1, 0},
                                           AttnCase{64, 2, 0}, AttnCase{64, 3, 0},
                                           AttnCase{128, 2, 0}, AttnCase{128, 3, 0}),
                         [](const auto& info) {
                           const AttnCase& c = info.param;
                           return "d" + std::to_string(c.head_dim) +
                                  (c.attention_kernel == 3   ? "_wide"
                                   : c.attention_kernel == 2 ? "_wgmma"
                                   : c.attention_kernel == 1 ? "_mma"
                                                             : "_generic") +
                                  (c.tree_groups > 0 ? "" : "_pernode");
                         });

}  // namespace
}  // namespace arbor
