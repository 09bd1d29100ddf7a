// Every non-attention Backend op of the CUDA backend against the CPU reference (the pattern of
// llama.cpp's test-backend-ops): fresh random inputs, ragged shapes, GPU outputs poisoned with
// NaN before the op (an unwritten element fails), and per-op tolerances. Inputs the GPU stores
// in 16 bits (weight matrices, KV) are rounded to bf16 for the CPU too, so the remaining
// difference is the GPU's own arithmetic (and linear()'s documented bf16 input rounding).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <initializer_list>
#include <limits>
#include <numeric>
#include <random>
#include <string>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/core/error.h"
#include "kernels/attention/paged_tree_attention.h"
#include "tests/cuda/cuda_test_util.h"

namespace arbor {
namespace {

using testing::max_rel_error;
using testing::nan_vector;
using testing::random_vector;

struct Both {
  Tensor c, g;
  int64_t rows = 0, cols = 0;
};

class CpuGpu {
 public:
  explicit CpuGpu(const KvCacheShape& kv, CudaBackendOptions opts = {}) {
    cpu_ = std::make_unique<CpuBackend>(1);
    gpu_ = std::make_unique<CudaBackend>(opts);
    cpu_->allocate_kv(kv);
    gpu_->allocate_kv(kv);
  }
  CpuBackend& cpu() { return *cpu_; }
  CudaBackend& gpu() { return *gpu_; }
  void set_step(const StepInputs& s) {
    cpu_->set_step(s);
    gpu_->set_step(s);
  }
  Both input(const std::vector<float>& v, int64_t rows, int64_t cols) {
    Both b{cpu_->scratch(rows, cols), gpu_->scratch(rows, cols), rows, cols};
    cpu_->upload(v.data(), b.c);
    gpu_->upload(v.data(), b.g);
    return b;
  }
  // An output: NaN on the GPU so unwritten elements show.
  Both output(int64_t rows, int64_t cols) {
    Both b{cpu_->scratch(rows, cols), gpu_->scratch(rows, cols), rows, cols};
    const auto nan = nan_vector(static_cast<size_t>(rows * cols));
    gpu_->upload(nan.data(), b.g);
    return b;
  }
  // A weight: the CPU gets the bf16-rounded values the GPU stores (matrices).
  Both weight(HostTensor w) {
    Both b;
    b.g = gpu_->upload_weight(w);
    if (w.shape.size() >= 2)
      for (auto& x : w.data) x = testing::round_bf16(x);
    b.c = cpu_->upload_weight(w);
    b.rows = b.c.rows;
    b.cols = b.c.cols;
    return b;
  }
  std::pair<std::vector<float>, std::vector<float>> get(const Both& b) {
    std::vector<float> c(static_cast<size_t>(b.rows * b.cols)), g(c.size());
    cpu_->download(b.c, c.data());
    gpu_->download(b.g, g.data());
    return {c, g};
  }

 private:
  std::unique_ptr<CpuBackend> cpu_;
  std::unique_ptr<CudaBackend> gpu_;
};

KvCacheShape small_kv(int64_t hkv = 2, int64_t d = 16, int64_t layers = 2, int64_t blocks = 64) {
  KvCacheShape kv;
  kv.num_layers = layers;
  kv.num_blocks = blocks;
  kv.block_size = 16;
  kv.num_kv_heads = hkv;
  kv.head_dim = d;
  return kv;
}

// One causal request of n tokens: ids < vocab, slots scrambled, positions spread up to 30000.
StepInputs flat_step(std::mt19937& rng, int32_t n, int32_t vocab, int64_t num_blocks) {
  StepInputs s;
  const int32_t blocks = (n + 15) / 16;
  std::vector<int32_t> ids(static_cast<size_t>(num_blocks));
  std::iota(ids.begin(), ids.end(), 0);
  std::shuffle(ids.begin(), ids.end(), rng);
  s.block_tables.assign(ids.begin(), ids.begin() + blocks);
  s.max_blocks_per_request = blocks;
  for (int32_t i = 0; i < n; ++i) {
    s.token_ids.push_back(std::uniform_int_distribution<int32_t>(0, vocab - 1)(rng));
    s.positions.push_back(std::uniform_int_distribution<int32_t>(0, 30000)(rng));
    s.slot_mapping.push_back(static_cast<int64_t>(s.block_tables[i / 16]) * 16 + i % 16);
  }
  s.qo_indptr = {0, n};
  s.committed_len = {0};
  s.mask_indptr = {0, 0};
  for (int32_t i = 0; i < n; i += 3) s.logits_rows.push_back(i);
  return s;
}

void expect_close(const std::pair<std::vector<float>, std::vector<float>>& cg, double tol,
                  const std::string& what) {
  const auto& [c, g] = cg;
  ASSERT_EQ(c.size(), g.size());
  EXPECT_EQ(testing::count_non_finite(g), 0u) << what << ": unwritten or non-finite outputs";
  const double err = max_rel_error(g, c);
  EXPECT_LE(err, tol) << what;
  std::printf("  %-40s max rel err %.3g (tol %.1g)\n", what.c_str(), err, tol);
}

// Runs `fn`, expects an arbor::Error with `code` whose message holds every needle.
void expect_error(const std::function<void()>& fn, ErrorCode code,
                  const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "expected arbor::Error, nothing thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    for (const auto& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos) << n << ": " << e.what();
  }
}

TEST(CudaOps, UploadDownloadRoundTrip) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(1);
  CudaBackend gpu({});
  const auto v = random_vector(rng, 1000 * 3 + 7);
  Tensor t = gpu.scratch(1, static_cast<int64_t>(v.size()));
  gpu.upload(v.data(), t);
  std::vector<float> back(v.size());
  gpu.download(t, back.data());
  EXPECT_EQ(back, v);
  // Scratch beyond the first chunk (64 MiB) and a reset that consolidates.
  Tensor big = gpu.scratch(5000, 4000);
  gpu.upload(nan_vector(static_cast<size_t>(big.numel())).data(), big);
  gpu.reset_scratch();
  Tensor again = gpu.scratch(5000, 4000);
  EXPECT_NE(again.data, nullptr);
}

