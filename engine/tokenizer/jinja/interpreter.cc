#include "engine/tokenizer/jinja/interpreter.h"

#include <cmath>
#include <stdexcept>
#include <unordered_map>

#include "engine/core/error.h"
#include "engine/tokenizer/jinja/builtins.h"
#include "engine/tokenizer/jinja/parser.h"

namespace arbor::jinja {
namespace {

[[noreturn]] void type_error(const std::string& op, const Value& a, const Value& b) {
  throw std::runtime_error("unsupported operand type(s) for " + op + ": '" + a.type_name() +
                           "' and '" + b.type_name() + "'");
}

void require_defined(const Value& v) {
  if (v.is_undefined()) throw std::runtime_error(v.as_string());
}

// Python's integers do not overflow; arbor's are 64-bit (engine/tokenizer/README.md), so a
// result that does not fit is an error, never undefined behaviour.
[[noreturn]] void integer_overflow(const std::string& what) {
  throw std::runtime_error("integer overflow: " + what + " does not fit in 64 bits");
}

int64_t checked(const std::string& op, int64_t a, int64_t b) {
  int64_t r = 0;
  const bool overflow = op == "+"   ? __builtin_add_overflow(a, b, &r)
                        : op == "-" ? __builtin_sub_overflow(a, b, &r)
                                    : __builtin_mul_overflow(a, b, &r);
  if (overflow) integer_overflow(std::to_string(a) + " " + op + " " + std::to_string(b));
  return r;
}

// b != 0. Python's floor division; INT64_MIN // -1 is the one quotient that does not fit.
int64_t floor_div(int64_t a, int64_t b) {
  if (b == -1) {
    if (a == INT64_MIN) integer_overflow(std::to_string(a) + " // -1");
    return -a;
  }
  int64_t q = a / b;
  if ((a % b != 0) && ((a < 0) != (b < 0))) --q;
  return q;
}

// exponent >= 0, by squaring: O(log exponent) even for 1 ** 10**18.
int64_t integer_pow(int64_t base, int64_t exponent) {
  const std::string what = std::to_string(base) + " ** " + std::to_string(exponent);
  int64_t result = 1;
  while (exponent > 0) {
    if (exponent & 1)
      if (__builtin_mul_overflow(result, base, &result)) integer_overflow(what);
    exponent >>= 1;
    if (exponent > 0 && __builtin_mul_overflow(base, base, &base)) integer_overflow(what);
  }
  return result;
}

Value arithmetic(const std::string& op, const Value& a, const Value& b) {
  require_defined(a);
  require_defined(b);
  if (op == "+") {
    if (a.is_number() && b.is_number()) {
      if (a.is_float() || b.is_float()) return Value::number(a.as_double() + b.as_double());
      return Value::integer(checked("+", a.as_int(), b.as_int()));
    }
    if (a.is_string() && b.is_string()) return Value::string(a.as_string() + b.as_string());
    if (a.is_list() && b.is_list() && a.is_tuple() == b.is_tuple()) {
      ValueList items = a.items();
      items.insert(items.end(), b.items().begin(), b.items().end());
      return Value::list(std::move(items), a.is_tuple());
    }
    if (a.is_string()) {
      throw std::runtime_error("can only concatenate str (not \"" + b.type_name() + "\") to str");
    }
    if (a.is_list() && !a.is_tuple()) {
      throw std::runtime_error("can only concatenate list (not \"" + b.type_name() + "\") to list");
    }
    type_error(op, a, b);
  }
  if (op == "*") {
    const Value* seq = a.is_string() || a.is_list()   ? &a
                       : b.is_string() || b.is_list() ? &b
                                                      : nullptr;
    const Value* count = seq == &a ? &b : &a;
    if (seq && (count->is_int() || count->is_bool())) {
      const int64_t n = std::max<int64_t>(0, count->as_int());
      const uint64_t unit = seq->is_string() ? seq->as_string().size() : seq->items().size();
      if (unit != 0 &&
          static_cast<uint64_t>(n) > (seq->is_string() ? kMaxStringBytes : kMaxListItems) / unit)
        throw std::runtime_error("repeating a " + seq->type_name() + " of " + std::to_string(unit) +
                                 " " + (seq->is_string() ? "bytes" : "items") + " " +
                                 std::to_string(n) + " times exceeds the template's size limits");
      if (seq->is_string()) {
        std::string out;
        for (int64_t i = 0; i < n; ++i) out += seq->as_string();
        return Value::string(out);
      }
      ValueList items;
      for (int64_t i = 0; i < n; ++i)
        items.insert(items.end(), seq->items().begin(), seq->items().end());
      return Value::list(std::move(items), seq->is_tuple());
    }
  }
  if (!a.is_number() || !b.is_number()) {
    if (op == "%" && a.is_string())
      throw std::runtime_error("printf-style '%' formatting is not supported");
    type_error(op, a, b);
  }
  const bool use_float = a.is_float() || b.is_float();
  if (op == "-") {
    return use_float ? Value::number(a.as_double() - b.as_double())
                     : Value::integer(checked("-", a.as_int(), b.as_int()));
  }
  if (op == "*") {
    return use_float ? Value::number(a.as_double() * b.as_double())
                     : Value::integer(checked("*", a.as_int(), b.as_int()));
  }
  if (op == "/") {
    if (b.as_double() == 0) throw std::runtime_error("division by zero");
    return Value::number(a.as_double() / b.as_double());
  }
  if (op == "//" || op == "%") {
    if (use_float) {
      if (b.as_double() == 0) throw std::runtime_error("float floor division by zero");
      const double q = std::floor(a.as_double() / b.as_double());
      return op == "//" ? Value::number(q) : Value::number(a.as_double() - q * b.as_double());
    }
    if (b.as_int() == 0) throw std::runtime_error("integer division or modulo by zero");
    if (op == "%" && b.as_int() == -1) return Value::integer(0);  // no INT64_MIN // -1
    const int64_t q = floor_div(a.as_int(), b.as_int());
    return op == "//" ? Value::integer(q) : Value::integer(a.as_int() - q * b.as_int());
  }
  if (op == "**") {
    if (!use_float && b.as_int() >= 0) return Value::integer(integer_pow(a.as_int(), b.as_int()));
    return Value::number(std::pow(a.as_double(), b.as_double()));
  }
  type_error(op, a, b);
}

bool contains(const Value& container, const Value& item) {
  switch (container.kind()) {
    case Value::Kind::kString:
      if (!item.is_string()) {
        require_defined(item);
        throw std::runtime_error("'in <string>' requires string as left operand, not " +
                                 item.type_name());
      }
      return container.as_string().find(item.as_string()) != std::string::npos;
    case Value::Kind::kDict:
      return container.entries().find(item) != nullptr;
    case Value::Kind::kUndefined:
      return false;
    case Value::Kind::kList:
      for (const Value& v : container.items()) {
        if (values_equal(v, item)) return true;
      }
      return false;
    default:
      throw std::runtime_error("argument of type '" + container.type_name() + "' is not iterable");
  }
}

bool compare(const std::string& op, const Value& a, const Value& b) {
  if (op == "==") return values_equal(a, b);
  if (op == "!=") return !values_equal(a, b);
  if (op == "in") return contains(b, a);
  if (op == "not in") return !contains(b, a);
  require_defined(a);
  require_defined(b);
  if (op == "<") return value_less(a, b);
  if (op == ">") return value_less(b, a);
  if (op == "<=") return !value_less(b, a);
  if (op == ">=") return !value_less(a, b);
  throw std::runtime_error("unknown comparison '" + op + "'");
}

enum class Flow { kNormal, kBreak, kContinue };

class Interpreter {
 public:
  explicit Interpreter(const ValueDict& variables) {
    auto root = std::make_shared<Frame>();
    ValueDict globals;
    add_global_functions(globals);
    for (const auto& [k, v] : globals.entries) (*root)[k.as_string()] = v;
    for (const auto& [k, v] : variables.entries) (*root)[k.str()] = v;
    scopes_.push_back(root);
  }

