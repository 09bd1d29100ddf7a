#include "server/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <optional>

#include "engine/core/error.h"
#include "engine/tokenizer/chat_template.h"

namespace arbor {

using nlohmann::json;

nlohmann::json error_body(const ApiError& e) {
  json err = {{"message", e.what()}, {"type", e.type}, {"param", nullptr}, {"code", nullptr}};
  if (!e.param.empty()) err["param"] = e.param;
  if (!e.code.empty()) err["code"] = e.code;
  return json{{"error", err}};
}

ApiError to_api_error(const std::exception& ex) {
  if (const auto* a = dynamic_cast<const ApiError*>(&ex)) return *a;
  if (const auto* r = dynamic_cast<const RequestError*>(&ex))
    return ApiError(400, r->what(), "invalid_request_error", r->param, r->code);
  if (const auto* e = dynamic_cast<const Error*>(&ex)) {
    switch (e->code()) {
      case ErrorCode::kInvalidArgument:
        return ApiError(400, e->what());
      case ErrorCode::kResourceExhausted:
        return ApiError(429, e->what(), "rate_limit_error", "", "queue_full");
      case ErrorCode::kUnsupported:
        return ApiError(503, e->what(), "service_unavailable");
      case ErrorCode::kNotFound:
        return ApiError(404, e->what(), "invalid_request_error", "", "not_found");
      default:
        return ApiError(500, e->what(), "internal_error");
    }
  }
  return ApiError(500, ex.what(), "internal_error");
}

std::string dump_json(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, json::error_handler_t::replace);
}

namespace {

const char* type_name(const json& v) {
  return v.type_name();
}

[[noreturn]] void bad(const std::string& param, const std::string& msg) {
  throw ApiError(400, msg, "invalid_request_error", param);
}

// The value of `key` when present and not null.
const json* field(const json& body, const char* key) {
  auto it = body.find(key);
  if (it == body.end() || it->is_null()) return nullptr;
  return &*it;
}

bool get_bool(const json& body, const char* key, bool def) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_boolean())
    bad(key, std::string("'") + key + "' must be a boolean, got " + type_name(*v));
  return v->get<bool>();
}

// A JSON integer (never a float, not even 16.0: JSON numbers with a fraction or an exponent
// are floats) within [lo, hi], compared exactly in 64 bits.
int64_t get_int(const json& body, const char* key, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_number_integer())  // covers is_number_unsigned()
    bad(key, std::string("'") + key + "' must be an integer, got " +
                 (v->is_number() ? v->dump() : std::string(type_name(*v))));
  // nlohmann keeps non-negative integers as uint64 and negative ones as int64: compare each in
  // its own type (a uint64 above INT64_MAX must not wrap to a negative value).
  const bool in_range = v->is_number_unsigned()
                            ? hi >= 0 && v->get<uint64_t>() <= static_cast<uint64_t>(hi) &&
                                  (lo <= 0 || v->get<uint64_t>() >= static_cast<uint64_t>(lo))
                            : v->get<int64_t>() >= lo && v->get<int64_t>() <= hi;
  if (!in_range)
    bad(key, std::string("'") + key + "' must be an integer in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], got " + v->dump());
  return v->is_number_unsigned() ? static_cast<int64_t>(v->get<uint64_t>()) : v->get<int64_t>();
}

// An integer field held in an int32_t; the ranges themselves are check_request()'s.
int32_t get_int32(const json& body, const char* key, int32_t def) {
  return static_cast<int32_t>(get_int(body, key, def, std::numeric_limits<int32_t>::min(),
                                      std::numeric_limits<int32_t>::max()));
}

// A number (integers too); finite, as JSON has no NaN (1e999 parses to infinity and is
// refused by the range checks).
float get_float(const json& body, const char* key, float def) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_number())
    bad(key, std::string("'") + key + "' must be a number, got " + type_name(*v));
  return static_cast<float>(v->get<double>());
}

