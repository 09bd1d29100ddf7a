// What the front ends report about the served model (/v1/models, gRPC GetModelInfo).
#pragma once

#include <cstdint>
#include <string>

namespace arbor {

struct ServedModelInfo {
  std::string id;           // the name clients pass as `model`
  int32_t max_context = 0;  // prompt + generated tokens of one request at most
  int32_t vocab_size = 0;
  std::string speculation;  // "off", "ngram", "medusa", "eagle", "eagle3"
  std::string backend;      // "cpu" or "cuda"
};

}  // namespace arbor