  Flow exec(const NodeList& nodes, std::string& out) {
    for (const auto& node : nodes) {
      const Flow flow = exec(*node, out);
      if (flow != Flow::kNormal) return flow;
    }
    return Flow::kNormal;
  }

 private:
  using Frame = std::unordered_map<std::string, Value>;

  // Statements and expressions being evaluated, one inside the other. A macro that calls itself
  // without end, or a tree nested deeper, fails as in jinja2 (which stops at Python's recursion
  // limit, "maximum recursion depth exceeded") instead of overflowing the C++ stack. A level of
  // macro recursion takes 2-3 units and up to ~10 KiB of stack in an ASan build: 250 units stay
  // under ~2.5 MiB (threads have 8 MiB); real templates need a few dozen.
  static constexpr int kMaxDepth = 250;
  int depth_ = 0;
  // Statements, expressions and loop iterations evaluated in one render: a template that would
  // run for minutes (nested loops over range(100000)) fails instead, after about a second (a few
  // in an ASan build). SmolLM2's template takes ~15 steps per message, tool-calling templates
  // ~50: conversations of thousands of messages stay below.
  static constexpr int64_t kMaxSteps = 200'000;
  int64_t steps_ = 0;
  void step(const SourcePos& pos) {
    if (++steps_ > kMaxSteps)
      fail_at(pos,
              "the template took more than " + std::to_string(kMaxSteps) + " evaluation steps");
  }
  class Depth {
   public:
    Depth(Interpreter& interpreter, const SourcePos& pos) : interpreter_(interpreter) {
      interpreter_.step(pos);
      if (interpreter_.depth_ >= kMaxDepth)
        fail_at(pos, "maximum recursion depth exceeded (" + std::to_string(kMaxDepth) +
                         " nested statements and expressions)");
      ++interpreter_.depth_;
    }
    ~Depth() { --interpreter_.depth_; }
    Depth(const Depth&) = delete;
    Depth& operator=(const Depth&) = delete;

