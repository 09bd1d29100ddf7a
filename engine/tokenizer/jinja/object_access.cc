// Attribute, item and slice access, and the Python methods of str and dict that templates call.
#include <algorithm>
#include <cctype>
#include <stdexcept>

#include "engine/tokenizer/jinja/builtins.h"

namespace arbor::jinja {
namespace {

uint32_t decode_utf8(const std::string& ch) {
  const unsigned char c0 = static_cast<unsigned char>(ch[0]);
  if (ch.size() == 1) return c0;
  uint32_t cp = ch.size() == 2 ? (c0 & 0x1F) : ch.size() == 3 ? (c0 & 0x0F) : (c0 & 0x07);
  for (size_t i = 1; i < ch.size(); ++i)
    cp = (cp << 6) | (static_cast<unsigned char>(ch[i]) & 0x3F);
  return cp;
}

bool is_python_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

std::string object_name(const Value& v) {
  if (v.is_none()) return "None";
  return v.type_name() + " object";
}

Value missing_attribute(const Value& object, const std::string& name) {
  return Value::undefined("'" + object_name(object) + "' has no attribute '" + name + "'");
}

const std::string& string_arg(const CallArgs& args, size_t index, const std::string& name,
                              const std::string& method) {
  const Value* v = args.get(index, name);
  if (!v || !v->is_string()) {
    throw std::runtime_error(method + "() argument '" + name + "' must be str");
  }
  return v->as_string();
}

std::vector<std::string> split_string(const std::string& s, const Value* sep, int64_t maxsplit) {
  std::vector<std::string> parts;
  if (!sep || sep->is_none()) {
    const auto chars = utf8_chars(s);
    size_t i = 0;
    while (true) {
      while (i < chars.size() && is_python_space(decode_utf8(chars[i]))) ++i;
      if (i >= chars.size()) break;
      std::string part;
      if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) {
        for (; i < chars.size(); ++i) part += chars[i];
        // Python keeps the remainder minus trailing whitespace.
        parts.push_back(python_strip(part, false, true, nullptr));
        break;
      }
      while (i < chars.size() && !is_python_space(decode_utf8(chars[i]))) part += chars[i++];
      parts.push_back(std::move(part));
    }
    return parts;
  }
  if (!sep->is_string()) throw std::runtime_error("must be str or None, not " + sep->type_name());
  const std::string& d = sep->as_string();
  if (d.empty()) throw std::runtime_error("empty separator");
  size_t start = 0;
  while (true) {
    if (maxsplit >= 0 && static_cast<int64_t>(parts.size()) == maxsplit) break;
    const size_t at = s.find(d, start);
    if (at == std::string::npos) break;
    parts.push_back(s.substr(start, at - start));
    start = at + d.size();
  }
  parts.push_back(s.substr(start));
  return parts;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  std::string out;
  if (from.empty()) {
    // Python inserts `to` around every character.
    const auto chars = utf8_chars(s);
    int64_t done = 0;
    for (const auto& c : chars) {
      if (count < 0 || done < count) {
        out += to;
        ++done;
      }
      out += c;
    }
    if (count < 0 || done < count) out += to;
    return out;
  }
  size_t start = 0;
  int64_t done = 0;
  while (count < 0 || done < count) {
    const size_t at = s.find(from, start);
    if (at == std::string::npos) break;
    out += s.substr(start, at - start) + to;
    start = at + from.size();
    ++done;
  }
  return out + s.substr(start);
}

bool affix_match(const std::string& s, const Value& affix, bool prefix) {
  auto one = [&](const Value& a) {
    if (!a.is_string())
      throw std::runtime_error("startswith/endswith first arg must be str or tuple");
    const std::string& x = a.as_string();
    if (x.size() > s.size()) return false;
    return prefix ? s.compare(0, x.size(), x) == 0
                  : s.compare(s.size() - x.size(), x.size(), x) == 0;
  };
  if (affix.is_list()) {
    return std::any_of(affix.items().begin(), affix.items().end(), one);
  }
  return one(affix);
}

std::string ascii_upper(std::string s) {
  for (char& c : s) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return s;
}
std::string ascii_lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Value string_method(const Value& self, const std::string& name) {
  const std::string s = self.as_string();
  auto method = [&](auto fn) { return Value::function("str." + name, fn); };
  if (name == "strip" || name == "lstrip" || name == "rstrip") {
    const bool left = name != "rstrip";
    const bool right = name != "lstrip";
    return method([s, left, right](const CallArgs& a) {
      return Value::string(python_strip(s, left, right, a.get(0, "chars")));
    });
  }
  if (name == "split") {
    return method([s](const CallArgs& a) {
      const Value* max = a.get(1, "maxsplit");
      ValueList parts;
      for (auto& p : split_string(s, a.get(0, "sep"), max ? max->as_int() : -1)) {
        parts.push_back(Value::string(std::move(p)));
      }
      return Value::list(std::move(parts));
    });
  }
  if (name == "startswith" || name == "endswith") {
    const bool prefix = name == "startswith";
    return method([s, prefix](const CallArgs& a) {
      const Value* affix = a.get(0, "prefix");
      if (!affix) throw std::runtime_error("startswith/endswith takes at least 1 argument");
      return Value::boolean(affix_match(s, *affix, prefix));
    });
  }
  if (name == "upper")
    return method([s](const CallArgs&) { return Value::string(ascii_upper(s)); });
  if (name == "lower")
    return method([s](const CallArgs&) { return Value::string(ascii_lower(s)); });
  if (name == "title" || name == "capitalize") {
    const bool title = name == "title";
    return method([s, title](const CallArgs&) {
      std::string out = s;
      bool at_word_start = true;
      for (char& c : out) {
        const bool alpha = std::isalpha(static_cast<unsigned char>(c)) != 0;
        c = static_cast<char>(at_word_start ? std::toupper(static_cast<unsigned char>(c))
                                            : std::tolower(static_cast<unsigned char>(c)));
        if (title) {
          at_word_start = !alpha;
        } else {
          at_word_start = false;
        }
      }
      return Value::string(out);
    });
  }
  if (name == "replace") {
    return method([s](const CallArgs& a) {
      const Value* count = a.get(2, "count");
      return Value::string(replace_all(s, string_arg(a, 0, "old", "replace"),
                                       string_arg(a, 1, "new", "replace"),
                                       count ? count->as_int() : -1));
    });
  }
  if (name == "find" || name == "count") {
    const bool find = name == "find";
    return method([s, find](const CallArgs& a) {
      const std::string& sub = string_arg(a, 0, "sub", find ? "find" : "count");
      if (find) {
        const size_t at = s.find(sub);
        return Value::integer(
            at == std::string::npos ? -1 : static_cast<int64_t>(utf8_length(s.substr(0, at))));
      }
      if (sub.empty()) return Value::integer(static_cast<int64_t>(utf8_length(s)) + 1);
      int64_t n = 0;
      for (size_t at = s.find(sub); at != std::string::npos; at = s.find(sub, at + sub.size())) ++n;
      return Value::integer(n);
    });
  }
  if (name == "join") {
    return method([s](const CallArgs& a) {
      const Value* items = a.get(0, "iterable");
      if (!items) throw std::runtime_error("join() takes exactly one argument");
      std::string out;
      bool first = true;
      for (const Value& item : items->iterate()) {
        if (!item.is_string()) {
          throw std::runtime_error("sequence item: expected str instance, " + item.type_name() +
                                   " found");
        }
        if (!first) out += s;
        first = false;
        out += item.as_string();
      }
      return Value::string(out);
    });
  }
  if (name == "splitlines") {
    return method([s](const CallArgs&) {
      ValueList lines;
      size_t start = 0;
      for (size_t i = 0; i < s.size(); ++i) {
        if (s[i] == '\n' || s[i] == '\r') {
          lines.push_back(Value::string(s.substr(start, i - start)));
          if (s[i] == '\r' && i + 1 < s.size() && s[i + 1] == '\n') ++i;
          start = i + 1;
        }
      }
      if (start < s.size()) lines.push_back(Value::string(s.substr(start)));
      return Value::list(std::move(lines));
    });
  }
  return missing_attribute(self, name);
}

Value dict_method(const Value& self, const std::string& name, bool* found) {
  *found = true;
  if (name == "items" || name == "keys" || name == "values") {
    const int which = name == "items" ? 0 : name == "keys" ? 1 : 2;
    return Value::function("dict." + name, [self, which](const CallArgs&) {
      ValueList out;
      for (const auto& [k, v] : self.entries().entries) {
        if (which == 0) {
          out.push_back(Value::list({k, v}, /*is_tuple=*/true));
        } else {
          out.push_back(which == 1 ? k : v);
        }
      }
      return Value::list(std::move(out));
    });
  }
  if (name == "get") {
    return Value::function("dict.get", [self](const CallArgs& a) {
      const Value* key = a.get(0, "key");
      if (!key) throw std::runtime_error("get expected at least 1 argument, got 0");
      if (const Value* v = self.entries().find(*key)) return *v;
      const Value* fallback = a.get(1, "default");
      return fallback ? *fallback : Value::none();
    });
  }
  if (name == "pop" || name == "popitem" || name == "update" || name == "clear" ||
      name == "setdefault") {
    return Value::undefined("access to attribute '" + name + "' of 'dict' object is unsafe.");
  }
  *found = false;
  return {};
}

int64_t normalize_index(int64_t index, int64_t size) {
  return index < 0 ? index + size : index;
}

}  // namespace

