#include "engine/tokenizer/jinja/parser.h"

#include <algorithm>
#include <cstdlib>

#include "engine/core/error.h"

namespace arbor::jinja {
namespace {

class Parser {
 public:
  explicit Parser(std::vector<Token> tokens) : tokens_(std::move(tokens)) {}

  NodeList parse() {
    std::string end;
    NodeList body = parse_body({}, &end);
    return body;
  }

 private:
  // Bounds that keep parsing, rendering and destroying the tree (all recursive) far from the end
  // of the stack, where jinja2 stops at Python's recursion limit. Real chat templates nest a few
  // levels and hold tens of expression nodes per tag.
  static constexpr int kMaxNesting = 200;  // brackets (3 levels each), unary chains, blocks
  // Per {{ }} or {% %} tag: bounds the height of left-deep chains (a + b + c ..., a.b.c ...,
  // a|f|g ...), which the parser builds in loops, not by recursion.
  static constexpr int kMaxNodesPerTag = 1000;

  class Nested {
   public:
    explicit Nested(Parser& parser) : parser_(parser) {
      if (parser_.nesting_ >= kMaxNesting)
        parser_.fail(parser_.cur(),
                     "nested deeper than " + std::to_string(kMaxNesting) + " levels");
      ++parser_.nesting_;
    }
    ~Nested() { --parser_.nesting_; }
    Nested(const Nested&) = delete;
    Nested& operator=(const Nested&) = delete;

   private:
    Parser& parser_;
  };

  const Token& cur() const { return tokens_[index_]; }
  const Token& peek(size_t ahead = 1) const {
    return tokens_[std::min(index_ + ahead, tokens_.size() - 1)];
  }
  const Token& next() {
    const Token& t = tokens_[index_];
    if (index_ + 1 < tokens_.size()) ++index_;
    return t;
  }
  bool is_op(const std::string& op) const {
    return cur().type == TokenType::kOperator && cur().value == op;
  }
  bool is_name(const std::string& name) const {
    return cur().type == TokenType::kName && cur().value == name;
  }
  bool skip_op(const std::string& op) {
    if (!is_op(op)) return false;
    next();
    return true;
  }
  bool skip_name(const std::string& name) {
    if (!is_name(name)) return false;
    next();
    return true;
  }

  static std::string describe(const Token& t) {
    switch (t.type) {
      case TokenType::kName:
      case TokenType::kInteger:
      case TokenType::kFloat:
      case TokenType::kOperator:
        return "'" + t.value + "'";
      case TokenType::kString:
        return "string";
      default:
        return token_type_name(t.type);
    }
  }

  [[noreturn]] void fail(const Token& at, const std::string& message) const {
    throw_error(ErrorCode::kInvalidArgument, "chat template syntax error at line " +
                                                 std::to_string(at.pos.line) + ", column " +
                                                 std::to_string(at.pos.column) + ": " + message);
  }

  void expect_op(const std::string& op) {
    if (!skip_op(op)) fail(cur(), "expected '" + op + "', got " + describe(cur()));
  }
  std::string expect_name() {
    if (cur().type != TokenType::kName) fail(cur(), "expected a name, got " + describe(cur()));
    return next().value;
  }
  void expect_block_end() {
    if (cur().type != TokenType::kBlockEnd) {
      fail(cur(), "expected end of statement '%}', got " + describe(cur()));
    }
    next();
  }

  // Statements until a {% name %} with name in end_names (consumed up to the name).
  NodeList parse_body(const std::vector<std::string>& end_names, std::string* found_end) {
    const Nested nested(*this);
    NodeList body;
    while (true) {
      const Token& t = cur();
      tag_nodes_ = 0;
      switch (t.type) {
        case TokenType::kData: {
          auto node = make_node(Node::Kind::kText, t);
          node->text = t.value;
          body.push_back(std::move(node));
          next();
          break;
        }
        case TokenType::kVariableBegin: {
          next();
          auto node = make_node(Node::Kind::kOutput, t);
          node->expr = parse_tuple(true);
          if (cur().type != TokenType::kVariableEnd) {
            fail(cur(), "expected end of print statement '}}', got " + describe(cur()));
          }
          next();
          body.push_back(std::move(node));
          break;
        }
        case TokenType::kBlockBegin: {
          const Token& name = peek();
          if (name.type == TokenType::kName &&
              std::find(end_names.begin(), end_names.end(), name.value) != end_names.end()) {
            next();
            *found_end = next().value;
            return body;
          }
          next();
          body.push_back(parse_statement(end_names));
          break;
        }
        case TokenType::kEof:
          if (!end_names.empty()) {
            std::string expected;
            for (const auto& n : end_names)
              expected += (expected.empty() ? "'" : " or '") + n + "'";
            fail(t, "unexpected end of template, expected " + expected);
          }
          return body;
        default:
          fail(t, "unexpected " + describe(t));
      }
    }
  }

