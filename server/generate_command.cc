// `arbor generate`: loads a model (showing progress), streams the generated text as it is
// produced (incremental detokenization), and reports prefill and decode tokens per second.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <functional>

#include <unistd.h>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/model/dummy_weights.h"
#include "engine/runner/generator.h"
#include "engine/runner/model_bundle.h"
#include "engine/spec/eagle_proposer.h"
#include "server/cli_commands.h"

#ifdef ARBOR_CUDA
#include "engine/backend/cuda/cuda_backend.h"
#endif

namespace arbor {

void add_generate_command(CLI::App& app, GenerateOptions* o) {
  CLI::App* c = app.add_subcommand("generate", "Generate text from a prompt, streaming it");
  c->add_option("--model,-m", o->model, "HF directory, .gguf file, or llama2.c checkpoint")
      ->required();
  c->add_option("--tokenizer", o->tokenizer, "Tokenizer file (default: found beside the model)");
  c->add_option("--prompt,-p", o->prompt, "Prompt text")->required();
  c->add_option("--max-tokens,-n", o->max_tokens, "Tokens to generate at most")
      ->check(CLI::Range(1, 1 << 20));
  c->add_option("--temperature", o->sampling.temperature, "0 = greedy")->capture_default_str();
  c->add_option("--top-k", o->sampling.top_k, "0 = off");
  c->add_option("--top-p", o->sampling.top_p, "Nucleus mass in (0, 1]");
  c->add_option("--min-p", o->sampling.min_p, "Minimum probability relative to the top token");
  c->add_option("--repetition-penalty", o->sampling.repetition_penalty, "HF repetition penalty");
  c->add_option("--presence-penalty", o->sampling.presence_penalty, "OpenAI presence penalty");
  c->add_option("--frequency-penalty", o->sampling.frequency_penalty, "OpenAI frequency penalty");
  c->add_option("--seed", o->seed, "Sampling seed (-1: random)");
  c->add_flag("--no-bos", o->no_bos, "Do not prepend BOS");
  c->add_flag("--echo", o->echo, "Write the prompt to stdout before the generated text");
  c->add_flag("--ignore-eos", o->ignore_eos, "Keep generating past EOS");
  c->add_option("--threads", o->threads, "BLAS threads (0: default)");
  c->add_option("--tensor-parallel", o->tensor_parallel,
                "Tensor-parallel ranks: GPUs 0..N-1 over NCCL (cuda), threads (cpu)")
      ->capture_default_str();
  c->add_option("--backend", o->backend, "cpu | cuda")->capture_default_str();
  c->add_option("--kv-blocks", o->kv_blocks,
                "KV cache blocks (0: as many as --gpu-memory-utilization of the memory holds)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--gpu-memory-utilization", o->gpu_memory_utilization,
                "Fraction of device memory (host memory on the CPU) for weights, activations "
                "and the KV cache")
      ->check(CLI::Range(0.0, 1.0))
      ->capture_default_str();
  c->add_option("--block-size", o->block_size, "Tokens per KV block")->check(CLI::PositiveNumber);
  SpecConfig& sc = o->spec_config;
  c->add_option("--spec", o->spec, "Speculation: off | ngram | medusa | eagle | eagle3")
      ->capture_default_str();
  c->add_option("--spec-heads", sc.head_path, "Medusa / EAGLE head checkpoint directory");
  c->add_option("--spec-tree", sc.tree,
                "Medusa static tree: mc_sim_7b_63, chain-N, product-K1-K2.., JSON or a file")
      ->capture_default_str();
  c->add_option("--spec-total-tokens", sc.total_tokens, "EAGLE tree nodes incl. the root")
      ->capture_default_str();
  c->add_option("--spec-depth", sc.depth, "EAGLE draft steps")->capture_default_str();
  c->add_option("--spec-top-k", sc.top_k, "EAGLE children per node")->capture_default_str();
  c->add_option("--spec-token-map", sc.token_map,
                "EAGLE-1/2 draft vocabulary: token map file ('none': all; default: the heads' "
                "token_map.json when present)");
  c->add_option("--spec-draft-vocab", sc.draft_vocab,
                "EAGLE-1/2: the token map's first N ids (0: all)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--spec-max-ngram", sc.max_ngram, "n-gram: longest suffix matched")
      ->capture_default_str();
  c->add_option("--spec-max-nodes", o->max_tree_nodes, "Largest tree verified in one step")
      ->capture_default_str();
  c->add_flag("--typical", o->typical,
              "Medusa typical acceptance instead of rejection sampling (NOT lossless)");
}

std::unique_ptr<Backend> make_draft_backend(const std::string& backend_kind, Backend& target,
                                            bool step_graphs) {
#ifdef ARBOR_CUDA
  if (backend_kind == "cuda") {
    CudaBackendOptions options;
    options.cuda_graphs = step_graphs;
    return make_cuda_backend_on_stream_of(options, target);
  }
#endif
  (void)backend_kind;
  (void)target;
  (void)step_graphs;
  return nullptr;
}

namespace {

// The largest dummy model the CPU backend fills with random host weights (fp32 bytes).
constexpr int64_t kMaxHostDummyBytes = int64_t{2} << 30;

}  // namespace

std::string draft_vocab_line(const SpecConfig& config, const Proposer* proposer) {
  const auto* eagle = dynamic_cast<const EagleProposer*>(proposer);
  if (eagle == nullptr || eagle->draft().eagle3()) return "";
  const EagleDraftConfig& c = eagle->draft().config();
  const std::string map = resolve_token_map(config);
  return "EAGLE draft vocabulary: " + std::to_string(c.draft_vocab_size) + " of " +
         std::to_string(c.vocab_size) + " target ids (" +
         (map.empty() ? std::string("no token map") : "token map " + map) + ")";
}

void check_spec_for_model(const std::string& model_path, SpecMethod method) {
  if (is_dummy_model_path(model_path) && method != SpecMethod::kOff && method != SpecMethod::kNgram)
    throw_error(ErrorCode::kInvalidArgument,
                std::string("--spec ") + spec_method_name(method) + ": " + model_path +
                    " has random weights and no trained heads; use --spec off or ngram");
}

std::unique_ptr<LlamaModel> load_for_cli(
    const std::string& path, const std::string& tokenizer, int32_t threads, ModelBundle* bundle,
    std::unique_ptr<Backend>* backend,
    const std::function<void(const ModelWeights&)>& before_release) {
  return load_for_cli(path, tokenizer, "cpu", threads, 1, bundle, backend, before_release);
}

std::unique_ptr<LlamaModel> load_for_cli(
    const std::string& path, const std::string& tokenizer, const std::string& backend_kind,
    int32_t threads, int32_t tensor_parallel, ModelBundle* bundle,
    std::unique_ptr<Backend>* backend,
    const std::function<void(const ModelWeights&)>& before_release) {
  if (backend_kind != "cpu" && backend_kind != "cuda")
    throw_error(ErrorCode::kInvalidArgument,
                "--backend: '" + backend_kind + "' (expected cpu or cuda)");
#ifndef ARBOR_CUDA
  if (backend_kind == "cuda")
    throw_error(ErrorCode::kUnsupported,
                "--backend cuda: this build has no CUDA backend (configure with -DARBOR_CUDA=ON)");
#endif
  const auto t0 = std::chrono::steady_clock::now();
  int last_pct = -1;
  *bundle = load_model_bundle(path, tokenizer, [&](const std::string& stage, double f) {
    const int pct = static_cast<int>(f * 100);
    if (pct / 10 != last_pct / 10 || f >= 1.0) {
      std::fprintf(stderr, "\r[load] %-24s %3d%%", stage.c_str(), pct);
      if (f >= 1.0) std::fputc('\n', stderr);
      last_pct = pct;
    }
  });
  if (tensor_parallel < 1)
    throw_error(ErrorCode::kInvalidArgument,
                "--tensor-parallel: " + std::to_string(tensor_parallel) + " (expected >= 1)");
  const bool dummy = is_dummy_model_path(path);
  if (dummy && backend_kind == "cpu") {
    // The CPU backend computes on host fp32 weights: fill them here, for small presets only.
    const int64_t bytes = host_weight_bytes(bundle->weights);
    if (bytes > kMaxHostDummyBytes)
      throw_error(ErrorCode::kInvalidArgument,
                  path + ": random weights on the CPU backend would take " +
                      std::to_string(bytes >> 20) + " MiB of host fp32 (at most " +
                      std::to_string(kMaxHostDummyBytes >> 20) +
                      " MiB): serve it with --backend cuda, or take dummy:tiny");
    fill_random_host_weights(&bundle->weights, /*seed=*/1);
  }
  std::vector<std::unique_ptr<Backend>> ranks;
#ifdef ARBOR_CUDA
  if (backend_kind == "cuda") {
    CudaBackendOptions options;
    options.random_weights = dummy;  // shape-only weights filled on the device
    ranks = make_cuda_tp_backends(options, tensor_parallel);
  } else
#endif
    ranks = make_cpu_tp_backends(tensor_parallel, threads);
  *backend = std::move(ranks[0]);
  ranks.erase(ranks.begin());
  auto model = std::make_unique<LlamaModel>(**backend, bundle->weights, std::move(ranks));
  if (before_release) before_release(bundle->weights);
  bundle->weights = ModelWeights{};  // the backend holds its own copy
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  spdlog::info("loaded {} in {:.2f}s: {}{}", path, secs, model->config().summary(),
               tensor_parallel > 1 ? " (tensor parallel: " + std::to_string(tensor_parallel) +
                                         " ranks on " + backend_kind + ")"
                                   : std::string());
  return model;
}

int run_generate(const GenerateOptions& o) {
  SamplingParams sampling = o.sampling;
  if (o.seed >= 0) sampling.seed = static_cast<uint64_t>(o.seed);
  sampling.validate();
  ModelBundle bundle;
  std::unique_ptr<Backend> backend;
  SpecConfig sc = o.spec_config;
  sc.method = parse_spec_method(o.spec);
  sc.validate();
  check_spec_for_model(o.model, sc.method);
  std::unique_ptr<Proposer> proposer;
  auto model = load_for_cli(o.model, o.tokenizer, o.backend, o.threads, o.tensor_parallel, &bundle,
                            &backend, [&](const ModelWeights& w) {
                              proposer =
                                  make_proposer(sc, w, make_draft_backend(o.backend, *backend));
                            });
  if (const std::string line = draft_vocab_line(sc, proposer.get()); !line.empty())
    spdlog::info("{}", line);
  const Tokenizer& tok = *bundle.tokenizer;

  GenerationRequest req;
  req.prompt = tok.encode(o.prompt, /*add_bos=*/!o.no_bos, /*parse_special=*/true);
  if (req.prompt.empty()) throw_error(ErrorCode::kInvalidArgument, "--prompt encodes to no tokens");
  req.sampling = sampling;
  req.max_tokens = o.max_tokens;
  req.ignore_eos = o.ignore_eos;
  if (!o.ignore_eos) req.stop_token_ids = bundle.stop_token_ids;

  GeneratorConfig gc;
  gc.num_blocks = o.kv_blocks;
  gc.gpu_memory_utilization = o.gpu_memory_utilization;
  gc.block_size = o.block_size;
  gc.tree_budget.max_nodes = o.max_tree_nodes;
  if (o.typical) gc.verify.mode = VerifyMode::kTypical;
  Generator gen(*model, gc, proposer.get());
  spdlog::info("{}", gen.engine().kv_capacity());
  // stdout gets the generated text alone (with --echo, the prompt before it); logs, progress and
  // the speed report go to stderr.
  IncrementalDecoder decoder(tok, /*skip_special=*/true,
                             /*at_text_start=*/!o.echo || o.prompt.empty());
  if (o.echo) {
    std::fputs(o.prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  const auto t0 = std::chrono::steady_clock::now();
  const auto results = gen.run({req}, [&](size_t, int32_t id) {
    if (!o.ignore_eos && std::find(req.stop_token_ids.begin(), req.stop_token_ids.end(), id) !=
                             req.stop_token_ids.end())
      return;
    const std::string text = decoder.push(id);
    std::fwrite(text.data(), 1, text.size(), stdout);
    std::fflush(stdout);
  });
  const std::string rest = decoder.finish();
  std::fwrite(rest.data(), 1, rest.size(), stdout);
  if (isatty(fileno(stdout))) std::fputc('\n', stdout);  // a file gets the text exactly
  std::fflush(stdout);
  const double total = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  const GeneratorStats& st = gen.stats();
  const double decode_rate =
      st.decode_seconds > 0 ? (st.decode_tokens - 1) / st.decode_seconds : 0.0;
  std::fprintf(stderr,
               "[generate] prompt %lld tokens (%.1f tok/s prefill), generated %zu tokens "
               "(%.1f tok/s decode), %.2fs total, finish: %s\n",
               static_cast<long long>(st.prefill_tokens),
               st.prefill_seconds > 0 ? st.prefill_tokens / st.prefill_seconds : 0.0,
               results[0].tokens.size(), decode_rate, total, results[0].finish_reason.c_str());
  if (proposer) {
    const AcceptanceStats& acc = results[0].acceptance;
    std::string by_depth;
    for (size_t d = 0; d < acc.offered.size(); ++d)
      by_depth += " " + std::to_string(d + 1) + ":" +
                  std::to_string(static_cast<int>(acc.acceptance_rate(d + 1) * 100 + 0.5)) + "%";
    std::fprintf(stderr,
                 "[spec] %s (%s): mean accepted length %.2f tokens/step over %lld verify steps; "
                 "acceptance by depth%s\n",
                 proposer->name().c_str(), verify_mode_name(gc.verify.mode),
                 acc.mean_emitted_per_step(), static_cast<long long>(acc.steps), by_depth.c_str());
  }
  return 0;
}

}  // namespace arbor
