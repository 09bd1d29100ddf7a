// Tensor parallelism on the GPU (make_cuda_tp_backends: one rank per GPU, NCCL collectives on
// each rank's stream, a thread per rank). On one GPU: the group factory's errors, dummy-weight
// shards holding exactly the unsharded dummy weight's values, the vocabulary-sharded
// embedding. On two GPUs (the nvidia-h200-x2 machine; these report SKIPPED with the GPU count
// elsewhere): a random Llama-3-style model at TP=2 against TP=1 (logits within the bf16
// tolerance, 96 greedy tokens), the Llama-3-8B shape with dummy weights (96 greedy tokens), and
// greedy speculation at TP=2 (n-gram, recorded step graphs with the NCCL calls in them) equal
// to plain greedy at TP=2.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <random>

#include "engine/backend/backend.h"
#include "engine/backend/cuda/cuda_backend.h"
#include "engine/core/error.h"
#include "engine/model/dummy_weights.h"
#include "engine/model/llama_model.h"
#include "engine/runner/generator.h"
#include "engine/spec/proposer_factory.h"
#include "tests/common/direct_batch.h"
#include "tests/common/golden.h"
#include "tests/common/model_runs.h"
#include "tests/cuda/cuda_model_util.h"
#include "tests/cuda/cuda_test_util.h"

namespace arbor {
namespace {

using testing::DirectBatch;

int gpu_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) return 0;
  return n;
}

#define REQUIRE_TWO_GPUS()                                                              \
  do {                                                                                  \
    ARBOR_REQUIRE_GPU();                                                                \
    if (gpu_count() < 2) GTEST_SKIP() << "needs 2 GPUs, " << gpu_count() << " visible"; \
    if (!cuda_tensor_parallel_available()) GTEST_SKIP() << "this build has no NCCL";    \
  } while (0)

// A model on `ranks` GPUs owning its backends.
struct TpModel : testing::TpModel {
  TpModel(const ModelWeights& w, int ranks, const CudaBackendOptions& o = {})
      : testing::TpModel(make_cuda_tp_backends(o, ranks), w) {}
};

HostTensor shape_only(std::vector<int64_t> shape) {
  HostTensor t;
  t.shape = std::move(shape);
  return t;
}

TEST(CudaTp, GroupOfOneAndMoreRanksThanGpus) {
  ARBOR_REQUIRE_GPU();
  auto one = make_cuda_tp_backends({}, 1);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0]->tp_size(), 1);
  const int n = gpu_count();
  try {
    make_cuda_tp_backends({}, n + 1);
    ADD_FAILURE() << "no error for " << n + 1 << " ranks on " << n << " GPUs";
  } catch (const Error& e) {
    const std::string what = e.what();
    if (cuda_tensor_parallel_available()) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument);
      EXPECT_NE(what.find("visible"), std::string::npos) << what;
    } else {
      EXPECT_EQ(e.code(), ErrorCode::kUnsupported);
      EXPECT_NE(what.find("NCCL"), std::string::npos) << what;
    }
  }
}

