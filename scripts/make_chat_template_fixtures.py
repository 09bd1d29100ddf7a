#!/usr/bin/env python3
"""Renders the chat template fixtures with Python jinja2, the way Hugging Face transformers'
apply_chat_template does, into tests/data/chat_templates/expected.json.

The environment copies transformers' (utils/chat_template_utils.py, _cached_compile_jinja_template):
ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[loopcontrols]),
its tojson filter (json.dumps, ensure_ascii=False), raise_exception, strftime_now, dict and a
Namespace that rejects underscore attributes. Templates are rendered with messages, tools=None,
documents=None, add_generation_prompt, bos_token, eos_token and any extra kwargs, as
render_jinja_template does.

When transformers is importable, every template case is also rendered with its own
render_jinja_template and must agree. tests/unit/chat_template_test.cc compares arbor::ChatTemplate / jinja::Template output with these
strings byte for byte. Usage: python3 scripts/make_chat_template_fixtures.py
"""
import json
import os
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DATA = os.path.join(ROOT, "tests", "data", "chat_templates")


def make_environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    def strftime_now(format):
        return datetime.now().strftime(format)

    class TemplateDict:
        def __call__(self, *args, **kwargs):
            return dict(*args, **kwargs)

    class TemplateNamespace(jinja2.utils.Namespace):
        def __init__(*args, **kwargs):
            self, args = args[0], args[1:]
            attrs = dict(*args, **kwargs)
            for name in attrs:
                TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__init__(self, attrs)

        def __setitem__(self, name, value):
            TemplateNamespace._check_name(name)
            jinja2.utils.Namespace.__setitem__(self, name, value)

        @staticmethod
        def _check_name(name):
            if isinstance(name, str) and name.startswith("_"):
                raise jinja2.exceptions.SecurityError(
                    f"Chat templates cannot store underscore-prefixed attributes on a namespace, "
                    f"but got {name!r}. Please rename the attribute.")

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    env.globals["dict"] = TemplateDict()
    env.globals["namespace"] = TemplateNamespace
    return env


ENV = make_environment()


def run(render):
    """{"expected": text} or {"error": message, "error_kind": "raise_exception" | "runtime"}."""
    try:
        return {"expected": render()}
    except jinja2.exceptions.SecurityError as e:
        return {"error": str(e), "error_kind": "runtime"}
    except jinja2.exceptions.UndefinedError as e:
        return {"error": str(e), "error_kind": "runtime"}
    except jinja2.exceptions.TemplateError as e:
        return {"error": str(e), "error_kind": "raise_exception"}
    except (TypeError, ValueError, ZeroDivisionError) as e:
        return {"error": str(e), "error_kind": "runtime"}


# ---- conversations ----
SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
U1 = {"role": "user", "content": "Hello!"}
A1 = {"role": "assistant", "content": "Hi there. How can I help?"}
U2 = {"role": "user", "content": "What is 2 + 2?"}
TRICKY = {"role": "user",
          "content": "  Héllo wörld — 世界 🌍\nline two\n\t\"double\" and 'single' quotes, a \\ backslash, {{ not jinja }} {% raw %}  "}
TRICKY_REPLY = {"role": "assistant", "content": "\n  Ünïcødé reply: ✓ <b>tags</b> & ampersands  \n"}
EMPTY_USER = {"role": "user", "content": ""}
EMPTY_ASSISTANT = {"role": "assistant", "content": ""}

BASIC_CASES = [
    ("system_user_generation", [SYSTEM, U1], True),
    ("user_only", [U1], False),
    ("user_only_generation", [U1], True),
    ("multi_turn_system", [SYSTEM, U1, A1, U2], True),
    ("multi_turn_no_system", [U1, A1, U2], False),
    ("multi_turn_ends_with_assistant", [U1, A1], False),
    ("unicode_newlines_quotes", [SYSTEM, TRICKY, TRICKY_REPLY, U2], True),
    ("empty_content", [EMPTY_USER, EMPTY_ASSISTANT, U1], True),
]

