// Tensor-parallel benchmark (issue bars for TP on nvidia-h200-x2): a Llama-3 8B or 70B shape
// with dummy weights made on the GPUs (the same values at every TP size), through
// LlamaModel::forward on make_cuda_tp_backends' group.
//   * plain decode at each batch after a prefill of --context tokens per request: median step
//     time over --steps steps (greedy ids, step graphs recorded and replayed), tokens/s, and the
//     fraction of the weight-bandwidth floor (matrix bytes / TP over the measured copy rate);
//   * a verification step of --tree tokens per request (a chain) against the plain step;
//   * the all-reduce alone: [batch, hidden] fp32 all_reduce_sum, 2 per layer, as a step issues
//     them (per-call time and the share of a step);
//   * --eagle3 B:T,...: one full speculative step through the Engine (EAGLE-3-shaped draft with
//     dummy weights: one layer, a 32k draft vocabulary, depth 6, top-k 10, T tree tokens per
//     request at batch B; draft + verify + accept + compaction) against a plain Engine step, and
//     the speedup that ratio gives at the published acceptance lengths.
// Usage: tp_bench [--shape 8b|70b] [--tp 1,2] [--batch 1,8,32] [--context 512] [--steps 32]
//                 [--tree 60] [--eagle3 1:60,8:16] [--pick-on-device -1|0|1]
//                 [--paths-on-device -1|0|1] [--grow-before-wait -1|0|1] [--json out.json]
// The draft backend launches into the target's stream (make_cuda_backend_on_stream_of), as
// arbor serve, generate and spec-bench make it.
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/backend/rank_threads.h"
#include "engine/draft/eagle_checkpoint.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/llama_model.h"
#include "engine/runner/engine.h"
#include "engine/spec/eagle_proposer.h"
#include "tests/common/direct_batch.h"
#include "tests/cuda/device_rates.h"