// seed: any 64-bit integer, kept exactly (negative values as their two's complement).
std::optional<uint64_t> get_seed(const json& body) {
  const json* v = field(body, "seed");
  if (!v) return std::nullopt;
  if (!v->is_number_integer())
    bad("seed", "'seed' must be an integer in [-2^63, 2^64 - 1], got " +
                    (v->is_number() ? v->dump() : std::string(type_name(*v))));
  return v->is_number_unsigned() ? v->get<uint64_t>() : static_cast<uint64_t>(v->get<int64_t>());
}

std::vector<std::string> get_stop(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    for (const json& s : *v) {
      if (!s.is_string()) bad("stop", "'stop' must be a string or an array of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad("stop",
        std::string("'stop' must be a string or an array of strings, got ") + type_name(*v));
  }
  return out;
}

// {"<token id>": bias, ...} -> (id, bias) sorted by id. Ranges are check_request()'s.
std::vector<std::pair<int32_t, float>> get_logit_bias(const json& body) {
  const json* v = field(body, "logit_bias");
  if (!v) return {};
  if (!v->is_object())
    bad("logit_bias", std::string("'logit_bias' must be an object mapping token ids to biases, "
                                  "got ") +
                          type_name(*v));
  std::vector<std::pair<int32_t, float>> out;
  for (const auto& [key, bias] : v->items()) {
    int64_t id = -1;
    const bool digits =
        !key.empty() && key.size() <= 10 &&
        std::all_of(key.begin(), key.end(), [](char c) { return c >= '0' && c <= '9'; });
    if (digits) id = std::stoll(key);
    if (!digits || id > std::numeric_limits<int32_t>::max())
      bad("logit_bias", "'logit_bias' keys must be token ids (decimal integers), got '" +
                            key.substr(0, 32) + "'");
    if (!bias.is_number())
      bad("logit_bias", "'logit_bias' values must be numbers, got " + std::string(type_name(bias)) +
                            " for token " + key);
    out.emplace_back(static_cast<int32_t>(id), static_cast<float>(bias.get<double>()));
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int32_t> token_array(const json& a, const char* param) {
  std::vector<int32_t> ids;
  for (const json& t : a) {
    if (!t.is_number_integer())
      bad(param, std::string("'") + param + "' token arrays must hold integers, got " +
                     (t.is_number() ? t.dump() : std::string(type_name(t))));
    // Out-of-vocabulary ids are check_request()'s; ids beyond int32 are refused here.
    if (t.is_number_unsigned() ? t.get<uint64_t>() > std::numeric_limits<int32_t>::max()
                               : (t.get<int64_t>() < std::numeric_limits<int32_t>::min() ||
                                  t.get<int64_t>() > std::numeric_limits<int32_t>::max()))
      bad(param,
          std::string("token id ") + t.dump() + " in '" + param + "' is outside the vocabulary");
    ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
  }
  return ids;
}

// The request's fields: each is honoured, accepted as changing nothing, or refused by name.
enum class FieldUse { kHonoured, kNoEffect };
const std::map<std::string, FieldUse>& known_fields(bool chat) {
  static const std::map<std::string, FieldUse> common = {
      {"model", FieldUse::kHonoured},
      {"stream", FieldUse::kHonoured},
      {"stream_options", FieldUse::kHonoured},
      {"n", FieldUse::kHonoured},
      {"temperature", FieldUse::kHonoured},
      {"top_p", FieldUse::kHonoured},
      {"top_k", FieldUse::kHonoured},
      {"min_p", FieldUse::kHonoured},
      {"presence_penalty", FieldUse::kHonoured},
      {"frequency_penalty", FieldUse::kHonoured},
      {"repetition_penalty", FieldUse::kHonoured},
      {"logit_bias", FieldUse::kHonoured},
      {"seed", FieldUse::kHonoured},
      {"stop", FieldUse::kHonoured},
      {"max_tokens", FieldUse::kHonoured},
      {"logprobs", FieldUse::kHonoured},
      {"ignore_eos", FieldUse::kHonoured},
      {"speculate", FieldUse::kHonoured},
      {"speculation", FieldUse::kHonoured},
      {"user", FieldUse::kNoEffect},
      {"metadata", FieldUse::kNoEffect},
      {"store", FieldUse::kNoEffect},
      {"service_tier", FieldUse::kNoEffect},
      {"prompt_cache_key", FieldUse::kNoEffect},
      {"safety_identifier", FieldUse::kNoEffect},
  };
  static const std::map<std::string, FieldUse> completions = [] {
    auto m = common;
    m["prompt"] = m["echo"] = m["best_of"] = m["suffix"] = FieldUse::kHonoured;
    return m;
  }();
  static const std::map<std::string, FieldUse> chat_fields = [] {
    auto m = common;
    m["messages"] = m["max_completion_tokens"] = m["top_logprobs"] = FieldUse::kHonoured;
    // Checked below: text only / no tools.
    m["response_format"] = m["tools"] = m["tool_choice"] = m["modalities"] = FieldUse::kHonoured;
    m["parallel_tool_calls"] = FieldUse::kNoEffect;
    return m;
  }();
  return chat ? chat_fields : completions;
}

void refuse_unsupported_fields(const json& body, bool chat) {
  const auto& known = known_fields(chat);
  for (const auto& [key, value] : body.items()) {
    if (known.count(key)) continue;
    bad(key, "Unrecognized request argument supplied: '" + key.substr(0, 64) +
                 "' (not supported by this server" +
                 (chat ? ")" : "; /v1/completions takes prompt, not messages)"));
  }
  if (chat) {
    if (const json* rf = field(body, "response_format")) {
      if (!rf->is_object() || !rf->contains("type") || !(*rf)["type"].is_string())
        bad("response_format", "'response_format' must be an object with a string 'type'");
      if ((*rf)["type"] != "text")
        bad("response_format", "'response_format' of type '" +
                                   (*rf)["type"].get<std::string>().substr(0, 32) +
                                   "' is not supported: this server generates text only");
    }
    if (const json* tools = field(body, "tools"))
      if (!tools->is_array() || !tools->empty())
        bad("tools", "'tools' (function calling) is not supported by this server");
    if (const json* tc = field(body, "tool_choice"))
      if (!(tc->is_string() && *tc == "none"))
        bad("tool_choice", "'tool_choice' other than \"none\" is not supported (no tools)");
    if (const json* mod = field(body, "modalities"))
      if (!mod->is_array() || mod->size() != 1 || (*mod)[0] != "text")
        bad("modalities", "'modalities' other than [\"text\"] is not supported");
  } else if (const json* suffix = field(body, "suffix")) {
    if (!suffix->is_string() || !suffix->get<std::string>().empty())
      bad("suffix", "'suffix' (insertion) is not supported by this server");
  }
}

// Chat messages as the template sees them: role, content (text parts joined) and name.
json chat_messages(const json& body) {
  const json* m = field(body, "messages");
  if (!m) bad("messages", "'messages' is required");
  if (!m->is_array() || m->empty()) bad("messages", "'messages' must be a non-empty array");
  json out = json::array();
  for (size_t i = 0; i < m->size(); ++i) {
    const json& msg = (*m)[i];
    const std::string where = "messages[" + std::to_string(i) + "]";
    if (!msg.is_object()) bad(where, "'" + where + "' must be an object");
    const json* role = field(msg, "role");
    if (!role || !role->is_string()) bad(where + ".role", "'" + where + ".role' must be a string");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "developer")
      bad(where + ".role", "'" + where +
                               ".role' must be system, developer, user or assistant, got '" +
                               r.substr(0, 32) + "'" +
                               (r == "tool" ? " (tool messages need function calling, which "
                                              "this server does not support)"
                                            : ""));
    json o = json::object();
    o["role"] = r == "developer" ? "system" : r;
    for (const auto& [key, value] : msg.items()) {
      if (key == "role" || key == "content" || value.is_null()) continue;
      if (key == "name") {
        if (!value.is_string()) bad(where + ".name", "'" + where + ".name' must be a string");
        o["name"] = value;
      } else if (key == "refusal" && value.is_string()) {
        // An assistant turn's refusal text, as the API returns it: the template does not use it.
      } else {
        bad(where + "." + key.substr(0, 64),
            "'" + where + "." + key.substr(0, 64) + "' is not supported by this server");
      }
    }
    const json* content = field(msg, "content");
    if (!content) {
      o["content"] = "";
    } else if (content->is_string()) {
      o["content"] = *content;
    } else if (content->is_array()) {
      std::string text;
      for (const json& part : *content) {
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
            !part.contains("text") || !part["text"].is_string())
          bad(where + ".content", "only text content parts are supported");
        text += part["text"].get<std::string>();
      }
      o["content"] = text;
    } else {
      bad(where + ".content", "'" + where + ".content' must be a string or an array of parts");
    }
    out.push_back(std::move(o));
  }
  return out;
}

}  // namespace

