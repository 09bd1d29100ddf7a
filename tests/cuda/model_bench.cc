// Model benchmark of the CUDA backend at Llama-3-8B shapes (hidden 4096, 32 layers, 32 query /
// 8 KV heads, head_dim 128, intermediate 14336, vocab 128256, llama3 RoPE) with random bf16
// weights made on the GPU (CudaBackendOptions::random_weights: no weight file). Measures
//   * the linear layers alone: invariant cuBLASLt vs the chunked GEMM per shape and row count
//   (--linear);
//   * plain decode: step time and tokens/s at each batch after a prefill of --context tokens,
//     through LlamaModel::forward (logits copied to the host, the engine's path today), through
//     the same op sequence with the logits left on the device, and as a CUDA-graph replay of
//     one step (launch gaps removed), against the floor (weights + KV bytes / copy bandwidth);
//   * the verification step time vs tree tokens per request at each batch (random trees after
//     the prefix, logits of every tree row left on the device): the curve a scheduler sizes
//     trees with, written as JSON (--verify-json, configs/verify_cost_h100.json's format);
//   * where a step's GPU time goes (event-timed per op kind);
//   * step graphs on vs off (--graph-compare): greedy decode through LlamaModel::forward (argmax
//     ids only, contexts growing a token per step), each step recorded / replayed by the
//     model's StepGraphCache or launched op by op, and the same through the Engine (--engine:
//     Engine::step with its scheduler, batch builder and device argmax, after the prefill).
//
//   model_bench [--batch 1,8,32,64] [--context 512] [--decode-steps 32]
//               [--verify-batch 1,8,32] [--tree 1,2,4,...,256] [--verify-iters 10]
//               [--profile-tree 64]
//               [--skinny-max-rows 0] [--max-splits 0] [--linear | --linear-only] [--no-graphs]
//               [--json out.json]
//               [--verify-json curve.json] [--batch-invariant 0|1|both] [--graph-compare]
//               [--engine] [--no-verify] [--no-plain] [--gemm 0|1|2] [--gemm-tune 0|1]
//               [--ncu-step]
//   --ncu-step: one replayed decode step per batch between cudaProfilerStart / Stop, for
//   `ncu --profile-from-start off --graph-profiling node` (per-kernel times of a step).
//   --batch-invariant both: two passes in one process (CudaBackendOptions::batch_invariant off,
//   then on), a JSON file per pass (.bi0 / .bi1 appended) and a decode cost table at the end.
#include <cuda_profiler_api.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/llama_model.h"
#include "engine/runner/engine.h"
#include "tests/cuda/cold_timing.h"
#include "tests/cuda/device_rates.h"

namespace arbor {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

ModelConfig llama3_8b_config(int64_t layers) {
  ModelConfig c = dummy_model_config("llama-3-8b");
  c.num_layers = layers;
  return c;
}

HostTensor shape_only(std::vector<int64_t> shape) {
  HostTensor t;
  t.shape = std::move(shape);  // no data: the backend fills it on the device
  return t;
}

// Matrix bytes a decode step streams: every linear weight once (the embedding is gathered).
double streamed_weight_bytes(const ModelConfig& c) {
  const double h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim,
               f = c.intermediate_size;
  const double per_layer = h * q + 2 * h * kv + q * h + 3 * h * f;
  return 2.0 * (c.num_layers * per_layer + c.vocab_size * h);
}

// The weights as device tensors, uploaded in LlamaModel's constructor order, so that with the
// same seed they equal the LlamaModel's (checked at start-up).
struct BenchModel {
  struct Layer {
    Tensor attn_norm, wq, wk, wv, wo, ffn_norm, w_gate, w_up, w_down;
    Tensor wqkv, w_gate_up;  // fused projections (CudaBackendOptions::fuse_projections)
  };
  bool fused = false;
  ModelConfig config;
  RopeParams rope;
  Tensor embed, final_norm, lm_head;
  std::vector<Layer> layers;
};

BenchModel upload_bench_model(Backend& b, const ModelWeights& w) {
  BenchModel m;
  m.fused = b.fuse_projections();
  auto stacked = [](std::vector<int64_t> shape) {
    HostTensor t;
    t.shape = std::move(shape);
    return t;
  };
  m.config = w.config;
  const ModelConfig& c = w.config;
  m.rope.head_dim = c.head_dim;
  m.rope.theta = c.rope_theta;
  m.rope.scaling = c.rope_scaling.type;
  m.rope.factor = c.rope_scaling.factor;
  m.rope.low_freq_factor = c.rope_scaling.low_freq_factor;
  m.rope.high_freq_factor = c.rope_scaling.high_freq_factor;
  m.rope.original_max_position = c.rope_scaling.original_max_position;
  m.embed = b.upload_weight(w.embed);
  m.final_norm = b.upload_weight(w.final_norm);
  m.lm_head = b.upload_weight(w.lm_head);
  for (const LayerWeights& lw : w.layers) {
    BenchModel::Layer l;
    l.attn_norm = b.upload_weight(lw.attn_norm);
    if (m.fused) {
      l.wqkv = b.upload_weight(
          stacked({lw.wq.shape[0] + lw.wk.shape[0] + lw.wv.shape[0], lw.wq.shape[1]}));
    } else {
      l.wq = b.upload_weight(lw.wq);
      l.wk = b.upload_weight(lw.wk);
      l.wv = b.upload_weight(lw.wv);
    }
    l.wo = b.upload_weight(lw.wo);
    l.ffn_norm = b.upload_weight(lw.ffn_norm);
    if (m.fused) {
      l.w_gate_up =
          b.upload_weight(stacked({lw.w_gate.shape[0] + lw.w_up.shape[0], lw.w_gate.shape[1]}));
    } else {
      l.w_gate = b.upload_weight(lw.w_gate);
      l.w_up = b.upload_weight(lw.w_up);
    }
    l.w_down = b.upload_weight(lw.w_down);
    m.layers.push_back(l);
  }
  return m;
}

// Event-timed GPU intervals per op kind (one event after each op; an interval includes any
// idle gap before the op, i.e. host launch latency the GPU waited for).
class OpProfiler {
 public:
  OpProfiler(CudaBackend& b, cudaStream_t s) : backend_(b), stream_(s) {}
  ~OpProfiler() {
    for (auto& e : events_) cudaEventDestroy(e.second);
  }
  void mark(const char* kind) {
    backend_.flush();  // deferred (fused) launches belong to the ops before the mark
    cudaEvent_t e;
    check(cudaEventCreate(&e), "event");
    check(cudaEventRecord(e, stream_), "event");
    events_.push_back({kind, e});
  }
  std::map<std::string, double> totals_ms() const {
    std::map<std::string, double> t;
    for (size_t i = 1; i < events_.size(); ++i) {
      float ms = 0;
      check(cudaEventElapsedTime(&ms, events_[i - 1].second, events_[i].second), "elapsed");
      t[events_[i].first] += ms;
    }
    return t;
  }

