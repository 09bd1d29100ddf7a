// Options and entry points of the `arbor` subcommands.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include <CLI/CLI.hpp>

#include "engine/backend/backend.h"
#include "engine/model/llama_model.h"
#include "engine/runner/model_bundle.h"
#include "engine/sampling/sampling_params.h"
#include "engine/spec/proposer_factory.h"

namespace arbor {

struct GenerateOptions {
  std::string model;
  std::string tokenizer;  // override (llama2.c checkpoints)
  std::string prompt;
  int32_t max_tokens = 128;
  bool no_bos = false;
  bool echo = false;  // prompt to stdout before the text
  bool ignore_eos = false;
  int32_t threads = 0;  // 0: BLAS default
  int32_t tensor_parallel = 1;
  int32_t kv_blocks = 0;  // 0: sized from gpu_memory_utilization
  double gpu_memory_utilization = 0.9;
  int32_t block_size = 16;
  SamplingParams sampling;
  int64_t seed = -1;         // -1: random
  std::string spec = "off";  // off | ngram | medusa | eagle | eagle3
  SpecConfig spec_config;    // heads, tree options (method filled from `spec`)
  bool typical = false;      // Medusa typical acceptance (NOT lossless)
  int32_t max_tree_nodes = 64;
  std::string backend = "cpu";  // cpu | cuda
};

struct BenchOptions {
  std::string model;
  std::string tokenizer;
  int32_t prompt_tokens = 128;
  int32_t gen_tokens = 128;
  std::string batches = "1";  // comma-separated batch sizes
  int32_t repeats = 3;
  int32_t threads = 0;
  int32_t tensor_parallel = 1;
  int32_t block_size = 16;
  std::string backend = "cpu";  // cpu | cuda
};

struct SpecBenchOptions {
  std::string model;
  std::string tokenizer;
  std::string prompts;
  int32_t limit = 0;
  int32_t max_tokens = 128;
  float temperature = 0.0f;
  int64_t seed = 1;
  int32_t batch = 1;
  int32_t threads = 0;
  int32_t tensor_parallel = 1;
  bool no_bos = false;
  bool skip_plain = false;     // acceptance only: no plain-decoding baseline run
  int32_t warmup_tokens = 16;  // untimed runs of both modes first (GEMM tuning, step graphs)
  int32_t warmup_rounds = -1;  // then untimed full rounds (step graphs recorded); -1: 2 with graphs
  int32_t rounds = 1;          // timed rounds of both modes; the medians are reported
  bool draft_graphs = true;    // the draft's backend records step graphs (A/B runs)
  bool plain_first = false;    // each round (and the warm-up) runs plain before speculative
  bool no_spec_warmup = false;       // the warm-up runs plain decoding only
  bool fresh_policy = false;         // timed runs' tree policy not started from the warm-up's
  bool plain_after_release = false;  // one more plain pass after the proposer is freed
  bool gemm_report = false;          // print the target backend's run-time choices (tuning_report)
  bool time_graphs = false;          // time the target's and draft's step-graph replays (device)
  std::string node_stats;            // write per-node acceptance (JSON) to this file
  bool host_sampling = false;        // download logits and verify on the host (EngineConfig)
  int32_t pad_trees = -1;            // EngineConfig::pad_trees
  bool adaptive_trees = false;       // EngineConfig::adaptive_trees
  std::string cost_model;            // verify-cost curve (JSON) for adaptive trees
  std::string spec;
  SpecConfig spec_config;
  int32_t max_tree_nodes = 64;
  std::string backend = "cpu";  // cpu | cuda
};

// Loads a model bundle onto the CPU backend with a progress line; `before_release` sees the
// host weights (to build a proposer) before they are freed. Defined in generate_command.cc.
std::unique_ptr<LlamaModel> load_for_cli(
    const std::string& path, const std::string& tokenizer, int32_t threads, ModelBundle* bundle,
    std::unique_ptr<Backend>* backend,
    const std::function<void(const ModelWeights&)>& before_release = {});
// A backend of the named kind for a proposer's draft model (EAGLE, Medusa's heads): a CUDA
// backend for "cuda" (recording step graphs unless step_graphs is false) that launches into
// the target's stream (make_cuda_backend_on_stream_of; target: the model's rank-0 backend),
// nullptr (the proposer's own CPU backend, or Medusa's heads on the host) otherwise.
std::unique_ptr<Backend> make_draft_backend(const std::string& backend_kind, Backend& target,
                                            bool step_graphs = true);
// The same on a named backend: "cpu", or "cuda" (bf16 weights on GPU 0; builds with
// -DARBOR_CUDA=ON only, else a kUnsupported error naming the build option). A dummy model
// ("dummy:llama-3-8b", engine/model/dummy_weights.h) gets random weights: on the device with
// "cuda", on the host with "cpu" for presets of at most 2 GiB of fp32 (else kInvalidArgument).
// tensor_parallel > 1: a group of that many ranks (LlamaModel owns ranks 1..; *backend is rank
// 0; docs/tensor_parallel.md).
std::unique_ptr<LlamaModel> load_for_cli(
    const std::string& path, const std::string& tokenizer, const std::string& backend_kind,
    int32_t threads, int32_t tensor_parallel, ModelBundle* bundle,
    std::unique_ptr<Backend>* backend,
    const std::function<void(const ModelWeights&)>& before_release = {});

// kInvalidArgument when `method` needs trained heads and `model_path` names a dummy model
// (random weights have none): such a model serves with speculation off or n-gram.
void check_spec_for_model(const std::string& model_path, SpecMethod method);
// "EAGLE draft vocabulary: 8192 of 49152 target ids (token map F)" for an EAGLE-1/2 proposer
// (the whole vocabulary without a token map), "" for other proposers.
std::string draft_vocab_line(const SpecConfig& config, const Proposer* proposer);

void add_spec_bench_command(CLI::App& app, SpecBenchOptions* o);
int run_spec_bench(const SpecBenchOptions& o);
void add_generate_command(CLI::App& app, GenerateOptions* o);
void add_bench_command(CLI::App& app, BenchOptions* o);
int run_generate(const GenerateOptions& o);
int run_bench(const BenchOptions& o);
// `arbor serve` (serve_command.cc): options live in the command's own state.
void add_serve_command(CLI::App& app);
int run_serve();

}  // namespace arbor