   private:
    Interpreter& interpreter_;
  };

  [[noreturn]] static void fail_at(const SourcePos& pos, const std::string& message) {
    throw_error(ErrorCode::kInvalidArgument, "chat template error at line " +
                                                 std::to_string(pos.line) + ", column " +
                                                 std::to_string(pos.column) + ": " + message);
  }

  Value lookup(const std::string& name) const {
    for (auto it = scopes_.rbegin(); it != scopes_.rend(); ++it) {
      auto found = (*it)->find(name);
      if (found != (*it)->end()) return found->second;
    }
    return Value::undefined("'" + name + "' is undefined");
  }

  void assign(const AssignTarget& target, const Value& value, const SourcePos& pos) {
    Frame& frame = *scopes_.back();
    if (!target.attribute.empty()) {
      Value ns = lookup(target.names[0]);
      if (!ns.is_namespace()) fail_at(pos, "cannot assign attribute on non-namespace object");
      if (target.attribute[0] == '_') {
        fail_at(
            pos,
            "Chat templates cannot store underscore-prefixed attributes on a namespace, but got '" +
                target.attribute + "'. Please rename the attribute.");
      }
      ns.entries().set(Value::string(target.attribute), value);
      return;
    }
    if (target.names.size() == 1) {
      frame[target.names[0]] = value;
      return;
    }
    ValueList items;
    try {
      items = value.iterate();
    } catch (const std::runtime_error& e) {
      fail_at(pos, std::string("cannot unpack non-iterable ") + value.type_name() + " object");
    }
    if (items.size() != target.names.size()) {
      fail_at(
          pos,
          items.size() < target.names.size()
              ? "not enough values to unpack (expected " + std::to_string(target.names.size()) +
                    ", got " + std::to_string(items.size()) + ")"
              : "too many values to unpack (expected " + std::to_string(target.names.size()) + ")");
    }
    for (size_t i = 0; i < items.size(); ++i) frame[target.names[i]] = items[i];
  }