 private:
  CudaBackend& backend_;
  cudaStream_t stream_;
  std::vector<std::pair<std::string, cudaEvent_t>> events_;
};

// LlamaModel::forward's op sequence without the host copies: the logits rows stay on the device
// (where a GPU sampler / verifier reads them). Assumes set_step() was called.
Tensor forward_ops(CudaBackend& b, const BenchModel& m, const StepInputs& step, OpProfiler* prof) {
  const ModelConfig& c = m.config;
  auto mark = [&](const char* k) {
    if (prof != nullptr) prof->mark(k);
  };
  b.reset_scratch();
  const int64_t n = step.num_tokens(), hidden = c.hidden_size;
  const int64_t q_width = c.num_heads * c.head_dim, kv_width = c.num_kv_heads * c.head_dim;
  const double eps = c.rms_norm_eps;
  mark("start");
  Tensor x = b.scratch(n, hidden);
  b.embedding(m.embed, x);
  mark("embedding");
  Tensor normed = b.scratch(n, hidden);
  Tensor q = b.scratch(n, q_width), k = b.scratch(n, kv_width), v = b.scratch(n, kv_width);
  Tensor attn = b.scratch(n, q_width), proj = b.scratch(n, hidden);
  Tensor gate = b.scratch(n, c.intermediate_size), up = b.scratch(n, c.intermediate_size);
  Tensor qkv, gate_up;
  if (m.fused) {
    qkv = b.scratch(n, q_width + 2 * kv_width);
    gate_up = b.scratch(n, 2 * c.intermediate_size);
    if (n == 1) {
      auto view = [](const Tensor& t, int64_t col, int64_t cols) {
        return Tensor{static_cast<float*>(t.data) + col, t.dtype, 1, cols};
      };
      q = view(qkv, 0, q_width);
      k = view(qkv, q_width, kv_width);
      v = view(qkv, q_width + kv_width, kv_width);
      gate = view(gate_up, 0, c.intermediate_size);
      up = view(gate_up, c.intermediate_size, c.intermediate_size);
    }
  }
  for (size_t li = 0; li < m.layers.size(); ++li) {
    const BenchModel::Layer& l = m.layers[li];
    b.rms_norm(x, l.attn_norm, eps, normed);
    mark("rms_norm");
    if (m.fused) {
      b.linear(normed, l.wqkv, Tensor{}, qkv);
      if (n > 1) b.split_cols(qkv, {q, k, v});
    } else {
      b.linear(normed, l.wq, Tensor{}, q);
      b.linear(normed, l.wk, Tensor{}, k);
      b.linear(normed, l.wv, Tensor{}, v);
    }
    mark("linear qkv");
    b.rope(q, k, m.rope);
    mark("rope");
    b.write_kv(static_cast<int64_t>(li), k, v);
    mark("write_kv");
    b.paged_tree_attention(static_cast<int64_t>(li), q, c.num_heads, attn);
    mark("attention");
    b.linear(attn, l.wo, Tensor{}, proj);
    mark("linear o");
    b.add(x, proj, x);
    mark("add");
    b.rms_norm(x, l.ffn_norm, eps, normed);
    mark("rms_norm");
    if (m.fused) {
      b.linear(normed, l.w_gate_up, Tensor{}, gate_up);
      if (n > 1) b.split_cols(gate_up, {gate, up});
    } else {
      b.linear(normed, l.w_gate, Tensor{}, gate);
      b.linear(normed, l.w_up, Tensor{}, up);
    }
    mark("linear gate+up");
    b.silu_mul(gate, up, gate);
    mark("silu_mul");
    b.linear(gate, l.w_down, Tensor{}, proj);
    mark("linear down");
    b.add(x, proj, x);
    mark("add");
  }
  const int64_t rows_m = static_cast<int64_t>(step.logits_rows.size());
  Tensor rows = b.scratch(rows_m, hidden), rows_normed = b.scratch(rows_m, hidden);
  b.gather_logit_rows(x, rows);
  b.rms_norm(rows, m.final_norm, eps, rows_normed);
  mark("final norm");
  Tensor logits = b.scratch(rows_m, c.vocab_size);
  b.linear(rows_normed, m.lm_head, Tensor{}, logits);
  mark("lm_head");
  return logits;
}

// Paged KV layout of the benchmark's requests: request r owns blocks_per_request blocks taken
// from a scrambled permutation of the cache.
struct KvLayout {
  int32_t block_size = 16;
  int32_t blocks_per_request = 0;
  std::vector<int32_t> table;  // [max_requests, blocks_per_request]