ALTERNATION_ERRORS = [
    ("error_user_user", [U1, U2], True),
    ("error_starts_with_assistant", [A1, U1], True),
]

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Get the current weather in a city",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "description": "City name, e.g. Zürich"},
                "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city"],
        },
    },
}
TOOL_CALL = {"id": "call12345", "type": "function",
             "function": {"name": "get_weather", "arguments": {"city": "Zürich", "unit": "celsius"}}}
TOOL_CONVERSATION = [
    SYSTEM,
    {"role": "user", "content": "Weather in Zürich?"},
    {"role": "assistant", "content": "", "tool_calls": [TOOL_CALL]},
    {"role": "tool", "tool_call_id": "call12345", "name": "get_weather",
     "content": "{\"temperature\": 21, \"sky\": \"sunny\"}"},
    {"role": "tool", "tool_call_id": "call12345", "name": "get_weather", "content": "second result"},
    {"role": "assistant", "content": "It is 21°C and sunny."},
    {"role": "user", "content": "Thanks"},
]

TEMPLATES = {
    # meta-llama/Llama-2-7b-chat-hf tokenizer_config.json
    "llama2": {"bos_token": "<s>", "eos_token": "</s>",
               "cases": BASIC_CASES + ALTERNATION_ERRORS},
    # meta-llama/Meta-Llama-3-8B-Instruct tokenizer_config.json
    "llama3": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>", "cases": BASIC_CASES},
    # meta-llama/Llama-3.1-8B-Instruct (llama.cpp models/templates)
    "llama3_1": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>",
                 "cases": BASIC_CASES + [
                     ("tools_in_user_message", TOOL_CONVERSATION[1:3] + [
                         {"role": "ipython", "content": {"temperature": 21}},
                         {"role": "tool", "content": "plain text result"},
                     ], True, {"tools": [WEATHER_TOOL]}),
                     ("tools_in_system_message", TOOL_CONVERSATION[:3], True,
                      {"tools": [WEATHER_TOOL], "tools_in_user_message": False,
                       "date_string": "01 Jan 2025"}),
                     ("builtin_tools", [SYSTEM, {"role": "user", "content": "Search it"},
                                        {"role": "assistant", "tool_calls": [
                                            {"type": "function", "function": {
                                                "name": "brave_search",
                                                "arguments": {"query": "weather", "count": "3"}}}]}],
                      False, {"builtin_tools": ["brave_search", "code_interpreter", "wolfram_alpha"]}),
                     ("error_two_tool_calls", [U1, {"role": "assistant",
                                                    "tool_calls": [TOOL_CALL, TOOL_CALL]}], False),
                     ("error_tools_without_user_message", [SYSTEM], True, {"tools": [WEATHER_TOOL]}),
                 ]},
    # mistralai/Mistral-7B-Instruct-v0.1 / v0.2 / Mixtral-8x7B-Instruct-v0.1
    "mistral_v1": {"bos_token": "<s>", "eos_token": "</s>",
                   "cases": [c for c in BASIC_CASES if c[1][0]["role"] != "system"] +
                   ALTERNATION_ERRORS + [("error_system_role", [SYSTEM, U1], True)]},
    # mistralai "v3" template (Mistral-7B-Instruct-v0.3 / Mistral-Large-Instruct-2407)
    "mistral_v3": {"bos_token": "<s>", "eos_token": "</s>",
                   "cases": BASIC_CASES + ALTERNATION_ERRORS + [
                       ("tools", [
                           {"role": "user", "content": "Weather in Zürich?"},
                           {"role": "assistant", "tool_calls": [TOOL_CALL]},
                           {"role": "tool", "tool_call_id": "call12345", "content": "21 degrees"},
                           {"role": "assistant", "content": "It is 21 degrees."},
                           {"role": "user", "content": "Thanks"},
                       ], False, {"tools": [WEATHER_TOOL]}),
                       ("error_bad_tool_call_id", [
                           {"role": "user", "content": "Weather?"},
                           {"role": "assistant", "tool_calls": [dict(TOOL_CALL, id="short")]},
                       ], False),
                   ]},
    # Qwen/Qwen2.5-7B-Instruct (llama.cpp models/templates)
    "qwen2_5": {"bos_token": "", "eos_token": "<|im_end|>",
                "cases": BASIC_CASES + [
                    ("tools", TOOL_CONVERSATION, True, {"tools": [WEATHER_TOOL]}),
                    ("tool_calls_without_tools", TOOL_CONVERSATION[1:], False),
                ]},
    # HuggingFaceTB/SmolLM2-135M-Instruct (GGUF tokenizer.chat_template)
    "smollm2": {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "cases": BASIC_CASES},
    # eachadea/vicuna-13b-1.1 (llama.cpp tests/test-chat-template.cpp)
    "vicuna": {"bos_token": "<s>", "eos_token": "</s>", "cases": BASIC_CASES},
    # ChatML as arbor::chatml_template_source() spells it
    "chatml": {"bos_token": "", "eos_token": "<|im_end|>", "cases": BASIC_CASES},
}

