// Fuzz target: HTTP request bodies of /v1/completions and /v1/chat/completions, as the server
// parses them (server/openai_api.h parse_openai_body, with SmolLM2's tokenizer and chat
// template), then the content checks every request passes before it is queued
// (check_request, as EngineService::submit runs it). Every input is parsed both as a chat and as
// a completions body.
// Invariants: parse_openai_body returns or throws ApiError with a 4xx status (anything else
// escaping would be a 500 or a dead server); check_request accepts or throws RequestError; an
// accepted request is within the limits (tests/fuzz/request_checks.h).
#include <memory>

#include "engine/tokenizer/chat_template.h"
#include "server/openai_api.h"
#include "tests/fuzz/request_checks.h"

namespace {

struct Fixture {
  std::unique_ptr<arbor::Tokenizer> tokenizer;
  std::unique_ptr<arbor::ChatTemplate> chat_template;
  arbor::ApiContext ctx;
  arbor::RequestLimits limits;
};
Fixture* fixture = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  fixture = new Fixture;
  const arbor::TokenizerSpec spec = arbor::fuzz::smollm2_tokenizer_spec();
  fixture->tokenizer = arbor::Tokenizer::create(spec);
  fixture->chat_template =
      std::make_unique<arbor::ChatTemplate>(arbor::chat_template_from_spec(spec));
  fixture->ctx.tokenizer = fixture->tokenizer.get();
  fixture->ctx.chat_template = fixture->chat_template.get();
  fixture->ctx.model_id = "SmolLM2-135M-Instruct";
  fixture->ctx.max_context = 8192;
  fixture->ctx.add_bos = spec.add_bos;
  fixture->limits = arbor::fuzz::served_limits(*fixture->tokenizer);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view body(reinterpret_cast<const char*>(data), size);
  for (bool chat : {true, false}) {
    arbor::ParsedRequest parsed;
    try {
      parsed = arbor::parse_openai_body(body, chat, fixture->ctx);
    } catch (const arbor::ApiError& e) {
      if (e.status < 400 || e.status >= 500)
        arbor::fuzz::fail("parse_openai_body answered " + std::to_string(e.status) + ": " +
                          e.what());
      continue;
    }
    arbor::fuzz::check_submitted(parsed.requests, fixture->limits, parsed.speculate_requested);
  }
  return 0;
}
