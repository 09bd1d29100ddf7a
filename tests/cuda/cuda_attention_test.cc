// Paged tree attention on the GPU against the CPU reference: one launch over mixed requests
// (plain decode T = 1, causal prefill chunks with and without a prefix, trees of 7/33/40/70/128
// nodes starting mid-block and spanning blocks, a long decode that triggers split-KV), GQA
// ratios 1/4/8, head_dim 8/16 (generic path) and 64/128 (tensor cores), bf16 and fp16 KV,
// block sizes 8/16/32, shared prefix blocks, split-KV forced off and chosen from the shape.
// The KV cache is poisoned with NaN first, so a read of any slot outside a request's keys (or
// of a padded tail) shows up as NaN; outputs are poisoned too.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

#include <numeric>
#include <random>

#include "engine/backend/backend.h"
#include "engine/backend/cpu/cpu_backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/verify/tree_mask.h"
#include "kernels/attention/paged_tree_attention.h"
#include "tests/cuda/attention_params.h"
#include "tests/cuda/cuda_test_util.h"

namespace arbor {
namespace {

struct Req {
  int32_t committed;
  int32_t t;
  bool tree;
};

struct AttnCase {
  std::string name;
  int32_t hq, hkv, d;
  std::vector<Req> reqs;
  DType kv_dtype = DType::kBF16;
  int32_t block_size = 16;
  int max_splits = 0;         // backend option (0 = from the shape)
  int expect_splits = 0;      // > 0: the plan must split at least this much; -1: no split
  bool share_prefix = false;  // request 1 reuses request 0's full prefix blocks
  int kernel = 0;             // backend attention_kernel: 1 mma.sync, 2 wgmma, 3 wide wgmma
  bool shape_tuned = false;   // the shape-tuned plan (not batch-invariant)
};

std::vector<Req> mixed_requests() {
  return {{37, 1, false}, {0, 1, false},    {13, 50, false}, {0, 100, false},
          {13, 7, true},  {30, 40, true},   {5, 70, true},   {200, 128, true},
          {16, 33, true}, {1000, 1, false}, {45, 64, true}};
}

void run_case(const AttnCase& c) {
  std::mt19937 rng(std::hash<std::string>{}(c.name) & 0xffffffu);
  const int32_t bs = c.block_size;
  const int32_t r_count = static_cast<int32_t>(c.reqs.size());

  // Block tables: scrambled unique blocks, request 1 optionally sharing request 0's prefix.
  std::vector<std::vector<int32_t>> tables(r_count);
  int32_t total_blocks = 0;
  for (const Req& r : c.reqs) total_blocks += (r.committed + r.t + bs - 1) / bs;
  const int64_t num_blocks = total_blocks + 7;
  std::vector<int32_t> pool(static_cast<size_t>(num_blocks));
  std::iota(pool.begin(), pool.end(), 0);
  std::shuffle(pool.begin(), pool.end(), rng);
  size_t next = 0;
  for (int32_t r = 0; r < r_count; ++r) {
    const int32_t need = (c.reqs[r].committed + c.reqs[r].t + bs - 1) / bs;
    int32_t shared = 0;
    if (c.share_prefix && r == 1) shared = std::min(c.reqs[0].committed, c.reqs[1].committed) / bs;
    for (int32_t b = 0; b < need; ++b)
      tables[r].push_back(b < shared ? tables[0][b] : pool[next++]);
  }
  KvCacheShape kv;
  kv.num_layers = 2;
  kv.num_blocks = num_blocks;
  kv.block_size = bs;
  kv.num_kv_heads = c.hkv;
  kv.head_dim = c.d;
  const int64_t width = static_cast<int64_t>(c.hkv) * c.d;

  CpuBackend cpu(1);
  CudaBackendOptions opts;
  opts.kv_dtype = c.kv_dtype;
  opts.attention_max_splits = c.max_splits;
  opts.attention_kernel = c.kernel;
  // Batch-invariant cases: trees scored in the largest node groups wherever they qualify, so
  // the group path is checked against the CPU reference at every shape here.
  opts.attention_tree_groups = 2;
  // Cases about the split-KV choice test the shape-tuned plan; the others the batch-invariant
  // one (the default).
  opts.batch_invariant = c.max_splits == 0 && c.expect_splits == 0 && !c.shape_tuned;
  CudaBackend gpu(opts);
  cpu.allocate_kv(kv);
  gpu.allocate_kv(kv);
  gpu.poison_kv();

  // Fill step: every slot any request reads gets random K/V (rounded to the cache dtype).
  std::vector<int64_t> fill_slots;
  {
    std::vector<bool> seen(static_cast<size_t>(num_blocks * bs), false);
    for (int32_t r = 0; r < r_count; ++r)
      for (int32_t j = 0; j < c.reqs[r].committed + c.reqs[r].t; ++j) {
        const int64_t slot = static_cast<int64_t>(tables[r][j / bs]) * bs + j % bs;
        if (!seen[slot]) fill_slots.push_back(slot);
        seen[slot] = true;
      }
  }
  const int32_t n_fill = static_cast<int32_t>(fill_slots.size());
  {
    StepInputs fill;
    fill.token_ids.assign(n_fill, 0);
    fill.positions.assign(n_fill, 0);
    fill.slot_mapping = fill_slots;
    fill.qo_indptr = {0, n_fill};
    fill.committed_len = {0};
    fill.max_blocks_per_request = static_cast<int32_t>(num_blocks);
    fill.block_tables.resize(static_cast<size_t>(num_blocks));
    std::iota(fill.block_tables.begin(), fill.block_tables.end(), 0);
    fill.mask_indptr = {0, 0};
    cpu.set_step(fill);
    gpu.set_step(fill);
    auto kv_k = testing::random_vector(rng, static_cast<size_t>(n_fill * width));
    auto kv_v = testing::random_vector(rng, static_cast<size_t>(n_fill * width));
    testing::round_all(&kv_k, c.kv_dtype);
    testing::round_all(&kv_v, c.kv_dtype);
    for (int64_t layer = 0; layer < 2; ++layer) {
      Tensor ck = cpu.scratch(n_fill, width), cv = cpu.scratch(n_fill, width);
      Tensor gk = gpu.scratch(n_fill, width), gv = gpu.scratch(n_fill, width);
      cpu.upload(kv_k.data(), ck);
      cpu.upload(kv_v.data(), cv);
      gpu.upload(kv_k.data(), gk);
      gpu.upload(kv_v.data(), gv);
      cpu.write_kv(layer, ck, cv);
      gpu.write_kv(layer, gk, gv);
      std::reverse(kv_k.begin(), kv_k.end());  // layer 0 differs from layer 1
    }
    cpu.reset_scratch();
    gpu.reset_scratch();
  }

  // The attention step.
  StepInputs s;
  s.qo_indptr.push_back(0);
  s.mask_indptr.push_back(0);
  int32_t max_blocks = 0;
  for (auto& t : tables) max_blocks = std::max<int32_t>(max_blocks, static_cast<int32_t>(t.size()));
  s.max_blocks_per_request = max_blocks + 1;  // a padded column of -1
  for (int32_t r = 0; r < r_count; ++r) {
    const Req& q = c.reqs[r];
    for (int32_t i = 0; i < q.t; ++i) {
      const int32_t j = q.committed + i;
      s.token_ids.push_back(0);
      s.positions.push_back(j);
      s.slot_mapping.push_back(static_cast<int64_t>(tables[r][j / bs]) * bs + j % bs);
    }
    s.qo_indptr.push_back(s.num_tokens());
    s.committed_len.push_back(q.committed);
    if (q.tree) {
      std::vector<int32_t> parent(q.t, -1);
      for (int32_t i = 1; i < q.t; ++i)
        parent[i] = std::uniform_int_distribution<int32_t>(std::max(0, i - 9), i - 1)(rng);
      const auto mask = pack_ancestor_mask(parent);
      s.tree_mask.insert(s.tree_mask.end(), mask.begin(), mask.end());
    }
    s.mask_indptr.push_back(static_cast<int32_t>(s.tree_mask.size()));
    for (int32_t b = 0; b < s.max_blocks_per_request; ++b)
      s.block_tables.push_back(b < static_cast<int32_t>(tables[r].size()) ? tables[r][b] : -1);
  }
  cpu.set_step(s);
  gpu.set_step(s);
  const int32_t n = s.num_tokens();
  const int64_t qw = static_cast<int64_t>(c.hq) * c.d;
  const auto qv = testing::random_vector(rng, static_cast<size_t>(n * qw), 2.f);
  const auto nan = testing::nan_vector(static_cast<size_t>(n * qw));
  std::vector<float> ref(static_cast<size_t>(n * qw)), got(ref.size());
  for (int64_t layer = 0; layer < 2; ++layer) {
    Tensor cq = cpu.scratch(n, qw), co = cpu.scratch(n, qw);
    Tensor gq = gpu.scratch(n, qw), go = gpu.scratch(n, qw);
    cpu.upload(qv.data(), cq);
    gpu.upload(qv.data(), gq);
    gpu.upload(nan.data(), go);
    cpu.paged_tree_attention(layer, cq, c.hq, co);
    gpu.paged_tree_attention(layer, gq, c.hq, go);
    cpu.download(co, ref.data());
    gpu.download(go, got.data());
    EXPECT_EQ(testing::count_non_finite(got), 0u) << c.name << " layer " << layer;
    const bool tc = gpu.last_attention_tensor_core();
    const double tol = !tc ? 1e-5 : c.kv_dtype == DType::kF16 ? 4e-3 : 2e-2;
    const double err = testing::max_rel_error(got, ref);
    const double nm = testing::nmse(got, ref);
    EXPECT_LE(err, tol) << c.name << " layer " << layer;
    EXPECT_LE(nm, tc ? 1e-4 : 1e-10) << c.name << " layer " << layer;
    // Row by row: the worst row names the request, so a failure points at its shape.
    double worst = 0;
    int32_t worst_row = 0;
    for (int32_t row = 0; row < n; ++row) {
      std::vector<float> a(got.begin() + row * qw, got.begin() + (row + 1) * qw);
      std::vector<float> b(ref.begin() + row * qw, ref.begin() + (row + 1) * qw);
      const double e = testing::max_rel_error(a, b);
      if (e > worst) worst = e, worst_row = row;
    }
    int32_t worst_req = 0;
    while (s.qo_indptr[worst_req + 1] <= worst_row) ++worst_req;
    std::printf(
        "  %-34s layer %lld: %s, splits %d, max rel err %.3g, nmse %.3g, worst row %d "
        "(request %d: committed %d, T %d)\n",
        c.name.c_str(), static_cast<long long>(layer),
        !tc                          ? "generic"
        : gpu.last_attention_wide()  ? "wgmma wide"
        : gpu.last_attention_wgmma() ? "wgmma"
                                     : "mma.sync",
        gpu.last_attention_splits(), err, nm, worst_row, worst_req, c.reqs[worst_req].committed,
        c.reqs[worst_req].t);
    if ((c.kernel == 2 || c.kernel == 3) && tc) {
      EXPECT_TRUE(gpu.last_attention_wgmma()) << c.name;
    }
    if (c.kernel == 3 && tc) {
      EXPECT_TRUE(gpu.last_attention_wide()) << c.name;
    }
    if (c.kernel == 1) {
      EXPECT_FALSE(gpu.last_attention_wgmma()) << c.name;
    }
    if (c.expect_splits > 0) {
      EXPECT_GE(gpu.last_attention_splits(), c.expect_splits) << c.name;
    }
    if (c.expect_splits < 0) {
      EXPECT_EQ(gpu.last_attention_splits(), 1) << c.name;
    }
  }
}

class CudaAttention : public ::testing::TestWithParam<AttnCase> {};

TEST_P(CudaAttention, MatchesCpuReference) {
  ARBOR_REQUIRE_GPU();
  run_case(GetParam());
}

std::vector<AttnCase> cases() {
  std::vector<AttnCase> v;
  // GQA ratios and head dims over the mixed batch.
  for (int32_t d : {128, 64, 16, 8})
    for (int32_t g : {1, 4, 8}) {
      AttnCase c;
      c.name = "mixed_d" + std::to_string(d) + "_g" + std::to_string(g);
      c.hkv = 2;
      c.hq = 2 * g;
      c.d = d;
      c.reqs = mixed_requests();
      v.push_back(c);
    }
  {  // fp16 KV.
    AttnCase c{"mixed_d128_g4_f16", 8, 2, 128, mixed_requests(), DType::kF16};
    v.push_back(c);
    AttnCase c64{"mixed_d64_g8_f16", 16, 2, 64, mixed_requests(), DType::kF16};
    v.push_back(c64);
  }
  {  // Other block sizes: trees span more (8) or fewer (32) blocks.
    AttnCase c8{"mixed_d128_g4_block8", 8, 2, 128, mixed_requests()};
    c8.block_size = 8;
    v.push_back(c8);
    AttnCase c32{"mixed_d64_g4_block32", 8, 2, 64, mixed_requests()};
    c32.block_size = 32;
    v.push_back(c32);
  }
  {  // Split-KV chosen from the shape: few requests, long contexts.
    AttnCase c{
        "long_split_d128_g4", 8, 2, 128, {{3001, 1, false}, {2500, 64, true}, {999, 7, true}}};
    c.expect_splits = 4;
    c.share_prefix = true;
    v.push_back(c);
    AttnCase c1 = c;
    c1.name = "long_nosplit_d128_g4";
    c1.max_splits = 1;
    c1.expect_splits = -1;
    v.push_back(c1);
    AttnCase c64{"long_split_d64_g8", 16, 2, 64, {{4100, 1, false}, {1800, 128, true}}};
    c64.expect_splits = 4;
    v.push_back(c64);
    AttnCase cg{"long_generic_d16_g4", 8, 2, 16, {{3001, 1, false}, {700, 70, true}}};
    v.push_back(cg);
  }
  {  // Llama-3-8B grouping (32 q heads, 8 kv heads) on a tree batch.
    AttnCase c{
        "llama8b_heads_trees", 32, 8, 128, {{100, 64, true}, {77, 16, true}, {300, 1, false}}};
    c.share_prefix = true;
    v.push_back(c);
  }
  {  // The shape-tuned plan (row tiles of 16 / 32 / 64 by request, splits from the shape) over
     // the mixed batch: GQA 1 / 4 / 8, fp16, block size 8, and the Llama-3-8B grouping.
    for (int32_t g : {1, 4, 8}) {
      AttnCase c{"mixed_d128_g" + std::to_string(g) + "_tuned", 2 * g, 2, 128, mixed_requests()};
      c.shape_tuned = true;
      v.push_back(c);
    }
    AttnCase f{"mixed_d128_g4_f16_tuned", 8, 2, 128, mixed_requests(), DType::kF16};
    f.shape_tuned = true;
    v.push_back(f);
    AttnCase b8{"mixed_d128_g4_block8_tuned", 8, 2, 128, mixed_requests()};
    b8.block_size = 8;
    b8.shape_tuned = true;
    v.push_back(b8);
    AttnCase l{"llama8b_heads_trees_tuned",
               32,
               8,
               128,
               {{100, 64, true}, {77, 16, true}, {300, 1, false}}};
    l.share_prefix = true;
    l.shape_tuned = true;
    v.push_back(l);
  }
  // Every tensor-core case through mma.sync, wgmma and 128-row wgmma tiles.
  std::vector<AttnCase> all;
  for (AttnCase c : v) {
    if (c.d != 64 && c.d != 128) {
      all.push_back(c);
      continue;
    }
    AttnCase m = c;
    m.kernel = 1;
    m.name += "_mma";
    all.push_back(m);
    AttnCase w = c;
    w.kernel = 2;
    w.name += "_wgmma";
    all.push_back(w);
    // And through 128-row tiles (requests of <= 64 rows leave the second consumer warpgroup
    // idle; trees of 40 and 70 nodes end mid-tile; batch-invariant plans then score every tree
    // node on its own).
    AttnCase wide = c;
    wide.kernel = 3;
    wide.name += "_wide";
    all.push_back(wide);
  }
  return all;
}

// Ragged requests for the kernel-level tests: trees (random parents within 6) and causal
// chunks, scrambled block tables, and the device buffers the launches share.
struct KernelScene {
  static constexpr int32_t kHq = 8, kHkv = 2, kD = 128, kBs = 16;
  std::vector<int32_t> qo{0}, committed, tables, mask_indptr{0};
  std::vector<uint32_t> mask;
  int32_t max_blocks = 0, n = 0;
  size_t cache_elems = 0;
  std::mt19937 rng{2024};
  std::vector<void*> owned;

