// What templates can reach besides the syntax: attribute / item access with jinja2's sandboxed
// lookup rules, Python str / dict methods, the filters and tests jinja2 ships (the subset chat
// templates use), and transformers' globals (raise_exception, strftime_now, namespace, ...).
// Failures throw std::runtime_error with jinja2's wording; the interpreter adds the position.
#pragma once

#include <string>

#include "engine/tokenizer/jinja/value.h"

namespace arbor::jinja {

// obj.name: methods first (str.strip, dict.items ...), then dict keys / namespace attributes;
// missing -> undefined carrying jinja2's message ("'dict object' has no attribute 'x'").
Value get_attribute(const Value& object, const std::string& name);
// obj[key]: dict keys / list and string indexes first, then attributes for string keys.
Value get_item(const Value& object, const Value& key);
// obj[start:stop:step] on lists, tuples and strings (null pointers: omitted).
Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step);

using FilterFunction = Value (*)(const Value& input, const CallArgs& args);
using TestFunction = bool (*)(const Value& input, const CallArgs& args);

// nullptr when jinja2 (as transformers configures it) has no such filter / test.
FilterFunction find_filter(const std::string& name);
TestFunction find_test(const std::string& name);

// range, dict, namespace, raise_exception (throws arbor::Error(kInvalidArgument) with the
// template's message), strftime_now.
void add_global_functions(ValueDict& globals);

// Python's str.strip / lstrip / rstrip: Unicode whitespace, or any code point of `chars`.
std::string python_strip(const std::string& s, bool left, bool right, const Value* chars);

}  // namespace arbor::jinja
