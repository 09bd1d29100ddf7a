#include "engine/tokenizer/tokenizer.h"

#include "engine/core/error.h"
#include "engine/tokenizer/vocab_tokenizer.h"

namespace arbor {

std::unique_ptr<Tokenizer> Tokenizer::create(TokenizerSpec spec) {
  switch (spec.kind) {
    case TokenizerKind::kSentencePieceBpe:
      return make_spm_tokenizer(std::move(spec));
    case TokenizerKind::kByteLevelBpe:
      return make_byte_level_tokenizer(std::move(spec));
  }
  throw_error(ErrorCode::kInvalidArgument,
              "tokenizer spec: unknown kind " + std::to_string(static_cast<int>(spec.kind)));
}

}  // namespace arbor
