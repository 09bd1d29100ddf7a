// jinja2's built-in filters and tests (the subset chat templates use), transformers' tojson, and
// the globals transformers installs.
#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <ctime>
#include <map>
#include <stdexcept>

#include "engine/core/error.h"
#include "engine/tokenizer/jinja/builtins.h"

namespace arbor::jinja {
namespace {

bool arg_bool(const CallArgs& a, size_t i, const std::string& name, bool fallback) {
  const Value* v = a.get(i, name);
  return v ? v->truthy() : fallback;
}

std::string ascii_case(std::string s, bool upper) {
  for (char& c : s) {
    c = static_cast<char>(upper ? std::toupper(static_cast<unsigned char>(c))
                                : std::tolower(static_cast<unsigned char>(c)));
  }
  return s;
}

// environment.getitem for dotted attribute paths ("function.name", "0").
Value lookup_path(const Value& item, const std::string& path) {
  Value v = item;
  size_t start = 0;
  while (true) {
    const size_t dot = path.find('.', start);
    const std::string part = path.substr(start, dot == std::string::npos ? dot : dot - start);
    const bool numeric = !part.empty() && std::all_of(part.begin(), part.end(), ::isdigit);
    v = get_item(
        v, numeric ? Value::integer(std::strtoll(part.c_str(), nullptr, 10)) : Value::string(part));
    if (dot == std::string::npos) return v;
    start = dot + 1;
  }
}

// ---- filters ----

Value f_trim(const Value& in, const CallArgs& a) {
  return Value::string(python_strip(in.str(), true, true, a.get(0, "chars")));
}
Value f_upper(const Value& in, const CallArgs&) {
  return Value::string(ascii_case(in.str(), true));
}
Value f_lower(const Value& in, const CallArgs&) {
  return Value::string(ascii_case(in.str(), false));
}
Value f_capitalize(const Value& in, const CallArgs&) {
  std::string s = ascii_case(in.str(), false);
  if (!s.empty()) s[0] = static_cast<char>(std::toupper(static_cast<unsigned char>(s[0])));
  return Value::string(s);
}
// jinja2 do_title: words start after runs of [-\s({\[<].
Value f_title(const Value& in, const CallArgs&) {
  std::string s = in.str();
  bool word_start = true;
  for (char& c : s) {
    const bool sep = c == '-' || std::isspace(static_cast<unsigned char>(c)) || c == '(' ||
                     c == '{' || c == '[' || c == '<';
    if (sep) {
      word_start = true;
    } else {
      c = static_cast<char>(word_start ? std::toupper(static_cast<unsigned char>(c))
                                       : std::tolower(static_cast<unsigned char>(c)));
      word_start = false;
    }
  }
  return Value::string(s);
}

Value f_length(const Value& in, const CallArgs&) {
  switch (in.kind()) {
    case Value::Kind::kUndefined:
      return Value::integer(0);
    case Value::Kind::kString:
      return Value::integer(static_cast<int64_t>(utf8_length(in.as_string())));
    case Value::Kind::kList:
      return Value::integer(static_cast<int64_t>(in.items().size()));
    case Value::Kind::kDict:
      return Value::integer(static_cast<int64_t>(in.entries().entries.size()));
    default:
      throw std::runtime_error("object of type '" + in.type_name() + "' has no len()");
  }
}

Value f_tojson(const Value& in, const CallArgs& a) {
  if (arg_bool(a, 0, "ensure_ascii", false)) {
    throw std::runtime_error("tojson(ensure_ascii=True) is not supported");
  }
  JsonDumpOptions opt;
  if (const Value* indent = a.get(1, "indent"); indent && !indent->is_none()) {
    if (!indent->is_int()) throw std::runtime_error("tojson: indent must be an integer");
    opt.indent = static_cast<int>(indent->as_int());
  }
  if (const Value* sep = a.get(2, "separators"); sep && !sep->is_none()) {
    if (!sep->is_list() || sep->items().size() != 2 || !sep->items()[0].is_string() ||
        !sep->items()[1].is_string()) {
      throw std::runtime_error("tojson: separators must be a (item, key) pair of strings");
    }
    opt.has_separators = true;
    opt.item_separator = sep->items()[0].as_string();
    opt.key_separator = sep->items()[1].as_string();
  }
  opt.sort_keys = arg_bool(a, 3, "sort_keys", false);
  return Value::string(json_dumps(in, opt));
}

Value f_default(const Value& in, const CallArgs& a) {
  const Value* fallback = a.get(0, "default_value");
  const bool boolean = arg_bool(a, 1, "boolean", false);
  if (in.is_undefined() || (boolean && !in.truthy())) {
    return fallback ? *fallback : Value::string("");
  }
  return in;
}

Value f_join(const Value& in, const CallArgs& a) {
  const Value* sep = a.get(0, "d");
  const Value* attribute = a.get(1, "attribute");
  std::string out;
  bool first = true;
  for (Value item : in.iterate()) {
    if (attribute && !attribute->is_none()) item = lookup_path(item, attribute->str());
    if (!first && sep) out += sep->str();
    first = false;
    out += item.str();
  }
  return Value::string(out);
}

Value f_first(const Value& in, const CallArgs&) {
  const ValueList items = in.iterate();
  if (items.empty()) return Value::undefined("No first item, sequence was empty.");
  return items.front();
}

Value f_last(const Value& in, const CallArgs&) {
  const ValueList items = in.iterate();
  if (items.empty()) return Value::undefined("No last item, sequence was empty.");
  return items.back();
}

Value f_string(const Value& in, const CallArgs&) {
  return Value::string(in.str());
}
Value f_safe(const Value& in, const CallArgs&) {
  return in;
}

Value f_escape(const Value& in, const CallArgs&) {
  std::string out;
  for (char c : in.str()) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&#34;";
        break;
      case '\'':
        out += "&#39;";
        break;
      default:
        out += c;
    }
  }
  return Value::string(out);
}

