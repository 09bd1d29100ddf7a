// `arbor serve`: loads the model (and speculation heads), starts the engine loop, the
// OpenAI-compatible HTTP server and the gRPC server, and drains gracefully on SIGTERM / SIGINT.
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <vector>

#include <spdlog/spdlog.h>

#include "engine/core/error.h"
#include "engine/runner/engine.h"
#include "engine/tokenizer/chat_template.h"
#include "server/cli_commands.h"
#include "server/config.h"
#include "server/engine_service.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "server/served_model.h"
#ifdef ARBOR_WITH_GRPC
#include "server/grpc/grpc_server.h"
#endif

namespace arbor {

namespace {

struct ServeCli {
  std::string config;
  ServeConfig values;
  std::vector<std::pair<CLI::Option*, std::function<void(ServeConfig&, const ServeConfig&)>>>
      overrides;
};

std::string env_or_empty(const char* name) {
  const char* value = std::getenv(name);
  return value ? value : "";
}

template <typename T>
void flag(CLI::App* c, ServeCli* s, const std::string& name, T ServeConfig::*member,
          const std::string& help) {
  CLI::Option* o = c->add_option(name, s->values.*member, help);
  s->overrides.emplace_back(
      o, [member](ServeConfig& dst, const ServeConfig& src) { dst.*member = src.*member; });
}

ServeCli* serve_cli() {
  static ServeCli cli;
  return &cli;
}

}  // namespace

void add_serve_command(CLI::App& app) {
  ServeCli* s = serve_cli();
  CLI::App* c = app.add_subcommand(
      "serve", "Serve a model over an OpenAI-compatible HTTP API and gRPC (see configs/)");
  c->add_option("-c,--config", s->config,
                "YAML configuration file (flags override it; default: $ARBOR_CONFIG)");
  flag(c, s, "-m,--model", &ServeConfig::model_path,
       "Model path (HF dir, .gguf, llama2.c .bin) or dummy:PRESET (random weights: llama-3-8b, "
       "llama-3-70b, tiny)");
  flag(c, s, "--tokenizer", &ServeConfig::tokenizer_path, "Tokenizer override");
  flag(c, s, "--name", &ServeConfig::model_name, "Model id clients pass as `model`");
  flag(c, s, "--chat-template", &ServeConfig::chat_template,
       "Jinja chat template file (overrides the tokenizer's)");
  flag(c, s, "--backend", &ServeConfig::backend, "cpu or cuda");
  flag(c, s, "--threads", &ServeConfig::threads, "CPU backend threads (0: default)");
  flag(c, s, "--tensor-parallel", &ServeConfig::tensor_parallel,
       "Tensor-parallel ranks: GPUs 0..N-1 over NCCL (cuda), threads (cpu)");
  flag(c, s, "--cuda-graphs", &ServeConfig::cuda_graphs,
       "Replay CUDA graphs for steady-state decode steps (cuda backend; true / false)");
  flag(c, s, "--kv-blocks", &ServeConfig::kv_blocks,
       "KV cache blocks (0: as many as --gpu-memory-utilization of the memory holds)");
  flag(c, s, "--gpu-memory-utilization", &ServeConfig::gpu_memory_utilization,
       "Fraction of device memory (host memory on the CPU) for weights, activations and KV");
  flag(c, s, "--block-size", &ServeConfig::block_size, "Tokens per KV block");
  flag(c, s, "--max-step-tokens", &ServeConfig::max_step_tokens, "Tokens per engine step");
  flag(c, s, "--max-running", &ServeConfig::max_running, "Sequences running at once");
  flag(c, s, "--prefix-caching", &ServeConfig::prefix_caching, "Share cached prompt blocks");
  flag(c, s, "--spec", &ServeConfig::spec_method, "off | ngram | medusa | eagle | eagle3");
  flag(c, s, "--spec-heads", &ServeConfig::spec_heads, "Medusa / EAGLE heads");
  flag(c, s, "--spec-tree", &ServeConfig::spec_tree, "Medusa tree (name, JSON or file)");
  flag(c, s, "--spec-total-tokens", &ServeConfig::spec_total_tokens, "EAGLE tree nodes");
  flag(c, s, "--spec-depth", &ServeConfig::spec_depth, "EAGLE draft depth");
  flag(c, s, "--spec-top-k", &ServeConfig::spec_top_k, "EAGLE top-k");
  flag(c, s, "--spec-token-map", &ServeConfig::spec_token_map,
       "EAGLE-1/2 draft vocabulary: token map file ('none': all; default: the heads' "
       "token_map.json when present)");
  flag(c, s, "--spec-draft-vocab", &ServeConfig::spec_draft_vocab,
       "EAGLE-1/2: the token map's first N ids (0: all)");
  flag(c, s, "--spec-max-nodes", &ServeConfig::spec_max_nodes, "Largest tree per request");
  flag(c, s, "--spec-adaptive", &ServeConfig::spec_adaptive,
       "Size trees per step from the cost model (true/false)");
  flag(c, s, "--cost-model", &ServeConfig::spec_cost_model,
       "Verify-cost curve (JSON), or 'measure' (this model's, at start-up)");
  flag(c, s, "--host", &ServeConfig::host, "Bind address (default 127.0.0.1)");
  flag(c, s, "-p,--port", &ServeConfig::port, "HTTP port (0: any free port)");
  flag(c, s, "--grpc-port", &ServeConfig::grpc_port, "gRPC port (0: no gRPC)");
  // A key flag replaces the config file's key and key file (and ARBOR_API_KEY): the two flags
  // exclude each other, and the one given clears the other field.
  CLI::Option* key = c->add_option("--api-key", s->values.api_key,
                                   "Require this bearer key (default: $ARBOR_API_KEY)");
  CLI::Option* key_file = c->add_option("--api-key-file", s->values.api_key_file,
                                        "Require the bearer key held in this file");
  key->excludes(key_file);
  s->overrides.emplace_back(key, [](ServeConfig& dst, const ServeConfig& src) {
    dst.api_key = src.api_key;
    dst.api_key_file.clear();
  });
  s->overrides.emplace_back(key_file, [](ServeConfig& dst, const ServeConfig& src) {
    dst.api_key_file = src.api_key_file;
    dst.api_key.clear();
  });
  flag(c, s, "--max-body-bytes", &ServeConfig::max_body_bytes, "Largest request body");
  flag(c, s, "--max-prompt-tokens", &ServeConfig::max_prompt_tokens, "Longest prompt");
  flag(c, s, "--max-queue", &ServeConfig::max_queue, "Waiting requests before 429");
  flag(c, s, "--http-threads", &ServeConfig::http_threads, "HTTP connections served at once");
  flag(c, s, "--drain-timeout", &ServeConfig::drain_timeout_s, "Seconds to finish on SIGTERM");
  flag(c, s, "--default-max-tokens", &ServeConfig::default_max_tokens,
       "Chat max_tokens when the request gives none");
}

int run_serve() {
  ServeCli* s = serve_cli();
  ServeConfig cfg;
  const std::string config_path = s->config.empty() ? env_or_empty("ARBOR_CONFIG") : s->config;
  if (!config_path.empty()) cfg = load_serve_config(config_path, cfg);
  // Precedence: the config file, then the environment's key, then flags.
  if (const std::string env_key = env_or_empty("ARBOR_API_KEY"); !env_key.empty()) {
    cfg.api_key = env_key;
    cfg.api_key_file.clear();
  }
  for (auto& [opt, apply] : s->overrides)
    if (opt->count() > 0) apply(cfg, s->values);
  cfg.validate();
  if (!cfg.api_key_file.empty()) cfg.api_key = read_api_key_file(cfg.api_key_file);
  if (cfg.model_name.empty())
    cfg.model_name = std::filesystem::path(cfg.model_path).filename().string();
  std::fprintf(stderr, "[serve] configuration:\n%s\n", cfg.to_yaml().c_str());

  // Signals go to the main thread (sigwait below); the threads started later inherit the mask.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGTERM);
  sigaddset(&signals, SIGINT);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);
  std::signal(SIGPIPE, SIG_IGN);

