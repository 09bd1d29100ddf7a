// Syntax tree of a parsed Jinja template: expressions (Expr) and statements (Node). Plain data
// built by the parser and walked by the interpreter; nodes own their children.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/tokenizer/jinja/lexer.h"
#include "engine/tokenizer/jinja/value.h"

namespace arbor::jinja {

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,  // literal
    kName,     // name
    kList,     // args: items
    kTuple,    // args: items
    kDict,     // pairs
    kGetAttr,  // object.name
    kGetItem,  // object[args[0]]
    kSlice,    // object[args[0]:args[1]:args[2]] (null entries: omitted)
    kCall,     // object(args, kwargs)
    kFilter,   // object | name(args, kwargs)
    kTest,     // object is [not] name(args, kwargs)
    kUnary,    // name: "not" / "-" / "+"; object: operand
    kBinary,   // name: operator ("+", "and", "in", "not in", "==", ...); args[0], args[1]
    kCompare,  // object, then (ops[i], args[i]) chained as Python's a < b < c
    kCondExpr  // args[0] if object else args[1] (args[1] null: undefined)
  };

  Kind kind;
  SourcePos pos;
  Value literal;
  std::string name;
  bool negated = false;  // kTest with "is not"
  ExprPtr object;
  std::vector<ExprPtr> args;
  std::vector<std::pair<std::string, ExprPtr>> kwargs;
  std::vector<std::pair<ExprPtr, ExprPtr>> pairs;
  std::vector<std::string> ops;
};

struct Node;
using NodePtr = std::unique_ptr<Node>;
using NodeList = std::vector<NodePtr>;

// Where `set` / `for` store a value: a name, `ns.attr`, or several names to unpack.
struct AssignTarget {
  std::vector<std::string> names;  // one name, or several for tuple unpacking
  std::string attribute;           // non-empty: names[0].attribute (namespace assignment)
};

struct MacroParam {
  std::string name;
  ExprPtr default_value;  // may be null
};

struct Node {
  enum class Kind {
    kText,    // text
    kOutput,  // expr
    kIf,      // branches (condition, body); else_body
    kFor,     // target in expr [if filter]: body; else_body
    kSet,     // target = expr, or target = rendered body (block set, expr null)
    kMacro,   // name(params): body
    kBreak,
    kContinue,
    kScope,  // body rendered in place (transformers' {% generation %} block)
  };

  Kind kind;
  SourcePos pos;
  std::string text;  // kText; kMacro name
  ExprPtr expr;
  ExprPtr filter;  // kFor: the `if` condition (may be null)
  AssignTarget target;
  std::vector<std::pair<ExprPtr, NodeList>> branches;
  NodeList body;
  NodeList else_body;
  std::vector<MacroParam> params;
};

}  // namespace arbor::jinja
