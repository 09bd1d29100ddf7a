#include "engine/tokenizer/jinja/value.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <stdexcept>

namespace arbor::jinja {

const Value* ValueDict::find(const Value& key) const {
  for (const auto& [k, v] : entries) {
    if (values_equal(k, key)) return &v;
  }
  return nullptr;
}

const Value* ValueDict::find(const std::string& key) const {
  for (const auto& [k, v] : entries) {
    if (k.is_string() && k.as_string() == key) return &v;
  }
  return nullptr;
}

void ValueDict::set(const Value& key, Value value) {
  for (auto& [k, v] : entries) {
    if (values_equal(k, key)) {
      v = std::move(value);
      return;
    }
  }
  entries.emplace_back(key, std::move(value));
}

const Value* CallArgs::get(size_t index, const std::string& name) const {
  if (index < positional.size()) return &positional[index];
  for (const auto& [k, v] : keyword) {
    if (k == name) return &v;
  }
  return nullptr;
}

Value Value::undefined(std::string message) {
  Value v;
  v.string_ = std::move(message);
  return v;
}

Value Value::none() {
  Value v;
  v.kind_ = Kind::kNone;
  return v;
}

Value Value::boolean(bool b) {
  Value v;
  v.kind_ = Kind::kBool;
  v.bool_ = b;
  return v;
}

Value Value::integer(int64_t i) {
  Value v;
  v.kind_ = Kind::kInt;
  v.int_ = i;
  return v;
}

Value Value::number(double d) {
  Value v;
  v.kind_ = Kind::kFloat;
  v.float_ = d;
  return v;
}

Value Value::string(std::string s) {
  Value v;
  v.kind_ = Kind::kString;
  v.string_ = std::move(s);
  return v;
}

Value Value::list(ValueList items, bool is_tuple) {
  Value v;
  v.kind_ = Kind::kList;
  v.tuple_ = is_tuple;
  v.list_ = std::make_shared<ValueList>(std::move(items));
  return v;
}

Value Value::dict(ValueDict dict) {
  Value v;
  v.kind_ = Kind::kDict;
  v.dict_ = std::make_shared<ValueDict>(std::move(dict));
  return v;
}

Value Value::namespace_object(ValueDict attributes) {
  Value v = dict(std::move(attributes));
  v.kind_ = Kind::kNamespace;
  return v;
}

Value Value::function(std::string name, NativeFunction fn) {
  Value v;
  v.kind_ = Kind::kFunction;
  v.string_ = std::move(name);
  v.function_ = std::make_shared<NativeFunction>(std::move(fn));
  return v;
}

Value Value::from_json(const nlohmann::ordered_json& json) {
  switch (json.type()) {
    case nlohmann::ordered_json::value_t::null:
      return none();
    case nlohmann::ordered_json::value_t::boolean:
      return boolean(json.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return integer(json.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return integer(static_cast<int64_t>(json.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return number(json.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return string(json.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      ValueList items;
      for (const auto& item : json) items.push_back(from_json(item));
      return list(std::move(items));
    }
    case nlohmann::ordered_json::value_t::object: {
      ValueDict d;
      for (const auto& [k, v] : json.items()) d.entries.emplace_back(string(k), from_json(v));
      return dict(std::move(d));
    }
    default:
      return undefined("unsupported JSON value");
  }
}

bool Value::truthy() const {
  switch (kind_) {
    case Kind::kUndefined:
    case Kind::kNone:
      return false;
    case Kind::kBool:
      return bool_;
    case Kind::kInt:
      return int_ != 0;
    case Kind::kFloat:
      return float_ != 0.0;
    case Kind::kString:
      return !string_.empty();
    case Kind::kList:
      return !list_->empty();
    case Kind::kDict:
      return !dict_->entries.empty();
    case Kind::kNamespace:
    case Kind::kFunction:
      return true;
  }
  return false;
}

std::string python_float_repr(double d) {
  if (std::isnan(d)) return "nan";
  if (std::isinf(d)) return d > 0 ? "inf" : "-inf";
  if (d == 0) return std::signbit(d) ? "-0.0" : "0.0";
  // Shortest round-trip digits, then Python's layout: fixed for 1e-4 <= |d| < 1e16.
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof(buf), d, std::chars_format::scientific);
  std::string sci(buf, res.ptr);
  const size_t e_pos = sci.find('e');
  std::string mantissa = sci.substr(0, e_pos);
  const int exponent = std::stoi(sci.substr(e_pos + 1));
  std::string sign;
  if (mantissa[0] == '-') {
    sign = "-";
    mantissa.erase(0, 1);
  }
  std::string digits;
  for (char c : mantissa) {
    if (c != '.') digits += c;
  }
  if (exponent < -4 || exponent >= 16) {
    std::string out = sign + digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char exp_buf[16];
    std::snprintf(exp_buf, sizeof(exp_buf), "e%c%02d", exponent < 0 ? '-' : '+',
                  std::abs(exponent));
    return out + exp_buf;
  }
  std::string out;
  if (exponent < 0) {
    out = "0." + std::string(static_cast<size_t>(-exponent - 1), '0') + digits;
  } else if (static_cast<size_t>(exponent) + 1 >= digits.size()) {
    out = digits + std::string(static_cast<size_t>(exponent) + 1 - digits.size(), '0') + ".0";
  } else {
    out = digits.substr(0, exponent + 1) + "." + digits.substr(exponent + 1);
  }
  return sign + out;
}

namespace {

std::string python_string_repr(const std::string& s) {
  const bool has_single = s.find('\'') != std::string::npos;
  const bool has_double = s.find('"') != std::string::npos;
  const char quote = has_single && !has_double ? '"' : '\'';
  std::string out(1, quote);
  for (unsigned char c : s) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == quote) {
      out += '\\';
      out += static_cast<char>(c);
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (c < 0x20 || c == 0x7f) {
      char buf[8];
      std::snprintf(buf, sizeof(buf), "\\x%02x", c);
      out += buf;
    } else {
      out += static_cast<char>(c);
    }
  }
  out += quote;
  return out;
}

}  // namespace

std::string Value::str() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "";
    case Kind::kString:
      return string_;
    default:
      return repr();
  }
}

std::string Value::repr() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "None";
    case Kind::kBool:
      return bool_ ? "True" : "False";
    case Kind::kInt:
      return std::to_string(int_);
    case Kind::kFloat:
      return python_float_repr(float_);
    case Kind::kString:
      return python_string_repr(string_);
    case Kind::kList: {
      std::string out = tuple_ ? "(" : "[";
      for (size_t i = 0; i < list_->size(); ++i) {
        if (i) out += ", ";
        out += (*list_)[i].repr();
      }
      if (tuple_ && list_->size() == 1) out += ",";
      return out + (tuple_ ? ")" : "]");
    }
    case Kind::kDict:
    case Kind::kNamespace: {
      std::string out = kind_ == Kind::kNamespace ? "<Namespace {" : "{";
      bool first = true;
      for (const auto& [k, v] : dict_->entries) {
        if (!first) out += ", ";
        first = false;
        out += k.repr() + ": " + v.repr();
      }
      return out + (kind_ == Kind::kNamespace ? "}>" : "}");
    }
    case Kind::kFunction:
      return "<function " + string_ + ">";
  }
  return "";
}

