// Chat templates and the Jinja interpreter against Python jinja2: every expected string in
// tests/data/chat_templates/expected.json was rendered by jinja2 configured as transformers does
// (scripts/make_chat_template_fixtures.py); outputs must match byte for byte, and templates that
// call raise_exception must fail with the same message.
#include <filesystem>
#include <fstream>
#include <string>

#include <gtest/gtest.h>

#include "engine/core/error.h"
#include "engine/model/gguf_file.h"
#include "engine/tokenizer/chat_template.h"
#include "engine/tokenizer/jinja/interpreter.h"
#include "engine/tokenizer/tokenizer_loaders.h"

namespace arbor {
namespace {

using nlohmann::ordered_json;

const std::string kDataDir = std::string(ARBOR_TEST_DATA_DIR) + "/chat_templates";

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  EXPECT_TRUE(in.good()) << "cannot open " << path;
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

const ordered_json& fixtures() {
  static const ordered_json kFixtures = ordered_json::parse(read_text(kDataDir + "/expected.json"));
  return kFixtures;
}

std::string template_source(const ordered_json& spec) {
  if (spec["file"].is_null()) return chatml_template_source();
  return read_text(kDataDir + "/" + spec["file"].get<std::string>());
}

// Checks one rendering against a fixture entry holding "expected", or "error" + "error_kind".
template <typename Render>
void expect_matches(const ordered_json& entry, Render&& render) {
  SCOPED_TRACE(entry["name"].get<std::string>());
  if (entry.contains("expected")) {
    try {
      EXPECT_EQ(render(), entry["expected"].get<std::string>());
    } catch (const Error& e) {
      ADD_FAILURE() << "unexpected error: " << e.what();
    }
    return;
  }
  const std::string message = entry["error"].get<std::string>();
  try {
    const std::string out = render();
    ADD_FAILURE() << "expected an error '" << message << "', rendered: " << out;
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    if (entry["error_kind"] == "raise_exception") {
      EXPECT_EQ(std::string(e.what()), message);  // the template's own message, verbatim
    } else {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("line "), std::string::npos) << e.what();
    }
  }
}

class ChatTemplateFixtureTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ChatTemplateFixtureTest, RendersLikeJinja2) {
  const ordered_json& spec = fixtures()["templates"][GetParam()];
  const ChatTemplate tpl(template_source(spec), spec["bos_token"].get<std::string>(),
                         spec["eos_token"].get<std::string>());
  ASSERT_FALSE(spec["cases"].empty());
  for (const ordered_json& c : spec["cases"]) {
    expect_matches(c, [&] {
      return tpl.render(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"]);
    });
  }
}

INSTANTIATE_TEST_SUITE_P(Templates, ChatTemplateFixtureTest,
                         ::testing::Values("llama2", "llama3", "llama3_1", "mistral_v1",
                                           "mistral_v3", "qwen2_5", "smollm2", "vicuna", "chatml"),
                         [](const auto& info) { return info.param; });

TEST(ChatTemplateTest, ChatMessageVectorRendersLikeJsonMessages) {
  for (const char* name : {"llama2", "llama3", "qwen2_5", "vicuna"}) {
    const ordered_json& spec = fixtures()["templates"][name];
    const ChatTemplate tpl(template_source(spec), spec["bos_token"].get<std::string>(),
                           spec["eos_token"].get<std::string>());
    for (const ordered_json& c : spec["cases"]) {
      bool plain = c.contains("expected") && c["extra"].empty();
      for (const auto& m : c["messages"])
        plain = plain && m.size() == 2 && m["content"].is_string();
      if (!plain) continue;
      std::vector<ChatMessage> messages;
      for (const auto& m : c["messages"]) {
        messages.push_back(
            {m["role"].get<std::string>(), m["content"].get<std::string>(), "", "", {}});
      }
      SCOPED_TRACE(std::string(name) + "/" + c["name"].get<std::string>());
      EXPECT_EQ(tpl.render(messages, c["add_generation_prompt"].get<bool>()),
                c["expected"].get<std::string>());
      // nlohmann::json (sorted keys) gives the same text for templates that never print dicts.
      EXPECT_EQ(tpl.render(nlohmann::json::parse(c["messages"].dump()),
                           c["add_generation_prompt"].get<bool>()),
                c["expected"].get<std::string>());
    }
  }
}

TEST(ChatTemplateTest, AlternationViolationsRaiseTheTemplatesMessage) {
  const std::vector<ChatMessage> two_users = {{"user", "a", "", "", {}}, {"user", "b", "", "", {}}};
  for (const char* name : {"llama2", "mistral_v1"}) {
    const ChatTemplate tpl(read_text(kDataDir + "/" + name + ".jinja"), "<s>", "</s>");
    try {
      tpl.render(two_users, true);
      ADD_FAILURE() << name << ": expected raise_exception";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_STREQ(e.what(), "Conversation roles must alternate user/assistant/user/assistant/...");
    }
  }
}

TEST(JinjaInterpreterTest, SnippetsRenderLikeJinja2) {
  ASSERT_FALSE(fixtures()["snippets"].empty());
  for (const ordered_json& s : fixtures()["snippets"]) {
    expect_matches(s, [&] {
      const jinja::Template tpl(s["template"].get<std::string>());
      const jinja::Value vars = jinja::Value::from_json(s["variables"]);
      return tpl.render(vars.entries());
    });
  }
}

TEST(JinjaInterpreterTest, SyntaxErrorsNameLineAndColumn) {
  struct Case {
    std::string source;
    std::string where;   // "line L, column C"
    std::string detail;  // part of the message
  };
  const std::vector<Case> cases = {
      {"hello\n  {{ a + }}", "line 2, column 10", "unexpected '}}'"},
      {"{% if x %}\nyes", "line 2, column 4", "expected 'elif' or 'else' or 'endif'"},
      {"{% for x in items %}{% endif %}", "line 1, column 24",
       "unknown tag 'endif', expected 'endfor' or 'else'"},
      {"a\nb\n{{ 'unterminated }}", "line 3, column 4", "unterminated string"},
      {"{% endfor %}", "line 1, column 4", "unknown tag 'endfor'"},
      {"{{ x | no_such_filter }}", "line 1, column 6", "no filter named 'no_such_filter'"},
      {"{% if x is no_such_test %}{% endif %}", "line 1, column 9", "no test named 'no_such_test'"},
      {"{# never closed", "line 1, column 1", "missing end of comment tag"},
      {"{{ x ]}}", "line 1, column 6", "unexpected ']'"},
      {"{% break %}", "line 1, column 4", "'break' outside of a loop"},
      {"{{ (1, 2 }}", "line 1, column 10", "unexpected '}'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.source);
    try {
      ChatTemplate tpl(c.source, "", "");
      ADD_FAILURE() << "expected a syntax error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      const std::string what = e.what();
      EXPECT_NE(what.find(c.where), std::string::npos) << what;
      EXPECT_NE(what.find(c.detail), std::string::npos) << what;
    }
  }
}

TEST(JinjaInterpreterTest, RuntimeErrorsNamePosition) {
  const ChatTemplate tpl("{% for m in messages %}\n{{ m.content.nope.deeper }}{% endfor %}", "",
                         "");
  try {
    tpl.render(std::vector<ChatMessage>{{"user", "hi", "", "", {}}}, false);
    ADD_FAILURE() << "expected an undefined-attribute error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("line 2"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("'str object' has no attribute 'nope'"), std::string::npos)
        << e.what();
  }
}

// Found by review while writing tests/fuzz/chat_template_source (the inputs below, crafted by
// hand, overflowed the stack of the fuzz build): parsing, rendering and destroying a template
// recurse, and a template that nests without bound (a macro calling itself, 1000 nested
// brackets, a 1000-term sum) overflowed the C++ stack -- a crash of `arbor serve` at start-up or
// on the first chat request. jinja2 stops at Python's recursion limit; arbor now errors too.
TEST(JinjaInterpreterTest, UnboundedNestingIsAnErrorNotAStackOverflow) {
  auto expect_failure = [](const std::string& source, const std::string& detail) {
    SCOPED_TRACE(source.substr(0, 80));
    try {
      ChatTemplate tpl(source, "", "");
      tpl.render(nlohmann::ordered_json::array(), true);
      ADD_FAILURE() << "expected an error";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(detail), std::string::npos) << e.what();
    }
  };
  auto repeat = [](const std::string& s, int n) {
    std::string out;
    for (int i = 0; i < n; ++i) out += s;
    return out;
  };
  expect_failure("{% macro m() %}{{ m() }}{% endmacro %}{{ m() }}",
                 "maximum recursion depth exceeded");
  expect_failure("{% macro m(k) %}" + repeat("{% if true %}", 150) + "{{ m(k) }}" +
                     repeat("{% endif %}", 150) + "{% endmacro %}{{ m(1) }}",
                 "maximum recursion depth exceeded");
  expect_failure("{{ " + repeat("(", 1000) + "1" + repeat(")", 1000) + " }}",
                 "nested deeper than 200 levels");
  expect_failure("{{ " + repeat("[", 1000) + repeat("]", 1000) + " }}",
                 "nested deeper than 200 levels");
  expect_failure(repeat("{% if true %}", 1000) + repeat("{% endif %}", 1000),
                 "nested deeper than 200 levels");
  expect_failure("{{ " + repeat("not ", 1000) + "x }}", "nested deeper than 200 levels");
  expect_failure("{{ " + repeat("1 + ", 5000) + "1 }}", "more than 1000 expression nodes");

  // Nesting real templates use is far from the bounds.
  const ChatTemplate tpl("{% macro m(k) %}{% if k > 0 %}({{ m(k - 1) }}){% endif %}{% endmacro %}" +
                             std::string("{{ m(30) }}{{ ") + repeat("(", 20) + "1 + 2" +
                             repeat(")", 20) + " }}",
                         "", "");
  EXPECT_EQ(tpl.render(nlohmann::ordered_json::array(), true),
            repeat("(", 30) + repeat(")", 30) + "3");
}

// Found by review while writing tests/fuzz/chat_template_source (UBSan and libFuzzer's limits
// flagged the hand-made inputs): 64-bit integer arithmetic overflowed (undefined behaviour:
// 2**64, INT64_MIN // -1, -INT64_MIN, sums, abs, int(1e308)), and templates could build
// gigabytes ('a' * 10**9, a string doubled in a loop) or loop for minutes. Python's integers do
// not overflow; arbor's are 64-bit and a result that does not fit is an error.
TEST(JinjaInterpreterTest, OverflowAndRunawayTemplatesAreErrors) {
  auto render = [](const std::string& source) {
    return ChatTemplate(source, "", "").render(nlohmann::ordered_json::array(), false);
  };
  auto expect_failure = [&](const std::string& source, const std::string& detail) {
    SCOPED_TRACE(source);
    try {
      const std::string out = render(source);
      ADD_FAILURE() << "expected an error, rendered " << out.substr(0, 80);
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(std::string(e.what()).find(detail), std::string::npos) << e.what();
    }
  };
  const std::string min = "(-9223372036854775807 - 1)";
  expect_failure("{{ 9223372036854775807 + 1 }}", "integer overflow");
  expect_failure("{{ " + min + " - 1 }}", "integer overflow");
  expect_failure("{{ 3037000500 * 3037000500 }}", "integer overflow");
  expect_failure("{{ " + min + " // -1 }}", "integer overflow");
  expect_failure("{{ -" + min + " }}", "integer overflow");
  expect_failure("{{ 2 ** 64 }}", "integer overflow");
  expect_failure("{{ [9223372036854775807, 1]|sum }}", "integer overflow");
  expect_failure("{{ " + min + "|abs }}", "integer overflow");
  expect_failure("{{ 1e308|int }}", "integer overflow");
  expect_failure("{{ 'x'|indent(99999999999) }}", "indent width");
  expect_failure("{{ 'a' * 1000000000 }}", "size limits");
  expect_failure("{{ [1, 2] * 1000000000 }}", "size limits");
  expect_failure(
      "{% set ns = namespace(s='ab') %}{% for i in range(40) %}{% set ns.s = ns.s ~ ns.s %}"
      "{% endfor %}",
      "size limits");
  expect_failure("{% for i in range(1000) %}{% for j in range(1000) %}{% endfor %}{% endfor %}",
                 "evaluation steps");
  // What still works, as in Python: results that fit, x % -1, ranges ending at the extremes.
  EXPECT_EQ(render("{{ 2 ** 62 }} {{ (-2) ** 63 }} {{ 1 ** 1000000000000000000 }}"),
            "4611686018427387904 -9223372036854775808 1");
  EXPECT_EQ(render("{{ " + min + " % -1 }} {{ " + min + " is divisibleby(-1) }}"), "0 True");
  EXPECT_EQ(render("{{ range(9223372036854775800, 9223372036854775807, 5)|list }}"),
            "[9223372036854775800, 9223372036854775805]");
  EXPECT_EQ(render("{{ 'nan'|int }} {{ 'x'|indent(-3) }}{{ 'a' * 3 }}"), "0 xaaa");
}

TEST(ChatTemplateTest, MissingTemplateIsNotFound) {
  TokenizerSpec spec;
  try {
    chat_template_from_spec(spec);
    ADD_FAILURE() << "expected kNotFound";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), ErrorCode::kNotFound);
  }
}

TEST(ChatTemplateTest, SmolLm2GgufTemplateRendersLikeJinja2) {
  const std::string path = std::string(ARBOR_MODELS_DIR) + "/SmolLM2-135M-Instruct.Q4_1.gguf";
  if (!std::filesystem::exists(path)) GTEST_SKIP() << "missing " << path;
  const TokenizerSpec spec = tokenizer_spec_from_gguf(GgufFile::open(path).metadata());
  EXPECT_EQ(spec.chat_template, read_text(kDataDir + "/smollm2.jinja"));
  const ChatTemplate tpl = chat_template_from_spec(spec);
  const ordered_json& fixture = fixtures()["templates"]["smollm2"];
  for (const ordered_json& c : fixture["cases"]) {
    expect_matches(c, [&] {
      return tpl.render(c["messages"], c["add_generation_prompt"].get<bool>(), c["extra"]);
    });
  }
}

}  // namespace
}  // namespace arbor
