#include "server/openai_api.h"

#include <cmath>
#include <limits>

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

int64_t get_int(const json& body, const char* key, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_number_integer() && !v->is_number_unsigned()) {
    if (v->is_number_float() && std::floor(v->get<double>()) == v->get<double>() &&
        std::abs(v->get<double>()) < 9e15)
      ;  // 16.0 is accepted as 16
    else
      bad(key, std::string("'") + key + "' must be an integer, got " +
                   (v->is_number() ? v->dump() : std::string(type_name(*v))));
  }
  if (v->is_number_unsigned() && v->get<uint64_t>() > static_cast<uint64_t>(hi))
    bad(key,
        std::string("'") + key + "' must be at most " + std::to_string(hi) + ", got " + v->dump());
  const double d = v->get<double>();
  if (d < static_cast<double>(lo) || d > static_cast<double>(hi))
    bad(key, std::string("'") + key + "' must be in [" + std::to_string(lo) + ", " +
                 std::to_string(hi) + "], got " + v->dump());
  return static_cast<int64_t>(d);
}

double get_num(const json& body, const char* key, double def, double lo, double hi) {
  const json* v = field(body, key);
  if (!v) return def;
  if (!v->is_number())
    bad(key, std::string("'") + key + "' must be a number, got " + type_name(*v));
  const double d = v->get<double>();
  if (!(d >= lo && d <= hi))
    bad(key, std::string("'") + key + "' must be in [" + json(lo).dump() + ", " + json(hi).dump() +
                 "], got " + v->dump());
  return d;
}

std::vector<std::string> get_stop(const json& body) {
  const json* v = field(body, "stop");
  if (!v) return {};
  std::vector<std::string> out;
  if (v->is_string()) {
    out.push_back(v->get<std::string>());
  } else if (v->is_array()) {
    if (v->size() > 16) bad("stop", "'stop' holds at most 16 strings");
    for (const json& s : *v) {
      if (!s.is_string()) bad("stop", "'stop' must be a string or an array of strings");
      out.push_back(s.get<std::string>());
    }
  } else {
    bad("stop",
        std::string("'stop' must be a string or an array of strings, got ") + type_name(*v));
  }
  for (const auto& s : out)
    if (s.empty()) bad("stop", "'stop' strings must not be empty");
  return out;
}

std::vector<int32_t> token_array(const json& a, const Tokenizer& tok, const char* param) {
  std::vector<int32_t> ids;
  for (const json& t : a) {
    if (!t.is_number_integer() && !t.is_number_unsigned())
      bad(param, std::string("'") + param + "' token arrays must hold integers");
    const int64_t id = t.get<int64_t>();
    if (id < 0 || id >= tok.vocab_size())
      bad(param, "token id " + std::to_string(id) + " in '" + param +
                     "' is outside the vocabulary of " + std::to_string(tok.vocab_size()));
    ids.push_back(static_cast<int32_t>(id));
  }
  return ids;
}

// Chat messages as the template sees them: role and content strings (content parts of type
// "text" are joined).
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
    if (r != "system" && r != "user" && r != "assistant" && r != "tool" && r != "developer")
      bad(where + ".role", "'" + where +
                               ".role' must be system, user, assistant, tool or developer, got '" +
                               r + "'");
    json o = msg;
    o["role"] = r == "developer" ? "system" : r;
    const json* content = field(msg, "content");
    if (!content) {
      o["content"] = "";
    } else if (content->is_string()) {
      o["content"] = *content;
    } else if (content->is_array()) {
      std::string text;
      for (const json& part : *content) {
        if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
            !part["text"].is_string())
          bad(where + ".content", "only text content parts are supported");
        text += part["text"].get<std::string>();
      }
      o["content"] = text;
    } else {
      bad(where + ".content", "'" + where + ".content' must be a string or an array of parts");
    }
    out.push_back(o);
  }
  return out;
}

}  // namespace