  NodePtr make_node(Node::Kind kind, const Token& at) {
    auto node = std::make_unique<Node>();
    node->kind = kind;
    node->pos = at.pos;
    return node;
  }

  NodePtr parse_statement(const std::vector<std::string>& end_names) {
    const Token& t = cur();
    if (t.type != TokenType::kName) fail(t, "expected a statement name, got " + describe(t));
    const std::string keyword = t.value;
    if (keyword == "if") return parse_if();
    if (keyword == "for") return parse_for();
    if (keyword == "set") return parse_set();
    if (keyword == "macro") return parse_macro();
    if (keyword == "generation") {
      next();
      expect_block_end();
      auto node = make_node(Node::Kind::kScope, t);
      std::string end;
      node->body = parse_body({"endgeneration"}, &end);
      expect_block_end();
      return node;
    }
    if (keyword == "break" || keyword == "continue") {
      if (loop_depth_ == 0) fail(t, "'" + keyword + "' outside of a loop");
      next();
      expect_block_end();
      return make_node(keyword == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, t);
    }
    std::string message = "unknown tag '" + keyword + "'";
    for (size_t i = 0; i < end_names.size(); ++i) {
      message += (i == 0 ? ", expected '" : " or '") + end_names[i] + "'";
    }
    fail(t, message);
  }

  NodePtr parse_if() {
    auto node = make_node(Node::Kind::kIf, next());
    while (true) {
      ExprPtr condition = parse_tuple(false);
      expect_block_end();
      std::string end;
      NodeList body = parse_body({"elif", "else", "endif"}, &end);
      node->branches.emplace_back(std::move(condition), std::move(body));
      if (end == "elif") continue;
      if (end == "else") {
        expect_block_end();
        node->else_body = parse_body({"endif"}, &end);
      }
      expect_block_end();
      return node;
    }
  }

  AssignTarget parse_assign_target(bool allow_namespace) {
    AssignTarget target;
    const bool parenthesized = skip_op("(");
    target.names.push_back(expect_name());
    if (allow_namespace && !parenthesized && is_op(".")) {
      next();
      target.attribute = expect_name();
      return target;
    }
    while (skip_op(",")) {
      if (cur().type != TokenType::kName) break;
      target.names.push_back(expect_name());
    }
    if (parenthesized) expect_op(")");
    return target;
  }

  NodePtr parse_for() {
    auto node = make_node(Node::Kind::kFor, next());
    node->target = parse_assign_target(false);
    if (!skip_name("in")) fail(cur(), "expected 'in', got " + describe(cur()));
    node->expr = parse_tuple(false);
    if (skip_name("if")) node->filter = parse_expression(true);
    if (is_name("recursive")) fail(cur(), "recursive loops are not supported");
    expect_block_end();
    ++loop_depth_;
    std::string end;
    node->body = parse_body({"endfor", "else"}, &end);
    --loop_depth_;
    if (end == "else") {
      expect_block_end();
      node->else_body = parse_body({"endfor"}, &end);
    }
    expect_block_end();
    return node;
  }

  NodePtr parse_set() {
    auto node = make_node(Node::Kind::kSet, next());
    node->target = parse_assign_target(true);
    if (skip_op("=")) {
      node->expr = parse_tuple(true);
      expect_block_end();
      return node;
    }
    if (!node->target.attribute.empty() || node->target.names.size() != 1) {
      fail(cur(), "expected '=' in set statement");
    }
    expect_block_end();
    std::string end;
    node->body = parse_body({"endset"}, &end);
    expect_block_end();
    return node;
  }

