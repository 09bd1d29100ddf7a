// make_proposer and SpecConfig: every method builds the right proposer from the fixtures for
// the llama_gqa target, and bad settings or checkpoints fail with messages naming the field, the
// file or the tensor.
#include <gtest/gtest.h>

#include "engine/spec/proposer_factory.h"
#include "tests/unit/proposer_test_util.h"

namespace arbor {
namespace {

using test::expect_error;
using test::spec_fixture;

TEST(SpecConfig, MethodNamesRoundTrip) {
  for (const char* name : {"off", "medusa", "eagle", "eagle3", "ngram"})
    EXPECT_STREQ(spec_method_name(parse_spec_method(name)), name);
  expect_error([] { parse_spec_method("lookahead"); }, ErrorCode::kInvalidArgument,
               {"'lookahead'", "medusa", "eagle3", "ngram"});
}

TEST(SpecConfig, ValidateNamesTheField) {
  auto with = [](const std::function<void(SpecConfig&)>& edit) {
    SpecConfig c;
    c.method = SpecMethod::kNgram;
    edit(c);
    return c;
  };
  expect_error([&] { with([](SpecConfig& c) { c.depth = -1; }).validate(); },
               ErrorCode::kInvalidArgument, {"spec depth is -1", ">= 0"});
  expect_error([&] { with([](SpecConfig& c) { c.top_k = 0; }).validate(); },
               ErrorCode::kInvalidArgument, {"spec top_k is 0"});
  expect_error([&] { with([](SpecConfig& c) { c.total_tokens = 0; }).validate(); },
               ErrorCode::kInvalidArgument, {"spec total_tokens is 0"});
  expect_error([&] { with([](SpecConfig& c) { c.max_ngram = 0; }).validate(); },
               ErrorCode::kInvalidArgument, {"spec max_ngram is 0", "min_ngram (1)"});
  expect_error([&] { with([](SpecConfig& c) { c.draft_kv_blocks = 0; }).validate(); },
               ErrorCode::kInvalidArgument, {"spec draft_kv_blocks is 0"});
  expect_error([&] { with([](SpecConfig& c) { c.grow_on_device = 2; }).validate(); },
               ErrorCode::kInvalidArgument, {"spec grow_on_device is 2", "-1 (auto), 0 or 1"});
  expect_error([&] { with([](SpecConfig& c) { c.method = SpecMethod::kEagle; }).validate(); },
               ErrorCode::kInvalidArgument, {"head_path is empty", "eagle"});
}

TEST(MakeProposer, BuildsEveryMethod) {
  const ModelWeights& target = test::target_weights("llama_gqa");
  SpecConfig c;
  EXPECT_EQ(make_proposer(c, target), nullptr);

  c.method = SpecMethod::kMedusa;
  c.head_path = spec_fixture("medusa_llama_gqa");
  auto medusa = make_proposer(c, target);
  EXPECT_EQ(medusa->name(), "medusa");
  EXPECT_TRUE(medusa->needs_hidden());

  c.method = SpecMethod::kEagle;
  c.head_path = spec_fixture("eagle_llama_gqa");
  auto eagle = make_proposer(c, target);
  EXPECT_EQ(eagle->name(), "eagle");
  EXPECT_TRUE(eagle->needs_hidden());
  EXPECT_TRUE(eagle->capture_layers().empty());

  c.method = SpecMethod::kEagle3;
  c.head_path = spec_fixture("eagle3_llama_gqa");
  auto eagle3 = make_proposer(c, target);
  EXPECT_EQ(eagle3->name(), "eagle3");
  EXPECT_FALSE(eagle3->needs_hidden());
  EXPECT_EQ(eagle3->capture_layers(), (std::vector<int32_t>{0, 1, 2}));  // 2-layer target

  c.method = SpecMethod::kNgram;
  auto ngram = make_proposer(c, target);
  EXPECT_EQ(ngram->name(), "ngram");
  EXPECT_FALSE(ngram->needs_hidden());
}

TEST(MakeProposer, MedusaTreeOptions) {
  const ModelWeights& target = test::target_weights("llama_gqa");
  SpecConfig c;
  c.method = SpecMethod::kMedusa;
  c.head_path = spec_fixture("medusa_llama_gqa");  // 4 heads
  c.tree = "chain-5";
  expect_error([&] { make_proposer(c, target); }, ErrorCode::kInvalidArgument,
               {"chain-5", "depth 5", "4 heads"});
  c.tree = "[[0],[1],[0,0]]";
  EXPECT_NE(make_proposer(c, target), nullptr);
  c.tree = "[[0],[12]]";
  expect_error([&] { make_proposer(c, target); }, ErrorCode::kInvalidArgument,
               {"rank 12", "top_k = 10"});
  c.medusa_top_k = 16;
  EXPECT_NE(make_proposer(c, target), nullptr);
  c.tree = "/nonexistent/tree.json";
  expect_error([&] { make_proposer(c, target); }, ErrorCode::kInvalidArgument,
               {"/nonexistent/tree.json", "readable file"});
}

TEST(MakeProposer, MissingOrMismatchedHeadsAreNamed) {
  const ModelWeights& target = test::target_weights("llama_gqa");
  SpecConfig c;
  c.method = SpecMethod::kEagle3;
  c.head_path = spec_fixture("eagle_llama_gqa");
  expect_error([&] { make_proposer(c, target); }, ErrorCode::kInvalidArgument,
               {"EAGLE-1/2 checkpoint"});
  c.method = SpecMethod::kMedusa;
  c.head_path = "/nonexistent/heads";
  expect_error([&] { make_proposer(c, target); }, ErrorCode::kNotFound, {"/nonexistent/heads"});
  c.head_path = spec_fixture("medusa_llama_gqa");  // own LM heads of vocab 320
  expect_error([&] { make_proposer(c, test::target_weights("stories260K")); },
               ErrorCode::kCorruptData, {"0.1.weight", "expected shape [512, 64]", "[320, 64]"});
}

}  // namespace
}  // namespace arbor