  int64_t slot(int32_t r, int64_t j) const {
    return int64_t{table[static_cast<size_t>(r) * blocks_per_request + j / block_size]} *
               block_size +
           j % block_size;
  }
};

// One request of a step: T new tokens after `committed`, causal (parents empty) or a tree.
struct StepRequest {
  int32_t request;
  int32_t committed;
  int32_t tokens;
  std::vector<int> parents;  // [tokens] parent node (-1 root); empty: causal
  bool all_logits;           // logits for every row, else for the last row only
};

StepInputs make_step(const KvLayout& kv, const std::vector<StepRequest>& reqs, int64_t vocab,
                     std::mt19937& rng) {
  StepInputs s;
  s.max_blocks_per_request = kv.blocks_per_request;
  s.qo_indptr.push_back(0);
  s.mask_indptr.push_back(0);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab - 1));
  for (const StepRequest& r : reqs) {
    const int32_t base = static_cast<int32_t>(s.token_ids.size());
    std::vector<int32_t> depth(r.tokens, 0);
    for (int32_t t = 0; t < r.tokens; ++t) {
      if (!r.parents.empty() && r.parents[t] >= 0) depth[t] = depth[r.parents[t]] + 1;
      s.token_ids.push_back(tok(rng));
      s.positions.push_back(r.committed + (r.parents.empty() ? t : depth[t]));
      s.slot_mapping.push_back(kv.slot(r.request, r.committed + t));
      if (r.all_logits || t == r.tokens - 1) s.logits_rows.push_back(base + t);
    }
    s.qo_indptr.push_back(base + r.tokens);
    s.committed_len.push_back(r.committed);
    for (int32_t j = 0; j < kv.blocks_per_request; ++j)
      s.block_tables.push_back(
          kv.table[static_cast<size_t>(r.request) * kv.blocks_per_request + j]);
    if (!r.parents.empty()) {
      const int32_t words = (r.tokens + 31) / 32;
      std::vector<uint32_t> m(static_cast<size_t>(r.tokens) * words, 0);
      for (int32_t i = 0; i < r.tokens; ++i)
        for (int32_t j = i; j >= 0; j = r.parents[j])
          m[static_cast<size_t>(i) * words + j / 32] |= 1u << (j % 32);
      s.tree_mask.insert(s.tree_mask.end(), m.begin(), m.end());
    }
    s.mask_indptr.push_back(static_cast<int32_t>(s.tree_mask.size()));
  }
  return s;
}

std::vector<int> random_tree(int32_t t, std::mt19937& rng) {
  std::vector<int> parent(t, -1);
  for (int32_t i = 1; i < t; ++i) {
    std::uniform_int_distribution<int> d(std::max(0, i - 10), i - 1);
    parent[i] = d(rng);
  }
  return parent;
}

// The batch-invariant GEMMs on every linear shape of the model (q|k|v and gate|up fused as the
// model runs them), 1..2048 token rows, cold L2 (a 256 MiB memset first): the invariant
// cuBLASLt algorithm (CudaBackendOptions::batch_invariant_gemm = 0, the default) and the
// chunked kernel (= 2), the bf16 rounding of the input included. Median of 10 launches.
nlohmann::json linear_bench(double bw, double gemm_rate) {
  struct Shape {
    const char* name;
    int64_t out, in;
  };
  const std::vector<Shape> shapes = {{"q|k|v", 6144, 4096},
                                     {"o", 4096, 4096},
                                     {"gate|up", 28672, 4096},
                                     {"down", 4096, 14336},
                                     {"lm_head", 128256, 4096}};
  const std::vector<int> token_counts = {1, 2, 4, 8, 16, 32, 64, 128, 512, 2048};
  nlohmann::json out = nlohmann::json::array();
  std::printf("\n## linear layers: batch-invariant GEMMs (bf16 weights, fp32 in/out)\n\n");
  std::printf(
      "| shape | out x in | tokens | cuBLASLt us | chunked us | floor us | cuBLASLt %% of floor | "
      "chunked %% of floor |\n|---|---|---|---|---|---|---|---|\n");
  void* flush = nullptr;
  const size_t flush_bytes = size_t{256} << 20;
  check(cudaMalloc(&flush, flush_bytes), "flush");
  CudaBackendOptions opt[2];
  for (auto& o : opt) {
    o.random_weights = true;
    o.batch_invariant = true;
  }
  opt[1].batch_invariant_gemm = 2;
  std::vector<std::unique_ptr<CudaBackend>> bk;
  KvCacheShape kvs{1, 1, 16, 8, 128};
  for (auto& o : opt) {
    bk.push_back(std::make_unique<CudaBackend>(o));
    bk.back()->allocate_kv(kvs);
  }
  std::vector<std::string> algos;
  for (const Shape& sh : shapes) {
    std::vector<Tensor> w;
    for (auto& b : bk) {
      b->set_random_weight_seed(7);
      w.push_back(b->upload_weight(shape_only({sh.out, sh.in})));
    }
    for (int n : token_counts) {
      if (sh.out > 100000 && n > 64) continue;  // the LM head only sees sampled rows
      double us[2];
      for (int which = 0; which < 2; ++which) {
        CudaBackend& b = *bk[static_cast<size_t>(which)];
        auto stream = static_cast<cudaStream_t>(b.stream_handle());
        b.reset_scratch();
        Tensor x = b.scratch(n, sh.in), y = b.scratch(n, sh.out);
        std::vector<float> xh(static_cast<size_t>(n * sh.in));
        std::mt19937 rng(3);
        std::uniform_real_distribution<float> u(-1, 1);
        for (float& f : xh) f = u(rng);
        b.upload(xh.data(), x);
        us[which] = testing::median_launch_us(stream, flush, flush_bytes, [&] {
          b.linear(x, w[static_cast<size_t>(which)], Tensor{}, y);
        });
      }
      const double flops = 2.0 * n * sh.out * sh.in;
      const double floor_us =
          std::max((2.0 * sh.out * sh.in + 4.0 * n * (sh.in + sh.out)) / bw, flops / gemm_rate) *
          1e6;
      std::printf("| %s | %lld x %lld | %d | %.1f | %.1f | %.1f | %.0f%% | %.0f%% |\n", sh.name,
                  static_cast<long long>(sh.out), static_cast<long long>(sh.in), n, us[0], us[1],
                  floor_us, 100.0 * floor_us / us[0], 100.0 * floor_us / us[1]);
      out.push_back({{"shape", sh.name},
                     {"out", sh.out},
                     {"in", sh.in},
                     {"tokens", n},
                     {"cublaslt_us", us[0]},
                     {"chunked_us", us[1]},
                     {"floor_us", floor_us}});
    }
    algos.push_back(std::string(sh.name) + ": " + bk[0]->batch_invariant_gemm_algo(sh.out, sh.in));
  }
  std::printf("\n");
  for (const auto& a : algos) std::printf("%s\n", a.c_str());
  cudaFree(flush);
  std::fflush(stdout);
  return out;
}

