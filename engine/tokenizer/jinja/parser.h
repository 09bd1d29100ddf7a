// Jinja parser: tokens -> syntax tree, with jinja2's operator precedence. Statements: if / elif
// / else, for (with `if` filter, else, recursive not supported), set (plain, tuple, namespace
// attribute, block), macro, break / continue, raw, and transformers'
// {% generation %} blocks.
#pragma once

#include <string>

#include "engine/tokenizer/jinja/ast.h"

namespace arbor::jinja {

// Throws arbor::Error(kInvalidArgument) "chat template syntax error at line L, column C: ...".
NodeList parse_template(const std::string& source);

}  // namespace arbor::jinja