ParsedRequest parse_openai_request(const json& body, bool chat, const ApiContext& ctx) {
  if (!body.is_object()) bad("", "the request body must be a JSON object");
  const Tokenizer& tok = *ctx.tokenizer;
  ParsedRequest p;
  p.chat = chat;
  const json* model = field(body, "model");
  if (model && !model->is_string()) bad("model", "'model' must be a string");
  p.model = model ? model->get<std::string>() : ctx.model_id;
  if (p.model != ctx.model_id)
    throw ApiError(
        404,
        "The model '" + p.model + "' does not exist; this server serves '" + ctx.model_id + "'",
        "invalid_request_error", "model", "model_not_found");
  p.stream = get_bool(body, "stream", false);
  if (const json* so = field(body, "stream_options")) {
    if (!so->is_object()) bad("stream_options", "'stream_options' must be an object");
    p.include_usage = get_bool(*so, "include_usage", false);
  }
  p.n = static_cast<int32_t>(get_int(body, "n", 1, 1, 128));
  if (field(body, "best_of") && get_int(body, "best_of", 1, 1, 128) != p.n)
    bad("best_of", "'best_of' other than n is not supported");

  GenerationRequest g;
  SamplingParams& s = g.sampling;
  s.temperature = static_cast<float>(get_num(body, "temperature", 1.0, 0.0, 2.0));
  s.top_p = static_cast<float>(get_num(body, "top_p", 1.0, 0.0, 1.0));
  if (s.top_p <= 0) bad("top_p", "'top_p' must be in (0, 1]");
  s.top_k = static_cast<int32_t>(get_int(body, "top_k", 0, -1, 1 << 30));
  s.min_p = static_cast<float>(get_num(body, "min_p", 0.0, 0.0, 1.0));
  s.presence_penalty = static_cast<float>(get_num(body, "presence_penalty", 0.0, -2.0, 2.0));
  s.frequency_penalty = static_cast<float>(get_num(body, "frequency_penalty", 0.0, -2.0, 2.0));
  s.repetition_penalty = static_cast<float>(get_num(body, "repetition_penalty", 1.0, 1e-6, 1e6));
  if (field(body, "seed"))
    s.seed = static_cast<uint64_t>(get_int(body, "seed", 0, std::numeric_limits<int64_t>::min(),
                                           std::numeric_limits<int64_t>::max()));
  g.ignore_eos = get_bool(body, "ignore_eos", false);
  g.n = p.n;
  g.speculate = true;
  for (const char* key : {"speculate", "speculation"}) {
    if (!field(body, key)) continue;
    g.speculate = get_bool(body, key, true);
    if (g.speculate && !ctx.speculation_available)
      bad(key, "speculation is not configured on this server (start it with --spec)");
  }

  const int64_t max_ctx = ctx.max_context;
  if (chat) {
    if (get_bool(body, "logprobs", false)) {
      p.logprobs = static_cast<int32_t>(get_int(body, "top_logprobs", 0, 0, 20));
    } else if (field(body, "top_logprobs")) {
      bad("top_logprobs", "'top_logprobs' needs 'logprobs': true");
    }
    const char* mt_key =
        field(body, "max_completion_tokens") ? "max_completion_tokens" : "max_tokens";
    g.max_tokens =
        static_cast<int32_t>(get_int(body, mt_key, -1, -(int64_t{1} << 40), int64_t{1} << 40));
    if (g.max_tokens == -1 && !field(body, mt_key))
      g.max_tokens = 0;  // default below
    else if (g.max_tokens < 1)
      bad(mt_key,
          std::string("'") + mt_key + "' must be at least 1, got " + std::to_string(g.max_tokens));
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
    if (const json* lp = field(body, "logprobs"))
      p.logprobs = static_cast<int32_t>(get_int(body, "logprobs", -1, 0, 20)), (void)lp;
    p.echo = get_bool(body, "echo", false);
    const bool has_mt = field(body, "max_tokens") != nullptr;
    g.max_tokens = static_cast<int32_t>(
        get_int(body, "max_tokens", 16, -(int64_t{1} << 40), int64_t{1} << 40));
    if (has_mt && g.max_tokens < 1)
      bad("max_tokens", "'max_tokens' must be at least 1, got " + std::to_string(g.max_tokens));
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
          prompts.push_back(token_array(a, tok, "prompt"));
          texts.push_back(tok.decode(prompts.back(), false));
        }
      } else {
        prompts.push_back(token_array(*prompt, tok, "prompt"));
        texts.push_back(tok.decode(prompts.back(), false));
      }
    } else {
      bad("prompt", "'prompt' must be a string, an array of strings, or token ids");
    }
    if (prompts.size() > 64) bad("prompt", "at most 64 prompts per request");
    const std::vector<std::string> stop = get_stop(body);
    for (size_t i = 0; i < prompts.size(); ++i) {
      GenerationRequest gi = g;
      gi.prompt = std::move(prompts[i]);
      gi.logprobs = p.logprobs;
      if (gi.prompt.empty()) bad("prompt", "the prompt is empty");
      p.requests.push_back(ServiceRequest{gi, stop, true});
    }
    p.prompt_texts = std::move(texts);
  }
  const int64_t max_prompt = ctx.max_prompt_tokens > 0 ? ctx.max_prompt_tokens : max_ctx - 1;
  for (ServiceRequest& r : p.requests) {
    r.gen.logprobs = p.logprobs;
    const int64_t len = static_cast<int64_t>(r.gen.prompt.size());
    if (len > max_prompt || len >= max_ctx)
      throw ApiError(
          400,
          "This model's maximum context length is " + std::to_string(max_ctx) +
              " tokens (prompts at most " + std::to_string(std::min(max_prompt, max_ctx - 1)) +
              "); your prompt has " + std::to_string(len) + " tokens",
          "invalid_request_error", chat ? "messages" : "prompt", "context_length_exceeded");
    if (r.gen.max_tokens == 0)  // chat default: what fits
      r.gen.max_tokens =
          static_cast<int32_t>(std::min<int64_t>(ctx.default_max_tokens, max_ctx - len));
    if (len + r.gen.max_tokens > max_ctx)
      throw ApiError(400,
                     "This model's maximum context length is " + std::to_string(max_ctx) +
                         " tokens; you requested " + std::to_string(len + r.gen.max_tokens) + " (" +
                         std::to_string(len) + " in the prompt, " +
                         std::to_string(r.gen.max_tokens) + " for the completion)",
                     "invalid_request_error", chat ? "max_tokens" : "max_tokens",
                     "context_length_exceeded");
    try {
      r.gen.sampling.validate();
    } catch (const Error& e) {
      bad("", e.what());
    }
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