  SpecConfig sc;
  sc.method = parse_spec_method(cfg.spec_method);
  sc.head_path = cfg.spec_heads;
  sc.tree = cfg.spec_tree;
  sc.total_tokens = cfg.spec_total_tokens;
  sc.depth = cfg.spec_depth;
  sc.top_k = cfg.spec_top_k;
  sc.token_map = cfg.spec_token_map;
  sc.draft_vocab = cfg.spec_draft_vocab;
  sc.num_threads = cfg.threads;
  sc.validate();
  check_spec_for_model(cfg.model_path, sc.method);
  ModelBundle bundle;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Proposer> proposer;
  auto model = load_for_cli(cfg.model_path, cfg.tokenizer_path, cfg.backend, cfg.threads,
                            cfg.tensor_parallel, &bundle, &backend, [&](const ModelWeights& w) {
                              proposer =
                                  make_proposer(sc, w, make_draft_backend(cfg.backend, *backend));
                            });
  model->set_step_graphs(cfg.cuda_graphs);
  const Tokenizer& tok = *bundle.tokenizer;

  EngineConfig ec;
  ec.num_blocks = cfg.kv_blocks;
  ec.gpu_memory_utilization = cfg.gpu_memory_utilization;
  ec.block_size = cfg.block_size;
  ec.max_step_tokens = cfg.max_step_tokens;
  ec.max_running = cfg.max_running;
  ec.prefix_caching = cfg.prefix_caching;
  ec.tree_budget.max_nodes = cfg.spec_max_nodes;
  ec.tree_budget.max_depth = 16;
  ec.adaptive_trees = cfg.spec_adaptive;
  ec.set_cost_model(cfg.spec_cost_model);
  Engine engine(*model, ec, proposer.get());
  spdlog::info("{}", engine.kv_capacity());
  if (const std::string line = draft_vocab_line(sc, proposer.get()); !line.empty())
    spdlog::info("{}", line);
  if (ec.measure_cost && ec.adaptive_trees)
    spdlog::info("verify cost measured (total tokens -> ms): {}",
                 format_cost_curves(engine.scheduler().cost().config().curves));