std::string python_strip(const std::string& s, bool left, bool right, const Value* chars) {
  const auto cps = utf8_chars(s);
  std::vector<std::string> strip_set;
  const bool custom = chars && !chars->is_none() && !chars->is_undefined();
  if (custom) {
    if (!chars->is_string()) throw std::runtime_error("strip arg must be None or str");
    strip_set = utf8_chars(chars->as_string());
  }
  auto strippable = [&](const std::string& c) {
    if (custom) return std::find(strip_set.begin(), strip_set.end(), c) != strip_set.end();
    return is_python_space(decode_utf8(c));
  };
  size_t begin = 0;
  size_t end = cps.size();
  if (left) {
    while (begin < end && strippable(cps[begin])) ++begin;
  }
  if (right) {
    while (end > begin && strippable(cps[end - 1])) --end;
  }
  std::string out;
  for (size_t i = begin; i < end; ++i) out += cps[i];
  return out;
}

Value get_attribute(const Value& object, const std::string& name) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      throw std::runtime_error(object.as_string());
    case Value::Kind::kString:
      return string_method(object, name);
    case Value::Kind::kDict: {
      bool found = false;
      Value method = dict_method(object, name, &found);
      if (found) return method;
      if (const Value* v = object.entries().find(name)) return *v;
      return missing_attribute(object, name);
    }
    case Value::Kind::kNamespace:
      if (const Value* v = object.entries().find(name)) return *v;
      return missing_attribute(object, name);
    case Value::Kind::kList:
      if (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
          name == "remove" || name == "reverse" || name == "sort" || name == "clear") {
        return Value::undefined("access to attribute '" + name + "' of '" + object.type_name() +
                                "' object is unsafe.");
      }
      return missing_attribute(object, name);
    default:
      return missing_attribute(object, name);
  }
}

