// `arbor spec-bench`: acceptance and speed of speculation on a prompt set. Runs every prompt
// with the chosen proposer and again with plain decoding (same settings, same seeds), and
// prints one Markdown row: mean accepted length (tokens emitted per verify step), acceptance
// rate by tree depth, tokens/s with and without speculation, and whether greedy outputs were
// identical (they must be); then, for each run, the wall time per engine step split into the
// model's forward, the proposer's drafting and feedback, and the rest. An untimed warm-up of
// both modes on the first batch of prompts (--warmup-tokens) goes first, then (after the cost
// probe, which drops step graphs) untimed full rounds (--warmup-rounds) where graphs are recorded.
#include <spdlog/spdlog.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <optional>
#include <string>
#include <tuple>

#include <nlohmann/json.hpp>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/runner/cost_probe.h"
#include "engine/runner/generator.h"
#include "engine/runner/model_bundle.h"
#include "engine/scheduler/cost_model.h"
#include "engine/spec/medusa_proposer.h"
#include "server/cli_commands.h"

namespace arbor {

void add_spec_bench_command(CLI::App& app, SpecBenchOptions* o) {
  CLI::App* c = app.add_subcommand("spec-bench", "Measure speculation acceptance and speed");
  c->add_option("--model,-m", o->model, "Model path")->required();
  c->add_option("--tokenizer", o->tokenizer, "Tokenizer file");
  c->add_option("--prompts", o->prompts,
                "Prompt file: JSONL with a \"text\" field per line, or plain text lines")
      ->required();
  c->add_option("--limit", o->limit, "Use the first N prompts (0: all)");
  c->add_option("--max-tokens", o->max_tokens, "Tokens per prompt")->check(CLI::PositiveNumber);
  c->add_option("--temperature", o->temperature, "0 = greedy");
  c->add_option("--seed", o->seed, "Base seed (prompt i uses seed + i)");
  c->add_option("--batch", o->batch, "Requests decoding at once")->check(CLI::PositiveNumber);
  c->add_option("--threads", o->threads, "BLAS threads (0: default)");
  c->add_option("--tensor-parallel", o->tensor_parallel,
                "Tensor-parallel ranks: GPUs 0..N-1 over NCCL (cuda), threads (cpu)")
      ->capture_default_str();
  c->add_option("--backend", o->backend, "cpu | cuda")->capture_default_str();
  c->add_option("--spec", o->spec, "ngram | medusa | eagle | eagle3")->required();
  c->add_option("--spec-heads", o->spec_config.head_path, "Head checkpoint directory");
  c->add_option("--spec-tree", o->spec_config.tree, "Medusa static tree");
  c->add_option("--spec-total-tokens", o->spec_config.total_tokens, "EAGLE tree nodes");
  c->add_option("--spec-depth", o->spec_config.depth, "EAGLE draft steps");
  c->add_option("--spec-top-k", o->spec_config.top_k, "EAGLE children per node");
  c->add_option("--spec-token-map", o->spec_config.token_map,
                "EAGLE-1/2 draft vocabulary: token map file ('none': all; default: the heads' "
                "token_map.json when present)");
  c->add_option("--spec-draft-vocab", o->spec_config.draft_vocab,
                "EAGLE-1/2: the token map's first N ids (0: all)")
      ->check(CLI::NonNegativeNumber);
  c->add_option("--spec-grow-on-device", o->spec_config.grow_on_device,
                "EAGLE trees grown on the draft's backend: -1 auto (on a GPU), 0 no "
                "(depth by depth on the host), 1 yes")
      ->check(CLI::Range(-1, 1))
      ->capture_default_str();
  c->add_option("--spec-pick-on-device", o->spec_config.pick_on_device,
                "EAGLE trees grown on the device also picked there (the verify step reads "
                "them; no wait for the draft): -1 auto (on a GPU), 0 no (downloaded, picked "
                "on the host), 1 yes")
      ->check(CLI::Range(-1, 1))
      ->capture_default_str();
  c->add_option("--spec-paths-on-device", o->spec_config.paths_on_device,
                "EAGLE, Medusa: each verify step's accepted paths run through the draft (the "
                "heads) from the step's device results, before the host waits for them: -1 "
                "auto (on a GPU), 0 no (after the wait, from the host's copy), 1 yes")
      ->check(CLI::Range(-1, 1))
      ->capture_default_str();
  c->add_option("--spec-grow-before-wait", o->spec_config.grow_before_wait,
                "EAGLE with the paths on the device: the next step's trees also grow before "
                "the host waits (the path's length read on the device), taken when the next "
                "step's requests and budgets are the same: -1 auto (on a GPU), 0 no (the "
                "default), 1 yes")
      ->check(CLI::Range(-1, 1))
      ->capture_default_str();
  c->add_option("--spec-max-nodes", o->max_tree_nodes, "Largest tree verified in one step");
  c->add_flag("--no-bos", o->no_bos, "Do not prepend BOS (chat-rendered prompts carry it)");
  c->add_flag("--skip-plain", o->skip_plain, "Measure acceptance only (no plain baseline)");
  c->add_option("--warmup-tokens", o->warmup_tokens,
                "Before timing, run the first batch of prompts for this many tokens with "
                "speculation and without (GEMM tuning, first step graphs); 0: no warm-up")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  c->add_option("--warmup-rounds", o->warmup_rounds,
                "Then (after --cost-model measure's probe) untimed full rounds of both modes: a "
                "step shape seen once per round runs eagerly the first time and is recorded the "
                "second, so the timed rounds replay every shape as a long-running server does; "
                "-1: 2 where the model records step graphs, else 0")
      ->check(CLI::Range(-1, 100))
      ->capture_default_str();
  c->add_option("--rounds", o->rounds,
                "Timed rounds of both modes (each a full pass over the prompts, speculative then "
                "plain); tok/s and the speedup are the medians over the rounds, the breakdown "
                "lines the last round's")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  c->add_option("--draft-graphs", o->draft_graphs,
                "Whether the draft's own GPU backend records step graphs (A/B runs)")
      ->capture_default_str();
  c->add_flag("--plain-first", o->plain_first,
              "Run plain decoding before the speculative run in the warm-up and in each round "
              "(default: speculative first)");
  c->add_flag("--fresh-policy", o->fresh_policy,
              "Start every speculative run's tree policy from nothing (by default the timed "
              "runs start from what it learned in the --warmup-rounds, as a server that has "
              "served a while)");
  c->add_flag("--no-spec-warmup", o->no_spec_warmup,
              "Warm up plain decoding only (with --plain-first the first plain round then runs "
              "before any speculative step; the first speculative round pays its one-time "
              "costs)");
  c->add_flag("--plain-after-release", o->plain_after_release,
              "After the rounds, free the proposer and its draft backend and time one more "
              "plain pass");
  c->add_option("--node-stats", o->node_stats,
                "Write, per tree node, the steps that offered it and those that accepted it "
                "(JSON, with Medusa's static tree paths) to this file");
  c->add_flag("--gemm-report", o->gemm_report,
              "Print the target backend's run-time choices per weight shape (the CUDA backend's "
              "tuned GEMM algorithms)");
  c->add_flag("--time-graphs", o->time_graphs,
              "Time the target's and the draft's step-graph replays on the device (events around "
              "each) and the device's time between them (its waits for the host); print their "
              "means beside each run's forward times");
  c->add_flag("--host-sampling", o->host_sampling,
              "Download logits and sample / verify on the host (default: on the backend)");
  c->add_option("--pad-trees", o->pad_trees,
                "Pad trees for step graphs (n-gram's varying trees; with --adaptive-trees every "
                "decode step's token count to a bucket): -1 auto (with graphs), 0, 1")
      ->check(CLI::Range(-1, 1))
      ->capture_default_str();
  c->add_flag("--adaptive-trees", o->adaptive_trees,
              "Size each request's tree per step from the cost model and measured acceptance "
              "(as arbor serve does with speculation.adaptive)");
  c->add_option("--cost-model", o->cost_model,
                "Verify-cost curve (JSON, configs/verify_cost_*.json) for --adaptive-trees, or "
                "'measure': measure this model's curve before the timed runs");
}

namespace {

// --node-stats: how often each tree node was on the accepted path, with the static tree's paths
// (Medusa) so that scripts/medusa_tree_from_stats.py can pick the best subtree of any size.
void write_node_stats(const SpecBenchOptions& o, const AcceptanceStats& acc,
                      const Proposer* proposer) {
  nlohmann::json j;
  j["spec"] = o.spec;
  j["temperature"] = o.temperature;
  j["prompts"] = o.prompts;
  j["steps"] = acc.steps;
  j["on_path"] = acc.on_path;
  j["in_tree"] = acc.in_tree();
  j["paths"] = nullptr;
  if (const auto* medusa = dynamic_cast<const MedusaProposer*>(proposer)) {
    j["tree"] = medusa->tree().name;
    j["paths"] = medusa->tree().path;
  }
  std::ofstream f(o.node_stats);
  if (!f) throw_error(ErrorCode::kInvalidArgument, "--node-stats: cannot write " + o.node_stats);
  f << j.dump() << "\n";
  std::printf("node stats: %lld steps, %zu nodes -> %s\n", static_cast<long long>(acc.steps),
              acc.on_path.size(), o.node_stats.c_str());
}

std::vector<std::string> read_prompts(const std::string& path, int32_t limit) {
  std::ifstream f(path);
  if (!f) throw_error(ErrorCode::kNotFound, "cannot open prompt file " + path);
  std::vector<std::string> out;
  std::string line;
  int lineno = 0;
  while (std::getline(f, line)) {
    ++lineno;
    if (line.empty()) continue;
    if (line[0] == '{') {
      const auto j = nlohmann::json::parse(line, nullptr, false);
      if (j.is_discarded() || !j.contains("text") || !j["text"].is_string())
        throw_error(ErrorCode::kInvalidArgument,
                    path + ":" + std::to_string(lineno) + ": expected a JSON object with \"text\"");
      out.push_back(j["text"].get<std::string>());
    } else {
      out.push_back(line);
    }
    if (limit > 0 && static_cast<int32_t>(out.size()) >= limit) break;
  }
  if (out.empty()) throw_error(ErrorCode::kInvalidArgument, "no prompts in " + path);
  return out;
}

}  // namespace

int run_spec_bench(const SpecBenchOptions& o) {
  SpecConfig sc = o.spec_config;
  sc.method = parse_spec_method(o.spec);
  sc.validate();
  check_spec_for_model(o.model, sc.method);
  if (!o.node_stats.empty() && !std::ofstream(o.node_stats))  // before the runs, not after
    throw_error(ErrorCode::kInvalidArgument, "--node-stats: cannot write " + o.node_stats);
  ModelBundle bundle;
  std::unique_ptr<Backend> backend;
  std::unique_ptr<Proposer> proposer;
  auto model = load_for_cli(o.model, o.tokenizer, o.backend, o.threads, o.tensor_parallel, &bundle,
                            &backend, [&](const ModelWeights& w) {
                              auto draft = make_draft_backend(o.backend, *backend, o.draft_graphs);
                              if (draft != nullptr && o.time_graphs) draft->set_graph_timing(true);
                              proposer = make_proposer(sc, w, std::move(draft));
                            });
  if (const std::string line = draft_vocab_line(sc, proposer.get()); !line.empty())
    std::printf("%s\n", line.c_str());
  const auto texts = read_prompts(o.prompts, o.limit);
  std::vector<GenerationRequest> reqs;
  for (size_t i = 0; i < texts.size(); ++i) {
    GenerationRequest r;
    r.prompt = bundle.tokenizer->encode(texts[i], !o.no_bos, /*parse_special=*/true);
    r.sampling.temperature = o.temperature;
    r.sampling.seed = static_cast<uint64_t>(o.seed) + i;
    r.max_tokens = o.max_tokens;
    r.stop_token_ids = bundle.stop_token_ids;
    reqs.push_back(std::move(r));
  }
  GeneratorConfig gc;
  gc.max_running = o.batch;
  gc.backend_sampling = !o.host_sampling;
  gc.pad_trees = o.pad_trees;
  gc.tree_budget.max_nodes = o.max_tree_nodes;
  gc.adaptive_trees = o.adaptive_trees;
  gc.set_cost_model(o.cost_model);
  const bool measure_cost = gc.measure_cost;  // measured once below, not by every Generator
  gc.measure_cost = false;
  int64_t longest = 0;
  for (const auto& r : reqs) longest = std::max<int64_t>(longest, r.prompt.size());
  gc.num_blocks = static_cast<int32_t>(
      o.batch * ((longest + o.max_tokens + o.max_tree_nodes) / gc.block_size + 2) + 16);

  if (o.time_graphs) model->backend().set_graph_timing(true);
  // Step graphs used by a run: the model's counters after it minus before. Host waits and bytes
  // copied by a run: target and draft backends together in *x, the draft's share in *dx.
  using Timings = LlamaModel::ForwardTimings;
  std::optional<Scheduler::PolicyState> learned;  // see the warm-up rounds below
  auto timed = [&](Proposer* p, GeneratorStats* st, StepGraphStats* g, TransferStats* x,
                   Timings* ft, TransferStats* dx = nullptr) {
    const auto draft_stats = [&] {
      return p != nullptr ? p->draft_transfer_stats() : TransferStats{};
    };
    const StepGraphStats g0 = model->step_graph_stats();
    const TransferStats t0 = model->backend().transfer_stats(), d0 = draft_stats();
    const Timings f0 = model->forward_timings();
    Generator gen(*model, gc, p);
    if (p != nullptr && learned) gen.engine().restore_policy_state(*learned);
    const auto start = std::chrono::steady_clock::now();
    auto res = gen.run(reqs);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    *st = gen.stats();
    const StepGraphStats g1 = model->step_graph_stats();
    g->eager = g1.eager - g0.eager;
    g->captures = g1.captures - g0.captures;
    g->replays = g1.replays - g0.replays;
    g->evictions = g1.evictions - g0.evictions;
    const TransferStats draft = draft_stats() - d0;
    *x = (model->backend().transfer_stats() - t0) + draft;
    if (dx != nullptr) *dx = draft;
    *ft = model->forward_timings() - f0;
    return std::make_pair(std::move(res), secs);
  };
  // Untimed runs of both modes in the rounds' order; the speculative one starts from the tree
  // policy's learned state, and with `learn` leaves its own there (unless --fresh-policy).
  const auto untimed = [&](const std::vector<GenerationRequest>& rs, bool learn) {
    if (o.plain_first && !o.skip_plain) Generator(*model, gc, nullptr).run(rs);
    if (!o.no_spec_warmup) {
      Generator warm(*model, gc, proposer.get());
      if (learned) warm.engine().restore_policy_state(*learned);
      warm.run(rs);
      if (learn && !o.fresh_policy) learned = warm.engine().policy_state();
    }
    if (!o.plain_first && !o.skip_plain) Generator(*model, gc, nullptr).run(rs);
  };
  // Warm-up, untimed: the first use of each GEMM shape tunes its algorithm and the first
  // sightings of a step shape record its graph. Without it those one-time costs land in
  // whichever timed run goes first (the speculative one).
  if (o.warmup_tokens > 0) {
    std::vector<GenerationRequest> warm(
        reqs.begin(), reqs.begin() + std::min<size_t>(reqs.size(), static_cast<size_t>(o.batch)));
    for (auto& r : warm) r.max_tokens = std::min(o.warmup_tokens, o.max_tokens);  // fits the KV
    untimed(warm, /*learn=*/false);
  }
  if (measure_cost) {  // once, after the warm-up tuned the GEMMs; every run plans with it
    model->allocate_kv(model->kv_shape(gc.num_blocks, gc.block_size));
    const auto t0 = std::chrono::steady_clock::now();
    gc.cost.curves =
        measure_verify_cost(*model, proposer.get(), CostProbeOptions{}, gc.max_step_tokens,
                            gc.max_running, gc.tree_budget.max_nodes);
    std::printf("verify cost measured in %.2f s (total tokens -> ms): %s\n",
                std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(),
                format_cost_curves(gc.cost.curves).c_str());
  }
  // Full untimed rounds (the probe above drops the warm-up's recordings): the timed rounds
  // then measure the steady state, not the recording of shapes the short warm-up missed.
  const int32_t warmup_rounds =
      o.warmup_rounds >= 0 ? o.warmup_rounds : (model->step_graphs() ? 2 : 0);
  // The tree policy's state learned there (acceptance, drafting cost, the cost model's
  // corrections) is where each timed speculative run starts, as a server's engine that has
  // served a while does (--fresh-policy: from nothing, every run).
  for (int32_t round = 0; round < warmup_rounds; ++round) untimed(reqs, /*learn=*/true);
  GeneratorStats spec_stats, plain_stats;
  StepGraphStats spec_graphs, plain_graphs;
  TransferStats spec_x, plain_x, spec_draft_x;
  Timings spec_ft, plain_ft;
  std::vector<GenerationResult> spec_res, plain_res;
  double spec_secs = 0, plain_secs = 0;
  // Per round: tokens per second of each mode and their ratio (the reported figures are the
  // medians; the breakdown below is the last round's).
  std::vector<double> spec_rates, plain_rates, speedups;
  const auto total_tokens = [](const std::vector<GenerationResult>& res) {
    int64_t n = 0;
    for (const GenerationResult& r : res) n += static_cast<int64_t>(r.tokens.size());
    return static_cast<double>(n);
  };
  for (int32_t round = 0; round < o.rounds; ++round) {
    const auto run_plain = [&] {
      std::tie(plain_res, plain_secs) =
          timed(nullptr, &plain_stats, &plain_graphs, &plain_x, &plain_ft);
      plain_rates.push_back(total_tokens(plain_res) / plain_secs);
    };
    if (o.plain_first && !o.skip_plain) run_plain();
    std::tie(spec_res, spec_secs) =
        timed(proposer.get(), &spec_stats, &spec_graphs, &spec_x, &spec_ft, &spec_draft_x);
    spec_rates.push_back(total_tokens(spec_res) / spec_secs);
    if (o.skip_plain) continue;
    if (!o.plain_first) run_plain();
    speedups.push_back(spec_rates.back() / plain_rates.back());
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    const size_t n = v.size();
    return n == 0 ? 0.0 : n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
  };

  AcceptanceStats acc;
  int64_t identical = 0;
  for (size_t i = 0; i < reqs.size(); ++i) {
    acc.merge(spec_res[i].acceptance);
    if (!o.skip_plain) identical += spec_res[i].tokens == plain_res[i].tokens;
  }
  std::string by_depth;
  for (size_t d = 0; d < acc.offered.size() && d < 8; ++d)
    by_depth +=
        (d ? " " : "") + std::to_string(static_cast<int>(acc.acceptance_rate(d + 1) * 100 + 0.5));
  std::printf(
      "| method | prompts | temp | mean accepted length | acceptance %% by depth 1.. | tree "
      "nodes/verify | spec tok/s | plain tok/s | speedup | identical outputs |\n");
  std::printf("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n");
  const double spec_rate = median(spec_rates);
  char plain_cols[128] = "- | - | -";
  if (!o.skip_plain)
    std::snprintf(plain_cols, sizeof(plain_cols), "%.1f | %.2fx | %lld/%zu", median(plain_rates),
                  median(speedups), static_cast<long long>(identical), reqs.size());
  std::printf("| %s | %zu | %.2f | %.2f | %s | %.1f | %.1f | %s |\n", proposer->name().c_str(),
              reqs.size(), o.temperature, acc.mean_emitted_per_step(), by_depth.c_str(),
              double(spec_stats.tree_tokens) / std::max<int64_t>(acc.steps, 1), spec_rate,
              plain_cols);
  if (speedups.size() > 1) {
    std::string each;
    for (double x : speedups) each += (each.empty() ? "" : ", ") + std::to_string(x).substr(0, 5);
    std::printf("rounds: speedup %s (median %.2fx)\n", each.c_str(), median(speedups));
    std::string rates;
    for (size_t i = 0; i < speedups.size(); ++i)
      rates += (i ? ", " : "") + std::to_string(static_cast<int>(spec_rates[i])) + " / " +
               std::to_string(static_cast<int>(plain_rates[i]));
    std::printf("rounds: spec / plain tok/s %s\n", rates.c_str());
  }
  // Where the wall time went, per engine step (a verify step with speculation): the model's
  // forward (set_step, the device ops, sampling / verification, downloads), the proposer's
  // drafting and feedback, and the rest (scheduling, tree bookkeeping, detokenising).
  auto graph_words = [](const StepGraphStats& g) {
    char buf[160];
    std::snprintf(buf, sizeof(buf),
                  "step graphs: %lld replayed, %lld recorded, %lld eager, %lld evicted, %lld "
                  "invalidated, %lld failed",
                  static_cast<long long>(g.replays), static_cast<long long>(g.captures),
                  static_cast<long long>(g.eager), static_cast<long long>(g.evictions),
                  static_cast<long long>(g.invalidations),
                  static_cast<long long>(g.capture_failures));
    return std::string(buf);
  };
  auto breakdown = [&](const char* what, const GeneratorStats& st, double secs,
                       const StepGraphStats& g, const TransferStats& x, const Timings& ft,
                       const TransferStats& dx = {}) {
    const double steps = static_cast<double>(std::max<int64_t>(st.steps, 1));
    const double fwd = st.decode_seconds + st.mixed_seconds + st.prefill_seconds;
    const double other = secs - fwd - st.draft_seconds - st.feedback_seconds;
    std::printf(
        "%s: %lld steps, per step %.3f ms = forward %.3f + draft %.3f + feedback %.3f + other "
        "%.3f; %s\n",
        what, static_cast<long long>(st.steps), secs / steps * 1e3, fwd / steps * 1e3,
        st.draft_seconds / steps * 1e3, st.feedback_seconds / steps * 1e3, other / steps * 1e3,
        graph_words(g).c_str());
    if (st.draft_device_seconds > 0)  // trees picked on the device: the draft did not wait
      std::printf("%s draft on the device: %.3f ms per step (inside the forward's wait)\n", what,
                  st.draft_device_seconds / steps * 1e3);
    // The engine's host stages in "other" (EngineStats::stage_seconds); the rest is outside
    // the engine's step (the generator's event handling, stop checks).
    const EngineStats::Stages& sg = st.stage_seconds;
    std::printf(
        "%s other: per step %.3f ms plan + %.3f trees + %.3f reserve + %.3f inputs + %.3f "
        "verify + %.3f commit + %.3f learn + %.3f outside the engine step\n",
        what, sg.plan / steps * 1e3, sg.trees / steps * 1e3, sg.reserve / steps * 1e3,
        sg.inputs / steps * 1e3, sg.verify / steps * 1e3, sg.commit / steps * 1e3,
        sg.learn / steps * 1e3, (other - sg.sum()) / steps * 1e3);
    // The device probe: host waits and bytes per step, target and draft backends together.
    std::printf(
        "%s transfers: per step %.2f host syncs, %.1f KB device->host, %.1f KB "
        "host->device\n",
        what, x.syncs / steps, x.d2h_bytes / steps / 1024, x.h2d_bytes / steps / 1024);
    // --time-graphs: the target's step graphs, then the draft's (EAGLE), on the device.
    const auto device_time = [&](const char* whose, const TransferStats& t) {
      if (t.graphs_timed > 0)
        std::printf(
            "%s %s step graphs on the device: %.3f ms per replay, %.3f ms per step (%lld "
            "timed)\n",
            what, whose, t.graph_device_ms / static_cast<double>(t.graphs_timed),
            t.graph_device_ms / steps, static_cast<long long>(t.graphs_timed));
      // The device's time before them since the timed replay before: where it waits for the
      // host (or runs ops outside the graphs) in a step.
      if (t.graph_gaps_same + t.graph_gaps_other > 0)
        std::printf(
            "%s %s step graphs: the device before them %.3f ms per step after the other "
            "backend's (%lld gaps, %.3f ms each), %.3f after its own (%lld, %.3f each)\n",
            what, whose, t.graph_gap_other_ms / steps, static_cast<long long>(t.graph_gaps_other),
            t.graph_gap_other_ms / std::max<double>(1, static_cast<double>(t.graph_gaps_other)),
            t.graph_gap_same_ms / steps, static_cast<long long>(t.graph_gaps_same),
            t.graph_gap_same_ms / std::max<double>(1, static_cast<double>(t.graph_gaps_same)));
    };
    device_time("target", x - dx);
    device_time("draft", dx);
    // The host's time in each step-graph launch (cudaGraphLaunch), target and draft.
    const auto launch_time = [&](const char* whose, const TransferStats& t) {
      if (t.graph_launches > 0)
        std::printf("%s %s step-graph launches: %.3f ms host each, %.3f ms per step (%lld)\n", what,
                    whose, t.graph_launch_host_ms / static_cast<double>(t.graph_launches),
                    t.graph_launch_host_ms / steps, static_cast<long long>(t.graph_launches));
    };
    launch_time("target", x - dx);
    launch_time("draft", dx);
    // The forward's host phases (LlamaModel::ForwardTimings): the device's time is in the
    // finish, which ends with the wait for it.
    const double fs = static_cast<double>(std::max<int64_t>(ft.steps, 1));
    std::printf(
        "%s forward: per forward %.3f ms set_step (metadata built and uploaded) + %.3f launch + "
        "%.3f finish (sampling, downloads, the wait for the device)\n",
        what, ft.set_step_s / fs * 1e3, ft.launch_s / fs * 1e3, ft.finish_s / fs * 1e3);
    // The replayed steps alone (the averages above include prefill steps and warm-ups, whose
    // ops launch one by one).
    if (ft.replayed_steps == 0) return;
    const double rs = static_cast<double>(ft.replayed_steps);
    std::printf(
        "%s forward, %lld replayed: per forward %.3f ms launch (%.3f of it the graph key: the "
        "attention plan built and uploaded) + %.3f finish\n",
        what, static_cast<long long>(ft.replayed_steps), ft.replayed_launch_s / rs * 1e3,
        ft.replayed_key_s / rs * 1e3, ft.replayed_finish_s / rs * 1e3);
  };
  breakdown("spec", spec_stats, spec_secs, spec_graphs, spec_x, spec_ft, spec_draft_x);
  // The draft model's own recordings (EAGLE), warm-up included.
  const StepGraphStats dg = proposer->draft_graph_stats();
  if (dg.captures + dg.replays + dg.eager > 0) std::printf("draft: %s\n", graph_words(dg).c_str());
  if (!o.skip_plain) breakdown("plain", plain_stats, plain_secs, plain_graphs, plain_x, plain_ft);
  if (!o.node_stats.empty()) write_node_stats(o, acc, proposer.get());
  if (o.gemm_report) std::printf("target choices:\n%s", model->backend().tuning_report().c_str());
  if (o.plain_after_release && !o.skip_plain) {
    // The proposer and its draft backend (memory, streams, recorded graphs) freed, then one
    // more timed plain pass: whether what the speculative runs left behind on the draft's side
    // is what a later plain run pays for.
    proposer.reset();
    std::vector<GenerationResult> res;
    double secs = 0;
    Timings ft;
    std::tie(res, secs) = timed(nullptr, &plain_stats, &plain_graphs, &plain_x, &ft);
    std::printf("plain after the draft was released: %.1f tok/s (rounds' median %.1f)\n",
                total_tokens(res) / secs, median(plain_rates));
    breakdown("plain after release", plain_stats, secs, plain_graphs, plain_x, ft);
  }
  return 0;
}

}  // namespace arbor
