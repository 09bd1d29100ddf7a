#include "engine/sampling/sampling_params.h"

#include <cmath>
#include <sstream>
#include <string>

#include "engine/core/error.h"

namespace arbor {

namespace {
template <class T>
[[noreturn]] void bad(const char* field, const char* rule, T value) {
  std::ostringstream os;
  os << "sampling parameter " << field << " must be " << rule << ", got " << value;
  throw_error(ErrorCode::kInvalidArgument, os.str());
}
}  // namespace

void SamplingParams::validate() const {
  // Comparisons are written so that NaN fails them.
  if (!(temperature >= 0.0f) || std::isinf(temperature))
    bad("temperature", ">= 0 and finite", temperature);
  if (top_k < -1) bad("top_k", ">= 1, or 0 / -1 to disable", top_k);
  if (!(top_p > 0.0f && top_p <= 1.0f)) bad("top_p", "in (0, 1]", top_p);
  if (!(min_p >= 0.0f && min_p <= 1.0f)) bad("min_p", "in [0, 1]", min_p);
  if (!(repetition_penalty > 0.0f) || std::isinf(repetition_penalty))
    bad("repetition_penalty", "> 0 and finite", repetition_penalty);
  if (!(presence_penalty >= -2.0f && presence_penalty <= 2.0f))
    bad("presence_penalty", "in [-2, 2]", presence_penalty);
  if (!(frequency_penalty >= -2.0f && frequency_penalty <= 2.0f))
    bad("frequency_penalty", "in [-2, 2]", frequency_penalty);
  if (logit_bias.size() > static_cast<size_t>(kMaxLogitBiasEntries))
    throw_error(ErrorCode::kInvalidArgument,
                "logit_bias has " + std::to_string(logit_bias.size()) + " entries, at most " +
                    std::to_string(kMaxLogitBiasEntries) + " are allowed");
  for (size_t i = 0; i < logit_bias.size(); ++i) {
    const auto [token, bias] = logit_bias[i];
    if (token < 0)
      throw_error(ErrorCode::kInvalidArgument,
                  "logit_bias token id " + std::to_string(token) + " is negative");
    if (i > 0 && token <= logit_bias[i - 1].first)
      throw_error(ErrorCode::kInvalidArgument,
                  "logit_bias token ids must be strictly ascending: " + std::to_string(token) +
                      " follows " + std::to_string(logit_bias[i - 1].first));
    if (!(bias >= -kMaxLogitBias && bias <= kMaxLogitBias)) {
      std::ostringstream os;
      os << "logit_bias bias for token " << token << " is " << bias << ", must be in [-"
         << kMaxLogitBias << ", " << kMaxLogitBias << "]";
      throw_error(ErrorCode::kInvalidArgument, os.str());
    }
  }
}

}  // namespace arbor