Value f_int(const Value& in, const CallArgs& a) {
  const Value* fallback = a.get(0, "default");
  const Value dflt = fallback ? *fallback : Value::integer(0);
  if (in.is_undefined()) throw std::runtime_error(in.as_string());
  // Python's int() of a float: NaN is a ValueError (jinja2 then returns the default), anything
  // outside 64 bits an error here (Python's integers are unbounded).
  auto from_double = [&](double d) {
    if (std::isnan(d)) return dflt;
    if (!(d >= -9223372036854775808.0 && d < 9223372036854775808.0))
      throw std::runtime_error("integer overflow: int(" + Value::number(d).str() +
                               ") does not fit in 64 bits");
    return Value::integer(static_cast<int64_t>(d));
  };
  if (in.is_number())
    return in.is_float() ? from_double(in.as_double()) : Value::integer(in.as_int());
  if (in.is_string()) {
    const std::string s = python_strip(in.as_string(), true, true, nullptr);
    char* end = nullptr;
    errno = 0;
    const long long i = std::strtoll(s.c_str(), &end, 10);
    if (!s.empty() && end && *end == '\0') {
      if (errno == ERANGE)
        throw std::runtime_error("integer overflow: int('" + s + "') does not fit in 64 bits");
      return Value::integer(i);
    }
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return from_double(d);
  }
  return dflt;
}

Value f_float(const Value& in, const CallArgs& a) {
  const Value* fallback = a.get(0, "default");
  if (in.is_number()) return Value::number(in.as_double());
  if (in.is_string()) {
    const std::string s = python_strip(in.as_string(), true, true, nullptr);
    char* end = nullptr;
    const double d = std::strtod(s.c_str(), &end);
    if (!s.empty() && end && *end == '\0') return Value::number(d);
  }
  return fallback ? *fallback : Value::number(0.0);
}

