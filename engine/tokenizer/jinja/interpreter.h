// A parsed Jinja template and its renderer. Output matches Python jinja2 configured as
// transformers does for chat templates (ImmutableSandboxedEnvironment, trim_blocks,
// lstrip_blocks, loopcontrols); see engine/tokenizer/README.md for the supported subset.
#pragma once

#include <string>

#include "engine/tokenizer/jinja/ast.h"
#include "engine/tokenizer/jinja/value.h"

namespace arbor::jinja {

class Template {
 public:
  // Parses; throws arbor::Error(kInvalidArgument) naming line and column on syntax errors and
  // on unknown filters / tests (jinja2 rejects those at compile time too).
  explicit Template(const std::string& source);

  // Renders with `variables` (plus the globals of builtins.h, which variables may override).
  // Throws arbor::Error(kInvalidArgument): raise_exception's message verbatim, or
  // "chat template error at line L, column C: ..." for runtime errors (undefined attribute
  // access, type errors).
  std::string render(const ValueDict& variables) const;

 private:
  NodeList nodes_;
};

}  // namespace arbor::jinja