  Flow exec(const Node& node, std::string& out) {
    const Depth depth(*this, node.pos);
    switch (node.kind) {
      case Node::Kind::kText:
        out += node.text;
        return Flow::kNormal;
      case Node::Kind::kOutput:
        out += eval(*node.expr).str();
        if (out.size() > kMaxStringBytes)
          fail_at(node.pos,
                  "the rendered text exceeds " + std::to_string(kMaxStringBytes) + " bytes");
        return Flow::kNormal;
      case Node::Kind::kIf:
        for (const auto& [condition, body] : node.branches) {
          if (eval(*condition).truthy()) return exec(body, out);
        }
        return exec(node.else_body, out);
      case Node::Kind::kFor:
        return exec_for(node, out);
      case Node::Kind::kSet:
        if (node.expr) {
          assign(node.target, eval(*node.expr), node.pos);
        } else {
          std::string captured;
          exec(node.body, captured);
          assign(node.target, Value::string(captured), node.pos);
        }
        return Flow::kNormal;
      case Node::Kind::kMacro:
        (*scopes_.back())[node.text] = make_macro(node);
        return Flow::kNormal;
      case Node::Kind::kBreak:
        return Flow::kBreak;
      case Node::Kind::kContinue:
        return Flow::kContinue;
      case Node::Kind::kScope:
        return exec(node.body, out);
    }
    return Flow::kNormal;
  }

