#include "server/config.h"

#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "engine/core/error.h"

namespace arbor {

namespace {

[[noreturn]] void invalid(const std::string& field, const std::string& msg) {
  throw_error(ErrorCode::kInvalidArgument, field + ": " + msg);
}

void range(const std::string& field, int64_t v, int64_t lo, int64_t hi) {
  if (v < lo || v > hi)
    invalid(field, std::to_string(v) + " is outside [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "]");
}

// Field table: YAML path -> reader into the config.
using Reader = std::function<void(const YAML::Node&, ServeConfig&)>;

template <typename T>
Reader field(T ServeConfig::*member, const char* type) {
  return [member, type](const YAML::Node& n, ServeConfig& c) {
    if (!n.IsScalar()) throw std::runtime_error(std::string("expected ") + type);
    c.*member = n.as<T>();
  };
}

const std::map<std::string, Reader>& fields() {
  static const std::map<std::string, Reader> f = {
      {"model.path", field(&ServeConfig::model_path, "a string")},
      {"model.tokenizer", field(&ServeConfig::tokenizer_path, "a string")},
      {"model.name", field(&ServeConfig::model_name, "a string")},
      {"model.chat_template", field(&ServeConfig::chat_template, "a string")},
      {"model.backend", field(&ServeConfig::backend, "a string")},
      {"model.threads", field(&ServeConfig::threads, "an integer")},
      {"model.tensor_parallel", field(&ServeConfig::tensor_parallel, "an integer")},
      {"model.cuda_graphs", field(&ServeConfig::cuda_graphs, "a boolean")},
      {"engine.kv_blocks", field(&ServeConfig::kv_blocks, "an integer")},
      {"engine.gpu_memory_utilization", field(&ServeConfig::gpu_memory_utilization, "a number")},
      {"engine.block_size", field(&ServeConfig::block_size, "an integer")},
      {"engine.max_step_tokens", field(&ServeConfig::max_step_tokens, "an integer")},
      {"engine.max_running", field(&ServeConfig::max_running, "an integer")},
      {"engine.prefix_caching", field(&ServeConfig::prefix_caching, "a boolean")},
      {"speculation.method", field(&ServeConfig::spec_method, "a string")},
      {"speculation.heads", field(&ServeConfig::spec_heads, "a string")},
      {"speculation.tree", field(&ServeConfig::spec_tree, "a string")},
      {"speculation.total_tokens", field(&ServeConfig::spec_total_tokens, "an integer")},
      {"speculation.depth", field(&ServeConfig::spec_depth, "an integer")},
      {"speculation.top_k", field(&ServeConfig::spec_top_k, "an integer")},
      {"speculation.token_map", field(&ServeConfig::spec_token_map, "a string")},
      {"speculation.draft_vocab", field(&ServeConfig::spec_draft_vocab, "an integer")},
      {"speculation.max_nodes", field(&ServeConfig::spec_max_nodes, "an integer")},
      {"speculation.adaptive", field(&ServeConfig::spec_adaptive, "a boolean")},
      {"speculation.cost_model", field(&ServeConfig::spec_cost_model, "a string")},
      {"server.host", field(&ServeConfig::host, "a string")},
      {"server.port", field(&ServeConfig::port, "an integer")},
      {"server.grpc_port", field(&ServeConfig::grpc_port, "an integer")},
      {"server.api_key", field(&ServeConfig::api_key, "a string")},
      {"server.api_key_file", field(&ServeConfig::api_key_file, "a string")},
      {"server.max_body_bytes", field(&ServeConfig::max_body_bytes, "an integer")},
      {"server.max_prompt_tokens", field(&ServeConfig::max_prompt_tokens, "an integer")},
      {"server.max_queue", field(&ServeConfig::max_queue, "an integer")},
      {"server.http_threads", field(&ServeConfig::http_threads, "an integer")},
      {"server.drain_timeout_s", field(&ServeConfig::drain_timeout_s, "a number")},
      {"server.default_max_tokens", field(&ServeConfig::default_max_tokens, "an integer")},
  };
  return f;
}

void walk(const YAML::Node& node, const std::string& prefix, const std::string& file,
          ServeConfig& c) {
  for (const auto& kv : node) {
    const std::string key = kv.first.as<std::string>();
    const std::string path = prefix.empty() ? key : prefix + "." + key;
    if (kv.second.IsMap()) {
      walk(kv.second, path, file, c);
      continue;
    }
    auto it = fields().find(path);
    if (it == fields().end()) {
      std::string known;
      for (const auto& [k, r] : fields()) known += (known.empty() ? "" : ", ") + k;
      invalid(file + ": " + path, "unknown field (known: " + known + ")");
    }
    if (kv.second.IsNull()) continue;
    try {
      it->second(kv.second, c);
    } catch (const std::exception& e) {
      invalid(file + ": " + path, "cannot read '" + YAML::Dump(kv.second) + "' (" + e.what() + ")");
    }
  }
}

}  // namespace

std::string read_api_key_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorCode::kNotFound, "server.api_key_file: cannot open '" + path + "'");
  std::stringstream text;
  text << in.rdbuf();
  std::string key = text.str();
  key.erase(key.find_last_not_of(" \t\r\n") + 1);  // npos + 1 == 0: all whitespace -> empty
  if (key.empty()) invalid("server.api_key_file", "'" + path + "' holds no key");
  return key;
}

