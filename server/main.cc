// `arbor`: the command line. Subcommands: generate (stream text from a model), bench (CPU/GPU
// tokens per second), spec-bench, serve (the OpenAI-compatible HTTP + gRPC server).
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>
#include <CLI/CLI.hpp>

#include <cstdio>

#include "engine/core/error.h"
#include "server/cli_commands.h"

int main(int argc, char** argv) {
  // Logs go to stderr: stdout carries what a command produces (`arbor generate`'s text).
  spdlog::set_default_logger(spdlog::stderr_color_mt("arbor"));
  CLI::App app{"arbor: speculative-decoding inference engine"};
  app.require_subcommand(1);
  arbor::GenerateOptions gen;
  arbor::add_generate_command(app, &gen);
  arbor::BenchOptions bench;
  arbor::add_bench_command(app, &bench);
  arbor::SpecBenchOptions spec_bench;
  arbor::add_spec_bench_command(app, &spec_bench);
  arbor::add_serve_command(app);
  CLI11_PARSE(app, argc, argv);
  try {
    if (app.got_subcommand("generate")) return arbor::run_generate(gen);
    if (app.got_subcommand("bench")) return arbor::run_bench(bench);
    if (app.got_subcommand("spec-bench")) return arbor::run_spec_bench(spec_bench);
    if (app.got_subcommand("serve")) return arbor::run_serve();
  } catch (const arbor::Error& e) {
    std::fprintf(stderr, "error (%s): %s\n", arbor::error_code_name(e.code()), e.what());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "error: %s\n", e.what());
    return 2;
  }
  return 0;
}