Value get_item(const Value& object, const Value& key) {
  switch (object.kind()) {
    case Value::Kind::kUndefined:
      throw std::runtime_error(object.as_string());
    case Value::Kind::kDict:
    case Value::Kind::kNamespace:
      if (const Value* v = object.entries().find(key)) return *v;
      break;
    case Value::Kind::kList:
      if (key.is_int() || key.is_bool()) {
        const auto& items = object.items();
        const int64_t size = static_cast<int64_t>(items.size());
        const int64_t i = normalize_index(key.as_int(), size);
        if (i >= 0 && i < size) return items[static_cast<size_t>(i)];
        return Value::undefined(object.type_name() + " object has no element " +
                                std::to_string(key.as_int()));
      }
      break;
    case Value::Kind::kString:
      if (key.is_int() || key.is_bool()) {
        const auto chars = utf8_chars(object.as_string());
        const int64_t size = static_cast<int64_t>(chars.size());
        const int64_t i = normalize_index(key.as_int(), size);
        if (i >= 0 && i < size) return Value::string(chars[static_cast<size_t>(i)]);
        return Value::undefined("str object has no element " + std::to_string(key.as_int()));
      }
      break;
    default:
      break;
  }
  if (key.is_string()) {
    if (object.is_dict()) return missing_attribute(object, key.as_string());
    return get_attribute(object, key.as_string());
  }
  return Value::undefined("'" + object_name(object) + "' has no attribute '" + key.str() + "'");
}

Value get_slice(const Value& object, const Value* start, const Value* stop, const Value* step) {
  if (object.is_undefined()) throw std::runtime_error(object.as_string());
  ValueList items;
  std::vector<std::string> chars;
  int64_t size = 0;
  if (object.is_list()) {
    size = static_cast<int64_t>(object.items().size());
  } else if (object.is_string()) {
    chars = utf8_chars(object.as_string());
    size = static_cast<int64_t>(chars.size());
  } else {
    throw std::runtime_error("'" + object.type_name() + "' object is not subscriptable");
  }
  auto int_or = [](const Value* v, int64_t fallback) {
    if (!v || v->is_none()) return fallback;
    if (!v->is_int() && !v->is_bool()) {
      throw std::runtime_error("slice indices must be integers or None");
    }
    return v->as_int();
  };
  const int64_t stride = int_or(step, 1);
  if (stride == 0) throw std::runtime_error("slice step cannot be zero");
  // Python's PySlice_AdjustIndices.
  auto adjust = [&](const Value* v, bool is_start) {
    if (!v || v->is_none()) {
      if (stride > 0) return is_start ? int64_t{0} : size;
      return is_start ? size - 1 : int64_t{-1};
    }
    int64_t i = int_or(v, 0);
    if (i < 0) {
      i += size;
      if (i < 0) i = stride < 0 ? -1 : 0;
    } else if (i >= size) {
      i = stride < 0 ? size - 1 : size;
    }
    return i;
  };
  const int64_t begin = adjust(start, true);
  const int64_t end = adjust(stop, false);
  std::vector<int64_t> picks;
  if (stride > 0) {
    for (int64_t i = begin; i < end; i += stride) picks.push_back(i);
  } else {
    for (int64_t i = begin; i > end; i += stride) picks.push_back(i);
  }
  if (object.is_string()) {
    std::string out;
    for (int64_t i : picks) out += chars[static_cast<size_t>(i)];
    return Value::string(out);
  }
  for (int64_t i : picks) items.push_back(object.items()[static_cast<size_t>(i)]);
  return Value::list(std::move(items), object.is_tuple());
}

}  // namespace arbor::jinja