  NodePtr parse_macro() {
    auto node = make_node(Node::Kind::kMacro, next());
    node->text = expect_name();
    expect_op("(");
    while (!is_op(")")) {
      if (!node->params.empty()) expect_op(",");
      if (is_op(")")) break;
      MacroParam param;
      param.name = expect_name();
      if (skip_op("=")) param.default_value = parse_expression(true);
      node->params.push_back(std::move(param));
    }
    expect_op(")");
    expect_block_end();
    const int saved_depth = loop_depth_;
    loop_depth_ = 0;
    std::string end;
    node->body = parse_body({"endmacro"}, &end);
    loop_depth_ = saved_depth;
    expect_block_end();
    return node;
  }

  // ---- expressions ----

  ExprPtr make_expr(Expr::Kind kind, const SourcePos& pos) {
    if (++tag_nodes_ > kMaxNodesPerTag)
      fail(cur(), "more than " + std::to_string(kMaxNodesPerTag) + " expression nodes in one tag");
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->pos = pos;
    return e;
  }

  bool can_start_expression() const {
    const Token& t = cur();
    if (t.type == TokenType::kName) {
      return t.value != "in" && t.value != "if" && t.value != "else" && t.value != "recursive";
    }
    if (t.type == TokenType::kString || t.type == TokenType::kInteger ||
        t.type == TokenType::kFloat) {
      return true;
    }
    return t.type == TokenType::kOperator &&
           (t.value == "(" || t.value == "[" || t.value == "{" || t.value == "-" || t.value == "+");
  }

  // expr or expr, expr, ... (a tuple); explicit: inside parentheses.
  ExprPtr parse_tuple(bool allow_condexpr, bool explicit_parens = false) {
    const SourcePos pos = cur().pos;
    std::vector<ExprPtr> items;
    bool saw_comma = false;
    while (true) {
      if (!items.empty()) {
        if (!skip_op(",")) break;
        saw_comma = true;
      }
      if (!items.empty() && !can_start_expression()) break;
      if (items.empty() && explicit_parens && is_op(")")) break;
      items.push_back(parse_expression(allow_condexpr));
    }
    if (items.size() == 1 && !saw_comma) return std::move(items[0]);
    if (items.empty() && !explicit_parens)
      fail(cur(), "expected an expression, got " + describe(cur()));
    auto e = make_expr(Expr::Kind::kTuple, pos);
    e->args = std::move(items);
    return e;
  }

  ExprPtr parse_expression(bool allow_condexpr) {
    return allow_condexpr ? parse_condexpr() : parse_or();
  }

  ExprPtr parse_condexpr() {
    const Nested nested(*this);
    ExprPtr expr = parse_or();
    while (is_name("if")) {
      const SourcePos pos = next().pos;
      auto cond = make_expr(Expr::Kind::kCondExpr, pos);
      cond->object = parse_or();
      cond->args.push_back(std::move(expr));
      cond->args.push_back(skip_name("else") ? parse_condexpr() : nullptr);
      expr = std::move(cond);
    }
    return expr;
  }

  ExprPtr binary(const std::string& op, ExprPtr left, ExprPtr right, const SourcePos& pos) {
    auto e = make_expr(Expr::Kind::kBinary, pos);
    e->name = op;
    e->args.push_back(std::move(left));
    e->args.push_back(std::move(right));
    return e;
  }

  ExprPtr parse_or() {
    const Nested nested(*this);
    ExprPtr left = parse_and();
    while (is_name("or")) {
      const SourcePos pos = next().pos;
      left = binary("or", std::move(left), parse_and(), pos);
    }
    return left;
  }

  ExprPtr parse_and() {
    ExprPtr left = parse_not();
    while (is_name("and")) {
      const SourcePos pos = next().pos;
      left = binary("and", std::move(left), parse_not(), pos);
    }
    return left;
  }

  ExprPtr parse_not() {
    const Nested nested(*this);
    if (is_name("not")) {
      auto e = make_expr(Expr::Kind::kUnary, next().pos);
      e->name = "not";
      e->object = parse_not();
      return e;
    }
    return parse_compare();
  }