Value f_list(const Value& in, const CallArgs&) {
  return Value::list(in.iterate());
}

Value f_items(const Value& in, const CallArgs&) {
  if (in.is_undefined()) return Value::list({});
  if (!in.is_dict()) throw std::runtime_error("Can only get item pairs from a mapping.");
  ValueList out;
  for (const auto& [k, v] : in.entries().entries) out.push_back(Value::list({k, v}, true));
  return Value::list(std::move(out));
}

Value f_replace(const Value& in, const CallArgs& a) {
  const Value* old_v = a.get(0, "old");
  const Value* new_v = a.get(1, "new");
  if (!old_v || !new_v) throw std::runtime_error("replace() needs 'old' and 'new'");
  const Value* count = a.get(2, "count");
  CallArgs method_args;
  method_args.positional = {Value::string(old_v->str()), Value::string(new_v->str())};
  if (count && !count->is_none()) method_args.positional.push_back(*count);
  return get_attribute(Value::string(in.str()), "replace").call()(method_args);
}

Value f_reverse(const Value& in, const CallArgs&) {
  if (in.is_string()) {
    const Value step = Value::integer(-1);
    return get_slice(in, nullptr, nullptr, &step);
  }
  ValueList items = in.iterate();
  std::reverse(items.begin(), items.end());
  return Value::list(std::move(items));
}

// select / reject / selectattr / rejectattr share jinja2's prepare_select_or_reject.
Value select_impl(const Value& in, const CallArgs& a, bool by_attribute, bool keep_matches) {
  size_t next_arg = 0;
  std::string attribute;
  if (by_attribute) {
    if (a.positional.empty()) throw std::runtime_error("selectattr/rejectattr need an attribute");
    attribute = a.positional[0].str();
    next_arg = 1;
  }
  TestFunction test = nullptr;
  CallArgs test_args;
  if (next_arg < a.positional.size()) {
    const std::string name = a.positional[next_arg].str();
    test = find_test(name);
    if (!test) throw std::runtime_error("No test named '" + name + "'.");
    test_args.positional.assign(a.positional.begin() + static_cast<std::ptrdiff_t>(next_arg) + 1,
                                a.positional.end());
    test_args.keyword = a.keyword;
  }
  ValueList out;
  for (const Value& item : in.iterate()) {
    const Value subject = by_attribute ? lookup_path(item, attribute) : item;
    const bool matched = test ? test(subject, test_args) : subject.truthy();
    if (matched == keep_matches) out.push_back(item);
  }
  return Value::list(std::move(out));
}

Value f_select(const Value& in, const CallArgs& a) {
  return select_impl(in, a, false, true);
}
Value f_reject(const Value& in, const CallArgs& a) {
  return select_impl(in, a, false, false);
}
Value f_selectattr(const Value& in, const CallArgs& a) {
  return select_impl(in, a, true, true);
}
Value f_rejectattr(const Value& in, const CallArgs& a) {
  return select_impl(in, a, true, false);
}

Value f_map(const Value& in, const CallArgs& a) {
  ValueList out;
  if (a.positional.empty()) {
    const Value* attribute = nullptr;
    const Value* fallback = nullptr;
    for (const auto& [k, v] : a.keyword) {
      if (k == "attribute") attribute = &v;
      if (k == "default") fallback = &v;
    }
    if (!attribute) throw std::runtime_error("map() needs a filter name or attribute=");
    for (const Value& item : in.iterate()) {
      Value v = lookup_path(item, attribute->str());
      out.push_back(v.is_undefined() && fallback ? *fallback : v);
    }
    return Value::list(std::move(out));
  }
  const std::string name = a.positional[0].str();
  FilterFunction filter = find_filter(name);
  if (!filter) throw std::runtime_error("No filter named '" + name + "'.");
  CallArgs filter_args;
  filter_args.positional.assign(a.positional.begin() + 1, a.positional.end());
  filter_args.keyword = a.keyword;
  for (const Value& item : in.iterate()) out.push_back(filter(item, filter_args));
  return Value::list(std::move(out));
}