# ---- interpreter snippets: (name, template, variables) ----
SNIPPETS = [
    # whitespace control, trim_blocks, lstrip_blocks
    ("trim_blocks", "{% if true %}\nyes\n{% endif %}\nafter", {}),
    ("lstrip_blocks", "  {% if true %}\n    x\n  {% endif %}\nend", {}),
    ("lstrip_not_for_variables", "  {{ 'v' }}\n  {% if true %}w{% endif %}", {}),
    ("minus_strips_newlines", "a  \n  {{- 'b' -}}  \n  c\n{%- if true -%}\n d \n{%- endif -%}\n e", {}),
    ("plus_disables_lstrip", "  {%+ if true %}x{% endif %}\n  {%+ if true +%}\ny{% endif %}", {}),
    ("comments", "a {# comment #}\n  {# own line #}\nb {#- strip -#}  c", {}),
    ("trailing_newline_removed", "text\n", {}),
    ("crlf_normalized", "a\r\n{% if true %}\r\nb\r\n{% endif %}\r\n", {}),
    ("raw_block", "{% raw %}{{ not evaluated }}{% endraw %}!", {}),
    ("text_after_inline_block", "{% set x = 1 %}   indented\n{% set y = 2 %}\n   {{ x + y }}", {}),
    # loops
    ("loop_variables",
     "{% for x in items %}{{ loop.index }}/{{ loop.index0 }}/{{ loop.revindex }}/{{ loop.revindex0 }}/"
     "{{ loop.first }}/{{ loop.last }}/{{ loop.length }}|{% endfor %}", {"items": ["a", "b", "c"]}),
    ("loop_filter_and_else",
     "{% for x in items if x > 1 %}{{ x }}:{{ loop.index }}:{{ loop.length }} {% else %}none{% endfor %}"
     "{% for x in [] %}{% else %}empty{% endfor %}", {"items": [1, 2, 3, 0, 5]}),
    ("loop_break_continue",
     "{% for x in range(10) %}{% if x == 2 %}{% continue %}{% endif %}{% if x > 5 %}{% break %}"
     "{% endif %}{{ x }}{% endfor %}", {}),
    ("loop_dict_items", "{% for k, v in d.items() %}{{ k }}={{ v }};{% endfor %}{% for k in d %}{{ k }}{% endfor %}",
     {"d": {"b": 1, "a": [1, 2], "c": None}}),
    ("loop_items_filter", "{% for k, v in d | items %}{{ k }}:{{ v }} {% endfor %}", {"d": {"x": "1", "y": True}}),
    ("loop_scoping", "{% set x = 5 %}{% for i in [1, 2] %}[{{ x }}]{% set x = i %}({{ x }}){% endfor %}{{ x }}", {}),
    ("nested_loops",
     "{% for a in [1, 2] %}{% for b in 'xy' %}{{ a }}{{ b }}{{ loop.index }}{% endfor %}{{ loop.index }};{% endfor %}", {}),
    ("loop_previtem_cycle",
     "{% for x in [1, 2, 3] %}{{ loop.previtem is defined }}{{ loop.nextitem | default('-') }}{{ loop.cycle('a', 'b') }} {% endfor %}", {}),
    # namespaces, set
    ("namespace",
     "{% set ns = namespace(count=0, seen=false) %}{% for m in msgs %}{% if m.role == 'user' %}"
     "{% set ns.count = ns.count + 1 %}{% set ns.seen = true %}{% endif %}{% endfor %}{{ ns.count }} {{ ns.seen }}",
     {"msgs": [{"role": "user"}, {"role": "assistant"}, {"role": "user"}]}),
    ("set_block", "{% set greeting %}Hello {{ name }}!{% endset %}[{{ greeting }}]", {"name": "Bob"}),
    ("set_tuple", "{% set a, b = [1, 'two'] %}{{ b }}{{ a }}", {}),
    ("macro", "{% macro tag(name, body='x') %}<{{ name }}>{{ body }}</{{ name }}>{% endmacro %}{{ tag('a') }}{{ tag('b', body='y') }}", {}),
    # filters
    ("filters_string",
     "{{ s | trim }}|{{ s | upper }}|{{ s | lower }}|{{ 'hello wORLD' | capitalize }}|{{ 'hello big-world' | title }}|"
     "{{ s | length }}|{{ s | replace('l', 'L') }}|{{ s | trim | replace('l', 'L', 1) }}", {"s": "  Hello World \n"}),
    ("filters_tojson",
     "{{ v | tojson }}\n{{ v | tojson(indent=2) }}\n{{ v | tojson(indent=4) }}\n{{ 'ünï \"q\"\\n' | tojson }}\n{{ [] | tojson }}{{ {} | tojson(indent=2) }}\n"
     "{{ v | tojson(separators=(',', ':')) }}\n{{ v | tojson(sort_keys=true) }}",
     {"v": {"name": "f", "args": {"z": 1, "a": [1.5, None, True, False, "é"]}, "n": -3, "e": 1e-07, "big": 1e16}}),
    ("filters_sequences",
     "{{ xs | join(', ') }}|{{ xs | first }}|{{ xs | last }}|{{ xs | length }}|{{ xs | list }}|{{ 'abc' | list }}|"
     "{{ xs | reverse | join }}|{{ xs | sort | join }}|{{ [3, 1, 2] | sort(reverse=true) | join }}|{{ [1, 2, 1] | unique | list }}|"
     "{{ [1, 2, 3] | sum }}|{{ [4, 2, 8] | max }}{{ [4, 2, 8] | min }}", {"xs": ["b", "a", "c"]}),
    ("filters_default",
     "{{ missing | default('dflt') }}|{{ '' | default('empty') }}|{{ '' | default('empty', true) }}|{{ none | default('n') }}|"
     "{{ missing | d('short') }}|{{ value | default('unused') }}", {"value": 0}),
    ("filters_select_map",
     "{{ ms | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(',') }}|"
     "{{ ms | rejectattr('role', 'equalto', 'user') | map(attribute='content') | list }}|"
     "{{ ms | selectattr('flag') | list | length }}|{{ [1, 2, 3, 4] | select('odd') | list }}|"
     "{{ ['a', 'b'] | map('upper') | join }}|{{ ms | map(attribute='missing', default='?') | join }}|"
     "{{ ['x', 'code', 'y'] | reject('equalto', 'code') | join(', ') }}",
     {"ms": [{"role": "user", "content": "u1", "flag": True}, {"role": "assistant", "content": "a1"},
             {"role": "user", "content": "u2"}]}),
    ("filters_numbers_strings",
     "{{ '42' | int + 1 }}|{{ '3.7' | int }}|{{ 'x' | int }}|{{ 'x' | int(7) }}|{{ 3 | string + 'a' }}|{{ '2.5' | float }}|"
     "{{ -3 | abs }}|{{ 2.567 | round(2) }}|{{ 'a<b>&\"c\"' | escape }}|{{ 'x' | safe }}|{{ 'one two  three' | wordcount }}", {}),
    ("filter_indent", "{{ 'a\nb\n\nc' | indent(2) }}|{{ 'a\nb' | indent(2, true) }}|{{ 'a\n\nb' | indent(width='--', blank=true) }}", {}),
    ("filter_items_dictsort", "{{ d | items | list }}|{{ d | dictsort }}", {"d": {"b": 2, "a": 1}}),
    # tests
    ("tests",
     "{{ x is defined }}{{ y is defined }}{{ y is undefined }}{{ n is none }}{{ s is string }}{{ d is mapping }}"
     "{{ l is iterable }}{{ s is iterable }}{{ l is sequence }}{{ 3 is number }}{{ 3.5 is number }}{{ true is number }}"
     "{{ 3 is integer }}{{ 3.0 is float }}{{ true is true }}{{ 1 is true }}{{ false is false }}{{ true is boolean }}"
     "{{ 4 is even }}{{ 3 is odd }}{{ 9 is divisibleby 3 }}{{ 'a' is equalto 'a' }}{{ 2 is eq 2 }}{{ 2 is ne 3 }}"
     "{{ 'a' is in 'cat' }}{{ 2 is in l }}{{ 'ab' is lower }}{{ 'AB' is upper }}{{ x is not none }}{{ d is not mapping }}"
     "{{ range is callable }}{{ 3 is gt 2 }}{{ 3 is lt 2 }}",
     {"x": 1, "n": None, "s": "str", "d": {"k": 1}, "l": [1, 2]}),
    # operators
    ("operators",
     "{{ 1 + 2 * 3 }}|{{ (1 + 2) * 3 }}|{{ 7 // 2 }}|{{ -7 // 2 }}|{{ 7 % 3 }}|{{ -7 % 3 }}|{{ 7 / 2 }}|{{ 6 / 3 }}|"
     "{{ 2 ** 10 }}|{{ 'a' ~ 1 ~ none }}|{{ 'ab' * 3 }}|{{ [1] + [2] }}|{{ 1.5 + 1 }}|{{ 0.1 + 0.2 }}|{{ -x }}|"
     "{{ 1 < 2 < 3 }}|{{ 3 > 2 > 2 }}|{{ 1 == 1.0 }}|{{ 'a' != 'b' }}|{{ 'b' >= 'a' }}|{{ [1, 2] < [1, 3] }}|"
     "{{ 'x' in 'xyz' }}|{{ 'k' in d }}|{{ 3 not in [1, 2] }}|{{ not 'k' in d }}|{{ none == none }}|{{ true == 1 }}",
     {"x": 5, "d": {"k": 1}}),
    ("logic",
     "{{ a and b }}|{{ a or b }}|{{ b or 'fallback' }}|{{ not a }}|{{ a and not b }}|{{ '' or [] or 0 }}|"
     "{{ 'yes' if a else 'no' }}|{{ 'yes' if b else 'no' }}|[{{ 'only' if b }}]|{{ 1 if b else 2 if a else 3 }}",
     {"a": "x", "b": 0}),
    # literals, indexing, slicing
    ("literals",
     "{{ 'single' }}{{ \"double\" }}{{ 'esc\\'aped \\\"q\\\" \\t tab \\\\ \\u00e9 \\x41' }}|{{ 'adj' 'acent' }}|{{ [1, 'a', none, true, 1.0] }}|"
     "{{ {'k': 'v', 'n': [1]} }}|{{ (1, 2) }}|{{ (1,) }}|{{ 1_000 }}|{{ 1e3 }}|{{ 2.50 }}|{{ True }}{{ None }}|{{ {'q': \"it's\"} }}", {}),
    ("indexing_slicing",
     "{{ l[0] }}{{ l[-1] }}{{ l[1:] }}{{ l[:-1] }}{{ l[::-1] }}{{ l[::2] }}{{ s[1:3] }}{{ s[::-1] }}{{ s[-2:] }}"
     "|{{ d['k'] }}{{ d.k }}{{ l.0 }}|{{ u[1:] }}{{ u[0] }}|[{{ l[10] }}]|{{ d.items() | list }}{{ d.get('k') }}{{ d.get('z', 'dz') }}{{ d.get('z') }}",
     {"l": [1, 2, 3, 4], "s": "hello", "d": {"k": "v"}, "u": "éàü"}),
    # methods
    ("string_methods",
     "[{{ s.strip() }}][{{ s.lstrip() }}][{{ s.rstrip() }}][{{ 'xxhixx'.strip('x') }}]{{ 'a,b,,c'.split(',') }}{{ ' a  b '.split() }}"
     "{{ 'a b c'.split(' ', 1) }}{{ s.startswith('  he') }}{{ 'abc'.endswith(('x', 'c')) }}{{ 'Ab'.upper() }}{{ 'Ab'.lower() }}"
     "{{ 'hello world'.title() }}{{ 'hELLO'.capitalize() }}{{ 'aaa'.replace('a', 'b', 2) }}{{ 'hello'.find('l') }}{{ 'hello'.count('l') }}"
     "{{ '-'.join(['a', 'b']) }}", {"s": "  hello \n"}),
    # undefined behaviour
    ("undefined_prints_empty", "[{{ missing }}][{{ d.nokey }}][{{ missing | length }}][{{ missing | trim }}]"
     "{% for x in missing %}never{% endfor %}{% if not missing %}falsy{% endif %}{{ missing is defined }}", {"d": {}}),
    ("undefined_attribute_error", "{{ missing.attr }}", {}),
    ("undefined_nested_attribute_error", "{{ d.a.b }}", {"d": {}}),
    ("undefined_concat_error", "{{ missing + 'x' }}", {}),
    ("type_error_str_plus_int", "{{ 'a' + 1 }}", {}),
    ("unsafe_list_append", "{% set l = [] %}{{ l.append(1) }}", {}),
    ("namespace_underscore_error", "{% set ns = namespace() %}{% set ns._x = 1 %}", {}),
    ("raise_exception", "{% if true %}{{ raise_exception('custom failure: ' ~ 42) }}{% endif %}", {}),
    ("call_undefined", "{{ nope() }}", {}),
    # edge cases
    ("lstrip_only_at_line_start", "x  {% if true %}y{% endif %}\n\t {% if true %}z{% endif %}\n{{ 'a' }}\n  {% if true %}b{% endif %}", {}),
    ("strip_after_variable_end", "{{ 'a' -}}\n   {% if true %}b{% endif %}\n{# c #}\n  {#- d #} e", {}),
    ("unicode_whitespace_trim", "[{{ s | trim }}][{{ s.strip() }}][{{ s.split() }}]", {"s": "\u00a0\u3000 x y \u2003\n"}),
    ("float_formatting", "{{ 1e22 }} {{ 123456.789 }} {{ 1 / 3 * 3 }} {{ 2 ** -1 }} {{ -2 ** 2 }} {{ 10 // 3 * 2 }} {{ 1.0e-10 }} {{ 100.0 }} {{ 3 / 1 }}", {}),
    ("repr_quotes", "{{ [\"it's\", 'say \"hi\"', 'both \\' and \"', 'tab\there'] }}", {}),
    ("dict_method_shadowing", "{{ d['items'] }}|{{ d.keys() | list }}|{{ d.values() | list }}|{{ 'items' in d }}", {"d": {"items": 3, "x": 1}}),
    ("empty_list_index_error", "{{ l[0]['role'] }}", {"l": []}),
    ("undefined_is_defined_error", "{{ x.y is defined }}", {}),
    ("inline_if_without_else", "[{{ 1 if none }}][{{ 'a' if 'x' in 'xyz' }}]", {}),
    ("selectattr_dotted", "{{ calls | selectattr('function.name', 'equalto', 'b') | map(attribute='function.arguments') | list }}",
     {"calls": [{"function": {"name": "a", "arguments": "1"}}, {"function": {"name": "b", "arguments": "2"}}]}),
    ("tojson_nested_indent_unicode", "{{ v | tojson(indent=2) }}", {"v": [{"k": "ü\u0001\u007f", "e": {}, "l": [[]]}, 1.25, -0.0, 10 ** 18]}),
    ("string_concat_loop", "{% set ns = namespace(out='') %}{% for c in 'héllo' %}{% set ns.out = c ~ ns.out %}{% endfor %}{{ ns.out }}|{{ 'héllo' | length }}|{{ 'héllo'[1] }}", {}),
    ("truthiness", "{% for v in [0, 1, '', 'a', [], [0], {}, none, 0.0] %}{{ 'T' if v else 'F' }}{% endfor %}", {}),
    ("comparisons_mixed", "{{ 1 == '1' }}{{ [1] == [1.0] }}{{ {'a': 1} == {'a': 1} }}{{ none != false }}{{ 'B' < 'a' }}{{ 'é' > 'z' }}", {}),
    ("macro_scope", "{% set g = 'global' %}{% macro m(x) %}{{ x }}-{{ g }}-{{ y }}{% endmacro %}{% for y in [1] %}{{ m('a') }}{% endfor %}", {}),
    ("loop_unpack_tuple_literal", "{% for a, b in [(1, 2), [3, 4]] %}{{ a + b }}{% endfor %}", {}),
    ("nested_data_access", "{{ m.tool_calls[0].function.arguments.city }}|{{ m['tool_calls'][0]['id'] }}|{{ m.tool_calls | length }}",
     {"m": {"tool_calls": [{"id": "x1", "function": {"arguments": {"city": "Oslo"}}}]}}),
    ("generation_block_absent_tag", "{% for m in ms %}{{ m }}{% endfor %}", {"ms": ["a", "b"]}),
]