// The dummy load format's shards: rows (with padding), columns, vectors hold the values the
// unsharded dummy weight of the same seed holds there (so a TP=2 dummy model is the TP=1 one).
TEST(CudaTp, DummyWeightShardsHoldTheUnshardedValues) {
  ARBOR_REQUIRE_GPU();
  CudaBackendOptions o;
  o.random_weights = true;
  auto b = make_cuda_backend(o);
  auto& cuda = static_cast<CudaBackend&>(*b);
  const int64_t rows = 96, cols = 64;
  cuda.set_random_weight_seed(11);
  const Tensor full = b->upload_weight(shape_only({rows, cols}));
  std::vector<float> f(static_cast<size_t>(rows * cols));
  b->download(full, f.data());
  WeightShard by_rows;
  by_rows.row_ranges = {{8, 16}, {40, 8}};
  by_rows.pad_rows = 3;
  cuda.set_random_weight_seed(11);
  const Tensor r = b->upload_weight_shard(shape_only({rows, cols}), by_rows);
  ASSERT_EQ(r.rows, 27);
  std::vector<float> got(static_cast<size_t>(r.numel()));
  b->download(r, got.data());
  for (int64_t i = 0; i < 27; ++i)
    for (int64_t c = 0; c < cols; ++c) {
      const float want = i < 16 ? f[(8 + i) * cols + c] : i < 24 ? f[(40 + i - 16) * cols + c] : 0;
      ASSERT_EQ(got[i * cols + c], want) << "row " << i << " col " << c;
    }
  WeightShard by_cols;
  by_cols.col_begin = 32;
  by_cols.col_count = 16;
  cuda.set_random_weight_seed(11);
  const Tensor c16 = b->upload_weight_shard(shape_only({rows, cols}), by_cols);
  ASSERT_EQ(c16.cols, 16);
  got.assign(static_cast<size_t>(c16.numel()), 0);
  b->download(c16, got.data());
  for (int64_t i = 0; i < rows; ++i)
    for (int64_t c = 0; c < 16; ++c) ASSERT_EQ(got[i * 16 + c], f[i * cols + 32 + c]);
  cuda.set_random_weight_seed(3);
  const Tensor v = b->upload_weight(shape_only({cols}));
  std::vector<float> fv(static_cast<size_t>(cols));
  b->download(v, fv.data());
  WeightShard part;
  part.row_ranges = {{10, 20}};
  cuda.set_random_weight_seed(3);
  const Tensor vs = b->upload_weight_shard(shape_only({cols}), part);
  got.assign(20, 0);
  b->download(vs, got.data());
  for (int64_t i = 0; i < 20; ++i) ASSERT_EQ(got[i], fv[10 + i]);
}

// embedding_shard: the rows of ids inside the shard, zeros for the others.
TEST(CudaTp, EmbeddingShardLooksUpItsVocabularyRows) {
  ARBOR_REQUIRE_GPU();
  auto b = make_cuda_backend();
  std::mt19937 rng(5);
  HostTensor table = testing::random_tensor(rng, {10, 8}, 1.f);
  const Tensor t = b->upload_weight(table);
  DirectBatch batch(16, 16, 1);
  const StepInputs step = batch.step({{batch.add_sequence(), {3, 12, 15, 21, 0}, false}});
  b->allocate_kv({1, 16, 16, 1, 8});
  b->set_step(step);
  b->reset_scratch();
  const Tensor out = b->scratch(5, 8);
  b->embedding_shard(t, 12, out);  // ids 12..21
  std::vector<float> got(40);
  b->download(out, got.data());
  const std::vector<int> row = {-1, 0, 3, 9, -1};
  for (int n = 0; n < 5; ++n)
    for (int c = 0; c < 8; ++c) {
      const float want = row[n] < 0 ? 0.f : testing::round_bf16(table.data[row[n] * 8 + c]);
      EXPECT_EQ(got[n * 8 + c], want) << "token " << n;
    }
}

// Greedy decode of one prompt, one token per step: the tokens and the prompt rows' logits.
std::vector<int32_t> greedy(LlamaModel& model, const std::vector<int32_t>& prompt, int n,
                            std::vector<float>* first_logits) {
  return testing::greedy_decode(model, prompt, n, 16, first_logits);
}

