// Fuzz target: request-supplied chat messages rendered by SmolLM2's own chat template (from its
// GGUF), as /v1/chat/completions does (server/openai_api.cc). Input that parses as JSON is
// rendered as given: an array is the messages, an object supplies "messages" and
// "add_generation_prompt"; both the sorted (json) and order-keeping (ordered_json) overloads run.
// Any other input becomes messages: split at 0x1E (record separator), the first byte of each
// part picks the role (system, user, assistant, tool), the rest is the content.
// Invariants: render returns text or throws arbor::Error (never kInternal, never another
// exception); for the messages built from bytes (string roles and contents, what the server
// passes after validation) rendering succeeds and equals the ChatML text the template defines.
#include <memory>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using arbor::ChatTemplate;
using arbor::fuzz::escaped;
using arbor::fuzz::fail;
using nlohmann::json;
using nlohmann::ordered_json;

ChatTemplate* smollm2 = nullptr;

// What SmolLM2's template renders (tests/data/chat_templates/smollm2.jinja): a default system
// turn unless the first message is one, then ChatML turns.
std::string smollm2_chatml(const std::vector<std::pair<std::string, std::string>>& messages,
                           bool add_generation_prompt) {
  std::string out;
  if (!messages.empty() && messages[0].first != "system")
    out +=
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging "
        "Face<|im_end|>\n";
  for (const auto& [role, content] : messages)
    out += "<|im_start|>" + role + "\n" + content + "<|im_end|>\n";
  if (add_generation_prompt) out += "<|im_start|>assistant\n";
  return out;
}

void render_json(std::string_view text) {
  ordered_json parsed = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  ordered_json messages = parsed;
  bool add_generation_prompt = text.size() % 2 == 0;
  if (parsed.is_object()) {
    messages = parsed.contains("messages") ? parsed["messages"] : ordered_json::array();
    if (parsed.contains("add_generation_prompt") && parsed["add_generation_prompt"].is_boolean())
      add_generation_prompt = parsed["add_generation_prompt"].get<bool>();
  }
  arbor::fuzz::accepts([&] { smollm2->render(messages, add_generation_prompt); });
  arbor::fuzz::accepts([&] { smollm2->render(json(messages), !add_generation_prompt); });
}

void render_bytes(std::string_view text) {
  static const char* const kRoles[] = {"system", "user", "assistant", "tool"};
  std::vector<std::pair<std::string, std::string>> messages;
  ordered_json array = ordered_json::array();
  size_t start = 0;
  while (start < text.size()) {
    size_t end = text.find('\x1E', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view part = text.substr(start, end - start);
    if (!part.empty()) {
      const std::string role = kRoles[static_cast<uint8_t>(part[0]) % 4];
      // The server's JSON parser only admits valid UTF-8 strings; nlohmann::json would refuse
      // to dump anything else (tojson), so contents are kept as they would arrive.
      std::string content(part.substr(1));
      if (!arbor::fuzz::is_valid_utf8(content)) content = "x";
      messages.emplace_back(role, content);
      array.push_back({{"role", role}, {"content", content}});
    }
    start = end + 1;
  }
  const bool add_generation_prompt = !text.empty() && (static_cast<uint8_t>(text[0]) & 0x80);
  std::string rendered;
  if (!arbor::fuzz::accepts([&] { rendered = smollm2->render(array, add_generation_prompt); }))
    fail("SmolLM2's template rejected plain messages " + escaped(array.dump()));
  const std::string expected = smollm2_chatml(messages, add_generation_prompt);
  if (rendered != expected)
    fail("SmolLM2's template rendered \"" + escaped(rendered) + "\", expected \"" +
         escaped(expected) + "\"");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  smollm2 = new ChatTemplate(arbor::chat_template_from_spec(arbor::fuzz::smollm2_tokenizer_spec()));
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  if (json::accept(text)) {
    render_json(text);
  } else {
    render_bytes(text);
  }
  return 0;
}
