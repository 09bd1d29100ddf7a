#include "engine/core/error.h"

#include <sstream>

namespace arbor {

const char* error_code_name(ErrorCode code) {
  switch (code) {
    case ErrorCode::kInvalidArgument:
      return "invalid_argument";
    case ErrorCode::kNotFound:
      return "not_found";
    case ErrorCode::kCorruptData:
      return "corrupt_data";
    case ErrorCode::kUnsupported:
      return "unsupported";
    case ErrorCode::kResourceExhausted:
      return "resource_exhausted";
    case ErrorCode::kInternal:
      return "internal";
  }
  return "unknown";
}

void throw_error(ErrorCode code, const std::string& message) {
  throw Error(code, message);
}

void check_failed(const char* expr, const char* file, int line, const std::string& msg) {
  std::ostringstream os;
  os << "internal check failed: " << expr << " at " << file << ":" << line;
  if (!msg.empty()) os << ": " << msg;
  throw Error(ErrorCode::kInternal, os.str());
}

}  // namespace arbor