  Flow exec_for(const Node& node, std::string& out) {
    const Value iterable = eval(*node.expr);
    ValueList items;
    try {
      items = iterable.iterate();
    } catch (const std::runtime_error& e) {
      fail_at(node.expr->pos, e.what());
    }
    if (node.filter) {
      ValueList kept;
      for (const Value& item : items) {
        scopes_.push_back(std::make_shared<Frame>());
        assign(node.target, item, node.pos);
        const bool keep = eval(*node.filter).truthy();
        scopes_.pop_back();
        if (keep) kept.push_back(item);
      }
      items = std::move(kept);
    }
    if (items.empty()) return exec(node.else_body, out);
    const int64_t length = static_cast<int64_t>(items.size());
    for (int64_t i = 0; i < length; ++i) {
      step(node.pos);
      scopes_.push_back(std::make_shared<Frame>());
      assign(node.target, items[static_cast<size_t>(i)], node.pos);
      ValueDict loop;
      loop.entries.reserve(12);
      auto put = [&](const char* key, Value v) {
        loop.entries.emplace_back(Value::string(key), std::move(v));
      };
      put("index", Value::integer(i + 1));
      put("index0", Value::integer(i));
      put("revindex", Value::integer(length - i));
      put("revindex0", Value::integer(length - i - 1));
      put("first", Value::boolean(i == 0));
      put("last", Value::boolean(i == length - 1));
      put("length", Value::integer(length));
      put("depth", Value::integer(1));
      put("depth0", Value::integer(0));
      if (i > 0) put("previtem", items[static_cast<size_t>(i - 1)]);
      if (i + 1 < length) put("nextitem", items[static_cast<size_t>(i + 1)]);
      put("cycle", Value::function("loop.cycle", [i](const CallArgs& a) {
            if (a.positional.empty()) throw std::runtime_error("no items for cycling given");
            return a.positional[static_cast<size_t>(i) % a.positional.size()];
          }));
      (*scopes_.back())["loop"] = Value::dict(std::move(loop));
      const Flow flow = exec(node.body, out);
      scopes_.pop_back();
      if (flow == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value make_macro(const Node& node) {
    const Node* macro = &node;
    // Weak: the macro is stored in a frame, and a strong pointer back to the root frame would
    // make a cycle (a leak) when the interpreter ends.
    std::weak_ptr<Frame> weak_root = scopes_.front();
    return Value::function(node.text, [this, macro, weak_root](const CallArgs& args) {
      std::shared_ptr<Frame> root = weak_root.lock();
      if (!root) throw std::runtime_error("macro '" + macro->text + "' called after rendering");
      if (args.positional.size() > macro->params.size()) {
        throw std::runtime_error("macro '" + macro->text + "' takes not more than " +
                                 std::to_string(macro->params.size()) + " argument(s)");
      }
      auto frame = std::make_shared<Frame>();
      std::vector<std::shared_ptr<Frame>> saved = std::move(scopes_);
      scopes_ = {root, frame};
      try {
        for (size_t i = 0; i < macro->params.size(); ++i) {
          const MacroParam& p = macro->params[i];
          const Value* given = args.get(i, p.name);
          (*frame)[p.name] = given ? *given
                             : p.default_value
                                 ? eval(*p.default_value)
                                 : Value::undefined("parameter '" + p.name + "' was not provided");
        }
        for (const auto& [k, v] : args.keyword) {
          bool known = false;
          for (const auto& p : macro->params) known = known || p.name == k;
          if (!known)
            throw std::runtime_error("macro '" + macro->text + "' takes no keyword argument '" + k +
                                     "'");
        }
        std::string out;
        exec(macro->body, out);
        scopes_ = std::move(saved);
        return Value::string(out);
      } catch (...) {
        scopes_ = std::move(saved);
        throw;
      }
    });
  }

  // Evaluates; a std::runtime_error from the innermost failing expression becomes an
  // arbor::Error carrying that expression's position (outer levels pass it through).
  Value eval(const Expr& e) {
    try {
      const Depth depth(*this, e.pos);
      Value v = eval_inner(e);
      // Doubling a string (ns.s = ns.s ~ ns.s) stops at the first result past the limit.
      if ((v.is_string() && v.as_string().size() > kMaxStringBytes) ||
          (v.is_list() && v.items().size() > kMaxListItems))
        throw std::runtime_error("a " + v.type_name() +
                                 " value exceeds the template's size limits");
      return v;
    } catch (const Error&) {
      throw;
    } catch (const std::runtime_error& ex) {
      fail_at(e.pos, ex.what());
    }
  }

  CallArgs eval_args(const Expr& e) {
    CallArgs args;
    for (const auto& a : e.args) args.positional.push_back(eval(*a));
    for (const auto& [k, v] : e.kwargs) args.keyword.emplace_back(k, eval(*v));
    return args;
  }

  Value eval_inner(const Expr& e) {
    switch (e.kind) {
      case Expr::Kind::kLiteral:
        return e.literal;
      case Expr::Kind::kName:
        return lookup(e.name);
      case Expr::Kind::kList:
      case Expr::Kind::kTuple: {
        ValueList items;
        for (const auto& item : e.args) items.push_back(eval(*item));
        return Value::list(std::move(items), e.kind == Expr::Kind::kTuple);
      }
      case Expr::Kind::kDict: {
        ValueDict d;
        for (const auto& [k, v] : e.pairs) d.set(eval(*k), eval(*v));
        return Value::dict(std::move(d));
      }
      case Expr::Kind::kGetAttr:
        return get_attribute(eval(*e.object), e.name);
      case Expr::Kind::kGetItem:
        return get_item(eval(*e.object), eval(*e.args[0]));
      case Expr::Kind::kSlice: {
        const Value object = eval(*e.object);
        Value bounds[3];
        const Value* ptrs[3] = {nullptr, nullptr, nullptr};
        for (int i = 0; i < 3; ++i) {
          if (e.args[static_cast<size_t>(i)]) {
            bounds[i] = eval(*e.args[static_cast<size_t>(i)]);
            ptrs[i] = &bounds[i];
          }
        }
        return get_slice(object, ptrs[0], ptrs[1], ptrs[2]);
      }
      case Expr::Kind::kCall: {
        const Value callee = eval(*e.object);
        const CallArgs args = eval_args(e);
        if (callee.is_function()) return callee.call()(args);
        require_defined(callee);
        throw std::runtime_error("'" + callee.type_name() + "' object is not callable");
      }
      case Expr::Kind::kFilter: {
        const Value input = eval(*e.object);
        return find_filter(e.name)(input, eval_args(e));
      }
      case Expr::Kind::kTest: {
        const Value input = eval(*e.object);
        const bool result = find_test(e.name)(input, eval_args(e));
        return Value::boolean(result != e.negated);
      }
      case Expr::Kind::kUnary: {
        const Value v = eval(*e.object);
        if (e.name == "not") return Value::boolean(!v.truthy());
        require_defined(v);
        if (!v.is_number())
          throw std::runtime_error("bad operand type for unary " + e.name + ": '" + v.type_name() +
                                   "'");
        if (e.name == "+")
          return v.is_float() ? Value::number(v.as_double()) : Value::integer(v.as_int());
        if (v.is_float()) return Value::number(-v.as_double());
        return Value::integer(checked("-", 0, v.as_int()));
      }
      case Expr::Kind::kBinary: {
        if (e.name == "and") {
          Value left = eval(*e.args[0]);
          return left.truthy() ? eval(*e.args[1]) : left;
        }
        if (e.name == "or") {
          Value left = eval(*e.args[0]);
          return left.truthy() ? left : eval(*e.args[1]);
        }
        const Value left = eval(*e.args[0]);
        const Value right = eval(*e.args[1]);
        if (e.name == "~") return Value::string(left.str() + right.str());
        return arithmetic(e.name, left, right);
      }
      case Expr::Kind::kCompare: {
        Value left = eval(*e.object);
        for (size_t i = 0; i < e.ops.size(); ++i) {
          Value right = eval(*e.args[i]);
          if (!compare(e.ops[i], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::Kind::kCondExpr:
        if (eval(*e.object).truthy()) return eval(*e.args[0]);
        if (e.args[1]) return eval(*e.args[1]);
        return Value::undefined(
            "the inline if-expression evaluated to false and no else section was defined.");
    }
    return {};
  }

  std::vector<std::shared_ptr<Frame>> scopes_;
};

// jinja2 resolves filter and test names when compiling; so do we, with the position.
void check_names(const Expr* e) {
  if (!e) return;
  if (e->kind == Expr::Kind::kFilter && !find_filter(e->name)) {
    throw_error(ErrorCode::kInvalidArgument,
                "chat template syntax error at line " + std::to_string(e->pos.line) + ", column " +
                    std::to_string(e->pos.column) + ": no filter named '" + e->name + "'");
  }
  if (e->kind == Expr::Kind::kTest && !find_test(e->name)) {
    throw_error(ErrorCode::kInvalidArgument,
                "chat template syntax error at line " + std::to_string(e->pos.line) + ", column " +
                    std::to_string(e->pos.column) + ": no test named '" + e->name + "'");
  }
  check_names(e->object.get());
  for (const auto& a : e->args) check_names(a.get());
  for (const auto& [k, v] : e->kwargs) check_names(v.get());
  for (const auto& [k, v] : e->pairs) {
    check_names(k.get());
    check_names(v.get());
  }
}

void check_names(const NodeList& nodes) {
  for (const auto& n : nodes) {
    check_names(n->expr.get());
    check_names(n->filter.get());
    for (const auto& [cond, body] : n->branches) {
      check_names(cond.get());
      check_names(body);
    }
    check_names(n->body);
    check_names(n->else_body);
    for (const auto& p : n->params) check_names(p.default_value.get());
  }
}

}  // namespace

Template::Template(const std::string& source) : nodes_(parse_template(source)) {
  check_names(nodes_);
}

std::string Template::render(const ValueDict& variables) const {
  Interpreter interpreter(variables);
  std::string out;
  interpreter.exec(nodes_, out);
  return out;
}

}  // namespace arbor::jinja