struct Args {
  std::vector<int> batches = {1, 8, 32, 64};
  int context = 512;
  int decode_steps = 32;
  std::vector<int> verify_batches = {1, 8, 32};
  std::vector<int> trees = {1, 2, 4, 8, 16, 32, 64, 128, 256};
  int verify_iters = 10;
  int profile_tree = 64;  // the verify breakdown's T (first verify batch)
  int skinny_max_rows = 0;
  int layers = 32;
  int max_splits = 0;
  bool linear = false;
  bool linear_only = false;
  bool graphs = true;
  bool ncu_step = false;       // cudaProfilerStart/Stop around one replayed decode step per batch
  bool graph_compare = false;  // LlamaModel::forward decode with step graphs off vs on
  bool engine = false;         // the same through Engine::step
  bool verify = true;          // the verify-step curve
  bool plain = true;           // the plain-decode table
  std::vector<int> batch_invariant = {1};  // CudaBackendOptions::batch_invariant per pass
  std::vector<int> split_keys = {512};     // CudaBackendOptions::invariant_split_keys per pass
  int gemm_tune = 1;                       // CudaBackendOptions::tune_invariant_gemm
  int gemm = 0;                            // CudaBackendOptions::batch_invariant_gemm
  int fuse = 1;                            // CudaBackendOptions::fuse_projections
  int tree_groups = 1;                     // CudaBackendOptions::attention_tree_groups
  std::string json, verify_json;
};

// One pass's plain-decode times (for the batch-invariance cost summary).
struct DecodeTimes {
  int batch_invariant;
  std::vector<std::array<double, 4>> rows;  // batch, model forward ms, device ms, graph ms
};

// Greedy decode through LlamaModel::forward with step graphs off, then on: each step's
// contexts one token longer (so the attention splits grow as in real decoding), argmax ids
// downloaded (the engine's greedy path). Returns the JSON rows.
nlohmann::json graph_compare(const Args& a, const ModelConfig& cfg, const KvLayout& kv,
                             LlamaModel& model, std::mt19937& rng) {
  std::printf(
      "\n## step graphs: greedy decode through LlamaModel::forward (argmax ids, context %d "
      "growing a token per step)\n\n| batch | graphs off ms | tok/s | graphs on ms | tok/s "
      "| speed-up | captures / replays |\n|---|---|---|---|---|---|---|\n",
      a.context);
  nlohmann::json rows = nlohmann::json::array();
  ForwardRequest want;
  want.argmax_only = true;
  for (int b : a.batches) {
    double ms[2] = {0, 0};
    StepGraphStats st;
    for (int on = 0; on < 2; ++on) {
      model.set_step_graphs(on != 0);
      std::vector<double> t;
      for (int s = 0; s < a.decode_steps + 4; ++s) {
        std::vector<StepRequest> reqs;
        for (int r = 0; r < b; ++r) reqs.push_back({r, a.context + s, 1, {}, false});
        const StepInputs step = make_step(kv, reqs, cfg.vocab_size, rng);
        ForwardOutput fo;
        const double t0 = now_s();
        model.forward(step, &fo, want);
        if (s >= 4) t.push_back(now_s() - t0);
      }
      ms[on] = median(t) * 1e3;
      if (on) st = model.step_graph_stats();
    }
    std::printf("| %d | %.2f | %.1f | %.2f | %.1f | %.2fx | %lld / %lld |\n", b, ms[0],
                b / ms[0] * 1e3, ms[1], b / ms[1] * 1e3, ms[0] / ms[1],
                static_cast<long long>(st.captures), static_cast<long long>(st.replays));
    std::fflush(stdout);
    rows.push_back({{"batch", b}, {"graphs_off_ms", ms[0]}, {"graphs_on_ms", ms[1]}});
  }
  return rows;
}