std::string Value::type_name() const {
  switch (kind_) {
    case Kind::kUndefined:
      return "Undefined";
    case Kind::kNone:
      return "NoneType";
    case Kind::kBool:
      return "bool";
    case Kind::kInt:
      return "int";
    case Kind::kFloat:
      return "float";
    case Kind::kString:
      return "str";
    case Kind::kList:
      return tuple_ ? "tuple" : "list";
    case Kind::kDict:
      return "dict";
    case Kind::kNamespace:
      return "Namespace";
    case Kind::kFunction:
      return "function";
  }
  return "object";
}

ValueList Value::iterate() const {
  switch (kind_) {
    case Kind::kUndefined:
      return {};
    case Kind::kList:
      return *list_;
    case Kind::kDict: {
      ValueList keys;
      for (const auto& [k, v] : dict_->entries) keys.push_back(k);
      return keys;
    }
    case Kind::kString: {
      ValueList chars;
      for (auto& c : utf8_chars(string_)) chars.push_back(Value::string(std::move(c)));
      return chars;
    }
    default:
      throw std::runtime_error("'" + type_name() + "' object is not iterable");
  }
}

bool values_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.kind() != b.kind()) return false;
  switch (a.kind()) {
    case Value::Kind::kUndefined:
    case Value::Kind::kNone:
      return true;
    case Value::Kind::kString:
      return a.as_string() == b.as_string();
    case Value::Kind::kList: {
      if (a.is_tuple() != b.is_tuple() || a.items().size() != b.items().size()) return false;
      for (size_t i = 0; i < a.items().size(); ++i) {
        if (!values_equal(a.items()[i], b.items()[i])) return false;
      }
      return true;
    }
    case Value::Kind::kDict: {
      if (a.entries().entries.size() != b.entries().entries.size()) return false;
      for (const auto& [k, v] : a.entries().entries) {
        const Value* other = b.entries().find(k);
        if (!other || !values_equal(v, *other)) return false;
      }
      return true;
    }
    case Value::Kind::kNamespace:
      return &a.entries() == &b.entries();
    case Value::Kind::kFunction:
      return &a.call() == &b.call();
    default:
      return false;
  }
}

