// Fuzz target: gRPC Generate requests: the bytes as a serialized arbor.v1.GenerateRequest
// (GenerateRequest::ParseFromArray, what the gRPC runtime does with a message), converted by
// convert_generate_request (server/grpc/grpc_request.h) with SmolLM2's tokenizer, then the
// content checks every request passes before it is queued (check_request).
// Invariants: conversion returns a status (OK, INVALID_ARGUMENT or NOT_FOUND) and throws
// nothing; check_request accepts or throws RequestError; an accepted request is within the
// limits (tests/fuzz/request_checks.h).
#include <memory>

#include <google/protobuf/stubs/logging.h>

#include "server/grpc/grpc_request.h"
#include "tests/fuzz/request_checks.h"

namespace {

struct Fixture {
  std::unique_ptr<arbor::Tokenizer> tokenizer;
  arbor::RequestContext ctx;
  arbor::RequestLimits limits;
};
Fixture* fixture = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  // Parsing a string field that is not UTF-8 fails, and protobuf logs each one: millions of
  // lines per run. The failures themselves are what the target checks.
  google::protobuf::SetLogHandler(nullptr);
  fixture = new Fixture;
  fixture->tokenizer = arbor::fuzz::load_smollm2_tokenizer();
  fixture->ctx.tokenizer = fixture->tokenizer.get();
  fixture->ctx.model_id = "SmolLM2-135M-Instruct";
  fixture->limits = arbor::fuzz::served_limits(*fixture->tokenizer);
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  arbor::v1::GenerateRequest req;
  if (!req.ParseFromArray(data, static_cast<int>(size))) return 0;
  arbor::ServiceRequest out;
  bool speculate_requested = false;
  const grpc::Status status =
      arbor::convert_generate_request(req, fixture->ctx, &out, &speculate_requested);
  const grpc::StatusCode code = status.error_code();
  if (code != grpc::StatusCode::OK && code != grpc::StatusCode::INVALID_ARGUMENT &&
      code != grpc::StatusCode::NOT_FOUND)
    arbor::fuzz::fail("convert_generate_request answered code " +
                      std::to_string(static_cast<int>(code)) + ": " + status.error_message());
  if (status.ok()) arbor::fuzz::check_submitted({out}, fixture->limits, speculate_requested);
  return 0;
}