// Greedy decode through the Engine (scheduler, batch builder, forward with device argmax,
// verification, KV bookkeeping): `batch` requests of `context` random prompt tokens prefilled,
// then decode_steps steps timed, step graphs off then on. Reallocates the backend's KV cache.
nlohmann::json engine_decode(const Args& a, const ModelConfig& cfg, LlamaModel& model) {
  std::printf(
      "\n## step graphs through the Engine: greedy decode steps after a %d-token prefill "
      "(Engine::step wall time)\n\n| batch | graphs off ms/step | tok/s | graphs on ms/step | "
      "tok/s | speed-up |\n|---|---|---|---|---|---|\n",
      a.context);
  nlohmann::json rows = nlohmann::json::array();
  std::mt19937 rng(77);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(cfg.vocab_size - 1));
  for (int b : a.batches) {
    double ms[2] = {0, 0}, tps[2] = {0, 0};
    for (int on = 0; on < 2; ++on) {
      model.set_step_graphs(on != 0);
      EngineConfig ec;
      ec.block_size = 16;
      const int max_tokens = a.decode_steps + 24;
      ec.num_blocks = b * ((a.context + max_tokens + 16) / 16 + 2);
      ec.max_step_tokens = std::max(2048, a.context);
      ec.max_running = std::max(64, b);
      Engine engine(model, ec);
      for (int r = 0; r < b; ++r) {
        GenerationRequest req;
        req.prompt.push_back(static_cast<int32_t>(cfg.bos_token_id));
        while (static_cast<int>(req.prompt.size()) < a.context) req.prompt.push_back(tok(rng));
        req.sampling.temperature = 0;
        req.max_tokens = max_tokens;
        req.ignore_eos = true;
        engine.add(static_cast<ReqId>(r + 1), req);
      }
      // Prefill (and the first tokens), then a few decode steps to reach steady state.
      std::vector<int> produced(static_cast<size_t>(b), 0);
      int ready = 0, guard = 0;
      while (ready < b && guard++ < 10000)
        for (const EngineEvent& ev : engine.step())
          if (produced[ev.id - 1]++ == 0) ++ready;
      for (int s = 0; s < 4; ++s) engine.step();
      int64_t tokens = 0;
      std::vector<double> t;
      const double t_all = now_s();
      for (int s = 0; s < a.decode_steps; ++s) {
        const double t0 = now_s();
        for (const EngineEvent& ev : engine.step())
          tokens += static_cast<int64_t>(ev.tokens.size());
        t.push_back(now_s() - t0);
      }
      tps[on] = tokens / (now_s() - t_all);
      ms[on] = median(t) * 1e3;
      while (!engine.idle()) engine.step();
    }
    std::printf("| %d | %.2f | %.1f | %.2f | %.1f | %.2fx |\n", b, ms[0], tps[0], ms[1], tps[1],
                tps[1] / tps[0]);
    std::fflush(stdout);
    rows.push_back({{"batch", b},
                    {"graphs_off_ms_per_step", ms[0]},
                    {"graphs_off_tok_s", tps[0]},
                    {"graphs_on_ms_per_step", ms[1]},
                    {"graphs_on_tok_s", tps[1]}});
  }
  const StepGraphStats st = model.step_graph_stats();
  std::printf("(model step graphs over the whole run: %lld captures, %lld replays, %lld eager)\n",
              static_cast<long long>(st.captures), static_cast<long long>(st.replays),
              static_cast<long long>(st.eager));
  return rows;
}

