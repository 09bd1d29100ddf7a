#include "engine/tokenizer/chat_template.h"

#include "engine/core/error.h"
#include "engine/tokenizer/jinja/interpreter.h"

namespace arbor {
namespace {

using jinja::Value;
using jinja::ValueDict;

std::string render_with(const jinja::Template& tpl, Value messages, bool add_generation_prompt,
                        const std::string& bos, const std::string& eos,
                        const nlohmann::ordered_json& extra) {
  if (!extra.is_null() && !extra.is_object()) {
    throw_error(ErrorCode::kInvalidArgument,
                "chat template extra variables must be a JSON object, got " +
                    std::string(extra.type_name()));
  }
  ValueDict vars;
  vars.set(Value::string("messages"), std::move(messages));
  vars.set(Value::string("tools"), Value::none());
  vars.set(Value::string("documents"), Value::none());
  vars.set(Value::string("add_generation_prompt"), Value::boolean(add_generation_prompt));
  vars.set(Value::string("bos_token"), Value::string(bos));
  vars.set(Value::string("eos_token"), Value::string(eos));
  if (extra.is_object()) {
    for (const auto& [key, value] : extra.items()) {
      vars.set(Value::string(key), Value::from_json(value));
    }
  }
  return tpl.render(vars);
}

void check_messages(const nlohmann::ordered_json& messages) {
  if (!messages.is_array()) {
    throw_error(ErrorCode::kInvalidArgument,
                "chat messages must be a JSON array, got " + std::string(messages.type_name()));
  }
  for (size_t i = 0; i < messages.size(); ++i) {
    if (!messages[i].is_object()) {
      throw_error(ErrorCode::kInvalidArgument, "chat message " + std::to_string(i) +
                                                   " must be a JSON object, got " +
                                                   std::string(messages[i].type_name()));
    }
  }
}

}  // namespace

ChatTemplate::ChatTemplate(std::string source, std::string bos_token, std::string eos_token)
    : source_(std::move(source)),
      bos_token_(std::move(bos_token)),
      eos_token_(std::move(eos_token)),
      template_(std::make_shared<jinja::Template>(source_)) {}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt, const nlohmann::json& extra) const {
  jinja::ValueList list;
  for (const ChatMessage& m : messages) {
    ValueDict d;
    d.set(Value::string("role"), Value::string(m.role));
    d.set(Value::string("content"), Value::string(m.content));
    if (!m.name.empty()) d.set(Value::string("name"), Value::string(m.name));
    if (!m.tool_call_id.empty())
      d.set(Value::string("tool_call_id"), Value::string(m.tool_call_id));
    if (!m.tool_calls.is_null()) d.set(Value::string("tool_calls"), Value::from_json(m.tool_calls));
    list.push_back(Value::dict(std::move(d)));
  }
  return render_with(*template_, Value::list(std::move(list)), add_generation_prompt, bos_token_,
                     eos_token_, nlohmann::ordered_json(extra));
}

std::string ChatTemplate::render(const nlohmann::json& messages, bool add_generation_prompt,
                                 const nlohmann::json& extra) const {
  return render(nlohmann::ordered_json(messages), add_generation_prompt,
                nlohmann::ordered_json(extra));
}

std::string ChatTemplate::render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                                 const nlohmann::ordered_json& extra) const {
  check_messages(messages);
  return render_with(*template_, Value::from_json(messages), add_generation_prompt, bos_token_,
                     eos_token_, extra);
}

ChatTemplate chat_template_from_spec(const TokenizerSpec& spec) {
  if (spec.chat_template.empty()) {
    throw_error(ErrorCode::kNotFound,
                "the tokenizer has no chat template (tokenizer_config.json chat_template, "
                "chat_template.jinja or GGUF tokenizer.chat_template); pass one explicitly or "
                "use chatml_template_source()");
  }
  auto token_text = [&](int32_t id) {
    return id >= 0 && static_cast<size_t>(id) < spec.tokens.size()
               ? spec.tokens[static_cast<size_t>(id)]
               : std::string();
  };
  return ChatTemplate(spec.chat_template, token_text(spec.bos_id), token_text(spec.eos_id));
}

const std::string& chatml_template_source() {
  static const std::string kChatMl =
      "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
      "{{ '<|im_start|>assistant\\n' }}{% endif %}";
  return kChatMl;
}

}  // namespace arbor
