#include "engine/tokenizer/id_tokenizer.h"

#include "engine/core/error.h"

namespace arbor {

IdTokenizer::IdTokenizer(std::string model_name, int32_t vocab_size, int32_t bos_id, int32_t eos_id)
    : model_name_(std::move(model_name)), vocab_size_(vocab_size) {
  if (vocab_size <= 0)
    throw_error(ErrorCode::kInvalidArgument,
                "id tokenizer: vocab_size must be positive, got " + std::to_string(vocab_size));
  spec_.kind = TokenizerKind::kByteLevelBpe;  // no SentencePiece space to strip when decoding
  spec_.bos_id = bos_id;
  spec_.eos_id = eos_id;
  spec_.add_bos = false;
  spec_.add_space_prefix = false;
}

std::vector<int32_t> IdTokenizer::encode(std::string_view, bool, bool) const {
  throw_error(ErrorCode::kInvalidArgument,
              model_name_ +
                  " has no tokenizer: send the prompt as token ids (/v1/completions with "
                  "\"prompt\": [id, ...]); text prompts and chat need a model with a tokenizer");
}

std::string IdTokenizer::token_bytes(int32_t id) const {
  if (id < 0 || id >= vocab_size_)
    throw_error(ErrorCode::kInvalidArgument, "token id " + std::to_string(id) +
                                                 " is outside the vocabulary of " +
                                                 std::to_string(vocab_size_));
  if (id == spec_.bos_id) return "<bos>";
  if (id == spec_.eos_id) return "<eos>";
  return " " + std::to_string(id);
}

std::string IdTokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string text;
  for (int32_t id : ids)
    if (!(skip_special && is_special(id))) text += token_bytes(id);
  return text;
}

bool IdTokenizer::is_special(int32_t id) const {
  return id == spec_.bos_id || id == spec_.eos_id;
}

}  // namespace arbor