TEST(CudaOps, Embedding) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(2);
  for (int32_t n : {1, 7, 130}) {
    CpuGpu b(small_kv());
    const int32_t vocab = 301, hidden = 72;
    HostTensor table({vocab, hidden});
    table.data = random_vector(rng, table.data.size());
    Both w = b.weight(table);
    b.set_step(flat_step(rng, n, vocab, 64));
    Both out = b.output(n, hidden);
    b.cpu().embedding(w.c, out.c);
    b.gpu().embedding(w.g, out.g);
    expect_close(b.get(out), 0, "embedding n=" + std::to_string(n));
  }
}

// A drafter's token ids left on the GPU: top_k_ids writes top_k_log_softmax's ids into a
// persistent int32 tensor of one backend (no wait), another backend on the same device reads
// them after wait_for: download_ids, and set_step's token_source, whose embedding equals the
// one of the same ids given on the host (the CPU backend's).
TEST(CudaOps, TokenIdsLeftOnTheDeviceReachAnotherBackendsStep) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(21);
  const int32_t rows = 6, vocab = 301, k = 5, hidden = 40;
  CudaBackend draft({});
  CpuGpu b(small_kv());
  EXPECT_TRUE(b.gpu().shares_memory_with(draft));
  EXPECT_FALSE(b.gpu().shares_memory_with(b.cpu()));
  EXPECT_TRUE(b.cpu().shares_memory_with(b.cpu()));
  const auto x = random_vector(rng, static_cast<size_t>(rows * vocab));
  Tensor logits = draft.scratch(rows, vocab);
  draft.upload(x.data(), logits);
  std::vector<int32_t> want;
  std::vector<float> values;
  b.cpu().top_k_log_softmax(Tensor{const_cast<float*>(x.data()), DType::kF32, rows, vocab}, k,
                            &want, &values);
  Tensor ids = draft.persistent(rows, k);
  ids.dtype = DType::kI32;
  const TransferStats before = draft.transfer_stats();
  draft.top_k_ids(logits, k, ids);
  EXPECT_EQ(draft.transfer_stats().syncs, before.syncs);  // nothing waited for
  b.gpu().wait_for(draft);
  std::vector<int64_t> all(static_cast<size_t>(rows * k));
  std::iota(all.begin(), all.end(), 0);
  std::vector<int32_t> got;
  b.gpu().download_ids(ids, all, &got);
  EXPECT_EQ(got, want);
  expect_error([&] { b.gpu().download_ids(ids, std::vector<int64_t>{rows * k}, &got); },
               ErrorCode::kInvalidArgument, {"download_ids", "index"});
  // A step whose rows 1 and 3 take ids from the tensor (its host ids are placeholders).
  HostTensor table({vocab, hidden});
  table.data = random_vector(rng, table.data.size());
  Both w = b.weight(table);
  StepInputs s = flat_step(rng, 5, vocab, 64);
  StepInputs on_device = s;
  on_device.token_source = ids;
  on_device.token_source_index = {-1, 7, -1, 0, -1};
  s.token_ids[1] = want[7];
  s.token_ids[3] = want[0];
  on_device.token_ids[1] = on_device.token_ids[3] = 0;
  b.cpu().set_step(s);
  b.gpu().set_step(on_device);
  Both out = b.output(5, hidden);
  b.cpu().embedding(w.c, out.c);
  b.gpu().embedding(w.g, out.g);
  expect_close(b.get(out), 0, "embedding of ids read on the device");
  on_device.token_source_index[2] = rows * k;  // outside the tensor
  expect_error([&] { b.gpu().set_step(on_device); }, ErrorCode::kInvalidArgument,
               {"token_source_index[2]"});
}

TEST(CudaOps, EmbeddingRejectsOutOfVocabularyIds) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(3);
  CudaBackend gpu({});
  gpu.allocate_kv(small_kv());
  HostTensor table({10, 8});
  table.data = random_vector(rng, 80);
  Tensor w = gpu.upload_weight(table);
  StepInputs s = flat_step(rng, 4, 10, 64);
  s.token_ids[2] = 10;
  gpu.set_step(s);
  Tensor out = gpu.scratch(4, 8);
  try {
    gpu.embedding(w, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("token id 10"), std::string::npos) << e.what();
  }
}

TEST(CudaOps, RmsNorm) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(4);
  for (auto [rows, cols] :
       std::vector<std::pair<int, int>>{{1, 8}, {5, 64}, {33, 4096}, {7, 1000}, {3, 1002}}) {
    CpuGpu b(small_kv());
    HostTensor wt({cols});
    wt.data = random_vector(rng, cols, 2.f);
    Both w = b.weight(wt);
    Both x = b.input(random_vector(rng, static_cast<size_t>(rows) * cols, 3.f), rows, cols);
    Both out = b.output(rows, cols);
    b.cpu().rms_norm(x.c, w.c, 1e-5, out.c);
    b.gpu().rms_norm(x.g, w.g, 1e-5, out.g);
    expect_close(b.get(out), 1e-5, "rms_norm " + std::to_string(rows) + "x" + std::to_string(cols));
    // In place (out aliases x).
    b.cpu().rms_norm(x.c, w.c, 1e-6, x.c);
    b.gpu().rms_norm(x.g, w.g, 1e-6, x.g);
    expect_close(b.get(x), 1e-5, "rms_norm in place");
  }
}

// A random [out, in] bf16 weight (and bias), x rounded to bf16 as the GPU does for its GEMM,
// out = x w^T (+ bias) on both backends within 1e-5 (NaN-poisoned GPU output). The weight and
// bias are handed back for further checks.
void linear_matches_cpu(CpuGpu& b, std::mt19937& rng, int n, int in, int out_features,
                        bool with_bias, const std::string& what, Both* w_out = nullptr,
                        Both* bias_out = nullptr) {
  HostTensor wt({out_features, in});
  wt.data = random_vector(rng, wt.data.size(), 0.5f);
  Both w = b.weight(wt);
  Both bias;
  if (with_bias) {
    HostTensor bt({out_features});
    bt.data = random_vector(rng, out_features);
    bias = b.weight(bt);
  }
  auto xv = random_vector(rng, static_cast<size_t>(n) * in);
  for (auto& v : xv) v = testing::round_bf16(v);
  Both x = b.input(xv, n, in);
  Both out = b.output(n, out_features);
  b.cpu().linear(x.c, w.c, bias.c, out.c);
  b.gpu().linear(x.g, w.g, bias.g, out.g);
  expect_close(b.get(out), 1e-5,
               what + " " + std::to_string(n) + "x" + std::to_string(in) + "->" +
                   std::to_string(out_features) + (with_bias ? "+bias" : ""));
  if (w_out != nullptr) *w_out = w;
  if (bias_out != nullptr) *bias_out = bias;
}