Value f_unique(const Value& in, const CallArgs&) {
  ValueList out;
  for (const Value& item : in.iterate()) {
    if (std::none_of(out.begin(), out.end(),
                     [&](const Value& o) { return values_equal(o, item); })) {
      out.push_back(item);
    }
  }
  return Value::list(std::move(out));
}

Value f_sort(const Value& in, const CallArgs& a) {
  ValueList items = in.iterate();
  const bool reverse = arg_bool(a, 0, "reverse", false);
  const Value* attribute = a.get(2, "attribute");
  auto key = [&](const Value& v) {
    return attribute && !attribute->is_none() ? lookup_path(v, attribute->str()) : v;
  };
  std::stable_sort(items.begin(), items.end(), [&](const Value& x, const Value& y) {
    return reverse ? value_less(key(y), key(x)) : value_less(key(x), key(y));
  });
  return Value::list(std::move(items));
}

Value f_abs(const Value& in, const CallArgs&) {
  if (in.is_float()) return Value::number(std::fabs(in.as_double()));
  if (in.is_number()) {
    if (in.as_int() == INT64_MIN)
      throw std::runtime_error("integer overflow: abs(" + in.str() + ") does not fit in 64 bits");
    return Value::integer(std::llabs(in.as_int()));
  }
  throw std::runtime_error("bad operand type for abs(): '" + in.type_name() + "'");
}

Value f_sum(const Value& in, const CallArgs& a) {
  const Value* attribute = a.get(0, "attribute");
  const Value* start = a.get(1, "start");
  bool is_float = start && start->is_float();
  double fsum = start ? start->as_double() : 0;
  int64_t isum = start ? start->as_int() : 0;
  for (Value item : in.iterate()) {
    if (attribute && !attribute->is_none()) item = lookup_path(item, attribute->str());
    if (!item.is_number()) throw std::runtime_error("unsupported operand type(s) for +");
    is_float = is_float || item.is_float();
    fsum += item.as_double();
    if (!is_float && __builtin_add_overflow(isum, item.as_int(), &isum))
      throw std::runtime_error("integer overflow: sum does not fit in 64 bits");
  }
  return is_float ? Value::number(fsum) : Value::integer(isum);
}

Value min_max(const Value& in, const CallArgs& a, bool want_max) {
  const ValueList items = in.iterate();
  if (items.empty()) return Value::undefined("No aggregated item, sequence was empty.");
  const Value* attribute = a.get(1, "attribute");
  auto key = [&](const Value& v) {
    return attribute && !attribute->is_none() ? lookup_path(v, attribute->str()) : v;
  };
  const Value* best = &items[0];
  for (const Value& item : items) {
    if (want_max ? value_less(key(*best), key(item)) : value_less(key(item), key(*best)))
      best = &item;
  }
  return *best;
}
Value f_max(const Value& in, const CallArgs& a) {
  return min_max(in, a, true);
}
Value f_min(const Value& in, const CallArgs& a) {
  return min_max(in, a, false);
}

Value f_round(const Value& in, const CallArgs& a) {
  const Value* precision = a.get(0, "precision");
  const Value* method = a.get(1, "method");
  const std::string how = method ? method->str() : "common";
  const double scale = std::pow(10.0, precision ? static_cast<double>(precision->as_int()) : 0.0);
  const double x = in.as_double() * scale;
  double r = how == "ceil" ? std::ceil(x) : how == "floor" ? std::floor(x) : std::round(x);
  return Value::number(r / scale);
}