nlohmann::json parse_json_body(std::string_view body, int max_depth) {
  // Depth first, before the parser or anything else walks the value: a body nested 300,000
  // arrays deep must cost a linear scan, not a recursion per level.
  int depth = 0;
  bool in_string = false;
  for (size_t i = 0; i < body.size(); ++i) {
    const char c = body[i];
    if (in_string) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > max_depth)
        throw ApiError(400,
                       "the request body nests arrays and objects deeper than " +
                           std::to_string(max_depth) + " levels (the server's limit)",
                       "invalid_request_error", "", "json_too_deep");
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  try {
    return json::parse(body);
  } catch (const std::exception& e) {
    throw ApiError(400, std::string("the body is not valid JSON: ") + e.what());
  }
}

ParsedRequest parse_openai_body(std::string_view body, bool chat, const ApiContext& ctx) {
  return parse_openai_request(parse_json_body(body), chat, ctx);
}

ParsedRequest parse_openai_request(const json& body, bool chat, const ApiContext& ctx) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  refuse_unsupported_fields(body, chat);
  const Tokenizer& tok = *ctx.tokenizer;
  ParsedRequest p;
  p.chat = chat;
  const json* model = field(body, "model");
  if (model && !model->is_string()) bad("model", "'model' must be a string");
  p.model = model ? model->get<std::string>() : ctx.model_id;
  if (p.model != ctx.model_id)
    throw ApiError(404,
                   "The model '" + p.model.substr(0, 256) +
                       "' does not exist; this server serves '" + ctx.model_id + "'",
                   "invalid_request_error", "model", "model_not_found");
  p.stream = get_bool(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    for (const auto& [key, value] : so->items())
      if (key != "include_usage" && key != "continuous_usage_stats")
        bad("stream_options", "'stream_options." + key.substr(0, 64) + "' is not supported");
    p.include_usage = get_bool(*so, "include_usage", false);
  }
  p.n = get_int32(body, "n", 1);
  if (field(body, "best_of") && get_int32(body, "best_of", 1) != p.n)
    bad("best_of", "'best_of' other than n is not supported");

  GenerationRequest g;
  SamplingParams& s = g.sampling;
  s.temperature = get_float(body, "temperature", 1.0f);
  s.top_p = get_float(body, "top_p", 1.0f);
  s.top_k = get_int32(body, "top_k", 0);
  s.min_p = get_float(body, "min_p", 0.0f);
  s.presence_penalty = get_float(body, "presence_penalty", 0.0f);
  s.frequency_penalty = get_float(body, "frequency_penalty", 0.0f);
  s.repetition_penalty = get_float(body, "repetition_penalty", 1.0f);
  s.seed = get_seed(body);
  s.logit_bias = get_logit_bias(body);
  g.ignore_eos = get_bool(body, "ignore_eos", false);
  g.n = p.n;
  g.speculate = true;
  for (const char* key : {"speculate", "speculation"}) {
    if (!field(body, key)) continue;
    g.speculate = get_bool(body, key, true);
    p.speculate_requested = p.speculate_requested || g.speculate;
  }

  bool default_max_tokens = false;
  if (chat) {
    if (get_bool(body, "logprobs", false)) {
      p.logprobs = get_int32(body, "top_logprobs", 0);
      if (p.logprobs < 0)
        bad("top_logprobs", "'top_logprobs' must be in [0, 20], got " + std::to_string(p.logprobs));
    } else if (field(body, "top_logprobs")) {
      bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    const char* mt_key =
        field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    default_max_tokens = field(body, mt_key) == nullptr;
    g.max_tokens = get_int32(body, mt_key, 0);
    if (!ctx.chat_template)
      throw ApiError(400, "this model has no chat template; use /v1/completions",
                     "invalid_request_error", "messages");
    const json messages = chat_messages(body);
    std::string text;
    try {
      text = ctx.chat_template->render(messages, /*add_generation_prompt=*/true);
    } catch (const std::exception& e) {
      bad("messages", std::string("the chat template rejected the messages: ") + e.what());
    }
    g.prompt = tok.encode(text, /*add_bos=*/false, /*parse_special=*/true);
    if (g.prompt.empty()) bad("messages", "the rendered conversation is empty");
    p.requests.push_back(ServiceRequest{g, get_stop(body), true});
  } else {
    if (field(body, "logprobs")) {
      p.logprobs = get_int32(body, "logprobs", -1);
      if (p.logprobs < 0)
        bad("logprobs", "'logprobs' must be in [0, 20], got " + std::to_string(p.logprobs));
    }
    p.echo = get_bool(body, "echo", false);
    g.max_tokens = get_int32(body, "max_tokens", 16);  // OpenAI's completions default
    const json* prompt = field(body, "prompt");
    if (!prompt) bad("prompt", "'prompt' is required");
    std::vector<std::vector<int32_t>> prompts;
    std::vector<std::string> texts;
    auto add_text = [&](const std::string& t) {
      prompts.push_back(tok.encode(t, ctx.add_bos, /*parse_special=*/true));
      texts.push_back(t);
    };
    if (prompt->is_string()) {
      add_text(prompt->get<std::string>());
    } else if (prompt->is_array() && !prompt->empty()) {
      if ((*prompt)[0].is_string()) {
        for (const json& t : *prompt) {
          if (!t.is_string()) bad("prompt", "'prompt' arrays must hold only strings");
          add_text(t.get<std::string>());
        }
      } else if ((*prompt)[0].is_array()) {
        for (const json& a : *prompt) {
          if (!a.is_array()) bad("prompt", "'prompt' must be a list of token lists");
          prompts.push_back(token_array(a, "prompt"));
        }
      } else {
        prompts.push_back(token_array(*prompt, "prompt"));
      }
    } else {
      bad("prompt", "'prompt' must be a string, an array of strings, or token ids");
    }
    if (p.echo && texts.empty())
      for (const auto& ids : prompts) {
        std::vector<int32_t> known;  // out-of-vocabulary ids are refused by check_request()
        for (int32_t id : ids)
          if (id >= 0 && id < tok.vocab_size()) known.push_back(id);
        texts.push_back(tok.decode(known, false));
      }
    const std::vector<std::string> stop = get_stop(body);
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest gi = g;
      gi.prompt = std::move(prompts[i]);
      p.requests.push_back(ServiceRequest{gi, stop, true});
    }
    p.prompt_texts = std::move(texts);
  }
  for (ServiceRequest& r : p.requests) {
    r.gen.logprobs = p.logprobs;
    if (default_max_tokens)  // chat without max_tokens: what fits
      r.gen.max_tokens = static_cast<int32_t>(std::clamp<int64_t>(
          ctx.max_context - static_cast<int64_t>(r.gen.prompt.size()), 1, ctx.default_max_tokens));
  }
  return p;
}