  ExprPtr parse_compare() {
    const SourcePos pos = cur().pos;
    ExprPtr expr = parse_math1();
    auto cmp = make_expr(Expr::Kind::kCompare, pos);
    while (true) {
      std::string op;
      if (cur().type == TokenType::kOperator &&
          (cur().value == "==" || cur().value == "!=" || cur().value == "<" ||
           cur().value == "<=" || cur().value == ">" || cur().value == ">=")) {
        op = next().value;
      } else if (is_name("in")) {
        next();
        op = "in";
      } else if (is_name("not") && peek().type == TokenType::kName && peek().value == "in") {
        next();
        next();
        op = "not in";
      } else {
        break;
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    if (cmp->ops.empty()) return expr;
    cmp->object = std::move(expr);
    return cmp;
  }

  ExprPtr parse_math1() {
    ExprPtr left = parse_concat();
    while (is_op("+") || is_op("-")) {
      const Token& op = next();
      left = binary(op.value, std::move(left), parse_concat(), op.pos);
    }
    return left;
  }

  ExprPtr parse_concat() {
    ExprPtr left = parse_math2();
    while (is_op("~")) {
      const SourcePos pos = next().pos;
      left = binary("~", std::move(left), parse_math2(), pos);
    }
    return left;
  }

  ExprPtr parse_math2() {
    ExprPtr left = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      const Token& op = next();
      left = binary(op.value, std::move(left), parse_pow(), op.pos);
    }
    return left;
  }

  ExprPtr parse_pow() {
    ExprPtr left = parse_unary(true);
    while (is_op("**")) {
      const SourcePos pos = next().pos;
      left = binary("**", std::move(left), parse_unary(true), pos);
    }
    return left;
  }

  ExprPtr parse_unary(bool with_filter) {
    const Nested nested(*this);
    ExprPtr node;
    if (is_op("-") || is_op("+")) {
      const Token& op = next();
      node = make_expr(Expr::Kind::kUnary, op.pos);
      node->name = op.value;
      node->object = parse_unary(false);
    } else {
      node = parse_primary();
    }
    node = parse_postfix(std::move(node));
    if (with_filter) node = parse_filter_expr(std::move(node));
    return node;
  }

  ExprPtr parse_primary() {
    const Token& t = cur();
    switch (t.type) {
      case TokenType::kName: {
        next();
        if (t.value == "true" || t.value == "True" || t.value == "false" || t.value == "False") {
          auto e = make_expr(Expr::Kind::kLiteral, t.pos);
          e->literal = Value::boolean(t.value == "true" || t.value == "True");
          return e;
        }
        if (t.value == "none" || t.value == "None") {
          auto e = make_expr(Expr::Kind::kLiteral, t.pos);
          e->literal = Value::none();
          return e;
        }
        auto e = make_expr(Expr::Kind::kName, t.pos);
        e->name = t.value;
        return e;
      }
      case TokenType::kString: {
        auto e = make_expr(Expr::Kind::kLiteral, t.pos);
        std::string s;
        while (cur().type == TokenType::kString) s += next().value;
        e->literal = Value::string(std::move(s));
        return e;
      }
      case TokenType::kInteger: {
        next();
        auto e = make_expr(Expr::Kind::kLiteral, t.pos);
        e->literal = Value::integer(std::strtoll(t.value.c_str(), nullptr, 10));
        return e;
      }
      case TokenType::kFloat: {
        next();
        auto e = make_expr(Expr::Kind::kLiteral, t.pos);
        e->literal = Value::number(std::strtod(t.value.c_str(), nullptr));
        return e;
      }
      case TokenType::kOperator:
        if (t.value == "(") {
          next();
          ExprPtr e = parse_tuple(true, /*explicit_parens=*/true);
          expect_op(")");
          return e;
        }
        if (t.value == "[") {
          next();
          auto e = make_expr(Expr::Kind::kList, t.pos);
          while (!is_op("]")) {
            if (!e->args.empty()) expect_op(",");
            if (is_op("]")) break;
            e->args.push_back(parse_expression(true));
          }
          expect_op("]");
          return e;
        }
        if (t.value == "{") {
          next();
          auto e = make_expr(Expr::Kind::kDict, t.pos);
          while (!is_op("}")) {
            if (!e->pairs.empty()) expect_op(",");
            if (is_op("}")) break;
            ExprPtr key = parse_expression(true);
            expect_op(":");
            e->pairs.emplace_back(std::move(key), parse_expression(true));
          }
          expect_op("}");
          return e;
        }
        break;
      default:
        break;
    }
    fail(t, "unexpected " + describe(t));
  }

  ExprPtr parse_postfix(ExprPtr node) {
    while (true) {
      if (is_op(".")) {
        const Token& dot = next();
        if (cur().type == TokenType::kName) {
          auto e = make_expr(Expr::Kind::kGetAttr, dot.pos);
          e->name = next().value;
          e->object = std::move(node);
          node = std::move(e);
        } else if (cur().type == TokenType::kInteger) {
          auto e = make_expr(Expr::Kind::kGetItem, dot.pos);
          auto index = make_expr(Expr::Kind::kLiteral, cur().pos);
          index->literal = Value::integer(std::strtoll(next().value.c_str(), nullptr, 10));
          e->object = std::move(node);
          e->args.push_back(std::move(index));
          node = std::move(e);
        } else {
          fail(cur(), "expected an attribute name after '.', got " + describe(cur()));
        }
      } else if (is_op("[")) {
        node = parse_subscript(std::move(node));
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  ExprPtr parse_subscript(ExprPtr node) {
    const SourcePos pos = next().pos;  // '['
    ExprPtr start;
    if (!is_op(":")) {
      start = parse_expression(true);
      if (!is_op(":")) {
        expect_op("]");
        auto e = make_expr(Expr::Kind::kGetItem, pos);
        e->object = std::move(node);
        e->args.push_back(std::move(start));
        return e;
      }
    }
    auto e = make_expr(Expr::Kind::kSlice, pos);
    e->object = std::move(node);
    expect_op(":");
    ExprPtr stop;
    ExprPtr step;
    if (!is_op("]") && !is_op(":")) stop = parse_expression(true);
    if (skip_op(":")) {
      if (!is_op("]")) step = parse_expression(true);
    }
    expect_op("]");
    e->args.push_back(std::move(start));
    e->args.push_back(std::move(stop));
    e->args.push_back(std::move(step));
    return e;
  }

  void parse_call_args(Expr& e) {
    expect_op("(");
    bool first = true;
    while (!is_op(")")) {
      if (!first) expect_op(",");
      first = false;
      if (is_op(")")) break;
      if (is_op("*") || is_op("**")) fail(cur(), "*args / **kwargs in calls are not supported");
      if (cur().type == TokenType::kName && peek().type == TokenType::kOperator &&
          peek().value == "=") {
        std::string key = next().value;
        next();
        e.kwargs.emplace_back(std::move(key), parse_expression(true));
      } else {
        if (!e.kwargs.empty()) fail(cur(), "positional argument follows keyword argument");
        e.args.push_back(parse_expression(true));
      }
    }
    expect_op(")");
  }

  ExprPtr parse_call(ExprPtr node) {
    auto e = make_expr(Expr::Kind::kCall, cur().pos);
    e->object = std::move(node);
    parse_call_args(*e);
    return e;
  }

  std::string parse_dotted_name() {
    std::string name = expect_name();
    while (is_op(".") && peek().type == TokenType::kName) {
      next();
      name += "." + next().value;
    }
    return name;
  }

  ExprPtr parse_filter_expr(ExprPtr node) {
    while (true) {
      if (is_op("|")) {
        auto e = make_expr(Expr::Kind::kFilter, next().pos);
        e->name = parse_dotted_name();
        e->object = std::move(node);
        if (is_op("(")) parse_call_args(*e);
        node = std::move(e);
      } else if (is_name("is")) {
        auto e = make_expr(Expr::Kind::kTest, next().pos);
        e->negated = skip_name("not");
        e->name = parse_dotted_name();
        e->object = std::move(node);
        if (is_op("(")) {
          parse_call_args(*e);
        } else {
          const Token& t = cur();
          const bool starts_arg =
              (t.type == TokenType::kName && t.value != "else" && t.value != "or" &&
               t.value != "and") ||
              t.type == TokenType::kString || t.type == TokenType::kInteger ||
              t.type == TokenType::kFloat ||
              (t.type == TokenType::kOperator && (t.value == "[" || t.value == "{"));
          if (starts_arg) {
            if (is_name("is")) fail(t, "you cannot chain multiple tests with is");
            e->args.push_back(parse_postfix(parse_primary()));
          }
        }
        node = std::move(e);
      } else if (is_op("(")) {
        node = parse_call(std::move(node));
      } else {
        return node;
      }
    }
  }

  std::vector<Token> tokens_;
  size_t index_ = 0;
  int nesting_ = 0;    // Nested levels entered
  int tag_nodes_ = 0;  // expression nodes made since the current tag began
  int loop_depth_ = 0;
};

}  // namespace

NodeList parse_template(const std::string& source) {
  return Parser(tokenize(source)).parse();
}

}  // namespace arbor::jinja
