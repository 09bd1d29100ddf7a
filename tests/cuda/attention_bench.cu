// Microbenchmark of the paged tree-attention kernel at Llama-3-8B attention shapes (32 query
// heads, 8 KV heads, head_dim 128, bf16 Q/K/V/O, block size 16): batch x context x tree grid,
// every request a random tree of T nodes after a committed prefix of L tokens, block tables
// scrambled. Prints the median time per launch (cold L2: a 256 MiB buffer is read, not
// written, before each timed launch, so no dirty lines are left to write back) and the floor
// max(bytes / copy rate, FLOPs / bf16 GEMM rate), both rates measured on this GPU at start-up
// (tests/cuda/device_rates.h; ~3.0 TB/s and ~790 TFLOP/s on the H100), where bytes = K+V+Q+O
// read/written once and FLOPs = 4 * D * sum over query rows of visible keys.
//
//   attention_bench [--batch 1,8,16,32,64] [--context 1024,2048,8192,32768]
//                   [--tree 16,32,64,128] [--iters 30] [--max-splits 0] [--splits 0,1,2,4]
//                   [--kernel wgmma|mma] [--wide -1|0|1] [--phases 0|1] [--ctas-per-sm 0]
//                   [--head-dim 128|64] [--latency-probe 0|1]
//   --wide: 128-row wgmma tiles where the rows fill them (-1, the planner's rule), never or
//   always.
//   --ctas-per-sm N: plan splits for a wave of N resident CTAs per SM (0: the planner's choice).
//   --head-dim 64: the same shapes with head_dim 64 (the tensor-core kernels' other size).
//   --phases 1: after each point's timing, one more launch with per-CTA phase stamps
//   (PagedTreeAttentionParams::phase_ns) and a line of medians: prologue, KV loop (and per
//   tile), epilogue, CTA total, and how many CTAs started in a later wave.
//   --latency-probe 1: after each point's timing, two probe kernels with the kernel's grid,
//   timed the same way (cold L2, events around one launch): an empty kernel, and one whose
//   CTAs do only what every paged design must before its first MMA (read the work item, the
//   request's first block-table entry, then one K row of that block: three dependent cold
//   reads) and write 2 KiB. Neither computes anything, so each is a lower bound on what any
//   one-launch kernel measures in this harness, against which the floor's 1.3x and 1.6x are
//   printed.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "kernels/attention/paged_tree_attention.h"
#include "tests/cuda/attention_params.h"
#include "tests/cuda/cold_timing.h"
#include "tests/cuda/device_rates.h"

namespace {

constexpr int kHq = 32, kHkv = 8, kBlock = 16;
int g_head_dim = 128;  // --head-dim: 128 (Llama-3-8B) or 64

using arbor::testing::check_cuda;

uint16_t bf16_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

std::vector<uint32_t> ancestor_mask(const std::vector<int>& parent) {
  const int t = static_cast<int>(parent.size()), words = (t + 31) / 32;
  std::vector<uint32_t> m(static_cast<size_t>(t) * words, 0);
  for (int i = 0; i < t; ++i)
    for (int j = i; j >= 0; j = parent[j])
      m[static_cast<size_t>(i) * words + j / 32] |= 1u << (j % 32);
  return m;
}

// Reads a buffer larger than L2 (evicting the KV of the previous launch) without writing it.
__global__ void l2_flush_read(const int4* p, size_t n, int* sink) {
  int4 acc = make_int4(0, 0, 0, 0);
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int4 v = p[i];
    acc.x ^= v.x, acc.y ^= v.y, acc.z ^= v.z, acc.w ^= v.w;
  }
  if (acc.x == 0x7f7f7f7f && acc.y == 0x1 && acc.z == 0x2 && acc.w == 0x3) *sink = acc.x;
}

// Evicts L2 (a 256 MiB read) so the next launch starts cold.
void flush_l2(cudaStream_t stream, const void* flush, size_t flush_bytes, int* sink, int sms) {
  l2_flush_read<<<4 * sms, 512, 0, stream>>>(static_cast<const int4*>(flush),
                                             flush_bytes / sizeof(int4), sink);
}

// The L2 buffer every timed launch starts from.
struct ColdL2 {
  const void* flush = nullptr;
  size_t flush_bytes = 0;
  int* sink = nullptr;
  int sms = 0;
};