json usage_json(const Usage& u) {
  return json{{"prompt_tokens", u.prompt_tokens},
              {"completion_tokens", u.completion_tokens},
              {"total_tokens", u.prompt_tokens + u.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", u.cached_prompt_tokens}}},
              {"speculation",
               {{"accepted_draft_tokens", u.accepted_draft_tokens},
                {"decode_steps", u.decode_steps},
                {"mean_accepted_length", u.mean_accepted_length()}}}};
}

namespace {

std::string token_text(const Tokenizer& tok, int32_t id) {
  return tok.token_bytes(id);
}

json bytes_of(const std::string& s) {
  json b = json::array();
  for (unsigned char c : s) b.push_back(static_cast<int>(c));
  return b;
}

json chat_logprobs(const std::vector<TokenLogprob>& lps, const Tokenizer& tok) {
  json content = json::array();
  for (const TokenLogprob& t : lps) {
    const std::string s = token_text(tok, t.token);
    json top = json::array();
    for (const auto& [id, lp] : t.top) {
      const std::string ts = token_text(tok, id);
      top.push_back({{"token", ts}, {"logprob", lp}, {"bytes", bytes_of(ts)}});
    }
    content.push_back(
        {{"token", s}, {"logprob", t.logprob}, {"bytes", bytes_of(s)}, {"top_logprobs", top}});
  }
  return json{{"content", content}};
}

json completion_logprobs(const std::vector<TokenLogprob>& lps, const Tokenizer& tok,
                         size_t text_offset) {
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  size_t off = text_offset;
  for (const TokenLogprob& t : lps) {
    const std::string s = token_text(tok, t.token);
    tokens.push_back(s);
    token_lps.push_back(t.logprob);
    json top = json::object();
    for (const auto& [id, lp] : t.top) top[token_text(tok, id)] = lp;
    tops.push_back(top);
    offsets.push_back(off);
    off += s.size();
  }
  return json{{"tokens", tokens},
              {"token_logprobs", token_lps},
              {"top_logprobs", tops},
              {"text_offset", offsets}};
}

}  // namespace

json completion_response(const ParsedRequest& p, const std::string& id, int64_t created,
                         const std::string& model, const std::vector<ChoiceState>& ch,
                         const Usage& usage, const Tokenizer& tok) {
  json choices = json::array();
  for (size_t i = 0; i < ch.size(); ++i) {
    json c = {{"index", i}, {"finish_reason", ch[i].finish_reason}};
    const bool lp = p.logprobs >= 0;
    if (p.chat) {
      c["message"] = {{"role", "assistant"}, {"content", ch[i].text}};
      c["logprobs"] = lp ? chat_logprobs(ch[i].logprobs, tok) : json(nullptr);
    } else {
      const std::string prefix =
          p.echo ? p.prompt_texts[i / static_cast<size_t>(p.n)] : std::string();
      c["text"] = prefix + ch[i].text;
      c["logprobs"] = lp ? completion_logprobs(ch[i].logprobs, tok, prefix.size()) : json(nullptr);
    }
    choices.push_back(c);
  }
  return json{{"id", id},           {"object", p.chat ? "chat.completion" : "text_completion"},
              {"created", created}, {"model", model},
              {"choices", choices}, {"usage", usage_json(usage)}};
}

json stream_chunk(const ParsedRequest& p, const std::string& id, int64_t created,
                  const std::string& model, const ChoiceDelta& d, bool first,
                  const Tokenizer& tok) {
  json c = {{"index", d.index}};
  c["finish_reason"] = d.finish_reason.empty() ? json(nullptr) : json(d.finish_reason);
  const bool lp = p.logprobs >= 0 && !d.logprobs.empty();
  if (p.chat) {
    json delta = json::object();
    if (first) delta["role"] = "assistant";
    if (!d.text.empty() || first) delta["content"] = d.text;
    c["delta"] = delta;
    c["logprobs"] = lp ? chat_logprobs(d.logprobs, tok) : json(nullptr);
  } else {
    std::string text = d.text;
    if (first && p.echo) text = p.prompt_texts[static_cast<size_t>(d.index / p.n)] + text;
    c["text"] = text;
    c["logprobs"] = lp ? completion_logprobs(d.logprobs, tok, 0) : json(nullptr);
  }
  json out = {{"id", id},
              {"object", p.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array({c})}};
  if (p.include_usage) out["usage"] = nullptr;
  return out;
}

json usage_chunk(const ParsedRequest& p, const std::string& id, int64_t created,
                 const std::string& model, const Usage& usage) {
  return json{{"id", id},
              {"object", p.chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", json::array()},
              {"usage", usage_json(usage)}};
}

}  // namespace arbor
