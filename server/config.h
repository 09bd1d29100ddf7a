// `arbor serve` configuration: one YAML file (configs/*.yaml) with command-line overrides,
// validated with messages that name the field, and echoed at start-up.
#pragma once

#include <cstdint>
#include <string>

namespace arbor {

struct ServeConfig {
  // model
  std::string model_path;
  std::string tokenizer_path;
  std::string model_name;     // served id; default: the file or directory name
  std::string chat_template;  // Jinja file overriding the tokenizer's template
  std::string backend = "cpu";
  int32_t threads = 0;
  // Ranks of a tensor-parallel group (GPUs 0..N-1 over NCCL on the CUDA backend; threads on the
  // CPU backend), docs/tensor_parallel.md.
  int32_t tensor_parallel = 1;
  // CUDA backend: replay recorded CUDA graphs for steady-state decode / verify steps
  // (CudaBackendOptions::cuda_graphs, docs/kernels.md "CUDA graphs"); ignored on the CPU.
  bool cuda_graphs = true;
  // engine
  int32_t kv_blocks = 0;                // 0: sized from gpu_memory_utilization (runner/kv_sizing.h)
  double gpu_memory_utilization = 0.9;  // of device memory; of available host memory on the CPU
  int32_t block_size = 16;
  int32_t max_step_tokens = 512;
  int32_t max_running = 64;
  bool prefix_caching = true;
  // speculation
  std::string spec_method = "off";  // off | ngram | medusa | eagle | eagle3
  std::string spec_heads;
  std::string spec_tree = "mc_sim_7b_63";
  int32_t spec_total_tokens = 60;
  int32_t spec_depth = 5;
  int32_t spec_top_k = 10;
  std::string spec_token_map;    // EAGLE-1/2 draft vocabulary file; "" = the heads' token_map.json
                                 // when present, "none" = the whole vocabulary
  int32_t spec_draft_vocab = 0;  // the token map's first N ids (0: all)
  int32_t spec_max_nodes = 64;
  bool spec_adaptive = true;
  std::string spec_cost_model;  // JSON curve (configs/verify_cost_*.json), "measure" (at
                                // start-up, runner/cost_probe.h); empty: learned online
  // server
  std::string host = "127.0.0.1";
  int32_t port = 8000;
  int32_t grpc_port = 50051;  // 0: no gRPC
  std::string api_key;
  std::string api_key_file;  // a file holding the key (a mounted secret); not with api_key
  int64_t max_body_bytes = 1 << 20;
  int32_t max_prompt_tokens = 0;  // 0: the context length - 1
  int32_t max_queue = 256;
  int32_t http_threads = 128;
  double drain_timeout_s = 30;
  int32_t default_max_tokens = 256;

  // Throws arbor::Error(kInvalidArgument) naming the field ("server.port: 70000 is outside
  // [0, 65535]").
  void validate() const;
  // The effective configuration as YAML (the API key masked).
  std::string to_yaml() const;
};

// The key in server.api_key_file: the file's text without trailing whitespace (secret files
// usually end in a newline). Throws naming the field when the file cannot be read or is empty.
std::string read_api_key_file(const std::string& path);

// Whether `host` binds loopback only (localhost, 127.0.0.0/8, ::1): anything else is reachable
// from other machines, which serve warns about when no API key is set.
bool is_loopback_host(const std::string& host);

// Reads a YAML file over `base` (fields absent from the file keep base's values). Unknown
// fields and wrong types are errors naming the file and the field.
ServeConfig load_serve_config(const std::string& path, ServeConfig base = {});

}  // namespace arbor