namespace arbor {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

HostTensor shape_only(std::vector<int64_t> shape) {
  HostTensor t;
  t.shape = std::move(shape);
  return t;
}

// bf16 bytes of every matrix a decode step streams (the embedding is gathered, not streamed).
double matrix_bytes(const ModelConfig& c) {
  const double h = c.hidden_size, q = c.num_heads * c.head_dim, kv = c.num_kv_heads * c.head_dim,
               f = c.intermediate_size;
  return 2.0 * (c.num_layers * (h * (q + 2 * kv) + q * h + 3 * h * f) + c.vocab_size * h);
}

struct Args {
  std::string shape = "8b";
  std::vector<int> tp = {1, 2};
  std::vector<int> batch = {1, 8, 32};
  int context = 512, steps = 32, tree = 60;
  std::vector<std::pair<int, int>> eagle3;  // (batch, tree tokens)
  int pick = -1;                            // --pick-on-device: EagleOptions::pick_on_backend
  int paths = -1;                           // --paths-on-device: EagleOptions::paths_on_device
  int early = -1;                           // --grow-before-wait: EagleOptions::grow_before_wait
  std::string json;
};

// An EAGLE-3-shaped draft for `target` with dummy weights (shape-only: the draft's backend
// fills them): one layer of the target's widths, a 32k draft vocabulary, identity d2t.
EagleWeights dummy_eagle3(const ModelConfig& t) {
  EagleWeights w;
  w.source = "(dummy)";
  EagleDraftConfig& c = w.config;
  c.version = EagleVersion::kEagle3;
  c.hidden_size = t.hidden_size;
  c.intermediate_size = t.intermediate_size;
  c.num_heads = t.num_heads;
  c.num_kv_heads = t.num_kv_heads;
  c.head_dim = t.head_dim;
  c.vocab_size = t.vocab_size;
  c.draft_vocab_size = 32000;
  c.target_hidden_size = t.hidden_size;
  c.rope_theta = t.rope_theta;
  c.fc_bias = false;
  const int64_t h = t.hidden_size, q = t.num_heads * t.head_dim, kv = t.num_kv_heads * t.head_dim,
                f = t.intermediate_size;
  w.fc = shape_only({h, 3 * h});
  w.input_norm = shape_only({h});
  w.hidden_norm = shape_only({h});
  w.wq = shape_only({q, 2 * h});
  w.wk = shape_only({kv, 2 * h});
  w.wv = shape_only({kv, 2 * h});
  w.wo = shape_only({h, q});
  w.post_norm = shape_only({h});
  w.w_gate = shape_only({f, h});
  w.w_up = shape_only({f, h});
  w.w_down = shape_only({h, f});
  w.norm = shape_only({h});
  w.lm_head = shape_only({c.draft_vocab_size, h});
  return w;
}

struct EngineStepTimes {
  double step = 0, draft = 0, feedback = 0, tokens_per_step = 0;
  double draft_waits = 0;         // the draft backend's host waits per step
  StepGraphStats draft_graphs{};  // its step graphs over the timed steps
};

// Median Engine::step time once every request is decoding (`batch` requests of `context` random
// prompt tokens), with the proposer (EAGLE-3, trees of `tree` tokens) or without.
// pick: EagleOptions::pick_on_backend (-1: trees picked on the device); paths:
// EagleOptions::paths_on_device (-1: the accepted paths run through the draft before the wait);
// early: EagleOptions::grow_before_wait (-1: the next trees grow before the wait too).
EngineStepTimes engine_steps(LlamaModel& model, const ModelWeights& w, int batch, int context,
                             int steps, int tree, int pick = -1, int paths = -1, int early = -1) {
  EngineConfig ec;
  ec.block_size = 16;
  ec.max_running = batch;
  ec.max_step_tokens = 2048;
  // Each step emits at most depth + 1 = 7 tokens; the requests run past the timed steps.
  const int32_t max_tokens = 8 * (steps + 64);
  ec.num_blocks = batch * ((context + max_tokens + std::max(tree, 1)) / 16 + 8);
  ec.tree_budget.max_nodes = std::max(tree, 1);
  std::unique_ptr<EagleProposer> proposer;
  if (tree > 1) {
    EagleOptions eo;
    eo.tree.total_tokens = tree;
    eo.tree.depth = 6;
    eo.tree.top_k = 10;
    eo.draft_kv = {ec.num_blocks, 16, false};
    eo.pick_on_backend = pick;
    eo.paths_on_device = paths;
    eo.grow_before_wait = early;
    CudaBackendOptions o;
    o.random_weights = true;
    proposer = std::make_unique<EagleProposer>(dummy_eagle3(w.config), w, eo,
                                               make_cuda_backend_on_stream_of(o, model.backend()));
  }
  Engine engine(model, ec, proposer.get());
  std::mt19937 rng(17);
  for (int b = 0; b < batch; ++b) {
    GenerationRequest r;
    r.prompt.resize(static_cast<size_t>(context));
    for (auto& t : r.prompt) t = static_cast<int32_t>(rng() % 32000);
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    r.sampling.temperature = 0;
    engine.add(static_cast<ReqId>(b + 1), r);
  }
  // Until every request has its first token (the prefill is done), then a few untimed steps.
  std::vector<bool> started(static_cast<size_t>(batch), false);
  int warm = 0;
  while (warm < 6) {
    for (const EngineEvent& e : engine.step()) started[static_cast<size_t>(e.id - 1)] = true;
    if (std::all_of(started.begin(), started.end(), [](bool x) { return x; })) ++warm;
  }
  const EngineStats before = engine.stats();
  const TransferStats draft_before = proposer ? proposer->draft_transfer_stats() : TransferStats{};
  const StepGraphStats graphs_before = proposer ? proposer->draft_graph_stats() : StepGraphStats{};
  std::vector<double> times;
  for (int s = 0; s < steps; ++s) {
    const double t0 = now_s();
    engine.step();
    times.push_back(now_s() - t0);
  }
  const EngineStats& after = engine.stats();
  EngineStepTimes out;
  out.step = median(times);
  out.draft = (after.draft_seconds - before.draft_seconds) / steps;
  out.feedback = (after.feedback_seconds - before.feedback_seconds) / steps;
  out.tokens_per_step = static_cast<double>(after.decode_tokens - before.decode_tokens) /
                        (static_cast<double>(steps) * batch);
  if (proposer) {
    out.draft_waits =
        static_cast<double>((proposer->draft_transfer_stats() - draft_before).syncs) / steps;
    const StepGraphStats g = proposer->draft_graph_stats();
    out.draft_graphs.captures = g.captures - graphs_before.captures;
    out.draft_graphs.replays = g.replays - graphs_before.replays;
    out.draft_graphs.eager = g.eager - graphs_before.eager;
    out.draft_graphs.capture_failures = g.capture_failures - graphs_before.capture_failures;
  }
  return out;
}

// Median seconds of `steps` decode steps (or tree steps of `tree` tokens) for `batch` requests
// after a prefill of `context` tokens each; steps are not committed beyond the decode token.
double time_steps(LlamaModel& model, int batch, int context, int steps, int tree) {
  const int64_t block = 16;
  testing::DirectBatch db(int64_t{batch} * ((context + steps + tree + 64) / block + 2), block, 3);
  std::mt19937 rng(11);
  std::vector<int> seqs;
  for (int b = 0; b < batch; ++b) {
    seqs.push_back(db.add_sequence());
    std::vector<int32_t> prompt(static_cast<size_t>(context));
    for (auto& t : prompt) t = static_cast<int32_t>(rng() % 128000);
    ForwardOutput out;
    ForwardRequest want;
    want.argmax_only = true;
    for (int at = 0; at < context; at += 512) {
      std::vector<int32_t> part(prompt.begin() + at, prompt.begin() + std::min(context, at + 512));
      model.forward(db.step({{seqs.back(), part, false}}), &out, want);
    }
  }
  ForwardRequest want;
  want.argmax_only = true;
  std::vector<double> times;
  for (int s = 0; s < steps + 6; ++s) {
    std::vector<testing::DirectBatch::Chunk> chunks;
    for (int q : seqs) {
      if (tree > 1) {
        std::vector<int32_t> tokens(static_cast<size_t>(tree)), parents(static_cast<size_t>(tree));
        for (int i = 0; i < tree; ++i) {
          tokens[i] = static_cast<int32_t>(rng() % 128000);
          parents[i] = i - 1;  // a chain
        }
        chunks.push_back({q, tokens, true, parents});
      } else {
        chunks.push_back({q, {static_cast<int32_t>(rng() % 128000)}, false});
      }
    }
    const StepInputs step = db.step(chunks);
    ForwardOutput out;
    const double t0 = now_s();
    model.forward(step, &out, want);
    const double t1 = now_s();
    if (s >= 6) times.push_back(t1 - t0);  // the first sightings record the step graph
  }
  return median(times);
}

// Per-call seconds of all_reduce_sum on [batch, hidden] fp32, 2 * layers calls as in a step.
double time_all_reduce(std::vector<Backend*> ranks, int batch, int64_t hidden, int64_t calls) {
  RankThreads threads(ranks);
  std::vector<double> per_rank(ranks.size());
  for (int rep = 0; rep < 3; ++rep)
    threads.run([&](int r) {
      auto& b = static_cast<CudaBackend&>(*ranks[static_cast<size_t>(r)]);
      b.reset_scratch();
      const Tensor x = b.scratch(batch, hidden);
      b.synchronize();
      const double t0 = now_s();
      for (int64_t i = 0; i < calls; ++i) b.all_reduce_sum(x);
      b.synchronize();
      per_rank[static_cast<size_t>(r)] = (now_s() - t0) / static_cast<double>(calls);
    });
  return *std::max_element(per_rank.begin(), per_rank.end());
}

int run(const Args& a) {
  const ModelWeights w = dummy_model_weights("llama-3-" + a.shape);
  const ModelConfig& c = w.config;
  cudaStream_t s0 = nullptr;
  cudaStreamCreate(&s0);
  const double bw = testing::measure_copy_bandwidth(s0);
  cudaStreamDestroy(s0);
  std::printf(
      "Llama-3 %s shape: %lld layers, hidden %lld, %lld/%lld heads, FFN %lld; %.2f GB of "
      "matrices; copy rate %.2f TB/s\n",
      a.shape.c_str(), static_cast<long long>(c.num_layers), static_cast<long long>(c.hidden_size),
      static_cast<long long>(c.num_heads), static_cast<long long>(c.num_kv_heads),
      static_cast<long long>(c.intermediate_size), matrix_bytes(c) / 1e9, bw / 1e12);
  nlohmann::json rows = nlohmann::json::array();
  std::printf(
      "| TP | batch | step ms | tok/s | floor ms | %% of floor | tree %d step ms | tree / "
      "plain | all-reduce us (x%lld) | all-reduce share |\n",
      a.tree, static_cast<long long>(2 * c.num_layers));
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  for (int tp : a.batch.empty() ? std::vector<int>{} : a.tp) {
    CudaBackendOptions o;
    o.random_weights = true;
    auto ranks = make_cuda_tp_backends(o, tp);
    std::unique_ptr<Backend> rank0 = std::move(ranks[0]);
    ranks.erase(ranks.begin());
    std::vector<Backend*> all{rank0.get()};
    for (auto& r : ranks) all.push_back(r.get());
    const double t_load = now_s();
    LlamaModel model(*rank0, w, std::move(ranks));
    std::printf("(TP=%d: weights made in %.1f s)\n", tp, now_s() - t_load);
    const int max_batch = *std::max_element(a.batch.begin(), a.batch.end());
    const int64_t blocks = int64_t{max_batch} * ((a.context + a.steps + a.tree + 64) / 16 + 2);
    model.allocate_kv(model.kv_shape(blocks, 16));
    for (int b : a.batch) {
      const double plain = time_steps(model, b, a.context, a.steps, 0);
      const double tree = a.tree > 1 ? time_steps(model, b, a.context, a.steps, a.tree) : 0;
      const double floor = matrix_bytes(c) / tp / bw;
      const double ar = tp > 1 ? time_all_reduce(all, b, c.hidden_size, 2 * c.num_layers) : 0;
      const double share = ar * 2 * c.num_layers / plain;
      std::printf("| %d | %d | %.3f | %.0f | %.3f | %.0f%% | %.3f | %.2fx | %.1f | %.0f%% |\n", tp,
                  b, plain * 1e3, b / plain, floor * 1e3, 100 * floor / plain, tree * 1e3,
                  tree / plain, ar * 1e6, 100 * share);
      std::fflush(stdout);
      rows.push_back({{"shape", a.shape},
                      {"tp", tp},
                      {"batch", b},
                      {"context", a.context},
                      {"step_ms", plain * 1e3},
                      {"tokens_per_s", b / plain},
                      {"floor_ms", floor * 1e3},
                      {"fraction_of_floor", floor / plain},
                      {"tree_tokens", a.tree},
                      {"tree_step_ms", tree * 1e3},
                      {"all_reduce_us", ar * 1e6},
                      {"copy_tb_s", bw / 1e12}});
    }
  }
  if (!a.eagle3.empty()) {
    std::printf(
        "\nEAGLE-3 speculative step (Engine::step: draft + verify + accept + compaction; "
        "dummy draft, depth 6, top-k 10) against a plain Engine step\n");
    std::printf(
        "| TP | batch | tree tokens | plain ms | spec ms | spec / plain | draft ms | "
        "feedback ms | speedup at 3.9 / 5.4 accepted |\n| --- | --- | --- | --- | --- | "
        "--- | --- | --- | --- |\n");
    for (int tp : a.tp) {
      CudaBackendOptions o;
      o.random_weights = true;
      auto ranks = make_cuda_tp_backends(o, tp);
      std::unique_ptr<Backend> rank0 = std::move(ranks[0]);
      ranks.erase(ranks.begin());
      LlamaModel model(*rank0, w, std::move(ranks));
      for (const auto& [b, t] : a.eagle3) {
        const EngineStepTimes plain = engine_steps(model, w, b, a.context, a.steps, 0);
        const EngineStepTimes spec =
            engine_steps(model, w, b, a.context, a.steps, t, a.pick, a.paths, a.early);
        const double ratio = spec.step / plain.step;
        std::printf("| %d | %d | %d | %.3f | %.3f | %.2fx | %.3f | %.3f | %.2fx / %.2fx |\n", tp, b,
                    t, plain.step * 1e3, spec.step * 1e3, ratio, spec.draft * 1e3,
                    spec.feedback * 1e3, 3.9 / ratio, 5.4 / ratio);
        const StepGraphStats& g = spec.draft_graphs;
        std::fprintf(
            stderr,
            "  batch %d: draft waits %.2f per step; draft graphs over the timed steps: %lld "
            "captures, %lld replays, %lld eager, %lld failed\n",
            b, spec.draft_waits, static_cast<long long>(g.captures),
            static_cast<long long>(g.replays), static_cast<long long>(g.eager),
            static_cast<long long>(g.capture_failures));
        std::fflush(stdout);
        rows.push_back({{"shape", a.shape},
                        {"tp", tp},
                        {"batch", b},
                        {"eagle3_tree_tokens", t},
                        {"plain_step_ms", plain.step * 1e3},
                        {"spec_step_ms", spec.step * 1e3},
                        {"draft_ms", spec.draft * 1e3},
                        {"feedback_ms", spec.feedback * 1e3}});
      }
    }
  }
  if (!a.json.empty()) std::ofstream(a.json) << rows.dump(1) << "\n";
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
        std::fprintf(stderr, "%s needs a value\n", k.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (k == "--shape")
      a.shape = next();
    else if (k == "--tp")
      a.tp = arbor::testing::parse_int_list(next());
    else if (k == "--batch")
      a.batch = next() == "none" ? std::vector<int>{} : arbor::testing::parse_int_list(argv[i]);
    else if (k == "--context")
      a.context = std::stoi(next());
    else if (k == "--steps")
      a.steps = std::stoi(next());
    else if (k == "--tree")
      a.tree = std::stoi(next());
    else if (k == "--eagle3") {
      std::stringstream ss(next());
      std::string item;
      while (std::getline(ss, item, ',')) {
        const size_t colon = item.find(':');
        a.eagle3.emplace_back(std::stoi(item.substr(0, colon)), std::stoi(item.substr(colon + 1)));
      }
    } else if (k == "--pick-on-device")
      a.pick = std::stoi(next());
    else if (k == "--paths-on-device")
      a.paths = std::stoi(next());
    else if (k == "--grow-before-wait")
      a.early = std::stoi(next());
    else if (k == "--json")
      a.json = next();
    else {
      std::fprintf(stderr, "unknown argument %s\n", k.c_str());
      return 2;
    }
  }
  if (a.shape != "8b" && a.shape != "70b") {
    std::fprintf(stderr, "--shape: '%s' (expected 8b or 70b)\n", a.shape.c_str());
    return 2;
  }
  try {
    return arbor::run(a);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 1;
  }
}