TEST(CudaOps, Linear) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(5);
  struct Shape {
    int n, in, out;
    bool bias;
  };
  for (const Shape sh : std::vector<Shape>{{1, 64, 96, false},
                                           {7, 72, 40, true},
                                           {33, 256, 320, false},
                                           {130, 128, 1000, true},
                                           {3, 2048, 512, false}}) {
    CpuGpu b(small_kv());
    Both w, bias;
    linear_matches_cpu(b, rng, sh.n, sh.in, sh.out, sh.bias, "linear", &w, &bias);
    // Unrounded fp32 input: the documented bf16 rounding of activations, within 1e-2.
    Both x2 = b.input(random_vector(rng, static_cast<size_t>(sh.n) * sh.in), sh.n, sh.in);
    Both out2 = b.output(sh.n, sh.out);
    b.cpu().linear(x2.c, w.c, bias.c, out2.c);
    b.gpu().linear(x2.g, w.g, bias.g, out2.g);
    expect_close(b.get(out2), 1e-2, "linear (fp32 input rounded to bf16)");
  }
}

// The chunked batch-invariant GEMM (CudaBackendOptions::batch_invariant_gemm = 2) against the
// CPU reference: its small-row path (1..16 rows, both NT variants) and its tile path (17+ rows:
// 32- and 64-token tiles, several of them), K with a short last chunk (576 = 512 + 64,
// SmolLM2's hidden size), several chunks and more chunks than warps (4640: two rounds, the second
// short), outputs not a multiple of 16, bias, NaN-poisoned outputs; K % 32 != 0 takes the
// cuBLASLt fallback.
TEST(CudaOps, LinearChunkedGemmMatchesCpu) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(15);
  CudaBackendOptions opts;
  opts.batch_invariant_gemm = 2;
  struct Shape {
    int in, out;
    bool bias;
  };
  for (const Shape sh : std::vector<Shape>{{576, 200, true},
                                           {1536, 72, false},
                                           {96, 40, true},
                                           {72, 24, false},
                                           {4640, 136, false}}) {
    for (int n : {1, 3, 8, 9, 16, 17, 32, 33, 64, 65, 130}) {
      CpuGpu b(small_kv(), opts);
      linear_matches_cpu(b, rng, n, sh.in, sh.out, sh.bias, "chunked linear");
    }
  }
}

// A backend made with environment variable `name` set to each of `bad` throws
// kInvalidArgument with a message that quotes the value; `name` is unset afterwards.
void expect_env_refused(const char* name, std::initializer_list<const char*> bad) {
  for (const char* v : bad) {
    ::setenv(name, v, 1);
    try {
      CudaBackend b{CudaBackendOptions{}};
      ADD_FAILURE() << name << "=" << v << " was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(std::string("'") + v + "'"), std::string::npos)
          << e.what();
    }
  }
  ::unsetenv(name);
}

// ARBOR_ATTN_SPLIT_KEYS sets the attention's batch-invariant split size; a bad value names
// itself.
TEST(CudaOps, AttentionSplitKeysEnvironmentOverride) {
  ARBOR_REQUIRE_GPU();
  expect_env_refused("ARBOR_ATTN_SPLIT_KEYS", {"100", "0", "abc", "256x", "131072"});
  ::setenv("ARBOR_ATTN_SPLIT_KEYS", "256", 1);
  EXPECT_NO_THROW(CudaBackend{CudaBackendOptions{}});
  ::unsetenv("ARBOR_ATTN_SPLIT_KEYS");
}

// ARBOR_ATTN_KERNEL picks the tensor-core attention kernel (as CudaBackendOptions::
// attention_kernel); a bad value names itself.
TEST(CudaOps, AttentionKernelEnvironmentOverride) {
  ARBOR_REQUIRE_GPU();
  expect_env_refused("ARBOR_ATTN_KERNEL", {"4", "-1", "x", "1a"});
  bool wgmma = false;
  ASSERT_EQ(kernels::attention_wgmma_available(&wgmma), cudaSuccess);
  std::mt19937 rng(9);
  for (const int kernel : {1, 2, 0}) {
    if (kernel == 2 && !wgmma) continue;
    ::setenv("ARBOR_ATTN_KERNEL", std::to_string(kernel).c_str(), 1);
    CudaBackend gpu({});
    ::unsetenv("ARBOR_ATTN_KERNEL");
    gpu.allocate_kv(small_kv(2, 64));
    gpu.set_step(flat_step(rng, 40, 100, 64));
    Tensor q = gpu.scratch(40, 4 * 64);
    Tensor out = gpu.scratch(40, 4 * 64);
    const std::vector<float> qv = random_vector(rng, 40 * 4 * 64);
    gpu.upload(qv.data(), q);
    gpu.paged_tree_attention(0, q, 4, out);
    // 0 (auto) takes wgmma wherever it is available.
    EXPECT_EQ(gpu.last_attention_wgmma(), kernel != 1 && wgmma) << "ARBOR_ATTN_KERNEL=" << kernel;
  }
}