def cross_check_with_transformers(source, messages, add_generation_prompt, kwargs, entry):
    """When transformers is installed, its own render_jinja_template must agree with ENV."""
    try:
        from transformers.utils.chat_template_utils import render_jinja_template
    except ImportError:
        return
    kwargs = dict(kwargs)
    tools = kwargs.pop("tools")
    documents = kwargs.pop("documents")
    try:
        rendered, _ = render_jinja_template([json.loads(json.dumps(messages))], tools=tools,
                                            documents=documents, chat_template=source,
                                            add_generation_prompt=add_generation_prompt, **kwargs)
        got = {"expected": rendered[0]}
    except Exception as e:  # noqa: BLE001 - compare whatever transformers raises
        got = {"error": str(e)}
    want = {k: v for k, v in entry.items() if k in ("expected", "error")}
    assert got == want, f"{entry['name']}: transformers gives {got!r}, ENV gives {want!r}"


def main():
    templates = {}
    for name, spec in TEMPLATES.items():
        if name == "chatml":
            source = ("{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + "
                      "message['content'] + '<|im_end|>' + '\\n'}}{% endfor %}{% if add_generation_prompt %}"
                      "{{ '<|im_start|>assistant\\n' }}{% endif %}")
            file = None
        else:
            file = name + ".jinja"
            with open(os.path.join(DATA, file), encoding="utf-8") as f:
                source = f.read()
        compiled = ENV.from_string(source)
        cases = []
        for case in spec["cases"]:
            case_name, messages, add_generation_prompt = case[:3]
            extra = case[3] if len(case) > 3 else {}
            kwargs = {"bos_token": spec["bos_token"], "eos_token": spec["eos_token"], **extra}
            kwargs.setdefault("tools", None)
            kwargs.setdefault("documents", None)

            def render():
                return compiled.render(messages=json.loads(json.dumps(messages)),
                                       add_generation_prompt=add_generation_prompt, **kwargs)

            entry = {"name": case_name, "messages": messages,
                     "add_generation_prompt": add_generation_prompt, "extra": extra}
            entry.update(run(render))
            cross_check_with_transformers(source, messages, add_generation_prompt, kwargs, entry)
            cases.append(entry)
        templates[name] = {"file": file, "bos_token": spec["bos_token"], "eos_token": spec["eos_token"],
                           "cases": cases}

    snippets = []
    for name, source, variables in SNIPPETS:
        entry = {"name": name, "template": source, "variables": variables}
        entry.update(run(lambda: ENV.from_string(source).render(**json.loads(json.dumps(variables)))))
        snippets.append(entry)

    out = {"generator": "scripts/make_chat_template_fixtures.py", "jinja2": jinja2.__version__,
           "templates": templates, "snippets": snippets}
    with open(os.path.join(DATA, "expected.json"), "w", encoding="utf-8") as f:
        json.dump(out, f, ensure_ascii=False, indent=1)
        f.write("\n")
    n_cases = sum(len(t["cases"]) for t in templates.values())
    print(f"wrote {n_cases} template cases and {len(snippets)} snippets")


if __name__ == "__main__":
    main()