// jinja2 do_indent, including its splitlines quirk (a trailing newline is dropped).
Value f_indent(const Value& in, const CallArgs& a) {
  const Value* width_v = a.get(0, "width");
  const int64_t width = width_v && !width_v->is_string() ? width_v->as_int() : 4;
  if (width > 4096)
    throw std::runtime_error("indent width " + std::to_string(width) + " is too large");
  const std::string pad = width_v && width_v->is_string()
                              ? width_v->as_string()
                              : std::string(static_cast<size_t>(std::max<int64_t>(0, width)), ' ');
  const bool first = arg_bool(a, 1, "first", false);
  const bool blank = arg_bool(a, 2, "blank", false);
  const std::string s = in.str() + "\n";
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t nl = s.find('\n'); nl != std::string::npos; nl = s.find('\n', start)) {
    lines.push_back(s.substr(start, nl - start));
    start = nl + 1;
  }
  std::string out = lines[0];
  for (size_t i = 1; i < lines.size(); ++i) {
    out += "\n";
    if (blank || !lines[i].empty()) out += pad;
    out += lines[i];
  }
  return Value::string(first ? pad + out : out);
}

Value f_wordcount(const Value& in, const CallArgs&) {
  int64_t n = 0;
  bool in_word = false;
  for (unsigned char c : in.str()) {
    const bool word = std::isalnum(c) || c == '_' || c >= 0x80;
    if (word && !in_word) ++n;
    in_word = word;
  }
  return Value::integer(n);
}

Value f_attr(const Value& in, const CallArgs& a) {
  const Value* name = a.get(0, "name");
  if (!name) throw std::runtime_error("attr() needs a name");
  return get_attribute(in, name->str());
}

Value f_dictsort(const Value& in, const CallArgs& a) {
  if (!in.is_dict()) throw std::runtime_error("You can only sort by either 'key' or 'value'");
  const bool by_value = a.get(1, "by") && a.get(1, "by")->str() == "value";
  const bool reverse = arg_bool(a, 2, "reverse", false);
  ValueList pairs = f_items(in, {}).items();
  std::stable_sort(pairs.begin(), pairs.end(), [&](const Value& x, const Value& y) {
    const Value& kx = x.items()[by_value ? 1 : 0];
    const Value& ky = y.items()[by_value ? 1 : 0];
    return reverse ? value_less(ky, kx) : value_less(kx, ky);
  });
  return Value::list(std::move(pairs));
}

// ---- tests ----

const Value& test_arg(const CallArgs& a, const std::string& test) {
  const Value* v = a.get(0, "other");
  if (!v) throw std::runtime_error("test '" + test + "' needs an argument");
  return *v;
}