  Metrics metrics;
  ServiceOptions so;
  so.max_queue = cfg.max_queue;
  so.limits.max_prompt_tokens = cfg.max_prompt_tokens;
  so.limits.speculation_available = proposer != nullptr;
  EngineService service(engine, tok, bundle.stop_token_ids, so, &metrics);

  std::unique_ptr<ChatTemplate> chat;
  if (!cfg.chat_template.empty()) {
    std::ifstream in(cfg.chat_template);
    if (!in)
      throw_error(ErrorCode::kNotFound,
                  "model.chat_template: cannot open '" + cfg.chat_template + "'");
    std::stringstream text;
    text << in.rdbuf();
    auto special = [&](int32_t id) { return id >= 0 ? tok.token_bytes(id) : std::string(); };
    chat = std::make_unique<ChatTemplate>(text.str(), special(tok.bos_id()), special(tok.eos_id()));
  } else if (!tok.spec().chat_template.empty()) {
    chat = std::make_unique<ChatTemplate>(chat_template_from_spec(tok.spec()));
  } else {
    spdlog::warn("the model has no chat template: /v1/chat/completions answers 400");
  }

  ServedModelInfo info;
  info.id = cfg.model_name;
  info.max_context = service.max_context();
  info.vocab_size = tok.vocab_size();
  info.speculation = cfg.spec_method;
  info.backend = cfg.backend;

  ApiContext api;
  api.tokenizer = &tok;
  api.chat_template = chat.get();
  api.model_id = info.id;
  api.max_context = info.max_context;
  api.default_max_tokens = cfg.default_max_tokens;
  api.add_bos = tok.spec().add_bos;

  service.start();
  HttpOptions ho;
  ho.host = cfg.host;
  ho.port = cfg.port;
  ho.api_key = cfg.api_key;
  ho.max_body_bytes = cfg.max_body_bytes;
  ho.threads = cfg.http_threads;
  HttpServer http(service, metrics, info, api, ho);
  http.start();
  std::printf("arbor: HTTP listening on http://%s:%d (model '%s')\n", cfg.host.c_str(), http.port(),
              info.id.c_str());
#ifdef ARBOR_WITH_GRPC
  std::unique_ptr<GrpcServer> grpc;
  if (cfg.grpc_port > 0) {
    GrpcOptions go;
    go.host = cfg.host;
    go.port = cfg.grpc_port;
    go.api_key = cfg.api_key;
    grpc = std::make_unique<GrpcServer>(service, info, api, go);
    grpc->start();
    std::printf("arbor: gRPC listening on %s:%d\n", cfg.host.c_str(), grpc->port());
  }
#else
  if (cfg.grpc_port > 0) spdlog::warn("built without gRPC: server.grpc_port ignored");
#endif
  if (!is_loopback_host(cfg.host) && cfg.api_key.empty())
    spdlog::warn(
        "listening on {} without an API key: anyone who reaches this address can use "
        "the model; set server.api_key, --api-key, --api-key-file or ARBOR_API_KEY",
        cfg.host);
  std::fflush(stdout);

  int sig = 0;
  sigwait(&signals, &sig);
  std::printf("arbor: %s received, draining (up to %.0f s)\n",
              sig == SIGTERM ? "SIGTERM" : "SIGINT", cfg.drain_timeout_s);
  std::fflush(stdout);
  http.set_draining();
#ifdef ARBOR_WITH_GRPC
  if (grpc) grpc->set_draining();
#endif
  const auto drain_deadline =
      std::chrono::steady_clock::now() +
      std::chrono::milliseconds(static_cast<int64_t>(cfg.drain_timeout_s * 1000));
  service.drain(std::chrono::duration_cast<std::chrono::milliseconds>(
      drain_deadline - std::chrono::steady_clock::now()));
  // The engine is done; the responses may still be on their way to slow clients: the listener
  // (and /health's 503) stays until their clients have acknowledged them.
  if (!http.wait_responses_delivered(drain_deadline))
    spdlog::warn(
        "drain deadline ({:.0f} s) reached with {} HTTP response(s) not yet received by their "
        "clients; closing their connections",
        cfg.drain_timeout_s, http.responses_in_flight());
  http.stop();
#ifdef ARBOR_WITH_GRPC
  if (grpc) grpc->shutdown();
#endif
  std::printf("arbor: stopped\n");
  return 0;
}

}  // namespace arbor
