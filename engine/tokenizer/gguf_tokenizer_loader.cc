// GGUF tokenizer.ggml.* metadata -> TokenizerSpec, with llama.cpp's defaults for missing keys.
#include <map>

#include "engine/core/error.h"
#include "engine/tokenizer/tokenizer_loaders.h"

namespace arbor {
namespace {

using nlohmann::json;

// tokenizer.ggml.pre values (llama.cpp names) -> our pre-tokenizer names.
const std::map<std::string, std::string>& gguf_pre_names() {
  static const std::map<std::string, std::string> kNames = {
      {"gpt2", "gpt2"},        {"gpt-2", "gpt2"},    {"smollm", "smollm"},
      {"starcoder", "smollm"}, {"refact", "smollm"}, {"llama3", "llama3"},
      {"llama-bpe", "llama3"}, {"qwen2", "qwen2"},   {"deepseek-r1-qwen", "qwen2"},
  };
  return kNames;
}

std::string where(const char* key) {
  return std::string("GGUF metadata ") + key;
}

const json* find(const json& md, const char* key) {
  if (!md.is_object()) return nullptr;
  auto it = md.find(key);
  return it == md.end() ? nullptr : &*it;
}

std::string get_string(const json& md, const char* key, const std::string& fallback) {
  const json* v = find(md, key);
  if (v == nullptr) return fallback;
  if (!v->is_string()) {
    throw_error(ErrorCode::kCorruptData, where(key) + " is not a string");
  }
  return v->get<std::string>();
}

bool get_bool(const json& md, const char* key, bool fallback) {
  const json* v = find(md, key);
  if (v == nullptr) return fallback;
  if (!v->is_boolean()) throw_error(ErrorCode::kCorruptData, where(key) + " is not a bool");
  return v->get<bool>();
}

int32_t get_id(const json& md, const char* key, int32_t fallback, size_t vocab) {
  const json* v = find(md, key);
  if (v == nullptr) return fallback < static_cast<int64_t>(vocab) ? fallback : -1;
  if (!v->is_number_integer())
    throw_error(ErrorCode::kCorruptData, where(key) + " is not an integer");
  const int64_t id = v->get<int64_t>();
  if (id < -1 || id >= static_cast<int64_t>(vocab)) {
    throw_error(ErrorCode::kCorruptData, where(key) + " is " + std::to_string(id) +
                                             ", expected an id below the vocabulary size " +
                                             std::to_string(vocab));
  }
  return static_cast<int32_t>(id);
}

const json& get_array(const json& md, const char* key, size_t expected_size) {
  const json* v = find(md, key);
  if (v == nullptr || !v->is_array()) {
    throw_error(ErrorCode::kCorruptData, where(key) + " is missing or not an array");
  }
  if (expected_size != 0 && v->size() != expected_size) {
    throw_error(ErrorCode::kCorruptData, where(key) + " has " + std::to_string(v->size()) +
                                             " entries, expected " + std::to_string(expected_size) +
                                             " (one per token)");
  }
  return *v;
}

TokenizerSpec spec_from_gguf(const json& md) {
  const std::string model = get_string(md, "tokenizer.ggml.model", "");
  TokenizerSpec spec;
  if (model == "llama") {
    spec.kind = TokenizerKind::kSentencePieceBpe;
  } else if (model == "gpt2") {
    spec.kind = TokenizerKind::kByteLevelBpe;
  } else {
    throw_error(ErrorCode::kUnsupported,
                where("tokenizer.ggml.model") + " is '" + model +
                    "', supported: 'llama' (SentencePiece BPE), 'gpt2' (byte-level BPE)");
  }

  const json& tokens = get_array(md, "tokenizer.ggml.tokens", 0);
  if (tokens.empty())
    throw_error(ErrorCode::kCorruptData, where("tokenizer.ggml.tokens") + " is empty");
  spec.tokens.reserve(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!tokens[i].is_string()) {
      throw_error(ErrorCode::kCorruptData,
                  where("tokenizer.ggml.tokens") + "[" + std::to_string(i) + "] is not a string");
    }
    spec.tokens.push_back(tokens[i].get<std::string>());
  }
  const size_t n = spec.tokens.size();

  if (find(md, "tokenizer.ggml.token_type") != nullptr) {
    const json& types = get_array(md, "tokenizer.ggml.token_type", n);
    spec.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const int64_t t = types[i].is_number_integer() ? types[i].get<int64_t>() : -1;
      if (t < 0 || t > static_cast<int64_t>(TokenType::kByte)) {
        throw_error(ErrorCode::kCorruptData, where("tokenizer.ggml.token_type") + "[" +
                                                 std::to_string(i) + "] is " + types[i].dump() +
                                                 ", expected 0..6");
      }
      spec.types.push_back(static_cast<TokenType>(t));
    }
  }

  if (spec.kind == TokenizerKind::kSentencePieceBpe) {
    const json& scores = get_array(md, "tokenizer.ggml.scores", n);
    spec.scores.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      if (!scores[i].is_number()) {
        throw_error(ErrorCode::kCorruptData,
                    where("tokenizer.ggml.scores") + "[" + std::to_string(i) + "] is not a number");
      }
      spec.scores.push_back(scores[i].get<float>());
    }
    spec.add_space_prefix = get_bool(md, "tokenizer.ggml.add_space_prefix", true);
    spec.add_bos = get_bool(md, "tokenizer.ggml.add_bos_token", true);
  } else {
    const json& merges = get_array(md, "tokenizer.ggml.merges", 0);
    spec.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      if (!merges[i].is_string()) {
        throw_error(ErrorCode::kCorruptData,
                    where("tokenizer.ggml.merges") + "[" + std::to_string(i) + "] is not a string");
      }
      spec.merges.push_back(merges[i].get<std::string>());
    }
    const std::string pre = get_string(md, "tokenizer.ggml.pre", "gpt2");
    auto it = gguf_pre_names().find(pre);
    if (it == gguf_pre_names().end()) {
      std::string known;
      for (const auto& [name, ours] : gguf_pre_names()) known += (known.empty() ? "" : ", ") + name;
      throw_error(ErrorCode::kUnsupported,
                  where("tokenizer.ggml.pre") + " is '" + pre + "', supported: " + known);
    }
    spec.pre_tokenizer = it->second;
    spec.ignore_merges = spec.pre_tokenizer == "llama3";  // as llama.cpp does for Llama 3
    spec.add_space_prefix = false;
    spec.add_bos = get_bool(md, "tokenizer.ggml.add_bos_token", false);
  }

  // llama.cpp's defaults for SentencePiece vocabularies: <unk> 0, <s> 1, </s> 2.
  const bool spm = spec.kind == TokenizerKind::kSentencePieceBpe;
  spec.bos_id = get_id(md, "tokenizer.ggml.bos_token_id", spm ? 1 : -1, n);
  spec.eos_id = get_id(md, "tokenizer.ggml.eos_token_id", spm ? 2 : -1, n);
  spec.unk_id = get_id(md, "tokenizer.ggml.unknown_token_id", spm ? 0 : -1, n);
  spec.pad_id = get_id(md, "tokenizer.ggml.padding_token_id", -1, n);
  spec.chat_template = get_string(md, "tokenizer.chat_template", "");
  return spec;
}

}  // namespace

TokenizerSpec tokenizer_spec_from_gguf(const json& md) {
  try {
    return spec_from_gguf(md);
  } catch (const json::exception& e) {  // a value of an unexpected type
    throw_error(ErrorCode::kCorruptData, std::string("GGUF tokenizer metadata: ") + e.what());
  }
}

}  // namespace arbor