// The A/B switches (programmatic launches, deferred split, chain GEMM tilings, the chunked
// GEMM's wgmma kernel) reach the kernels as CudaBackendOptions, the environment overriding
// them; a bad environment value is refused naming itself, and no setting changes a bit of a
// linear's result.
TEST(CudaOps, KernelSwitchesAreOptionsAndChangeNoBits) {
  ARBOR_REQUIRE_GPU();
  expect_env_refused("ARBOR_PDL", {"2", "yes"});
  expect_env_refused("ARBOR_DEFER_SPLIT", {"-1", "off"});
  expect_env_refused("ARBOR_CHUNKED_WGMMA", {"3", "on"});
  expect_env_refused("ARBOR_CHAIN_SMALL", {"44", "4425x"});
  expect_env_refused("ARBOR_CHAIN_DEEP", {"100000"});
  std::mt19937 rng(11);
  HostTensor w({512, 256});
  w.data = testing::random_vector(rng, w.data.size());
  const std::vector<float> xh = testing::random_vector(rng, 96 * 256);
  auto run = [&](const CudaBackendOptions& o, int64_t rows) {
    CudaBackend b{o};
    const Tensor wt = b.upload_weight(w);
    b.reset_scratch();
    Tensor x = b.scratch(rows, 256), y = b.scratch(rows, 512);
    b.upload(xh.data(), x);
    b.linear(x, wt, Tensor{}, y);
    std::vector<float> out(static_cast<size_t>(rows * 512));
    b.download(y, out.data());
    return out;
  };
  const CudaBackendOptions base;
  const std::vector<float> chain = run(base, 4);
  CudaBackendOptions t = base;
  t.chain_gemm_small_tiling = 44128;
  t.pdl = false;
  t.defer_split = false;
  EXPECT_EQ(run(t, 4), chain);
  CudaBackendOptions c = base;
  c.batch_invariant_gemm = 2;
  c.chunked_gemm_wgmma = 0;
  const std::vector<float> chunked = run(c, 96);
  c.chunked_gemm_wgmma = 1;
  EXPECT_EQ(run(c, 96), chunked);
  ::setenv("ARBOR_CHUNKED_WGMMA", "2", 1);
  EXPECT_EQ(run(c, 96), chunked);
  ::unsetenv("ARBOR_CHUNKED_WGMMA");
}

// ARBOR_CHAIN_GEMM sets the largest row count the chain GEMM takes (0 = off); a bad value, and
// a bad CudaBackendOptions::chain_gemm_max_rows, is refused naming itself.
TEST(CudaOps, ChainGemmRowsOverride) {
  ARBOR_REQUIRE_GPU();
  expect_env_refused("ARBOR_CHAIN_GEMM", {"17", "-1", "x", "8 rows"});
  CudaBackendOptions o;
  o.chain_gemm_max_rows = 20;
  try {
    CudaBackend b{o};
    ADD_FAILURE() << "chain_gemm_max_rows 20 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("chain_gemm_max_rows 20"), std::string::npos) << e.what();
  }
  // 0 turns it off: a decode-size linear then runs cuBLASLt and says so.
  ::setenv("ARBOR_CHAIN_GEMM", "0", 1);
  CudaBackendOptions t;
  t.tune_invariant_gemm = false;
  CudaBackend b{t};
  ::unsetenv("ARBOR_CHAIN_GEMM");
  HostTensor w({64, 128});
  std::mt19937 rng(3);
  w.data = testing::random_vector(rng, w.data.size());
  const Tensor wt = b.upload_weight(w);
  b.reset_scratch();
  Tensor x = b.scratch(1, 128), y = b.scratch(1, 64);
  const std::vector<float> xh = testing::random_vector(rng, 128);
  b.upload(xh.data(), x);
  b.linear(x, wt, Tensor{}, y);
  EXPECT_EQ(b.batch_invariant_gemm_algo(64, 128).find("chain"), std::string::npos)
      << b.batch_invariant_gemm_algo(64, 128);
}

// Weights of at most chain_gemm_small_bytes take the chain GEMM at up to
// chain_gemm_small_max_rows (16) rows, larger ones at up to chain_gemm_max_rows (8): a 12-row
// linear runs the chain GEMM on a 256 KiB weight and cuBLASLt on a 16 MiB one (the launches
// counted), the results equal to a cuBLASLt-only backend's bit for bit. chain_gemm_max_rows 0
// still turns it off for every weight; ARBOR_CHAIN_GEMM sets both limits; a bad
// chain_gemm_small_max_rows is refused naming itself.
TEST(CudaOps, ChainGemmRowsBySize) {
  ARBOR_REQUIRE_GPU();
  CudaBackendOptions bad;
  bad.chain_gemm_small_max_rows = 17;
  try {
    CudaBackend b{bad};
    ADD_FAILURE() << "chain_gemm_small_max_rows 17 was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("chain_gemm_small_max_rows 17"), std::string::npos)
        << e.what();
  }
  std::mt19937 rng(4);
  const auto random_weight = [&](int64_t out, int64_t in) {
    HostTensor w({out, in});
    w.data = testing::random_vector(rng, w.data.size());
    return w;
  };
  const HostTensor small_w = random_weight(256, 512), large_w = random_weight(4096, 2048);
  const std::vector<float> x12 = testing::random_vector(rng, 12 * 2048);
  // out = x [rows, in] (the first rows x in of x12) @ w^T on `b`; host fp32.
  const auto run = [&](CudaBackend& b, const HostTensor& w, int64_t rows) {
    const int64_t out_f = w.dim(0), in_f = w.dim(1);
    const Tensor wt = b.upload_weight(w);
    b.reset_scratch();
    Tensor x = b.scratch(rows, in_f), y = b.scratch(rows, out_f);
    b.upload(x12.data(), x);
    b.linear(x, wt, Tensor{}, y);
    std::vector<float> out(static_cast<size_t>(rows * out_f));
    b.download(y, out.data());
    return out;
  };
  CudaBackendOptions t;
  t.tune_invariant_gemm = false;  // the bitwise check alone decides
  CudaBackendOptions off = t;
  off.chain_gemm_max_rows = 0;
  CudaBackend ref{off};
  EXPECT_EQ(run(ref, small_w, 12), run(ref, small_w, 12));
  EXPECT_EQ(ref.chain_gemm_launches(), 0) << "chain_gemm_max_rows 0 must turn it off";
  {
    CudaBackend b{t};
    EXPECT_EQ(run(b, small_w, 12), run(ref, small_w, 12));
    EXPECT_EQ(b.chain_gemm_launches(), 1) << b.batch_invariant_gemm_algo(256, 512);
    EXPECT_NE(b.batch_invariant_gemm_algo(256, 512).find("chain GEMM at <= 16 rows"),
              std::string::npos)
        << b.batch_invariant_gemm_algo(256, 512);
    EXPECT_EQ(run(b, large_w, 12), run(ref, large_w, 12));
    EXPECT_EQ(b.chain_gemm_launches(), 1) << "12 rows of a 16 MiB weight: cuBLASLt";
    EXPECT_EQ(run(b, large_w, 8), run(ref, large_w, 8));
    EXPECT_EQ(b.chain_gemm_launches(), 2) << b.batch_invariant_gemm_algo(4096, 2048);
    EXPECT_NE(b.batch_invariant_gemm_algo(4096, 2048).find("chain GEMM at <= 8 rows"),
              std::string::npos)
        << b.batch_invariant_gemm_algo(4096, 2048);
  }
  ::setenv("ARBOR_CHAIN_GEMM", "4", 1);
  CudaBackend b{t};
  ::unsetenv("ARBOR_CHAIN_GEMM");
  EXPECT_EQ(run(b, small_w, 12), run(ref, small_w, 12));
  EXPECT_EQ(b.chain_gemm_launches(), 0) << b.batch_invariant_gemm_algo(256, 512);
  EXPECT_NE(b.batch_invariant_gemm_algo(256, 512).find("chain GEMM at <= 4 rows"),
            std::string::npos)
      << b.batch_invariant_gemm_algo(256, 512);
}