bool t_defined(const Value& v, const CallArgs&) {
  return !v.is_undefined();
}
bool t_undefined(const Value& v, const CallArgs&) {
  return v.is_undefined();
}
bool t_none(const Value& v, const CallArgs&) {
  return v.is_none();
}
bool t_boolean(const Value& v, const CallArgs&) {
  return v.is_bool();
}
bool t_true(const Value& v, const CallArgs&) {
  return v.is_bool() && v.as_bool();
}
bool t_false(const Value& v, const CallArgs&) {
  return v.is_bool() && !v.as_bool();
}
bool t_integer(const Value& v, const CallArgs&) {
  return v.is_int();
}
bool t_float(const Value& v, const CallArgs&) {
  return v.is_float();
}
bool t_number(const Value& v, const CallArgs&) {
  return v.is_number();
}
bool t_string(const Value& v, const CallArgs&) {
  return v.is_string();
}
bool t_mapping(const Value& v, const CallArgs&) {
  return v.is_dict();
}
bool t_iterable(const Value& v, const CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_sequence(const Value& v, const CallArgs&) {
  return v.is_undefined() || v.is_string() || v.is_list() || v.is_dict();
}
bool t_callable(const Value& v, const CallArgs&) {
  return v.is_function();
}
bool t_odd(const Value& v, const CallArgs&) {
  return v.as_int() % 2 != 0;
}
bool t_even(const Value& v, const CallArgs&) {
  return v.as_int() % 2 == 0;
}
bool t_divisibleby(const Value& v, const CallArgs& a) {
  const int64_t d = test_arg(a, "divisibleby").as_int();
  if (d == 0) throw std::runtime_error("integer division or modulo by zero");
  return d == -1 || v.as_int() % d == 0;  // INT64_MIN % -1 is undefined in C++
}
bool t_eq(const Value& v, const CallArgs& a) {
  return values_equal(v, test_arg(a, "eq"));
}
bool t_ne(const Value& v, const CallArgs& a) {
  return !values_equal(v, test_arg(a, "ne"));
}
bool t_lt(const Value& v, const CallArgs& a) {
  return value_less(v, test_arg(a, "lt"));
}
bool t_gt(const Value& v, const CallArgs& a) {
  return value_less(test_arg(a, "gt"), v);
}
bool t_le(const Value& v, const CallArgs& a) {
  return !value_less(test_arg(a, "le"), v);
}
bool t_ge(const Value& v, const CallArgs& a) {
  return !value_less(v, test_arg(a, "ge"));
}
bool t_sameas(const Value& v, const CallArgs& a) {
  const Value& other = test_arg(a, "sameas");
  if (v.kind() != other.kind()) return false;
  if (v.is_list()) return &v.items() == &other.items();
  if (v.is_dict() || v.is_namespace()) return &v.entries() == &other.entries();
  return values_equal(v, other);
}
bool t_in(const Value& v, const CallArgs& a) {
  const Value& container = test_arg(a, "in");
  if (container.is_string())
    return v.is_string() && container.as_string().find(v.as_string()) != std::string::npos;
  if (container.is_dict()) return container.entries().find(v) != nullptr;
  for (const Value& item : container.iterate()) {
    if (values_equal(item, v)) return true;
  }
  return false;
}
bool t_lower(const Value& v, const CallArgs&) {
  const std::string s = v.str();
  return ascii_case(s, false) == s;
}
bool t_upper(const Value& v, const CallArgs&) {
  const std::string s = v.str();
  return ascii_case(s, true) == s;
}
bool t_escaped(const Value&, const CallArgs&) {
  return false;
}

// ---- globals ----

Value g_range(const CallArgs& a) {
  int64_t start = 0;
  int64_t stop = 0;
  int64_t step = 1;
  if (a.positional.size() == 1) {
    stop = a.positional[0].as_int();
  } else if (a.positional.size() >= 2) {
    start = a.positional[0].as_int();
    stop = a.positional[1].as_int();
    if (a.positional.size() >= 3) step = a.positional[2].as_int();
  } else {
    throw std::runtime_error("range expected at least 1 argument, got 0");
  }
  if (step == 0) throw std::runtime_error("range() arg 3 must not be zero");
  ValueList out;
  for (int64_t i = start; step > 0 ? i < stop : i > stop;) {
    if (out.size() >= 100000) {
      throw std::runtime_error(
          "Range too big. The sandbox blocks ranges larger than MAX_RANGE (100000).");
    }
    out.push_back(Value::integer(i));
    if (__builtin_add_overflow(i, step, &i)) break;  // past INT64_MAX / MIN: the range ends
  }
  return Value::list(std::move(out));
}

ValueDict kwargs_dict(const CallArgs& a) {
  ValueDict d;
  if (!a.positional.empty()) {
    if (!a.positional[0].is_dict()) throw std::runtime_error("expected a mapping argument");
    d = a.positional[0].entries();
  }
  for (const auto& [k, v] : a.keyword) d.set(Value::string(k), v);
  return d;
}

Value g_dict(const CallArgs& a) {
  return Value::dict(kwargs_dict(a));
}

Value g_namespace(const CallArgs& a) {
  ValueDict d = kwargs_dict(a);
  for (const auto& [k, v] : d.entries) {
    if (k.is_string() && !k.as_string().empty() && k.as_string()[0] == '_') {
      throw std::runtime_error(
          "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
          k.as_string() + "'. Please rename the attribute.");
    }
  }
  return Value::namespace_object(std::move(d));
}

Value g_raise_exception(const CallArgs& a) {
  const Value* message = a.get(0, "message");
  throw_error(ErrorCode::kInvalidArgument, message ? message->str() : std::string());
}

Value g_strftime_now(const CallArgs& a) {
  const Value* format = a.get(0, "format");
  if (!format || !format->is_string())
    throw std::runtime_error("strftime_now() needs a format string");
  const std::time_t now = std::time(nullptr);
  std::tm local{};
  localtime_r(&now, &local);
  char buf[512];
  const size_t n = std::strftime(buf, sizeof(buf), format->as_string().c_str(), &local);
  return Value::string(std::string(buf, n));
}

}  // namespace