int run(const Args& a, int batch_invariant, DecodeTimes* times) {
  cudaDeviceProp prop{};
  check(cudaGetDeviceProperties(&prop, 0), "device");
  const std::string gpu = prop.name;
  const ModelConfig cfg = llama3_8b_config(a.layers);
  const ModelWeights dummy = shape_only_weights(cfg);

  CudaBackendOptions opt;
  opt.random_weights = true;
  opt.skinny_gemm_max_rows = a.skinny_max_rows;
  opt.attention_max_splits = a.max_splits;
  opt.batch_invariant = batch_invariant != 0;
  opt.invariant_split_keys = a.split_keys.at(0);
  opt.tune_invariant_gemm = a.gemm_tune != 0;
  opt.batch_invariant_gemm = a.gemm;
  opt.fuse_projections = a.fuse != 0;
  opt.attention_tree_groups = a.tree_groups;
  CudaBackend backend(opt);
  times->batch_invariant = batch_invariant;
  auto stream = static_cast<cudaStream_t>(backend.stream_handle());
  const double bw = testing::measure_copy_bandwidth(stream);
  const double gemm_rate = testing::measure_bf16_gemm_rate(stream);
  const double weight_bytes = streamed_weight_bytes(cfg);
  std::printf(
      "# model_bench: Llama-3-8B shapes (%lld layers), random bf16 weights, %s, "
      "batch_invariant %d, invariant_split_keys %d, tune_invariant_gemm %d, fuse_projections "
      "%d, attention_tree_groups %d, batch_invariant_gemm %d\n",
      static_cast<long long>(cfg.num_layers), gpu.c_str(), batch_invariant, a.split_keys.at(0),
      a.gemm_tune, a.fuse, a.tree_groups, a.gemm);
  std::printf(
      "device-to-device copy: %.2f TB/s (read + write), bf16 GEMM %.0f TFLOP/s (cuBLAS 8192^3); "
      "weights streamed per step: %.2f GB -> %.2f ms at that copy rate (the floor), %.2f ms at "
      "3.0 TB/s\n",
      bw / 1e12, gemm_rate / 1e12, weight_bytes / 1e9, weight_bytes / bw * 1e3,
      weight_bytes / 3e12 * 1e3);
  nlohmann::json report;
  report["gpu"] = gpu;
  report["copy_bandwidth_tb_s"] = bw / 1e12;
  report["bf16_gemm_tflop_s"] = gemm_rate / 1e12;
  report["streamed_weight_bytes"] = weight_bytes;
  report["context"] = a.context;
  report["skinny_gemm_max_rows"] = a.skinny_max_rows;
  report["batch_invariant"] = batch_invariant;
  if (a.linear) report["linear"] = linear_bench(bw, gemm_rate);
  if (a.linear_only) {
    if (!a.json.empty()) std::ofstream(a.json) << report.dump(1) << "\n";
    return 0;
  }

  // KV cache: every request gets room for its context, the decode steps and the largest tree.
  const int max_requests =
      std::max(*std::max_element(a.batches.begin(), a.batches.end()),
               *std::max_element(a.verify_batches.begin(), a.verify_batches.end()));
  const int max_tree = *std::max_element(a.trees.begin(), a.trees.end());
  KvLayout kv;
  kv.blocks_per_request =
      (a.context + std::max(a.decode_steps + 8, max_tree) + kv.block_size - 1) / kv.block_size;
  const int64_t num_blocks = int64_t{max_requests} * kv.blocks_per_request;
  kv.table.resize(static_cast<size_t>(num_blocks));
  std::iota(kv.table.begin(), kv.table.end(), 0);
  std::mt19937 rng(12345);
  std::shuffle(kv.table.begin(), kv.table.end(), rng);
  backend.allocate_kv({cfg.num_layers, num_blocks, kv.block_size, cfg.num_kv_heads, cfg.head_dim});

  const double t_load = now_s();
  backend.set_random_weight_seed(1);
  LlamaModel model(backend, dummy);
  backend.set_random_weight_seed(1);
  const BenchModel bm = upload_bench_model(backend, dummy);
  std::printf("random weights for two copies (LlamaModel + bench ops): %.2f s\n", now_s() - t_load);

  // Prefill every request's context (causal chunks of up to 2048 tokens).
  {
    const double t0 = now_s();
    const int per_step = std::max(1, 2048 / a.context);
    for (int r0 = 0; r0 < max_requests; r0 += per_step) {
      std::vector<StepRequest> reqs;
      for (int r = r0; r < std::min(max_requests, r0 + per_step); ++r)
        reqs.push_back({r, 0, a.context, {}, false});
      const StepInputs step = make_step(kv, reqs, cfg.vocab_size, rng);
      backend.set_step(step);
      forward_ops(backend, bm, step, nullptr);
    }
    backend.synchronize();
    const double secs = now_s() - t0;
    std::printf("prefill: %d requests x %d tokens in %.3f s = %.0f tokens/s (chunks of %d)\n",
                max_requests, a.context, secs, max_requests * double(a.context) / secs,
                per_step * a.context);
    report["prefill_tokens_per_s"] = max_requests * double(a.context) / secs;
  }

  // The bench's op sequence equals LlamaModel::forward (same weights, same ops).
  {
    std::vector<StepRequest> reqs = {{0, a.context, 1, {}, false}, {1, a.context, 1, {}, false}};
    const StepInputs step = make_step(kv, reqs, cfg.vocab_size, rng);
    ForwardOutput fo;
    model.forward(step, &fo);
    backend.set_step(step);
    const Tensor logits = forward_ops(backend, bm, step, nullptr);
    std::vector<float> mine(static_cast<size_t>(logits.numel()));
    backend.download(logits, mine.data());
    double max_diff = 0, max_ref = 0;
    bool finite = true;
    for (size_t i = 0; i < mine.size(); ++i) {
      finite = finite && std::isfinite(mine[i]);
      max_diff = std::max(max_diff, double(std::fabs(mine[i] - fo.logits[i])));
      max_ref = std::max(max_ref, double(std::fabs(fo.logits[i])));
    }
    std::printf(
        "check: bench ops vs LlamaModel::forward logits: max |diff| %.3g (max |logit| "
        "%.3g), all finite: %s\n",
        max_diff, max_ref, finite ? "yes" : "NO");
    report["check_max_abs_diff"] = max_diff;
    report["check_finite"] = finite;
    if (!finite || max_diff > 1e-3 * std::max(1.0, max_ref)) {
      std::fprintf(stderr, "model_bench: the bench forward disagrees with LlamaModel\n");
      return 1;
    }
  }

  // Plain decode.
  std::printf("\n## plain decode (context %d, greedy-free random next tokens)\n\n", a.context);
  std::printf(
      "| batch | LlamaModel::forward ms | tok/s | device-only ms | tok/s | graph replay ms "
      "| tok/s | floor ms | %% of floor (best) |\n|---|---|---|---|---|---|---|---|---|\n");
  nlohmann::json decode = nlohmann::json::array();
  nlohmann::json breakdown;
  for (int b : a.plain ? a.batches : std::vector<int>{}) {
    std::vector<int32_t> committed(b, a.context);
    auto decode_step = [&]() {
      std::vector<StepRequest> reqs;
      for (int r = 0; r < b; ++r) reqs.push_back({r, committed[r], 1, {}, false});
      return make_step(kv, reqs, cfg.vocab_size, rng);
    };
    std::vector<double> t_model, t_dev;
    model.set_step_graphs(false);  // this column: op by op (--graph-compare has both)
    for (int s = 0; s < a.decode_steps + 3; ++s) {
      const StepInputs step = decode_step();
      const double t0 = now_s();
      ForwardOutput fo;
      model.forward(step, &fo);
      if (s >= 3) t_model.push_back(now_s() - t0);
    }
    model.set_step_graphs(true);
    std::fill(committed.begin(), committed.end(), a.context);
    for (int s = 0; s < a.decode_steps + 3; ++s) {
      const StepInputs step = decode_step();
      const double t0 = now_s();
      backend.set_step(step);
      forward_ops(backend, bm, step, nullptr);
      backend.synchronize();
      if (s >= 3) t_dev.push_back(now_s() - t0);
      for (int32_t& c : committed) ++c;
    }
    // Where the time goes (one profiled step).
    {
      const StepInputs step = decode_step();
      backend.set_step(step);
      OpProfiler prof(backend, stream);
      forward_ops(backend, bm, step, &prof);
      backend.synchronize();
      breakdown["decode_batch_" + std::to_string(b)] = prof.totals_ms();
    }
    // CUDA graph of one step (same metadata each replay): the time without launch gaps.
    double graph_ms = 0;
    if (a.graphs) {
      const StepInputs step = decode_step();
      backend.set_step(step);
      // Two eager runs: the first builds the attention plan and may grow the scratch arena, the
      // second starts from the merged arena, so nothing inside the capture allocates or syncs.
      forward_ops(backend, bm, step, nullptr);
      forward_ops(backend, bm, step, nullptr);
      check(cudaStreamBeginCapture(stream, cudaStreamCaptureModeRelaxed), "capture");
      forward_ops(backend, bm, step, nullptr);
      backend.flush();
      cudaGraph_t graph;
      check(cudaStreamEndCapture(stream, &graph), "capture");
      cudaGraphExec_t exec;
      check(cudaGraphInstantiate(&exec, graph, 0), "instantiate");
      std::vector<double> t;
      for (int s = 0; s < a.decode_steps + 3; ++s) {
        // --ncu-step: the fourth replay alone is profiled (ncu --profile-from-start off), so
        // Nsight Compute lists every kernel of one steady-state decode step.
        if (a.ncu_step && s == 3) check(cudaProfilerStart(), "profiler start");
        const double t0 = now_s();
        check(cudaGraphLaunch(exec, stream), "graph launch");
        backend.synchronize();
        if (s >= 3) t.push_back(now_s() - t0);
        if (a.ncu_step && s == 3) check(cudaProfilerStop(), "profiler stop");
      }
      cudaGraphExecDestroy(exec);
      cudaGraphDestroy(graph);
      graph_ms = median(t) * 1e3;
    }
    const double kv_bytes =
        double(b) * a.context * cfg.num_layers * 2 * cfg.num_kv_heads * cfg.head_dim * 2;
    const double floor_ms = (weight_bytes + kv_bytes) / bw * 1e3;  // measured copy rate
    const double m_ms = median(t_model) * 1e3, d_ms = median(t_dev) * 1e3;
    const double best = std::min(d_ms, graph_ms > 0 ? graph_ms : d_ms);
    std::printf("| %d | %.2f | %.1f | %.2f | %.1f | %.2f | %.1f | %.2f | %.0f%% |\n", b, m_ms,
                b / m_ms * 1e3, d_ms, b / d_ms * 1e3, graph_ms,
                graph_ms > 0 ? b / graph_ms * 1e3 : 0, floor_ms, 100 * floor_ms / best);
    std::fflush(stdout);
    times->rows.push_back({double(b), m_ms, d_ms, graph_ms});
    decode.push_back({{"batch", b},
                      {"model_forward_ms", m_ms},
                      {"device_ms", d_ms},
                      {"graph_ms", graph_ms},
                      {"floor_ms", floor_ms}});
  }
  report["decode"] = decode;

  // Verification step time vs tree tokens per request.
  std::printf(
      "\n## verify step (context %d, random tree of T nodes per request, logits of every "
      "node on the device)\n\n| batch | T | tree tokens | step ms | ms per tree token |\n"
      "|---|---|---|---|---|\n",
      a.context);
  nlohmann::json curve;
  for (int b : a.verify ? a.verify_batches : std::vector<int>{}) {
    nlohmann::json points = nlohmann::json::array();
    for (int t : a.trees) {
      std::vector<StepRequest> reqs;
      for (int r = 0; r < b; ++r) reqs.push_back({r, a.context, t, random_tree(t, rng), true});
      const StepInputs step = make_step(kv, reqs, cfg.vocab_size, rng);
      std::vector<double> times;
      for (int it = 0; it < a.verify_iters + 2; ++it) {
        const double t0 = now_s();
        backend.set_step(step);
        forward_ops(backend, bm, step, nullptr);
        backend.synchronize();
        if (it >= 2) times.push_back(now_s() - t0);
      }
      const double ms = median(times) * 1e3;
      std::printf("| %d | %d | %d | %.2f | %.4f |\n", b, t, b * t, ms, ms / (b * t));
      std::fflush(stdout);
      points.push_back({t, ms});
      if (b == a.verify_batches.front() && t == a.profile_tree) {
        backend.set_step(step);
        OpProfiler prof(backend, stream);
        forward_ops(backend, bm, step, &prof);
        backend.synchronize();
        breakdown["verify_batch_" + std::to_string(b) + "_tree_" + std::to_string(t)] =
            prof.totals_ms();
      }
    }
    curve[std::to_string(b)] = points;
  }
  report["verify"] = curve;
  report["breakdown_ms"] = breakdown;
  if (a.graph_compare) report["graph_compare"] = graph_compare(a, cfg, kv, model, rng);
  if (a.engine) report["engine"] = engine_decode(a, cfg, model);

  std::printf("\n## where the GPU time of one step goes (ms, event-timed per op kind)\n\n");
  for (auto& [name, kinds] : breakdown.items()) {
    double total = 0;
    std::string line;
    for (auto& [k, v] : kinds.items()) {
      total += v.get<double>();
      char buf[96];
      std::snprintf(buf, sizeof(buf), " %s %.3f |", k.c_str(), v.get<double>());
      line += buf;
    }
    std::printf("%s (total %.3f):%s\n", name.c_str(), total, line.c_str());
  }
  if (!a.json.empty()) std::ofstream(a.json) << report.dump(1) << "\n";
  if (!a.verify_json.empty()) {
    nlohmann::json v;
    v["gpu"] = gpu;
    v["model"] = "Llama-3-8B shapes, bf16 weights and KV, CUDA backend (tests/cuda/model_bench)";
    v["context"] = a.context;
    v["unit"] = "[tree tokens per request, verify step ms]";
    v["batch"] = curve;
    std::ofstream(a.verify_json) << v.dump(1) << "\n";
  }
  if (batch_invariant)
    for (const auto& [o, i] : std::vector<std::pair<int64_t, int64_t>>{
             {(cfg.num_heads + 2 * cfg.num_kv_heads) * cfg.head_dim, cfg.hidden_size},  // q|k|v
             {cfg.num_heads * cfg.head_dim, cfg.hidden_size},
             {cfg.num_kv_heads * cfg.head_dim, cfg.hidden_size},
             {2 * cfg.intermediate_size, cfg.hidden_size},  // gate|up
             {cfg.intermediate_size, cfg.hidden_size},
             {cfg.hidden_size, cfg.intermediate_size},
             {cfg.vocab_size, cfg.hidden_size}})
      if (!backend.batch_invariant_gemm_algo(o, i).empty())
        std::printf("linear algo out %lld in %lld: %s\n", static_cast<long long>(o),
                    static_cast<long long>(i), backend.batch_invariant_gemm_algo(o, i).c_str());
  return 0;
}

}  // namespace
}  // namespace arbor