// ARBOR_GEMM picks the batch-invariant GEMM of any binary; a bad value names itself.
TEST(CudaOps, GemmEnvironmentOverride) {
  ARBOR_REQUIRE_GPU();
  expect_env_refused("ARBOR_GEMM", {"fastest"});
  ::setenv("ARBOR_GEMM", "chunked", 1);
  {
    CpuGpu b(small_kv());
    HostTensor wt({48, 64});
    std::mt19937 rng(16);
    wt.data = random_vector(rng, wt.data.size(), 0.5f);
    Both w = b.weight(wt);
    auto xv = random_vector(rng, 2 * 64);
    for (auto& v : xv) v = testing::round_bf16(v);
    Both x = b.input(xv, 2, 64);
    Both out = b.output(2, 48);
    b.cpu().linear(x.c, w.c, Both{}.c, out.c);
    b.gpu().linear(x.g, w.g, Both{}.g, out.g);
    expect_close(b.get(out), 1e-5, "linear with ARBOR_GEMM=chunked");
    EXPECT_EQ(b.gpu().batch_invariant_gemm_algo(48, 64), "")
        << "cuBLASLt ran, not the chunked GEMM";
  }
  ::unsetenv("ARBOR_GEMM");
  {  // without it: the cuBLASLt fixed algorithm (the default)
    CpuGpu b(small_kv());
    HostTensor wt({48, 64});
    std::mt19937 rng(17);
    wt.data = random_vector(rng, wt.data.size(), 0.5f);
    Both w = b.weight(wt);
    Both x = b.input(random_vector(rng, 2 * 64), 2, 64);
    Both out = b.output(2, 48);
    b.gpu().linear(x.g, w.g, Both{}.g, out.g);
    EXPECT_NE(b.gpu().batch_invariant_gemm_algo(48, 64), "");
  }
}

// The skinny GEMM (1..8 token rows, fp32 activations rounded to bf16 in the kernel): every row
// count against the CPU reference, K with a tail past the unrolled loop, an odd number of
// outputs (a warp's second row missing), bias; K not a multiple of 8 and 9 rows take cuBLAS.
// Three linears of the same x in a row (deferred into one multi-segment launch) and an add
// followed by the RMSNorm of its result (fused) give what the separate ops give.
TEST(CudaOps, LinearSkinnyGemmEveryRowCount) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(55);
  for (int max_rows : {8, 0}) {
    CudaBackendOptions opts;
    opts.skinny_gemm_max_rows = max_rows;
    opts.batch_invariant = false;  // the skinny kernel is off in batch-invariant mode
    struct Shape {
      int in, out;
      bool bias;
    };
    for (const Shape sh :
         std::vector<Shape>{{4104, 1001, true}, {256, 37, false}, {100, 64, true}}) {
      CpuGpu b(small_kv(), opts);
      std::vector<Both> ws, biases;
      for (int m = 0; m < 3; ++m) {
        HostTensor wt({sh.out + 8 * m, sh.in});
        wt.data = random_vector(rng, wt.data.size(), 0.5f);
        ws.push_back(b.weight(wt));
        Both bias;
        if (sh.bias) {
          HostTensor bt({sh.out + 8 * m});
          bt.data = random_vector(rng, sh.out + 8 * m);
          bias = b.weight(bt);
        }
        biases.push_back(bias);
      }
      for (int n = 1; n <= 9; ++n) {
        auto xv = random_vector(rng, static_cast<size_t>(n) * sh.in);
        for (auto& v : xv) v = testing::round_bf16(v);
        Both x = b.input(xv, n, sh.in);
        std::vector<Both> outs;
        for (int m = 0; m < 3; ++m) outs.push_back(b.output(n, sh.out + 8 * m));
        for (int m = 0; m < 3; ++m) {
          b.cpu().linear(x.c, ws[m].c, biases[m].c, outs[m].c);
          b.gpu().linear(x.g, ws[m].g, biases[m].g, outs[m].g);
        }
        const bool skinny = max_rows > 0 && n <= 8 && sh.in % 8 == 0;
        for (int m = 0; m < 3; ++m)
          expect_close(b.get(outs[m]), 1e-5,
                       "linear " + std::to_string(n) + "x" + std::to_string(sh.in) + "->" +
                           std::to_string(sh.out + 8 * m) + (skinny ? " skinny" : " cuBLAS"));
      }
    }
  }
  // add, then rms_norm of the sum (fused), then the sum itself is read.
  CpuGpu b(small_kv());
  for (int rows : {1, 5}) {
    const int cols = 4096;
    HostTensor wt({cols});
    wt.data = random_vector(rng, cols, 2.f);
    Both w = b.weight(wt);
    Both x = b.input(random_vector(rng, static_cast<size_t>(rows) * cols, 3.f), rows, cols);
    Both y = b.input(random_vector(rng, static_cast<size_t>(rows) * cols, 3.f), rows, cols);
    Both normed = b.output(rows, cols);
    b.cpu().add(x.c, y.c, x.c);
    b.gpu().add(x.g, y.g, x.g);
    b.cpu().rms_norm(x.c, w.c, 1e-5, normed.c);
    b.gpu().rms_norm(x.g, w.g, 1e-5, normed.g);
    expect_close(b.get(normed), 1e-5, "add + rms_norm (fused) " + std::to_string(rows));
    expect_close(b.get(x), 0, "add + rms_norm: the sum " + std::to_string(rows));
  }
}

