// Error type thrown at the library edge. The code maps to an HTTP status / gRPC code in the
// server; the message names the offending values ("tensor blk.0.attn_q.weight: expected shape
// [64, 64], found [64, 32]").
#pragma once

#include <stdexcept>
#include <string>

namespace arbor {

enum class ErrorCode {
  kInvalidArgument,  // bad user input (flags, request fields, tree shapes)
  kNotFound,         // missing file or tensor
  kCorruptData,      // truncated or malformed file contents
  kUnsupported,      // valid but not supported (dtype, architecture)
  kResourceExhausted,
  kInternal,  // broken invariant: a bug
};

const char* error_code_name(ErrorCode code);

class Error : public std::runtime_error {
 public:
  Error(ErrorCode code, const std::string& message) : std::runtime_error(message), code_(code) {}
  ErrorCode code() const { return code_; }

 private:
  ErrorCode code_;
};

[[noreturn]] void throw_error(ErrorCode code, const std::string& message);
[[noreturn]] void check_failed(const char* expr, const char* file, int line,
                               const std::string& msg);

namespace detail {
inline std::string check_message() {
  return {};
}
inline std::string check_message(const std::string& m) {
  return m;
}
}  // namespace detail

}  // namespace arbor

// Invariant check inside the engine: a failure is a bug, reported as kInternal with location.
#define ARBOR_CHECK(cond, ...)                                            \
  do {                                                                    \
    if (!(cond))                                                          \
      ::arbor::check_failed(#cond, __FILE__, __LINE__,                    \
                            ::arbor::detail::check_message(__VA_ARGS__)); \
  } while (0)
