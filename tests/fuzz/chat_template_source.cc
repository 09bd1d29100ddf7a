// Fuzz target: the chat template source itself (a model file's tokenizer.chat_template or
// tokenizer_config.json). The bytes are parsed as a Jinja template and rendered with a fixed
// two-turn conversation, with and without the generation prompt, and with one extra variable.
// Invariant: parsing and rendering return or throw arbor::Error (never kInternal, never another
// exception, no crash or sanitizer report).
#include <string>

#include <nlohmann/json.hpp>

#include "engine/tokenizer/chat_template.h"
#include "tests/fuzz/fuzz_util.h"

namespace {

using nlohmann::ordered_json;

const ordered_json& conversation() {
  static const ordered_json messages = ordered_json::parse(R"([
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi <b>there</b> \u00e9\ud83d\ude00"},
    {"role": "assistant", "content": "Hello!", "tool_calls": [
      {"type": "function", "function": {"name": "f", "arguments": {"x": [1, 2.5, null]}}}]},
    {"role": "tool", "content": "42", "tool_call_id": "c1"},
    {"role": "user", "content": ""}
  ])");
  return messages;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string source(reinterpret_cast<const char*>(data), size);
  arbor::fuzz::accepts([&] {
    const arbor::ChatTemplate tpl(source, "<s>", "</s>");
    // A template that ran into the interpreter's step budget takes seconds in this build:
    // once is enough.
    try {
      tpl.render(conversation(), true);
    } catch (const arbor::Error& e) {
      if (e.code() == arbor::ErrorCode::kInternal) arbor::fuzz::fail(e.what());
      if (std::string(e.what()).find("evaluation steps") != std::string::npos) return;
    }
    arbor::fuzz::accepts([&] { tpl.render(conversation(), false); });
    arbor::fuzz::accepts([&] {
      tpl.render(ordered_json::array(), true,
                 ordered_json{{"tools", ordered_json::array({{{"name", "f"}}})}, {"n", 3}});
    });
  });
  return 0;
}