int main(int argc, char** argv) {
  arbor::Args a;
  for (int i = 1; i < argc; ++i) {
    const std::string k = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "model_bench: %s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--batch")
      a.batches = arbor::testing::parse_int_list(next());
    else if (k == "--context")
      a.context = std::atoi(next().c_str());
    else if (k == "--decode-steps")
      a.decode_steps = std::atoi(next().c_str());
    else if (k == "--verify-batch")
      a.verify_batches = arbor::testing::parse_int_list(next());
    else if (k == "--tree")
      a.trees = arbor::testing::parse_int_list(next());
    else if (k == "--verify-iters")
      a.verify_iters = std::atoi(next().c_str());
    else if (k == "--profile-tree")
      a.profile_tree = std::atoi(next().c_str());
    else if (k == "--skinny-max-rows")
      a.skinny_max_rows = std::atoi(next().c_str());
    else if (k == "--max-splits")
      a.max_splits = std::atoi(next().c_str());
    else if (k == "--split-keys")
      a.split_keys = arbor::testing::parse_int_list(next());
    else if (k == "--fuse")
      a.fuse = std::atoi(next().c_str());
    else if (k == "--tree-groups")
      a.tree_groups = std::atoi(next().c_str());
    else if (k == "--gemm")
      a.gemm = std::atoi(next().c_str());
    else if (k == "--gemm-tune")
      a.gemm_tune = std::atoi(next().c_str());
    else if (k == "--layers")
      a.layers = std::atoi(next().c_str());
    else if (k == "--batch-invariant") {
      const std::string v = next();
      a.batch_invariant = v == "both" ? std::vector<int>{0, 1} : arbor::testing::parse_int_list(v);
    } else if (k == "--linear")
      a.linear = true;
    else if (k == "--linear-only")
      a.linear = a.linear_only = true;
    else if (k == "--no-graphs")
      a.graphs = false;
    else if (k == "--graph-compare")
      a.graph_compare = true;
    else if (k == "--ncu-step")
      a.ncu_step = true;
    else if (k == "--engine")
      a.engine = true;
    else if (k == "--no-verify")
      a.verify = false;
    else if (k == "--no-plain")
      a.plain = false;
    else if (k == "--json")
      a.json = next();
    else if (k == "--verify-json")
      a.verify_json = next();
    else {
      std::fprintf(stderr, "model_bench: unknown option %s\n", k.c_str());
      return 2;
    }
  }
  try {
    std::vector<arbor::DecodeTimes> passes;
    const arbor::Args base = a;
    for (int bi : base.batch_invariant)
      for (int sk : base.split_keys) {
        arbor::Args pass = base;
        pass.split_keys = {sk};
        if (base.batch_invariant.size() > 1) {  // one JSON file per pass
          const std::string tag = ".bi" + std::to_string(bi);
          if (!pass.json.empty()) pass.json += tag;
          if (!pass.verify_json.empty()) pass.verify_json += tag;
        }
        passes.emplace_back();
        if (const int rc = arbor::run(pass, bi, &passes.back()); rc != 0) return rc;
      }
    if (passes.size() == 2 && passes[0].rows.size() == passes[1].rows.size()) {
      std::printf(
          "\n## cost of batch invariance (plain decode; batch_invariant 0 -> 1)\n\n"
          "| batch | forward ms off | on | device ms off | on | graph ms off | on | graph "
          "cost |\n|---|---|---|---|---|---|---|---|\n");
      for (size_t i = 0; i < passes[0].rows.size(); ++i) {
        const auto& off = passes[0].rows[i];
        const auto& on = passes[1].rows[i];
        std::printf("| %d | %.2f | %.2f | %.2f | %.2f | %.2f | %.2f | %+.1f%% |\n",
                    static_cast<int>(off[0]), off[1], on[1], off[2], on[2], off[3], on[3],
                    off[3] > 0 ? 100 * (on[3] / off[3] - 1) : 0.0);
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "model_bench: %s\n", e.what());
    return 1;
  }
}