FilterFunction find_filter(const std::string& name) {
  static const std::map<std::string, FilterFunction> kFilters = {
      {"abs", f_abs},           {"attr", f_attr},       {"capitalize", f_capitalize},
      {"count", f_length},      {"d", f_default},       {"default", f_default},
      {"dictsort", f_dictsort}, {"e", f_escape},        {"escape", f_escape},
      {"first", f_first},       {"float", f_float},     {"indent", f_indent},
      {"int", f_int},           {"items", f_items},     {"join", f_join},
      {"last", f_last},         {"length", f_length},   {"list", f_list},
      {"lower", f_lower},       {"map", f_map},         {"max", f_max},
      {"min", f_min},           {"reject", f_reject},   {"rejectattr", f_rejectattr},
      {"replace", f_replace},   {"reverse", f_reverse}, {"round", f_round},
      {"safe", f_safe},         {"select", f_select},   {"selectattr", f_selectattr},
      {"sort", f_sort},         {"string", f_string},   {"sum", f_sum},
      {"title", f_title},       {"tojson", f_tojson},   {"trim", f_trim},
      {"unique", f_unique},     {"upper", f_upper},     {"wordcount", f_wordcount},
  };
  auto it = kFilters.find(name);
  return it == kFilters.end() ? nullptr : it->second;
}

TestFunction find_test(const std::string& name) {
  static const std::map<std::string, TestFunction> kTests = {
      {"!=", t_ne},
      {"<", t_lt},
      {"<=", t_le},
      {"==", t_eq},
      {">", t_gt},
      {">=", t_ge},
      {"boolean", t_boolean},
      {"callable", t_callable},
      {"defined", t_defined},
      {"divisibleby", t_divisibleby},
      {"eq", t_eq},
      {"equalto", t_eq},
      {"escaped", t_escaped},
      {"even", t_even},
      {"false", t_false},
      {"float", t_float},
      {"ge", t_ge},
      {"greaterthan", t_gt},
      {"gt", t_gt},
      {"in", t_in},
      {"integer", t_integer},
      {"iterable", t_iterable},
      {"le", t_le},
      {"lessthan", t_lt},
      {"lower", t_lower},
      {"lt", t_lt},
      {"mapping", t_mapping},
      {"ne", t_ne},
      {"none", t_none},
      {"number", t_number},
      {"odd", t_odd},
      {"sameas", t_sameas},
      {"sequence", t_sequence},
      {"string", t_string},
      {"true", t_true},
      {"undefined", t_undefined},
      {"upper", t_upper},
  };
  auto it = kTests.find(name);
  return it == kTests.end() ? nullptr : it->second;
}

void add_global_functions(ValueDict& globals) {
  globals.set(Value::string("range"), Value::function("range", g_range));
  globals.set(Value::string("dict"), Value::function("dict", g_dict));
  globals.set(Value::string("namespace"), Value::function("namespace", g_namespace));
  globals.set(Value::string("raise_exception"),
              Value::function("raise_exception", g_raise_exception));
  globals.set(Value::string("strftime_now"), Value::function("strftime_now", g_strftime_now));
}

}  // namespace arbor::jinja