bool is_loopback_host(const std::string& host) {
  return host == "localhost" || host.rfind("127.", 0) == 0 || host == "::1" || host == "[::1]";
}

ServeConfig load_serve_config(const std::string& path, ServeConfig base) {
  YAML::Node root;
  try {
    root = YAML::LoadFile(path);
  } catch (const YAML::BadFile&) {
    throw_error(ErrorCode::kNotFound, "config file " + path + " cannot be opened");
  } catch (const YAML::Exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "config file " + path + ": " + e.what());
  }
  if (root.IsNull()) return base;
  if (!root.IsMap()) invalid(path, "the top level must be a mapping");
  walk(root, "", path, base);
  return base;
}

void ServeConfig::validate() const {
  if (model_path.empty()) invalid("model.path", "no model given (set it or pass --model)");
  if (backend != "cpu" && backend != "cuda")
    invalid("model.backend", "'" + backend + "' is not cpu or cuda");
  range("model.threads", threads, 0, 1024);
  range("model.tensor_parallel", tensor_parallel, 1, 64);
  range("engine.kv_blocks", kv_blocks, 0, 1 << 24);
  if (!(gpu_memory_utilization > 0 && gpu_memory_utilization <= 1))
    invalid("engine.gpu_memory_utilization",
            std::to_string(gpu_memory_utilization) + " is outside (0, 1]");
  range("engine.block_size", block_size, 1, 1024);
  range("engine.max_step_tokens", max_step_tokens, 1, 1 << 20);
  range("engine.max_running", max_running, 1, 1 << 16);
  if (spec_method != "off" && spec_method != "ngram" && spec_method != "medusa" &&
      spec_method != "eagle" && spec_method != "eagle3")
    invalid("speculation.method",
            "'" + spec_method + "' is not one of off, ngram, medusa, eagle, eagle3");
  if ((spec_method == "medusa" || spec_method == "eagle" || spec_method == "eagle3") &&
      spec_heads.empty())
    invalid("speculation.heads", "speculation.method " + spec_method + " needs the heads' path");
  range("speculation.total_tokens", spec_total_tokens, 1, 1024);
  range("speculation.depth", spec_depth, 0, 64);
  range("speculation.top_k", spec_top_k, 1, 1024);
  range("speculation.draft_vocab", spec_draft_vocab, 0, 1 << 24);
  range("speculation.max_nodes", spec_max_nodes, 1, 1024);
  if (spec_max_nodes > max_step_tokens)
    invalid("speculation.max_nodes", std::to_string(spec_max_nodes) +
                                         " exceeds engine.max_step_tokens (" +
                                         std::to_string(max_step_tokens) + ")");
  if (host.empty()) invalid("server.host", "must not be empty");
  range("server.port", port, 0, 65535);
  range("server.grpc_port", grpc_port, 0, 65535);
  if (!api_key.empty() && !api_key_file.empty())
    invalid("server.api_key_file", "'" + api_key_file + "' given beside server.api_key; set one");
  range("server.max_body_bytes", max_body_bytes, 1024, int64_t{1} << 32);
  range("server.max_prompt_tokens", max_prompt_tokens, 0, 1 << 24);
  range("server.max_queue", max_queue, 0, 1 << 20);
  range("server.http_threads", http_threads, 4, 4096);
  if (!(drain_timeout_s >= 0 && drain_timeout_s <= 3600))
    invalid("server.drain_timeout_s", std::to_string(drain_timeout_s) + " is outside [0, 3600]");
  range("server.default_max_tokens", default_max_tokens, 1, 1 << 24);
}

