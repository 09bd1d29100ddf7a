#include "engine/tokenizer/jinja/lexer.h"

#include <algorithm>
#include <cctype>

#include "engine/core/error.h"

namespace arbor::jinja {
namespace {

bool is_space(char c) {
  return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v';
}

// jinja2 splits the source on \r\n, \r, \n, drops one trailing empty line and joins with \n.
std::string normalize_source(const std::string& source) {
  std::string out;
  out.reserve(source.size());
  for (size_t i = 0; i < source.size(); ++i) {
    if (source[i] == '\r') {
      out += '\n';
      if (i + 1 < source.size() && source[i + 1] == '\n') ++i;
    } else {
      out += source[i];
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

void append_utf8(uint32_t cp, std::string& out) {
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else if (cp < 0x800) {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += static_cast<char>(0xE0 | (cp >> 12));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    out += static_cast<char>(0xF0 | (cp >> 18));
    out += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    out += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
}

class Lexer {
 public:
  explicit Lexer(const std::string& source) : src_(normalize_source(source)) {
    line_starts_.push_back(0);
    for (size_t i = 0; i < src_.size(); ++i) {
      if (src_[i] == '\n') line_starts_.push_back(i + 1);
    }
  }

  std::vector<Token> run() {
    size_t pos = 0;
    bool line_starting = true;
    while (pos < src_.size()) {
      const size_t start = find_tag_start(pos);
      if (start == std::string::npos) {
        emit(TokenType::kData, src_.substr(pos), pos);
        break;
      }
      const char kind = src_[start + 1];  // '{', '%' or '#'
      const char sign = start + 2 < src_.size() ? src_[start + 2] : '\0';
      std::string text = src_.substr(pos, start - pos);
      if (sign == '-') {
        size_t end = text.size();
        while (end > 0 && is_space(text[end - 1])) --end;
        text.resize(end);
      } else if (sign != '+' && kind != '{') {
        // lstrip_blocks: drop spaces between the line start and a block or comment tag.
        const size_t nl = text.rfind('\n');
        const size_t line_begin = nl == std::string::npos ? 0 : nl + 1;
        if ((line_begin > 0 || line_starting) && line_begin < text.size() &&
            std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line_begin), text.end(),
                        is_space)) {
          text.resize(line_begin);
        }
      }
      if (!text.empty()) emit(TokenType::kData, text, pos);
      size_t after = start + 2 + ((sign == '-' || sign == '+') ? 1 : 0);
      if (kind == '#') {
        pos = lex_comment(start, after);
      } else if (kind == '%' && is_raw_begin(after, &pos)) {
        pos = lex_raw(pos);
      } else {
        pos = lex_tag(kind == '{', start, after);
      }
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    tokens_.push_back({TokenType::kEof, "", position(src_.size())});
    return std::move(tokens_);
  }

 private:
  SourcePos position(size_t offset) const {
    auto it = std::upper_bound(line_starts_.begin(), line_starts_.end(), offset);
    const size_t line = static_cast<size_t>(it - line_starts_.begin());
    return {static_cast<int>(line), static_cast<int>(offset - line_starts_[line - 1] + 1)};
  }

  [[noreturn]] void fail(size_t offset, const std::string& message) const {
    const SourcePos p = position(offset);
    throw_error(ErrorCode::kInvalidArgument, "chat template syntax error at line " +
                                                 std::to_string(p.line) + ", column " +
                                                 std::to_string(p.column) + ": " + message);
  }

  void emit(TokenType type, std::string value, size_t offset) {
    tokens_.push_back({type, std::move(value), position(offset)});
  }

  size_t find_tag_start(size_t pos) const {
    while (true) {
      const size_t p = src_.find('{', pos);
      if (p == std::string::npos || p + 1 >= src_.size()) return std::string::npos;
      const char c = src_[p + 1];
      if (c == '{' || c == '%' || c == '#') return p;
      pos = p + 1;
    }
  }

  // Skips whitespace after a "-" end tag, or one newline after a block end (trim_blocks).
  size_t after_end_tag(size_t pos, char sign, bool trim_newline) const {
    if (sign == '-') {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
    } else if (sign != '+' && trim_newline && pos < src_.size() && src_[pos] == '\n') {
      ++pos;
    }
    return pos;
  }

  size_t lex_comment(size_t start, size_t pos) {
    const size_t end = src_.find("#}", pos);
    if (end == std::string::npos) fail(start, "missing end of comment tag");
    const char sign =
        end > pos && (src_[end - 1] == '-' || src_[end - 1] == '+') ? src_[end - 1] : 0;
    return after_end_tag(end + 2, sign, true);
  }

  // {% raw %} (optionally with - modifiers): sets *content_start past the tag.
  bool is_raw_begin(size_t pos, size_t* content_start) const {
    size_t p = pos;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && is_space(src_[p])) ++p;
    if (src_.compare(p, 3, "-%}") == 0) {
      *content_start = after_end_tag(p + 3, '-', false);
      return true;
    }
    if (src_.compare(p, 2, "%}") == 0) {
      *content_start = p + 2;
      return true;
    }
    return false;
  }

  size_t lex_raw(size_t pos) {
    size_t search = pos;
    while (true) {
      const size_t tag = src_.find("{%", search);
      if (tag == std::string::npos) fail(pos, "missing end of raw directive");
      size_t p = tag + 2;
      const char sign = p < src_.size() && (src_[p] == '-' || src_[p] == '+') ? src_[p++] : 0;
      while (p < src_.size() && is_space(src_[p])) ++p;
      if (src_.compare(p, 6, "endraw") != 0) {
        search = tag + 2;
        continue;
      }
      p += 6;
      while (p < src_.size() && is_space(src_[p])) ++p;
      char end_sign = 0;
      if (p < src_.size() && (src_[p] == '-' || src_[p] == '+')) end_sign = src_[p++];
      if (src_.compare(p, 2, "%}") != 0) {
        search = tag + 2;
        continue;
      }
      std::string text = src_.substr(pos, tag - pos);
      if (sign == '-') {
        while (!text.empty() && is_space(text.back())) text.pop_back();
      } else if (sign != '+') {
        const size_t nl = text.rfind('\n');
        const size_t line_begin = nl == std::string::npos ? 0 : nl + 1;
        if ((line_begin > 0 || (pos > 0 && src_[pos - 1] == '\n')) && line_begin < text.size() &&
            std::all_of(text.begin() + static_cast<std::ptrdiff_t>(line_begin), text.end(),
                        is_space)) {
          text.resize(line_begin);
        }
      }
      if (!text.empty()) emit(TokenType::kData, text, pos);
      return after_end_tag(p + 2, end_sign, true);
    }
  }

  size_t lex_tag(bool is_variable, size_t start, size_t pos) {
    emit(is_variable ? TokenType::kVariableBegin : TokenType::kBlockBegin, "", start);
    const std::string close = is_variable ? "}}" : "%}";
    std::vector<char> balance;
    while (true) {
      while (pos < src_.size() && is_space(src_[pos])) ++pos;
      if (pos >= src_.size()) {
        fail(start, is_variable ? "unexpected end of template, expected '}}'"
                                : "unexpected end of template, expected '%}'");
      }
      if (balance.empty()) {
        char sign = 0;
        size_t p = pos;
        if (src_[p] == '-' || src_[p] == '+') sign = src_[p++];
        if (src_.compare(p, 2, close) == 0 && !(is_variable && sign == '+')) {
          emit(is_variable ? TokenType::kVariableEnd : TokenType::kBlockEnd, "", pos);
          return after_end_tag(p + 2, sign, !is_variable);
        }
      }
      const char c = src_[pos];
      if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
        size_t end = pos;
        while (end < src_.size() &&
               (std::isalnum(static_cast<unsigned char>(src_[end])) || src_[end] == '_')) {
          ++end;
        }
        emit(TokenType::kName, src_.substr(pos, end - pos), pos);
        pos = end;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        pos = lex_number(pos);
      } else if (c == '\'' || c == '"') {
        pos = lex_string(pos);
      } else {
        static const char* kOperators[] = {"//", "**", "==", "!=", ">=", "<=", "+", "-", "*",
                                           "/",  "%",  "~",  "<",  ">",  "=",  ".", ",", ":",
                                           "|",  "(",  ")",  "[",  "]",  "{",  "}", ";"};
        std::string op;
        for (const char* candidate : kOperators) {
          if (src_.compare(pos, std::char_traits<char>::length(candidate), candidate) == 0) {
            op = candidate;
            break;
          }
        }
        if (op.empty()) fail(pos, std::string("unexpected character '") + c + "'");
        if (op == "(" || op == "[" || op == "{") {
          balance.push_back(op == "(" ? ')' : op == "[" ? ']' : '}');
        } else if (op == ")" || op == "]" || op == "}") {
          if (balance.empty()) fail(pos, "unexpected '" + op + "'");
          if (balance.back() != op[0]) {
            fail(pos, "unexpected '" + op + "', expected '" + std::string(1, balance.back()) + "'");
          }
          balance.pop_back();
        }
        emit(TokenType::kOperator, op, pos);
        pos += op.size();
      }
    }
  }

  size_t lex_number(size_t pos) {
    auto digits = [&](size_t p) {
      while (p < src_.size() && (std::isdigit(static_cast<unsigned char>(src_[p])) ||
                                 (src_[p] == '_' && p + 1 < src_.size() &&
                                  std::isdigit(static_cast<unsigned char>(src_[p + 1]))))) {
        ++p;
      }
      return p;
    };
    size_t end = digits(pos);
    bool is_float = false;
    if (end + 1 < src_.size() && src_[end] == '.' &&
        std::isdigit(static_cast<unsigned char>(src_[end + 1]))) {
      end = digits(end + 1);
      is_float = true;
    }
    if (end < src_.size() && (src_[end] == 'e' || src_[end] == 'E')) {
      size_t p = end + 1;
      if (p < src_.size() && (src_[p] == '+' || src_[p] == '-')) ++p;
      if (p < src_.size() && std::isdigit(static_cast<unsigned char>(src_[p]))) {
        end = digits(p);
        is_float = true;
      }
    }
    std::string text;
    for (size_t i = pos; i < end; ++i) {
      if (src_[i] != '_') text += src_[i];
    }
    emit(is_float ? TokenType::kFloat : TokenType::kInteger, text, pos);
    return end;
  }

  // Python unicode-escape decoding of the literal's body, as jinja2 does.
  size_t lex_string(size_t pos) {
    const char quote = src_[pos];
    std::string value;
    size_t p = pos + 1;
    auto hex_value = [&](size_t at, int count, uint32_t* out) {
      uint32_t v = 0;
      for (int i = 0; i < count; ++i) {
        if (at + i >= src_.size() || !std::isxdigit(static_cast<unsigned char>(src_[at + i]))) {
          return false;
        }
        const char h = src_[at + i];
        v = v * 16 +
            static_cast<uint32_t>(std::isdigit(static_cast<unsigned char>(h))
                                      ? h - '0'
                                      : std::tolower(static_cast<unsigned char>(h)) - 'a' + 10);
      }
      *out = v;
      return true;
    };
    while (true) {
      if (p >= src_.size()) fail(pos, "unterminated string literal");
      const char c = src_[p];
      if (c == quote) break;
      if (c != '\\') {
        value += c;
        ++p;
        continue;
      }
      if (p + 1 >= src_.size()) fail(pos, "unterminated string literal");
      const char e = src_[p + 1];
      p += 2;
      switch (e) {
        case 'n':
          value += '\n';
          break;
        case 't':
          value += '\t';
          break;
        case 'r':
          value += '\r';
          break;
        case '\\':
          value += '\\';
          break;
        case '\'':
          value += '\'';
          break;
        case '"':
          value += '"';
          break;
        case 'a':
          value += '\a';
          break;
        case 'b':
          value += '\b';
          break;
        case 'f':
          value += '\f';
          break;
        case 'v':
          value += '\v';
          break;
        case '\n':
          break;  // line continuation
        case 'x':
        case 'u':
        case 'U': {
          const int count = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          if (!hex_value(p, count, &cp)) fail(p - 2, "invalid \\" + std::string(1, e) + " escape");
          append_utf8(cp, value);
          p += static_cast<size_t>(count);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = static_cast<uint32_t>(e - '0');
            for (int i = 0; i < 2 && p < src_.size() && src_[p] >= '0' && src_[p] <= '7'; ++i) {
              cp = cp * 8 + static_cast<uint32_t>(src_[p++] - '0');
            }
            append_utf8(cp, value);
          } else {
            value += '\\';
            value += e;
          }
      }
    }
    emit(TokenType::kString, value, pos);
    return p + 1;
  }

  std::string src_;
  std::vector<size_t> line_starts_;
  std::vector<Token> tokens_;
};

}  // namespace

const char* token_type_name(TokenType type) {
  switch (type) {
    case TokenType::kData:
      return "template data";
    case TokenType::kVariableBegin:
      return "'{{'";
    case TokenType::kVariableEnd:
      return "'}}'";
    case TokenType::kBlockBegin:
      return "'{%'";
    case TokenType::kBlockEnd:
      return "'%}'";
    case TokenType::kName:
      return "name";
    case TokenType::kString:
      return "string";
    case TokenType::kInteger:
      return "integer";
    case TokenType::kFloat:
      return "float";
    case TokenType::kOperator:
      return "operator";
    case TokenType::kEof:
      return "end of template";
  }
  return "token";
}

std::vector<Token> tokenize(const std::string& source) {
  return Lexer(source).run();
}

}  // namespace arbor::jinja