bool value_less(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) {
    if (a.is_float() || b.is_float()) return a.as_double() < b.as_double();
    return a.as_int() < b.as_int();
  }
  if (a.is_string() && b.is_string()) return a.as_string() < b.as_string();
  if (a.is_list() && b.is_list()) {
    const auto& x = a.items();
    const auto& y = b.items();
    for (size_t i = 0; i < x.size() && i < y.size(); ++i) {
      if (!values_equal(x[i], y[i])) return value_less(x[i], y[i]);
    }
    return x.size() < y.size();
  }
  throw std::runtime_error("'<' not supported between instances of '" + a.type_name() + "' and '" +
                           b.type_name() + "'");
}

namespace {

void json_escape(const std::string& s, std::string& out) {
  out += '"';
  for (unsigned char c : s) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof(buf), "\\u%04x", c);
          out += buf;
        } else {
          out += static_cast<char>(c);
        }
    }
  }
  out += '"';
}

void json_dump(const Value& v, const JsonDumpOptions& opt, int level, std::string& out) {
  const std::string item_sep =
      opt.has_separators ? opt.item_separator : (opt.indent >= 0 ? "," : ", ");
  const std::string key_sep = opt.has_separators ? opt.key_separator : ": ";
  auto newline = [&](int lvl) {
    if (opt.indent < 0) return;
    out += '\n';
    out.append(static_cast<size_t>(opt.indent) * static_cast<size_t>(lvl), ' ');
  };
  switch (v.kind()) {
    case Value::Kind::kNone:
      out += "null";
      return;
    case Value::Kind::kBool:
      out += v.as_bool() ? "true" : "false";
      return;
    case Value::Kind::kInt:
      out += std::to_string(v.as_int());
      return;
    case Value::Kind::kFloat: {
      const double d = v.as_double();
      if (std::isnan(d)) {
        out += "NaN";
      } else if (std::isinf(d)) {
        out += d > 0 ? "Infinity" : "-Infinity";
      } else {
        out += python_float_repr(d);
      }
      return;
    }
    case Value::Kind::kString:
      json_escape(v.as_string(), out);
      return;
    case Value::Kind::kList: {
      if (v.items().empty()) {
        out += "[]";
        return;
      }
      out += '[';
      bool first = true;
      for (const Value& item : v.items()) {
        if (!first) out += item_sep;
        first = false;
        newline(level + 1);
        json_dump(item, opt, level + 1, out);
      }
      newline(level);
      out += ']';
      return;
    }
    case Value::Kind::kDict: {
      if (v.entries().entries.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<Value, Value>*> entries;
      for (const auto& e : v.entries().entries) entries.push_back(&e);
      if (opt.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return value_less(a->first, b->first); });
      }
      out += '{';
      bool first = true;
      for (const auto* e : entries) {
        if (!first) out += item_sep;
        first = false;
        newline(level + 1);
        const Value& key = e->first;
        if (key.is_string()) {
          json_escape(key.as_string(), out);
        } else if (key.is_none()) {
          out += "\"null\"";
        } else if (key.is_bool()) {
          out += key.as_bool() ? "\"true\"" : "\"false\"";
        } else if (key.is_int() || key.is_float()) {
          json_escape(key.str(), out);
        } else {
          throw std::runtime_error("keys must be str, int, float, bool or None, not " +
                                   key.type_name());
        }
        out += key_sep;
        json_dump(e->second, opt, level + 1, out);
      }
      newline(level);
      out += '}';
      return;
    }
    default:
      throw std::runtime_error("Object of type " + v.type_name() + " is not JSON serializable");
  }
}

}  // namespace

std::string json_dumps(const Value& value, const JsonDumpOptions& options) {
  std::string out;
  json_dump(value, options, 0, out);
  return out;
}

std::vector<std::string> utf8_chars(const std::string& s) {
  std::vector<std::string> chars;
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t len = 1;
    if (c >= 0xF0) {
      len = 4;
    } else if (c >= 0xE0) {
      len = 3;
    } else if (c >= 0xC0) {
      len = 2;
    }
    len = std::min(len, s.size() - i);
    chars.push_back(s.substr(i, len));
    i += len;
  }
  return chars;
}

size_t utf8_length(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) {
    if ((c & 0xC0) != 0x80) ++n;
  }
  return n;
}

}  // namespace arbor::jinja