TEST(CudaOps, AddAndSiluMul) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(6);
  for (auto [rows, cols] : std::vector<std::pair<int, int>>{{1, 5}, {9, 96}, {129, 777}}) {
    CpuGpu b(small_kv());
    const size_t n = static_cast<size_t>(rows) * cols;
    Both x = b.input(random_vector(rng, n, 4.f), rows, cols);
    Both y = b.input(random_vector(rng, n, 4.f), rows, cols);
    Both out = b.output(rows, cols);
    b.cpu().add(x.c, y.c, out.c);
    b.gpu().add(x.g, y.g, out.g);
    expect_close(b.get(out), 0, "add");
    b.cpu().silu_mul(x.c, y.c, out.c);
    b.gpu().silu_mul(x.g, y.g, out.g);
    expect_close(b.get(out), 1e-6, "silu_mul");
    b.cpu().add(x.c, y.c, x.c);  // aliasing as the model uses it
    b.gpu().add(x.g, y.g, x.g);
    expect_close(b.get(x), 0, "add in place");
    b.cpu().silu_mul(x.c, y.c, x.c);
    b.gpu().silu_mul(x.g, y.g, x.g);
    expect_close(b.get(x), 1e-6, "silu_mul in place");
  }
}

// split_cols (fused q|k|v and gate|up outputs): float4 path (widths multiple of 4) and scalar
// path (odd widths), 2 and 3 outputs, poisoned outputs so unwritten elements show.
TEST(CudaOps, SplitColsMatchesCpu) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(8);
  for (const auto& widths : std::vector<std::vector<int>>{
           {4096, 1024, 1024}, {64, 16, 16}, {5, 3, 7}, {14336, 14336}, {9, 1}}) {
    for (int rows : {1, 3, 37}) {
      CpuGpu b(small_kv());
      int cols = 0;
      for (int w : widths) cols += w;
      Both x = b.input(random_vector(rng, static_cast<size_t>(rows) * cols, 2.f), rows, cols);
      std::vector<Both> outs;
      std::vector<Tensor> oc, og;
      for (int w : widths) {
        outs.push_back(b.output(rows, w));
        oc.push_back(outs.back().c);
        og.push_back(outs.back().g);
      }
      b.cpu().split_cols(x.c, oc);
      b.gpu().split_cols(x.g, og);
      for (size_t j = 0; j < outs.size(); ++j)
        expect_close(b.get(outs[j]), 0, "split_cols output " + std::to_string(j));
    }
  }
}

// copy_cols (EAGLE-3's capture layers side by side in one step tensor): every column range of
// a 3-wide layout, odd widths, outputs filled first so the columns left alone show.
TEST(CudaOps, CopyColsMatchesCpu) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(9);
  for (int width : {576, 7}) {
    for (int rows : {1, 5, 61}) {
      CpuGpu b(small_kv());
      const int cols = 3 * width;
      Both out = b.input(random_vector(rng, static_cast<size_t>(rows) * cols, 2.f), rows, cols);
      for (int c = 2; c >= 0; --c) {  // out of order, as any layer order may ask
        Both x = b.input(random_vector(rng, static_cast<size_t>(rows) * width, 2.f), rows, width);
        b.cpu().copy_cols(x.c, out.c, static_cast<int64_t>(c) * width);
        b.gpu().copy_cols(x.g, out.g, static_cast<int64_t>(c) * width);
        expect_close(b.get(out), 0, "copy_cols at column " + std::to_string(c * width));
      }
    }
  }
}

// A split whose next op is RoPE (+ KV write) of its q | k | v outputs, or SiLU * up of its
// gate | up outputs, is not launched: that op reads the fused projection in place and writes the
// split's outputs itself. Every output (q, k, v, gate, up, the cache slots) must still hold
// what the split and the op would have written, as on the CPU.
TEST(CudaOps, SplitColsConsumedInPlaceByRopeAndSiluMul) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(11);
  for (int64_t d : {16, 64}) {
    const int n = 37, hq = 4, hk = 2;
    const KvCacheShape kv = small_kv(hk, d, 2, 64);
    CpuGpu b(kv);
    b.gpu().poison_kv();
    const StepInputs s = flat_step(rng, n, 100, 64);
    b.set_step(s);
    RopeParams rp;
    rp.head_dim = d;
    const int64_t qw = hq * d, kw = hk * d;
    Both x = b.input(random_vector(rng, static_cast<size_t>(n * (qw + 2 * kw))), n, qw + 2 * kw);
    Both q = b.output(n, qw), k = b.output(n, kw), v = b.output(n, kw);
    b.cpu().split_cols(x.c, {q.c, k.c, v.c});
    b.gpu().split_cols(x.g, {q.g, k.g, v.g});
    b.cpu().rope(q.c, k.c, rp);
    const int64_t taken = b.gpu().splits_consumed_in_place();
    b.gpu().rope(q.g, k.g, rp);
    EXPECT_EQ(b.gpu().splits_consumed_in_place(), taken + 1) << "rope did not take the split";
    b.cpu().write_kv(1, k.c, v.c);
    b.gpu().write_kv(1, k.g, v.g);
    const std::string dn = " d=" + std::to_string(d);
    expect_close(b.get(q), 2e-5, "q (split + rope in place)" + dn);
    expect_close(b.get(k), 2e-5, "k (split + rope in place)" + dn);
    expect_close(b.get(v), 0, "v (split + rope in place)" + dn);
    std::vector<float> gk, gv, ck, cv, gk_written, gv_written;  // the step's slots only
    b.gpu().download_kv(1, &gk, &gv);
    for (int64_t slot : s.slot_mapping)
      for (int64_t c = 0; c < kw; ++c) {
        const size_t i = static_cast<size_t>(slot * kw + c);
        // The CPU cache holds fp32, the GPU's bf16 (round to nearest even).
        ck.push_back(testing::round_bf16(b.cpu().k_cache(1)[i]));
        cv.push_back(testing::round_bf16(b.cpu().v_cache(1)[i]));
        gk_written.push_back(gk[i]);
        gv_written.push_back(gv[i]);
      }
    // K: CPU and GPU rotations differ in the last fp32 ulps, which can flip a bf16 rounding.
    expect_close({ck, gk_written}, 8e-3, "K cache (bf16)" + dn);
    expect_close({cv, gv_written}, 0, "V cache (bf16)" + dn);

    // gate | up, SiLU * up into gate (as the model runs it), into up, and into a third tensor.
    const int64_t iw = 3 * d + 5;
    for (const std::string into : {"gate", "up", "third tensor"}) {
      Both gu = b.input(random_vector(rng, static_cast<size_t>(n * 2 * iw), 4.f), n, 2 * iw);
      Both gate = b.output(n, iw), up = b.output(n, iw), out = b.output(n, iw);
      b.cpu().split_cols(gu.c, {gate.c, up.c});
      b.gpu().split_cols(gu.g, {gate.g, up.g});
      const Both& o = into == "gate" ? gate : into == "up" ? up : out;
      b.cpu().silu_mul(gate.c, up.c, o.c);
      const int64_t before = b.gpu().splits_consumed_in_place();
      b.gpu().silu_mul(gate.g, up.g, o.g);
      EXPECT_EQ(b.gpu().splits_consumed_in_place(), before + 1) << "silu_mul did not take it";
      const std::string what = " (into " + into + ")";
      expect_close(b.get(o), 1e-6, "silu_mul of split" + what + dn);
      if (into != "up") expect_close(b.get(up), 0, "up (split consumed)" + what + dn);
      if (into != "gate") expect_close(b.get(gate), 0, "gate (split consumed)" + what + dn);
    }
  }
}