TEST(CudaTp2, RandomModelMatchesOneGpu) {
  REQUIRE_TWO_GPUS();
  const ModelWeights w = testing::random_model(128, 8, 2, 7);
  TpModel one(w, 1), two(w, 2);
  for (TpModel* m : {&one, &two}) m->model->allocate_kv(m->model->kv_shape(256, 16));
  std::mt19937 rng(9);
  std::vector<int32_t> prompt = {1};
  for (int i = 0; i < 40; ++i) prompt.push_back(3 + static_cast<int32_t>(rng() % 500));
  std::vector<float> l1, l2;
  const auto t1 = greedy(*one.model, prompt, 96, &l1);
  const auto t2 = greedy(*two.model, prompt, 96, &l2);
  const int64_t vocab = w.config.vocab_size;
  double worst = 0;
  for (size_t r = 0; r < prompt.size(); ++r) {
    const std::vector<float> a(l2.begin() + r * vocab, l2.begin() + (r + 1) * vocab);
    const std::vector<float> b(l1.begin() + r * vocab, l1.begin() + (r + 1) * vocab);
    worst = std::max(worst, testing::max_rel_error(a, b));
  }
  std::printf("random d128, TP=2 vs TP=1: worst relative logit error %.3g over %zu rows\n", worst,
              prompt.size());
  EXPECT_LE(worst, 5e-2);
  EXPECT_EQ(t2, t1);
}

// Llama-3-8B's shapes with dummy weights (the same values at TP=1 and TP=2): 96 greedy tokens.
TEST(CudaTp2, Llama3_8BShapeGreedyMatchesOneGpu) {
  REQUIRE_TWO_GPUS();
  const ModelWeights w = dummy_model_weights("llama-3-8b");
  const ModelConfig& c = w.config;
  CudaBackendOptions o;
  o.random_weights = true;
  std::vector<int32_t> prompt = {128000};
  std::mt19937 rng(4);
  for (int i = 0; i < 31; ++i) prompt.push_back(static_cast<int32_t>(rng() % 128000));
  std::vector<int32_t> t1, t2;
  std::vector<float> l1, l2;
  {
    TpModel one(w, 1, o);
    one.model->allocate_kv(one.model->kv_shape(256, 16));
    t1 = greedy(*one.model, prompt, 96, &l1);
  }
  {
    TpModel two(w, 2, o);
    two.model->allocate_kv(two.model->kv_shape(256, 16));
    t2 = greedy(*two.model, prompt, 96, &l2);
  }
  const int64_t vocab = c.vocab_size;
  const std::vector<float> a(l2.end() - vocab, l2.end()), b(l1.end() - vocab, l1.end());
  std::printf("Llama-3-8B shape, TP=2 vs TP=1: last prompt row's relative logit error %.3g\n",
              testing::max_rel_error(a, b));
  size_t same = 0;
  while (same < t1.size() && t1[same] == t2[same]) ++same;
  std::printf("Llama-3-8B shape: %zu of 96 greedy tokens equal before the first difference\n",
              same);
  EXPECT_EQ(t2, t1);
}

TEST(CudaTp2, SpeculativeGreedyEqualsPlainWithGraphs) {
  REQUIRE_TWO_GPUS();
  const ModelWeights w = testing::random_model(64, 8, 2, 64);
  const auto reqs = testing::motif_prompts(777, {15, 16, 17, 31, 5}, 5, w.config.vocab_size, 48);
  GeneratorConfig gc;
  gc.num_blocks = 256;
  gc.block_size = 16;
  gc.max_step_tokens = 96;
  TpModel plain(w, 2);
  Generator plain_gen(*plain.model, gc);
  const auto expect = plain_gen.run(reqs);
  SpecConfig sc;
  sc.method = parse_spec_method("ngram");
  auto proposer = make_proposer(sc, w);
  TpModel spec(w, 2);
  Generator spec_gen(*spec.model, gc, proposer.get());
  const auto got = spec_gen.run(reqs);
  const int equal = testing::expect_equal_tokens(got, expect, "n-gram at TP=2");
  const StepGraphStats g = spec.model->step_graph_stats();
  std::printf(
      "n-gram at TP=2: %d/%zu requests equal to plain; step graphs %lld replays, %lld "
      "captures, %lld eager\n",
      equal, reqs.size(), static_cast<long long>(g.replays), static_cast<long long>(g.captures),
      static_cast<long long>(g.eager));
  EXPECT_GT(g.replays, 0);
  EXPECT_EQ(spec_gen.kv().stats().used_blocks, 0);
}

}  // namespace
}  // namespace arbor
