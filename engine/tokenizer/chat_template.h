// Chat templates: turns a conversation into the prompt text a model was trained on, by running
// the model's Jinja chat template exactly as Hugging Face transformers' apply_chat_template does
// (jinja2 ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks, loopcontrols, globals
// raise_exception / strftime_now). The interpreter is engine/tokenizer/jinja/.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/tokenizer_spec.h"

namespace arbor {

namespace jinja {
class Template;
}

struct ChatMessage {
  std::string role;
  std::string content;
  std::string name;                   // optional (empty: the key is absent)
  std::string tool_call_id;           // optional (empty: the key is absent)
  nlohmann::ordered_json tool_calls;  // optional OpenAI tool_calls array (null: absent)
};

class ChatTemplate {
 public:
  // Parses once; throws arbor::Error(kInvalidArgument) naming line/column on syntax errors.
  ChatTemplate(std::string source, std::string bos_token, std::string eos_token);

  // Renders the template with messages, add_generation_prompt, bos_token, eos_token,
  // tools = None and documents = None, plus the keys of `extra` (which may override any of
  // these, e.g. "tools", "date_string"). Throws arbor::Error(kInvalidArgument) with the
  // template's raise_exception message verbatim (e.g. "Conversation roles must alternate
  // user/assistant/user/assistant/..."), or "chat template error at line L, column C: ..." for
  // a runtime error.
  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = {}) const;
  // OpenAI-style message objects (an array of {"role", "content", ...}). nlohmann::json sorts
  // object keys, which tojson then shows; the ordered_json overload keeps the caller's order,
  // as Python dicts do.
  std::string render(const nlohmann::json& messages, bool add_generation_prompt,
                     const nlohmann::json& extra = {}) const;
  std::string render(const nlohmann::ordered_json& messages, bool add_generation_prompt,
                     const nlohmann::ordered_json& extra = {}) const;

  const std::string& source() const { return source_; }

 private:
  std::string source_;
  std::string bos_token_;
  std::string eos_token_;
  std::shared_ptr<const jinja::Template> template_;
};

// The template a tokenizer came with (TokenizerSpec::chat_template, from tokenizer_config.json,
// chat_template.jinja or GGUF tokenizer.chat_template), with its BOS / EOS token text. Throws
// arbor::Error(kNotFound) when the tokenizer has none.
ChatTemplate chat_template_from_spec(const TokenizerSpec& spec);

// ChatML ("<|im_start|>role\ncontent<|im_end|>\n" per message, then "<|im_start|>assistant\n"),
// the fallback for tokenizers without a template.
const std::string& chatml_template_source();

}  // namespace arbor