TEST(CudaOps, RopeAtExplicitPositions) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(7);
  for (const std::string scaling : {"none", "linear", "llama3"}) {
    for (int64_t d : {8, 16, 64, 128}) {
      CpuGpu b(small_kv());
      const int n = 37, hq = 4, hk = 2;
      b.set_step(flat_step(rng, n, 100, 64));
      RopeParams rp;
      rp.head_dim = d;
      rp.theta = scaling == "llama3" ? 500000.0 : 10000.0;
      rp.scaling = scaling;
      rp.factor = scaling == "none" ? 1.0 : 8.0;
      Both q = b.input(random_vector(rng, static_cast<size_t>(n) * hq * d), n, hq * d);
      Both k = b.input(random_vector(rng, static_cast<size_t>(n) * hk * d), n, hk * d);
      b.cpu().rope(q.c, k.c, rp);
      b.gpu().rope(q.g, k.g, rp);
      // Angles up to 30000 rad: fp32 angle products are identical, sin/cos may differ in the
      // last ulps of the range reduction.
      expect_close(b.get(q), 2e-5, "rope q " + scaling + " d=" + std::to_string(d));
      expect_close(b.get(k), 2e-5, "rope k " + scaling + " d=" + std::to_string(d));
    }
  }
}

TEST(CudaOps, WriteKvToScrambledSlots) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(8);
  for (DType kv_dtype : {DType::kBF16, DType::kF16}) {
    const KvCacheShape kv = small_kv(2, 16, 3, 64);
    CudaBackendOptions o;
    o.kv_dtype = kv_dtype;
    CpuGpu b(kv, o);
    b.gpu().poison_kv();
    const int n = 45;
    StepInputs s = flat_step(rng, n, 100, 64);
    b.set_step(s);
    const int64_t w = kv.num_kv_heads * kv.head_dim;
    auto kvals = random_vector(rng, static_cast<size_t>(n * w));
    auto vvals = random_vector(rng, static_cast<size_t>(n * w));
    testing::round_all(&kvals, kv_dtype);
    testing::round_all(&vvals, kv_dtype);
    Both k = b.input(kvals, n, w), v = b.input(vvals, n, w);
    b.cpu().write_kv(1, k.c, v.c);
    b.gpu().write_kv(1, k.g, v.g);
    std::vector<float> gk, gv;
    b.gpu().download_kv(1, &gk, &gv);
    const auto& ck = b.cpu().k_cache(1);
    const auto& cv = b.cpu().v_cache(1);
    std::vector<bool> written(static_cast<size_t>(kv.num_blocks * kv.block_size), false);
    for (int64_t slot : s.slot_mapping) written[slot] = true;
    size_t mismatches = 0, untouched_not_nan = 0;
    for (size_t slot = 0; slot < written.size(); ++slot)
      for (int64_t c = 0; c < w; ++c) {
        const size_t i = slot * w + c;
        if (written[slot])
          mismatches += (gk[i] != ck[i]) + (gv[i] != cv[i]);
        else
          untouched_not_nan += !std::isnan(gk[i]) + !std::isnan(gv[i]);
      }
    EXPECT_EQ(mismatches, 0u) << dtype_name(kv_dtype);
    EXPECT_EQ(untouched_not_nan, 0u) << "write_kv touched slots outside slot_mapping";
    // Other layers untouched.
    b.gpu().download_kv(0, &gk, &gv);
    EXPECT_EQ(testing::count_non_finite(gk), gk.size());
  }
}

TEST(CudaOps, GatherLogitRows) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(9);
  CpuGpu b(small_kv());
  const int n = 50, h = 33;
  StepInputs s = flat_step(rng, n, 100, 64);
  b.set_step(s);
  Both x = b.input(random_vector(rng, static_cast<size_t>(n) * h), n, h);
  const int64_t m = static_cast<int64_t>(s.logits_rows.size());
  Both out = b.output(m, h);
  b.cpu().gather_logit_rows(x.c, out.c);
  b.gpu().gather_logit_rows(x.g, out.g);
  expect_close(b.get(out), 0, "gather_logit_rows");
}