  explicit KernelScene(const std::vector<Req>& reqs) {
    for (const Req& r : reqs)
      max_blocks = std::max(max_blocks, (r.committed + r.t + kBs - 1) / kBs);
    const int32_t r_count = static_cast<int32_t>(reqs.size());
    std::vector<int32_t> pool(static_cast<size_t>(r_count * max_blocks));
    std::iota(pool.begin(), pool.end(), 0);
    std::shuffle(pool.begin(), pool.end(), rng);
    for (int32_t r = 0; r < r_count; ++r) {
      qo.push_back(qo.back() + reqs[r].t);
      committed.push_back(reqs[r].committed);
      tables.insert(tables.end(), pool.begin() + r * max_blocks,
                    pool.begin() + (r + 1) * max_blocks);
      if (reqs[r].tree) {
        std::vector<int32_t> parent(reqs[r].t, -1);
        for (int32_t i = 1; i < reqs[r].t; ++i)
          parent[i] = std::uniform_int_distribution<int32_t>(std::max(0, i - 6), i - 1)(rng);
        const std::vector<uint32_t> m = pack_ancestor_mask(parent);
        mask.insert(mask.end(), m.begin(), m.end());
      }
      mask_indptr.push_back(static_cast<int32_t>(mask.size()));
    }
    n = qo.back();
    cache_elems = static_cast<size_t>(r_count) * max_blocks * kBs * kHkv * kD;
  }
  ~KernelScene() {
    for (void* ptr : owned) cudaFree(ptr);
  }
  std::vector<uint16_t> bits16(size_t count, bool bf16) {
    std::uniform_real_distribution<float> d(-2.f, 2.f);
    std::vector<uint16_t> v(count);
    for (auto& x : v) x = bf16 ? f32_to_bf16(d(rng)) : testing::f32_to_f16_bits(d(rng) * 0.5f);
    return v;
  }
  template <typename V>
  void* upload(const V& v) {
    void* ptr = nullptr;
    EXPECT_EQ(cudaMalloc(&ptr, std::max<size_t>(v.size() * sizeof(v[0]), 16)), cudaSuccess);
    if (!v.empty()) cudaMemcpy(ptr, v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice);
    owned.push_back(ptr);
    return ptr;
  }
  kernels::AttentionPlanInputs plan_inputs() const {
    return testing::step_plan_inputs({kHq, kHkv, kD, kBs}, qo, committed);
  }
  // The step's metadata, with each token row's request (the merge kernel's map).
  void set_step(kernels::PagedTreeAttentionParams& p) {
    testing::set_step_params(p, {kHq, kHkv, kD, kBs}, qo, committed, tables, max_blocks, mask,
                             mask_indptr, [&](const auto& v) { return upload(v); });
    std::vector<int32_t> token_request;
    for (size_t r = 0; r + 1 < qo.size(); ++r)
      token_request.insert(token_request.end(), qo[r + 1] - qo[r], static_cast<int32_t>(r));
    p.token_request = static_cast<const int32_t*>(upload(token_request));
  }
};

// Kernel level, 16-bit Q / O (the engine's attention runs fp32 I/O, so its cases above never take
// the wide CTAs' staged 16-bit epilogue): wide and 64-row wgmma CTAs compute each row with the
// same arithmetic, so with one split their outputs are bitwise equal, and equal to the bf16 copy
// that fp32 I/O writes straight from the accumulators (the same values, rounded the same way).
// Trees whose row counts leave the second consumer of the last CTA partly or wholly idle (160
// and 132 rows), a causal chunk, a decode row, scrambled blocks, outputs poisoned with NaN.
TEST(CudaAttentionKernel, StagedEpilogueMatchesDirectStores) {
  ARBOR_REQUIRE_GPU();
  bool wgmma = false;
  ASSERT_EQ(kernels::attention_wgmma_available(&wgmma), cudaSuccess);
  if (!wgmma) GTEST_SKIP() << "no sm_90a wgmma kernel on this GPU";
  KernelScene sc(
      {{1000, 64, true}, {777, 40, true}, {70, 33, true}, {300, 128, false}, {5, 1, false}});
  constexpr int32_t kHq = KernelScene::kHq, kD = KernelScene::kD;
  const int32_t n = sc.n;
  auto upload = [&](const auto& v) { return sc.upload(v); };  // (also set_plan_params' uploader)
  for (const bool bf16 : {true, false}) {
    const kernels::ElemType type = bf16 ? kernels::ElemType::kBF16 : kernels::ElemType::kF16;
    const std::vector<uint16_t> q_bits = sc.bits16(static_cast<size_t>(n) * kHq * kD, bf16);
    void* q = upload(q_bits);
    void* k_cache = upload(sc.bits16(sc.cache_elems, bf16));
    void* v_cache = upload(sc.bits16(sc.cache_elems, bf16));
    // Runs: 0 = wide CTAs (the staged epilogue), 1 = 64-row CTAs, both 16-bit Q / O; 2 (bf16
    // only) = 64-row CTAs with fp32 Q / O and the bf16 copy of O (out_bf16), whose 4-byte
    // stores straight from the accumulators are the reference for the staged tile's bits.
    std::vector<uint16_t> outs[3];
    bool planned_wide[3] = {false, false, false};
    for (int run = 0; run < (bf16 ? 3 : 2); ++run) {
      kernels::AttentionPlanInputs in = sc.plan_inputs();
      in.max_splits = 1;  // one split each: the staged epilogue, and no merge order to differ
      in.wgmma = true;
      in.wide = run == 0 ? 1 : 0;
      const kernels::AttentionPlan plan = kernels::plan_paged_tree_attention(in);
      planned_wide[run] = plan.wide;
      std::vector<uint16_t> poison(static_cast<size_t>(n) * kHq * kD, 0x7fc1);  // NaN
      kernels::PagedTreeAttentionParams p;
      void* out16 = upload(poison);
      if (run < 2) {
        p.q = q;
        p.out = out16;
        p.io_type = type;
      } else {
        std::vector<float> q32(q_bits.size());
        for (size_t i = 0; i < q_bits.size(); ++i) q32[i] = bf16_to_f32(q_bits[i]);
        p.q = upload(q32);
        p.out = upload(std::vector<float>(q32.size(), std::nanf("")));
        p.out_bf16 = out16;
        p.io_type = kernels::ElemType::kF32;
      }
      p.k_cache = k_cache;
      p.v_cache = v_cache;
      p.kv_type = type;
      sc.set_step(p);
      testing::set_plan_params(p, plan, upload);
      ASSERT_FALSE(plan.needs_merge);
      ASSERT_EQ(kernels::launch_paged_tree_attention(p, nullptr), cudaSuccess);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      outs[run] = poison;
      cudaMemcpy(outs[run].data(), out16, poison.size() * 2, cudaMemcpyDeviceToHost);
    }
    EXPECT_TRUE(planned_wide[0]);
    EXPECT_FALSE(planned_wide[1]);
    const int ref = bf16 ? 2 : 1;  // fp16: wide against 64-row CTAs only
    for (int run = 0; run < ref; ++run) {
      int64_t differ = 0, nan = 0;
      for (size_t i = 0; i < outs[ref].size(); ++i) {
        differ += outs[run][i] != outs[ref][i];
        const uint16_t e = bf16 ? 0x7f80 : 0x7c00;
        nan += (outs[run][i] & e) == e;
      }
      const char* what = run == 0 ? "wide CTAs (staged epilogue)" : "64-row CTAs";
      EXPECT_EQ(differ, 0) << what << (bf16 ? ", bf16" : ", fp16");
      EXPECT_EQ(nan, 0) << what << (bf16 ? ", bf16" : ", fp16")
                        << ": unwritten (poisoned) or non-finite outputs";
      std::printf("  %s, %s Q / O vs %s: %lld of %zu outputs differ\n", what,
                  bf16 ? "bf16" : "fp16",
                  bf16 ? "fp32 I/O's bf16 copy (direct stores)" : "64-row CTAs",
                  static_cast<long long>(differ), outs[ref].size());
    }
  }
}

// The merge kernel's two variants (PagedTreeAttentionParams::max_splits picks 16 partial loads
// in flight above 8 splits, else 8): the same bits for every output, whichever a launch takes
// (the choice follows the longest request of the launch, so a row's result must not depend on
// it), for the wgmma kernel with 64- and 128-row CTAs and the mma.sync kernel, at 2-12 splits.
TEST(CudaAttentionKernel, MergeVariantsGiveTheSameBits) {
  ARBOR_REQUIRE_GPU();
  bool have_wgmma = false;
  ASSERT_EQ(kernels::attention_wgmma_available(&have_wgmma), cudaSuccess);
  KernelScene sc({{1000, 64, true},
                  {777, 40, true},
                  {2100, 33, true},
                  {300, 128, false},
                  {5, 1, false},
                  {4000, 16, true}});
  constexpr int32_t kHq = KernelScene::kHq, kD = KernelScene::kD;
  const size_t out_elems = static_cast<size_t>(sc.n) * kHq * kD;
  void* q = sc.upload(sc.bits16(out_elems, true));
  void* k_cache = sc.upload(sc.bits16(sc.cache_elems, true));
  void* v_cache = sc.upload(sc.bits16(sc.cache_elems, true));
  int kernels_run = 0;
  for (const int variant : {0, 1, 2}) {  // wgmma wide, wgmma 64-row, mma.sync
    if (variant < 2 && !have_wgmma) continue;
    for (const int splits : {2, 5, 12}) {
      kernels::AttentionPlanInputs in = sc.plan_inputs();
      in.fixed_splits = splits;
      in.wgmma = variant < 2;
      in.wide = variant == 0 ? 1 : 0;
      const kernels::AttentionPlan plan = kernels::plan_paged_tree_attention(in);
      ASSERT_TRUE(plan.needs_merge);
      kernels::PagedTreeAttentionParams p;
      p.q = q;
      p.io_type = kernels::ElemType::kBF16;
      p.k_cache = k_cache;
      p.v_cache = v_cache;
      p.kv_type = kernels::ElemType::kBF16;
      sc.set_step(p);
      testing::set_plan_params(p, plan, [&](const auto& v) { return sc.upload(v); });
      const size_t prows = static_cast<size_t>(plan.num_partial_rows);
      p.partial_out = static_cast<float*>(sc.upload(std::vector<float>(prows * kHq * kD)));
      p.partial_lse = static_cast<float*>(sc.upload(std::vector<float>(prows * kHq)));
      const std::vector<uint16_t> poison(out_elems, 0x7fc1);  // NaN
      std::vector<uint16_t> outs[2];
      for (int run = 0; run < 2; ++run) {  // 8 loads in flight, then 16
        p.max_splits = run == 0 ? 2 : 16;
        p.out = sc.upload(poison);
        ASSERT_EQ(kernels::launch_paged_tree_attention(p, nullptr), cudaSuccess);
        ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
        outs[run] = poison;
        cudaMemcpy(outs[run].data(), p.out, out_elems * 2, cudaMemcpyDeviceToHost);
      }
      int64_t nan = 0, differ = 0;
      for (size_t i = 0; i < out_elems; ++i) {
        nan += (outs[0][i] & 0x7f80) == 0x7f80;
        differ += outs[1][i] != outs[0][i];
      }
      EXPECT_EQ(nan, 0) << "unwritten (poisoned) or non-finite outputs, variant " << variant;
      EXPECT_EQ(differ, 0) << "variant " << variant << ", splits " << splits;
      std::printf("  %s, %d splits (%zu CTAs): %lld of %zu outputs differ between the variants\n",
                  variant == 0   ? "wgmma wide"
                  : variant == 1 ? "wgmma 64-row"
                                 : "mma.sync",
                  plan.max_splits_used, plan.work.size(), static_cast<long long>(differ),
                  out_elems);
      ++kernels_run;
    }
  }
  EXPECT_GT(kernels_run, 0);
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAttention, ::testing::ValuesIn(cases()),
                         [](const auto& info) { return info.param.name; });

}  // namespace
}  // namespace arbor