// Median us of `iters` launches, each after an L2 flush with events around it (after `untimed`
// more the same way).
template <typename Launch>
double median_cold_us(cudaStream_t stream, const ColdL2& l2, int iters, int untimed,
                      Launch&& launch) {
  cudaEvent_t e0, e1;
  cudaEventCreate(&e0);
  cudaEventCreate(&e1);
  std::vector<float> t;
  for (int it = 0; it < untimed + iters; ++it) {
    flush_l2(stream, l2.flush, l2.flush_bytes, l2.sink, l2.sms);
    cudaEventRecord(e0, stream);
    launch();
    cudaEventRecord(e1, stream);
    check_cuda(cudaEventSynchronize(e1), "timed launch");
    float ms = 0;
    cudaEventElapsedTime(&ms, e0, e1);
    if (it >= untimed) t.push_back(ms * 1000.f);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

__global__ void empty_probe() {}

// Work item -> its request's first block-table entry -> one K row of that block (2 KiB: every
// KV head of the slot), written out. `tables` rows are `max_blocks` wide.
__global__ void dependent_read_probe(const arbor::kernels::AttentionWorkItem* work,
                                     const int32_t* tables, int max_blocks, int num_requests,
                                     const int4* k_cache, int slot_int4s, int block_size,
                                     int4* out) {
  const int request = work[blockIdx.x].request;
  if (request < 0 || request >= num_requests) return;  // padding item
  const int32_t block = tables[static_cast<size_t>(request) * max_blocks];
  const size_t slot = static_cast<size_t>(block) * block_size;
  if (threadIdx.x < slot_int4s)
    out[static_cast<size_t>(blockIdx.x) * slot_int4s + threadIdx.x] =
        k_cache[slot * slot_int4s + threadIdx.x];
}

// --latency-probe: the two probes' medians beside the floor's 1.3x and 1.6x.
void print_latency_probe(const arbor::kernels::PagedTreeAttentionParams& p, double floor_us,
                         cudaStream_t stream, const ColdL2& l2, int iters) {
  const int slot_int4s = kHkv * g_head_dim * 2 / 16;
  int4* out = nullptr;
  check_cuda(cudaMalloc(&out, static_cast<size_t>(p.num_work) * slot_int4s * 16), "probe out");
  const int threads = std::max(128, slot_int4s);
  const double empty_us = median_cold_us(
      stream, l2, iters, 3, [&] { empty_probe<<<p.num_work, threads, 0, stream>>>(); });
  const double chain_us = median_cold_us(stream, l2, iters, 3, [&] {
    dependent_read_probe<<<p.num_work, threads, 0, stream>>>(
        p.work, p.block_tables, p.max_blocks_per_request, p.num_requests,
        static_cast<const int4*>(p.k_cache), slot_int4s, p.block_size, out);
  });
  check_cuda(cudaGetLastError(), "probe launch");
  std::printf(
      "  latency probe (%d CTAs): empty %.1f us, dependent reads %.1f us; floor x1.3 %.1f us, "
      "x1.6 %.1f us%s\n",
      p.num_work, empty_us, chain_us, 1.3 * floor_us, 1.6 * floor_us,
      chain_us > 1.6 * floor_us   ? " (both below the probe)"
      : chain_us > 1.3 * floor_us ? " (x1.3 below the probe)"
                                  : "");
  cudaFree(out);
}

// One more launch (after the L2 flush) with phase stamps: where a CTA's time goes.
void print_phases(arbor::kernels::PagedTreeAttentionParams p, cudaStream_t stream,
                  const void* flush, size_t flush_bytes, int* sink, int sms) {
  constexpr int W = arbor::kernels::kAttnPhaseWords;
  unsigned long long* d = nullptr;
  check_cuda(cudaMalloc(&d, static_cast<size_t>(p.num_work) * W * 8), "malloc phases");
  check_cuda(cudaMemset(d, 0, static_cast<size_t>(p.num_work) * W * 8), "clear phases");
  p.phase_ns = d;
  flush_l2(stream, flush, flush_bytes, sink, sms);
  check_cuda(arbor::kernels::launch_paged_tree_attention(p, stream), "phase launch");
  check_cuda(cudaStreamSynchronize(stream), "phase sync");
  std::vector<unsigned long long> h(static_cast<size_t>(p.num_work) * W);
  check_cuda(cudaMemcpy(h.data(), d, h.size() * 8, cudaMemcpyDeviceToHost), "phases back");
  cudaFree(d);
  unsigned long long t0 = ~0ull, t_end = 0;
  std::vector<double> pro, loop, tile, epi, total, start;
  std::vector<unsigned long long> start_ns;  // made relative to t0 once t0 is known
  for (int c = 0; c < p.num_work; ++c) {
    const unsigned long long* x = &h[static_cast<size_t>(c) * W];
    if (x[7] == 0) continue;  // padding item
    t0 = std::min(t0, x[0]);
    t_end = std::max(t_end, x[7]);
    const double ns_per_cycle = double(x[7] - x[0]) / double(std::max(1ull, x[4] - x[1]));
    pro.push_back((x[2] - x[1]) * ns_per_cycle / 1e3);
    loop.push_back((x[3] - x[2]) * ns_per_cycle / 1e3);
    if (x[6] > 0) tile.push_back((x[3] - x[2]) * ns_per_cycle / 1e3 / double(x[6]));
    epi.push_back((x[4] - x[3]) * ns_per_cycle / 1e3);
    total.push_back((x[7] - x[0]) / 1e3);
    start_ns.push_back(x[0]);
  }
  for (unsigned long long s0 : start_ns) start.push_back((s0 - t0) / 1e3);
  auto med = [](std::vector<double> v) {
    if (v.empty()) return 0.0;
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
  };
  auto mx = [](const std::vector<double>& v) {
    return v.empty() ? 0.0 : *std::max_element(v.begin(), v.end());
  };
  int late = 0;  // CTAs that started after another CTA had finished (later waves)
  double first_end = 1e30;
  for (size_t i = 0; i < total.size(); ++i) first_end = std::min(first_end, start[i] + total[i]);
  for (double s0 : start) late += s0 > first_end;
  std::printf(
      "  phases: span %.1f us (first CTA start to last end); per CTA median us: prologue %.2f, "
      "loop %.2f (%.3f per tile), epilogue %.2f, total %.2f (max %.2f); CTAs starting after "
      "the first end: %d of %zu (last start %.1f us)\n",
      (t_end - t0) / 1e3, med(pro), med(loop), med(tile), med(epi), med(total), mx(total), late,
      total.size(), mx(start));
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> batches = {1, 8, 16, 32, 64}, contexts = {1024, 2048, 8192, 32768},
                   trees = {16, 32, 64, 128};
  int iters = 30, max_splits = 0;
  bool phases = false;                  // --phases 1: one more launch with per-CTA phase stamps
  bool latency_probe = false;           // --latency-probe 1: the two probe kernels per point
  std::vector<int> fixed_splits = {0};  // --splits: 0 = the planner's choice, N = N splits
  bool wgmma = true;
  int wide = -1;  // --wide: 128-row wgmma tiles (AttentionPlanInputs::wide: -1 auto, 0, 1)
  // --ctas-per-sm: the planner's resident CTAs per SM (AttentionPlanInputs::ctas_per_sm; 0: the
  // kernel's own), i.e. the wave that splits fill.
  int ctas_per_sm = 0;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--batch")
      batches = arbor::testing::parse_int_list(argv[i + 1]);
    else if (a == "--context")
      contexts = arbor::testing::parse_int_list(argv[i + 1]);
    else if (a == "--tree")
      trees = arbor::testing::parse_int_list(argv[i + 1]);
    else if (a == "--iters")
      iters = std::atoi(argv[i + 1]);
    else if (a == "--max-splits")
      max_splits = std::atoi(argv[i + 1]);
    else if (a == "--splits")
      fixed_splits = arbor::testing::parse_int_list(argv[i + 1]);
    else if (a == "--phases")
      phases = std::atoi(argv[i + 1]) != 0;
    else if (a == "--latency-probe")
      latency_probe = std::atoi(argv[i + 1]) != 0;
    else if (a == "--wide")
      wide = std::atoi(argv[i + 1]);
    else if (a == "--ctas-per-sm")
      ctas_per_sm = std::atoi(argv[i + 1]);
    else if (a == "--head-dim")
      g_head_dim = std::atoi(argv[i + 1]);
    else if (a == "--kernel")
      wgmma = std::string(argv[i + 1]) != "mma";
  }
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "props");
  bool have_wgmma = false;
  check_cuda(arbor::kernels::attention_wgmma_available(&have_wgmma), "probe");
  wgmma = wgmma && have_wgmma;
  std::printf("device: %s, %d SMs, L2 %d MiB; kernel: %s\n", prop.name, prop.multiProcessorCount,
              prop.l2CacheSize >> 20, wgmma ? "wgmma" : "mma.sync");
  const double copy_bw = arbor::testing::measure_copy_bandwidth(nullptr);    // bytes/s
  const double gemm_rate = arbor::testing::measure_bf16_gemm_rate(nullptr);  // FLOP/s
  std::printf(
      "shapes: Hq %d, Hkv %d, D %d, bf16, block %d; floor = max(bytes / %.2f TB/s, "
      "FLOPs / %.0f TFLOP/s), the measured copy and bf16 GEMM (cuBLAS 8192^3) rates\n",
      kHq, kHkv, g_head_dim, kBlock, copy_bw / 1e12, gemm_rate / 1e12);

  // One cache big enough for the largest point; random bf16 tiled from a 64 MiB host buffer.
  int64_t max_slots = 0;
  for (int b : batches)
    for (int l : contexts)
      for (int t : trees) {
        const int64_t blocks = static_cast<int64_t>(b) * ((l + t + kBlock - 1) / kBlock);
        max_slots = std::max(max_slots, blocks * kBlock);
      }
  const int64_t row_elems = static_cast<int64_t>(kHkv) * g_head_dim;
  const size_t cache_bytes = static_cast<size_t>(max_slots * row_elems * 2);
  void *k_cache = nullptr, *v_cache = nullptr;
  check_cuda(cudaMalloc(&k_cache, cache_bytes), "malloc k");
  check_cuda(cudaMalloc(&v_cache, cache_bytes), "malloc v");
  {
    std::mt19937 rng(1);
    std::uniform_real_distribution<float> d(-1.f, 1.f);
    const size_t chunk = std::min<size_t>(cache_bytes, 64u << 20);
    std::vector<uint16_t> h(chunk / 2);
    for (auto& x : h) x = bf16_bits(d(rng));
    void* src = nullptr;
    check_cuda(cudaMalloc(&src, chunk), "malloc src");
    check_cuda(cudaMemcpy(src, h.data(), chunk, cudaMemcpyHostToDevice), "fill");
    for (void* dst : {k_cache, v_cache})
      for (size_t off = 0; off < cache_bytes; off += chunk)
        check_cuda(cudaMemcpy(static_cast<char*>(dst) + off, src,
                              std::min(chunk, cache_bytes - off), cudaMemcpyDeviceToDevice),
                   "tile");
    cudaFree(src);
  }
  void* flush = nullptr;
  int* sink = nullptr;
  const size_t flush_bytes = 256u << 20;
  check_cuda(cudaMalloc(&flush, flush_bytes), "malloc flush");
  check_cuda(cudaMemset(flush, 1, flush_bytes), "flush init");
  check_cuda(cudaMalloc(&sink, sizeof(int)), "malloc sink");
  cudaStream_t stream;
  check_cuda(cudaStreamCreate(&stream), "stream");
  const ColdL2 l2{flush, flush_bytes, sink, prop.multiProcessorCount};

  std::printf(
      "\n| batch | context | tree | splits | CTAs | median us | floor us | x floor | "
      "bound | TB/s |\n|---|---|---|---|---|---|---|---|---|---|\n");
  std::mt19937 rng(7);
  for (int b : batches)
    for (int l : contexts)
      for (int t : trees) {
        // Step metadata.
        const int blocks_per_req = (l + t + kBlock - 1) / kBlock;
        std::vector<int32_t> qo(b + 1), committed(b, l), tables, mask_indptr(b + 1, 0),
            token_request;
        std::vector<uint32_t> mask;
        std::vector<int32_t> pool(static_cast<size_t>(b) * blocks_per_req);
        std::iota(pool.begin(), pool.end(), 0);
        std::shuffle(pool.begin(), pool.end(), rng);
        double visible = 0;
        for (int r = 0; r < b; ++r) {
          qo[r + 1] = qo[r] + t;
          tables.insert(tables.end(), pool.begin() + static_cast<int64_t>(r) * blocks_per_req,
                        pool.begin() + static_cast<int64_t>(r + 1) * blocks_per_req);
          std::vector<int> parent(t, -1);
          for (int i = 1; i < t; ++i)
            parent[i] = std::uniform_int_distribution<int>(std::max(0, i - 10), i - 1)(rng);
          const auto m = ancestor_mask(parent);
          for (int i = 0; i < t; ++i) {
            int depth = 0;
            for (int j = i; j >= 0; j = parent[j]) ++depth;
            visible += static_cast<double>(l + depth) * kHq;
          }
          mask.insert(mask.end(), m.begin(), m.end());
          mask_indptr[r + 1] = static_cast<int32_t>(mask.size());
          for (int i = 0; i < t; ++i) token_request.push_back(r);
        }
        const int n = qo[b];
        for (const int fs : fixed_splits) {
          arbor::kernels::AttentionPlanInputs in =
              arbor::testing::step_plan_inputs({kHq, kHkv, g_head_dim, kBlock}, qo, committed);
          in.num_sms = prop.multiProcessorCount;
          in.max_splits = max_splits;
          in.fixed_splits = fs;
          in.wgmma = wgmma;
          in.wide = wide;
          in.ctas_per_sm = ctas_per_sm;
          const arbor::kernels::AttentionPlan plan = arbor::kernels::plan_paged_tree_attention(in);

          auto upload = [&](const auto& v) {
            void* d = nullptr;
            const size_t bytes = std::max<size_t>(v.size() * sizeof(v[0]), 16);
            check_cuda(cudaMalloc(&d, bytes), "malloc meta");
            if (!v.empty())
              check_cuda(cudaMemcpy(d, v.data(), v.size() * sizeof(v[0]), cudaMemcpyHostToDevice),
                         "meta");
            return d;
          };
          std::vector<void*> owned;
          auto up = [&](const auto& v) {
            owned.push_back(upload(v));
            return owned.back();
          };
          arbor::kernels::PagedTreeAttentionParams p;
          std::vector<uint16_t> qh(static_cast<size_t>(n) * kHq * g_head_dim);
          std::uniform_real_distribution<float> d(-2.f, 2.f);
          for (auto& x : qh) x = bf16_bits(d(rng));
          p.q = up(qh);
          void* out = nullptr;
          check_cuda(cudaMalloc(&out, qh.size() * 2), "malloc out");
          owned.push_back(out);
          p.out = out;
          p.k_cache = k_cache;
          p.v_cache = v_cache;
          p.io_type = arbor::kernels::ElemType::kBF16;
          p.kv_type = arbor::kernels::ElemType::kBF16;
          arbor::testing::set_step_params(p, {kHq, kHkv, g_head_dim, kBlock}, qo, committed, tables,
                                          blocks_per_req, mask, mask_indptr, up);
          p.token_request = static_cast<const int32_t*>(up(token_request));
          arbor::testing::set_plan_params(p, plan, up);
          if (plan.needs_merge) {
            void* po = nullptr;
            void* pl = nullptr;
            check_cuda(
                cudaMalloc(&po, static_cast<size_t>(plan.num_partial_rows) * kHq * g_head_dim * 4),
                "partials");
            check_cuda(cudaMalloc(&pl, static_cast<size_t>(plan.num_partial_rows) * kHq * 4),
                       "partials");
            owned.push_back(po);
            owned.push_back(pl);
            p.partial_out = static_cast<float*>(po);
            p.partial_lse = static_cast<float*>(pl);
          }
          for (int w = 0; w < 3; ++w)
            check_cuda(arbor::kernels::launch_paged_tree_attention(p, stream), "warmup");
          const double med = median_cold_us(stream, l2, iters, 0, [&] {
            check_cuda(arbor::kernels::launch_paged_tree_attention(p, stream), "launch");
          });
          const double kv_bytes = static_cast<double>(b) * (l + t) * kHkv * g_head_dim * 2 * 2;
          const double qo_bytes = static_cast<double>(n) * kHq * g_head_dim * 2 * 2;
          const double flops = 4.0 * g_head_dim * visible;
          const double t_mem = (kv_bytes + qo_bytes) / copy_bw * 1e6;
          const double t_math = flops / gemm_rate * 1e6;
          const double floor_us = std::max(t_mem, t_math);
          std::printf("| %d | %d | %d | %d | %d | %.1f | %.1f | %.2f | %s | %.2f |\n", b, l, t,
                      plan.max_splits_used, p.num_work, med, floor_us, med / floor_us,
                      t_mem >= t_math ? "mem" : "math",
                      (kv_bytes + qo_bytes) / (med * 1e-6) / 1e12);
          std::fflush(stdout);
          if (phases) print_phases(p, stream, flush, flush_bytes, sink, prop.multiProcessorCount);
          if (latency_probe) print_latency_probe(p, floor_us, stream, l2, iters);
          for (void* ptr : owned) cudaFree(ptr);
        }
      }
  check_cuda(cudaGetLastError(), "end");
  return 0;
}
