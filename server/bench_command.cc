// `arbor bench`: plain-decode throughput on the CPU backend. For each batch size, runs
// `repeats` rounds of batch x (prompt_tokens random-free prompt, gen_tokens greedy tokens with
// EOS ignored) and prints the median prefill and decode tokens/s as a Markdown table.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <sstream>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/runner/generator.h"
#include "engine/runner/model_bundle.h"
#include "server/cli_commands.h"

namespace arbor {

void add_bench_command(CLI::App& app, BenchOptions* o) {
  CLI::App* c = app.add_subcommand("bench", "Measure plain-decode tokens/s");
  c->add_option("--model,-m", o->model, "Model path")->required();
  c->add_option("--tokenizer", o->tokenizer, "Tokenizer file");
  c->add_option("--prompt-tokens", o->prompt_tokens, "Prompt length")->check(CLI::PositiveNumber);
  c->add_option("--gen-tokens", o->gen_tokens, "Generated tokens per request")
      ->check(CLI::PositiveNumber);
  c->add_option("--batch", o->batches, "Comma-separated batch sizes, e.g. 1,4,16");
  c->add_option("--repeats", o->repeats, "Rounds per point (median reported)")
      ->check(CLI::PositiveNumber);
  c->add_option("--threads", o->threads, "BLAS threads (0: default)");
  c->add_option("--tensor-parallel", o->tensor_parallel,
                "Tensor-parallel ranks: GPUs 0..N-1 over NCCL (cuda), threads (cpu)")
      ->capture_default_str();
  c->add_option("--backend", o->backend, "cpu | cuda")->capture_default_str();
  c->add_option("--block-size", o->block_size, "Tokens per KV block")->check(CLI::PositiveNumber);
}

int run_bench(const BenchOptions& o) {
  std::vector<int32_t> batches;
  std::stringstream ss(o.batches);
  for (std::string part; std::getline(ss, part, ',');) {
    try {
      batches.push_back(std::stoi(part));
    } catch (const std::exception&) {
      throw_error(ErrorCode::kInvalidArgument, "--batch: '" + part + "' is not a number");
    }
    if (batches.back() <= 0)
      throw_error(ErrorCode::kInvalidArgument, "--batch: " + part + " is not positive");
  }
  ModelBundle bundle;
  std::unique_ptr<Backend> backend;
  auto model = load_for_cli(o.model, o.tokenizer, o.backend, o.threads, o.tensor_parallel, &bundle,
                            &backend);
  const int64_t vocab = model->config().vocab_size;
  std::printf("| model | batch | prompt | generated | prefill tok/s | decode tok/s |\n");
  std::printf("| --- | --- | --- | --- | --- | --- |\n");
  for (int32_t b : batches) {
    std::vector<double> prefill, decode;
    for (int32_t rep = 0; rep < o.repeats; ++rep) {
      GeneratorConfig gc;
      gc.block_size = o.block_size;
      gc.num_blocks = b * ((o.prompt_tokens + o.gen_tokens) / o.block_size + 2);
      gc.max_step_tokens = std::max(512, o.prompt_tokens);
      gc.max_running = b;
      gc.prefix_caching = false;  // distinct work per request, no cache hits across rounds
      Generator gen(*model, gc);
      std::vector<GenerationRequest> reqs(b);
      for (int32_t i = 0; i < b; ++i) {
        // Deterministic distinct prompts (ids spread over the vocabulary).
        for (int32_t t = 0; t < o.prompt_tokens; ++t)
          reqs[i].prompt.push_back(
              static_cast<int32_t>((7919LL * (t + 1) + 104729LL * i) % (vocab - 3)) + 3);
        reqs[i].sampling.temperature = 0;
        reqs[i].max_tokens = o.gen_tokens;
        reqs[i].ignore_eos = true;
      }
      gen.run(reqs);
      const GeneratorStats& st = gen.stats();
      prefill.push_back(st.prefill_tokens / std::max(st.prefill_seconds + st.mixed_seconds, 1e-9));
      // The first generated token of each request comes from the prefill step.
      decode.push_back((st.decode_tokens - b) / std::max(st.decode_seconds, 1e-9));
    }
    auto median = [](std::vector<double> v) {
      std::sort(v.begin(), v.end());
      return v[v.size() / 2];
    };
    std::printf("| %s | %d | %d | %d | %.1f | %.1f |\n", o.model.c_str(), b, o.prompt_tokens,
                o.gen_tokens, median(prefill), median(decode));
    std::fflush(stdout);
  }
  return 0;
}

}  // namespace arbor
