// Jinja lexer: template source -> tokens, with jinja2's whitespace rules as transformers
// configures them (trim_blocks, lstrip_blocks, keep_trailing_newline=False, "-" / "+" tag
// modifiers). Comments are dropped here; raw blocks become data.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace arbor::jinja {

struct SourcePos {
  int line = 1;    // 1-based
  int column = 1;  // 1-based, in bytes
};

enum class TokenType {
  kData,           // literal template text (whitespace control already applied)
  kVariableBegin,  // {{
  kVariableEnd,    // }}
  kBlockBegin,     // {%
  kBlockEnd,       // %}
  kName,
  kString,  // value: the unescaped contents
  kInteger,
  kFloat,
  kOperator,  // value: the operator text ("==", "(", "|", ...)
  kEof,
};

struct Token {
  TokenType type;
  std::string value;
  SourcePos pos;
};

const char* token_type_name(TokenType type);

// Throws arbor::Error(kInvalidArgument) naming line and column for unterminated tags, strings
// or comments and unexpected characters.
std::vector<Token> tokenize(const std::string& source);

}  // namespace arbor::jinja