// Device argmax against the CPU reference (itself tested against the host argmax()): values
// from a small set so maxima tie (the lowest index must win whichever thread holds it), +-0
// ties, -inf entries, all -inf / NaN / +inf rows (-1), vocabularies from 1 to 151936 columns.
TEST(CudaOps, ArgmaxRowsMatchesCpuWithTies) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(12);
  CpuGpu b(small_kv());
  const float inf = std::numeric_limits<float>::infinity();
  int64_t rows_checked = 0, rejected = 0;
  for (int64_t cols : {1, 2, 31, 255, 256, 257, 1000, 32000, 49152, 151936}) {
    const int64_t rows = 1 + static_cast<int64_t>(rng() % 70);
    std::vector<float> x(static_cast<size_t>(rows * cols));
    for (float& v : x) v = static_cast<float>(static_cast<int>(rng() % 5)) - 4.0f;
    for (int64_t r = 0; r < rows; ++r) {
      float* row = x.data() + r * cols;
      switch (rng() % 8) {
        case 0:  // the max is a +-0 tie over a few spread-out entries
          for (int k = 0; k < 4; ++k) row[rng() % cols] = (k % 2) ? 0.0f : -0.0f;
          break;
        case 1:  // -inf entries
          for (int64_t c = 0; c < cols; ++c)
            if (rng() % 2) row[c] = -inf;
          break;
        case 2:
          std::fill(row, row + cols, -inf);
          break;
        case 3:
          row[rng() % cols] = std::numeric_limits<float>::quiet_NaN();
          break;
        case 4:
          row[rng() % cols] = inf;
          break;
        case 5:  // one unique max near the end
          row[cols - 1 - static_cast<int64_t>(rng() % std::min<int64_t>(cols, 3))] = 7.0f;
          break;
        default:
          break;
      }
    }
    Both t = b.input(x, rows, cols);
    std::vector<int32_t> want, got = {-5};
    b.cpu().argmax_rows(t.c, &want);
    b.gpu().argmax_rows(t.g, &got);
    ASSERT_EQ(got.size(), static_cast<size_t>(rows));
    for (int64_t r = 0; r < rows; ++r)
      EXPECT_EQ(got[static_cast<size_t>(r)], want[static_cast<size_t>(r)])
          << "cols " << cols << " row " << r;
    for (int32_t id : want) rejected += id < 0;
    rows_checked += rows;
  }
  EXPECT_GT(rejected, 0);
  std::printf("  argmax_rows: %lld rows equal to the CPU, %lld rejected rows\n",
              static_cast<long long>(rows_checked), static_cast<long long>(rejected));
  std::vector<int32_t> none = {3};
  b.gpu().argmax_rows(b.gpu().scratch(0, 10), &none);
  EXPECT_TRUE(none.empty());
}

// Compaction: overlapping and cyclic moves (a destination that is another pair's source) must
// behave as if all copies were simultaneous, in every layer, K and V.
TEST(CudaOps, CopyKvIsSimultaneous) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(10);
  for (int64_t d : {16, 128, 6}) {
    const KvCacheShape kv = small_kv(2, d, 3, 16);
    CpuGpu b(kv);
    const int64_t slots = kv.num_blocks * kv.block_size;
    const int64_t w = kv.num_kv_heads * kv.head_dim;
    // Fill every slot of every layer.
    StepInputs s = flat_step(rng, static_cast<int32_t>(slots), 100, kv.num_blocks);
    b.set_step(s);
    for (int64_t layer = 0; layer < kv.num_layers; ++layer) {
      auto kvals = random_vector(rng, static_cast<size_t>(slots * w));
      auto vvals = random_vector(rng, static_cast<size_t>(slots * w));
      testing::round_all(&kvals, DType::kBF16);
      testing::round_all(&vvals, DType::kBF16);
      Both k = b.input(kvals, slots, w), v = b.input(vvals, slots, w);
      b.cpu().write_kv(layer, k.c, v.c);
      b.gpu().write_kv(layer, k.g, v.g);
    }
    // A shift left by one over a run (dst[i] = src[i+1]: each source is the next pair's
    // destination), a 3-cycle, and scattered pairs.
    std::vector<int64_t> src = {41, 42, 43, 44, 45, 100, 101, 102, 7, 200, 3};
    std::vector<int64_t> dst = {40, 41, 42, 43, 44, 101, 102, 100, 250, 8, 199};
    b.cpu().copy_kv(src, dst);
    b.gpu().copy_kv(src, dst);
    for (int64_t layer = 0; layer < kv.num_layers; ++layer) {
      std::vector<float> gk, gv;
      b.gpu().download_kv(layer, &gk, &gv);
      const std::span<const float> ck = b.cpu().k_cache(layer), cv = b.cpu().v_cache(layer);
      EXPECT_EQ(gk, std::vector<float>(ck.begin(), ck.end())) << "layer " << layer << " d=" << d;
      EXPECT_EQ(gv, std::vector<float>(cv.begin(), cv.end())) << "layer " << layer << " d=" << d;
    }
  }
}

TEST(CudaOps, CopyKvRejectsBadSlots) {
  ARBOR_REQUIRE_GPU();
  CudaBackend gpu({});
  gpu.allocate_kv(small_kv(2, 16, 2, 4));
  EXPECT_THROW(gpu.copy_kv({1, 2}, {3}), Error);
  try {
    gpu.copy_kv({1, 64}, {2, 3});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("64"), std::string::npos) << e.what();
  }
}

TEST(CudaOps, InvalidLaunchParametersAreRejected) {
  ARBOR_REQUIRE_GPU();
  std::mt19937 rng(11);
  // Unsupported KV dtype and head_dim.
  CudaBackendOptions f32kv;
  f32kv.kv_dtype = DType::kF32;
  EXPECT_THROW(CudaBackend{f32kv}, Error);
  {
    CudaBackend gpu({});
    try {
      gpu.allocate_kv(small_kv(2, 320));
      FAIL() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(std::string(e.what()).find("head_dim 320"), std::string::npos) << e.what();
    }
  }
  CudaBackend gpu({});
  gpu.allocate_kv(small_kv(2, 16, 2, 64));
  // Block table shorter than the context.
  StepInputs s = flat_step(rng, 40, 100, 64);
  s.committed_len = {30};
  try {
    gpu.set_step(s);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("block table"), std::string::npos) << e.what();
  }
  // A tree larger than supported.
  CudaBackendOptions small_trees;
  small_trees.max_tree_nodes = 32;
  CudaBackend gpu2(small_trees);
  gpu2.allocate_kv(small_kv(2, 16, 2, 64));
  StepInputs t = flat_step(rng, 40, 100, 64);
  t.tree_mask.assign(40 * 2, 1u);
  t.mask_indptr = {0, 80};
  try {
    gpu2.set_step(t);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("tree of 40 nodes"), std::string::npos) << e.what();
  }
  // Head counts that do not group.
  gpu.set_step(flat_step(rng, 4, 100, 64));
  Tensor q = gpu.scratch(4, 3 * 16);
  Tensor out = gpu.scratch(4, 3 * 16);
  try {
    gpu.paged_tree_attention(0, q, 3, out);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("3 query heads"), std::string::npos) << e.what();
  }
  // Shape mismatches.
  Tensor q4 = gpu.scratch(5, 4 * 16);
  EXPECT_THROW(gpu.paged_tree_attention(0, q4, 4, q4), Error);
  EXPECT_THROW(gpu.paged_tree_attention(7, q, 2, out), Error);
}

}  // namespace
}  // namespace arbor
