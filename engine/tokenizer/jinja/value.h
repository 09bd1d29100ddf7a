// The dynamic value of the Jinja interpreter, with Python's semantics where chat templates can
// observe them: str() / repr() spelling, truthiness, ==, <, json.dumps. Lists, dicts and
// namespaces are shared by reference, as Python objects are; dicts keep insertion order.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

namespace arbor::jinja {

class Value;
using ValueList = std::vector<Value>;

// Size limits of one rendering, so that a template building gigabytes (a string doubled in a
// loop, 'a' * 10**9) fails instead of exhausting memory: any string value and the rendered
// text, and any list. Rendered chat prompts are at most a few MiB.
inline constexpr uint64_t kMaxStringBytes = uint64_t{64} << 20;
inline constexpr uint64_t kMaxListItems = uint64_t{1} << 20;

// An insertion-ordered mapping (Python dict). Linear lookup: template dicts are small.
struct ValueDict {
  std::vector<std::pair<Value, Value>> entries;

  const Value* find(const Value& key) const;
  const Value* find(const std::string& key) const;
  void set(const Value& key, Value value);
};

// Arguments of a call: positional, then keyword (Python order).
struct CallArgs {
  ValueList positional;
  std::vector<std::pair<std::string, Value>> keyword;

  // The argument at `index` or named `name`, or nullptr when absent.
  const Value* get(size_t index, const std::string& name) const;
};

using NativeFunction = std::function<Value(const CallArgs&)>;

class Value {
 public:
  enum class Kind {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };

  Value() = default;                            // undefined, no name
  static Value undefined(std::string message);  // message: what jinja2 says on misuse
  static Value none();
  static Value boolean(bool b);
  static Value integer(int64_t i);
  static Value number(double d);
  static Value string(std::string s);
  static Value list(ValueList items, bool is_tuple = false);
  static Value dict(ValueDict dict);
  static Value namespace_object(ValueDict attributes);
  static Value function(std::string name, NativeFunction fn);
  static Value from_json(const nlohmann::ordered_json& json);

  Kind kind() const { return kind_; }
  bool is_undefined() const { return kind_ == Kind::kUndefined; }
  bool is_none() const { return kind_ == Kind::kNone; }
  bool is_bool() const { return kind_ == Kind::kBool; }
  bool is_int() const { return kind_ == Kind::kInt; }
  bool is_float() const { return kind_ == Kind::kFloat; }
  bool is_number() const {
    return kind_ == Kind::kInt || kind_ == Kind::kFloat || kind_ == Kind::kBool;
  }
  bool is_string() const { return kind_ == Kind::kString; }
  bool is_list() const { return kind_ == Kind::kList; }
  bool is_dict() const { return kind_ == Kind::kDict; }
  bool is_namespace() const { return kind_ == Kind::kNamespace; }
  bool is_function() const { return kind_ == Kind::kFunction; }
  bool is_tuple() const { return kind_ == Kind::kList && tuple_; }

  bool as_bool() const { return bool_; }
  int64_t as_int() const { return kind_ == Kind::kBool ? (bool_ ? 1 : 0) : int_; }
  double as_double() const {
    return kind_ == Kind::kFloat ? float_ : static_cast<double>(as_int());
  }
  // String contents; for undefined values the error message jinja2 would raise.
  const std::string& as_string() const { return string_; }
  ValueList& items() const { return *list_; }    // list / tuple
  ValueDict& entries() const { return *dict_; }  // dict / namespace attributes
  const NativeFunction& call() const { return *function_; }
  const std::string& function_name() const { return string_; }

  // Python truthiness (undefined is falsy).
  bool truthy() const;
  // str(x) as jinja2 prints it: undefined -> "", None -> "None", True -> "True", lists as repr.
  std::string str() const;
  // repr(x): strings quoted as Python does.
  std::string repr() const;
  // Python type name for messages ("str", "int", "dict", "NoneType").
  std::string type_name() const;
  // The values `for x in v` visits: list items, dict keys, string characters; undefined is
  // empty. Throws std::runtime_error for a non-iterable.
  ValueList iterate() const;

 private:
  Kind kind_ = Kind::kUndefined;
  bool bool_ = false;
  bool tuple_ = false;
  int64_t int_ = 0;
  double float_ = 0;
  std::string string_;
  std::shared_ptr<ValueList> list_;
  std::shared_ptr<ValueDict> dict_;
  std::shared_ptr<NativeFunction> function_;
};

// Python ==, with 1 == 1.0 == True; undefined equals only undefined.
bool values_equal(const Value& a, const Value& b);
// Python <; throws std::runtime_error for unorderable types.
bool value_less(const Value& a, const Value& b);
// Python's float repr ("0.1", "1e+16", "2.5e-07", "5.0").
std::string python_float_repr(double d);

// json.dumps(value, ensure_ascii=False, indent, separators, sort_keys), as transformers'
// tojson filter. indent < 0: none. Throws std::runtime_error for non-serializable values.
struct JsonDumpOptions {
  int indent = -1;
  std::string item_separator;  // empty: Python's default for the indent
  std::string key_separator;
  bool has_separators = false;
  bool sort_keys = false;
};
std::string json_dumps(const Value& value, const JsonDumpOptions& options);

// UTF-8 helpers: Python indexes strings by code point.
std::vector<std::string> utf8_chars(const std::string& s);
size_t utf8_length(const std::string& s);

}  // namespace arbor::jinja