std::string ServeConfig::to_yaml() const {
  YAML::Emitter e;
  e << YAML::BeginMap;
  e << YAML::Key << "model" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "path" << YAML::Value << model_path;
  e << YAML::Key << "tokenizer" << YAML::Value << tokenizer_path;
  e << YAML::Key << "name" << YAML::Value << model_name;
  e << YAML::Key << "chat_template" << YAML::Value << chat_template;
  e << YAML::Key << "backend" << YAML::Value << backend;
  e << YAML::Key << "threads" << YAML::Value << threads;
  e << YAML::Key << "tensor_parallel" << YAML::Value << tensor_parallel;
  e << YAML::Key << "cuda_graphs" << YAML::Value << cuda_graphs << YAML::EndMap;
  e << YAML::Key << "engine" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "kv_blocks" << YAML::Value << kv_blocks;
  e << YAML::Key << "gpu_memory_utilization" << YAML::Value << gpu_memory_utilization;
  e << YAML::Key << "block_size" << YAML::Value << block_size;
  e << YAML::Key << "max_step_tokens" << YAML::Value << max_step_tokens;
  e << YAML::Key << "max_running" << YAML::Value << max_running;
  e << YAML::Key << "prefix_caching" << YAML::Value << prefix_caching << YAML::EndMap;
  e << YAML::Key << "speculation" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "method" << YAML::Value << spec_method;
  e << YAML::Key << "heads" << YAML::Value << spec_heads;
  e << YAML::Key << "tree" << YAML::Value << spec_tree;
  e << YAML::Key << "total_tokens" << YAML::Value << spec_total_tokens;
  e << YAML::Key << "depth" << YAML::Value << spec_depth;
  e << YAML::Key << "top_k" << YAML::Value << spec_top_k;
  e << YAML::Key << "token_map" << YAML::Value << spec_token_map;
  e << YAML::Key << "draft_vocab" << YAML::Value << spec_draft_vocab;
  e << YAML::Key << "max_nodes" << YAML::Value << spec_max_nodes;
  e << YAML::Key << "adaptive" << YAML::Value << spec_adaptive;
  e << YAML::Key << "cost_model" << YAML::Value << spec_cost_model << YAML::EndMap;
  e << YAML::Key << "server" << YAML::Value << YAML::BeginMap;
  e << YAML::Key << "host" << YAML::Value << host;
  e << YAML::Key << "port" << YAML::Value << port;
  e << YAML::Key << "grpc_port" << YAML::Value << grpc_port;
  e << YAML::Key << "api_key" << YAML::Value << (api_key.empty() ? "" : "<set>");
  e << YAML::Key << "api_key_file" << YAML::Value << api_key_file;
  e << YAML::Key << "max_body_bytes" << YAML::Value << max_body_bytes;
  e << YAML::Key << "max_prompt_tokens" << YAML::Value << max_prompt_tokens;
  e << YAML::Key << "max_queue" << YAML::Value << max_queue;
  e << YAML::Key << "http_threads" << YAML::Value << http_threads;
  e << YAML::Key << "drain_timeout_s" << YAML::Value << drain_timeout_s;
  e << YAML::Key << "default_max_tokens" << YAML::Value << default_max_tokens << YAML::EndMap;
  e << YAML::EndMap;
  return e.c_str();
}

}  // namespace arbor
