// The KV cache sized from the memory there is (EngineConfig::num_blocks 0, runner/kv_sizing.h)
// on the CPU backend with stories260K: the size follows from the cap and the utilization, the
// output does not change, and caches that cannot fit are errors naming the sizes (not
// std::bad_alloc).
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "engine/backend/backend.h"
#include "engine/core/error.h"
#include "engine/model/llama_model.h"
#include "engine/runner/generator.h"
#include "engine/runner/model_bundle.h"

namespace arbor {
namespace {

class KvSizingTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    bundle_ = new ModelBundle(
        load_model_bundle(std::string(ARBOR_SHARED_DIR) + "/models/stories260K/stories260K.bin"));
  }
  static void TearDownTestSuite() { delete bundle_; }
  static ModelBundle* bundle_;
};
ModelBundle* KvSizingTest::bundle_ = nullptr;

// MemTotal from /proc/meminfo, read here rather than through the backend.
int64_t mem_total_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  int64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit)
    if (key == "MemTotal:") return kib * 1024;
  return -1;
}

template <typename F>
std::string error_of(F&& f, ErrorCode code) {
  try {
    f();
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), code) << e.what();
    return e.what();
  }
  ADD_FAILURE() << "no error";
  return "";
}

TEST_F(KvSizingTest, StoriesShapeAndHostMemory) {
  // stories260K (llama2.c): 5 layers, 4 KV heads of 8 dimensions, a 512-token context.
  const ModelConfig& c = bundle_->weights.config;
  ASSERT_EQ(c.num_layers, 5);
  ASSERT_EQ(c.num_kv_heads, 4);
  ASSERT_EQ(c.head_dim, 8);
  ASSERT_EQ(c.max_position, 512);
  auto backend = make_cpu_backend(1);
  LlamaModel model(*backend, bundle_->weights);
  // K and V, 5 layers, 16 slots of 4 x 8 fp32.
  EXPECT_EQ(backend->kv_cache_bytes(model.kv_shape(1, 16)), 2 * 5 * 16 * 4 * 8 * 4);
  const MemoryInfo m = backend->memory_info();
  EXPECT_EQ(m.where, "host");
  EXPECT_GT(m.free_bytes, 0);
  EXPECT_LE(m.free_bytes, m.total_bytes);
  EXPECT_LE(m.total_bytes, mem_total_bytes());
}

TEST_F(KvSizingTest, AutoSizeOnTheHostIsCappedAtMaxRunningFullContexts) {
  auto backend = make_cpu_backend(1);
  LlamaModel model(*backend, bundle_->weights);
  GeneratorConfig cfg;
  cfg.num_blocks = 0;
  cfg.block_size = 16;
  cfg.max_running = 8;
  Generator gen(model, cfg);
  // 8 requests of 512 tokens = 256 blocks of 16: a few MiB, far below 0.9 of any host's memory.
  EXPECT_EQ(gen.kv().stats().num_blocks, 8 * 512 / 16);
  EXPECT_EQ(backend->kv_shape().num_blocks, 8 * 512 / 16);
  const std::string& line = gen.engine().kv_capacity();
  EXPECT_NE(line.find("256 blocks x 16 tokens = 4096 tokens"), std::string::npos) << line;
  EXPECT_NE(line.find("8.0 requests of the full 512-token context"), std::string::npos) << line;
  EXPECT_NE(line.find("capped at max_running"), std::string::npos) << line;
  EXPECT_NE(line.find("of host memory available"), std::string::npos) << line;
}

TEST_F(KvSizingTest, AutoSizedEngineGeneratesWhatAFixedOneDoes) {
  GenerationRequest r;
  r.prompt = {1, 403, 407, 261};
  r.max_tokens = 96;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  std::vector<std::vector<int32_t>> outs;
  for (int32_t blocks : {0, 64}) {
    auto backend = make_cpu_backend(1);
    LlamaModel model(*backend, bundle_->weights);
    GeneratorConfig cfg;
    cfg.num_blocks = blocks;
    Generator gen(model, cfg);
    outs.push_back(gen.run({r, r, r}).at(2).tokens);
  }
  EXPECT_EQ(outs[0].size(), 96u);
  EXPECT_EQ(outs[0], outs[1]);
}

TEST_F(KvSizingTest, TooLittleMemoryLeftIsAnErrorNamingTheSizes) {
  auto backend = make_cpu_backend(1);
  LlamaModel model(*backend, bundle_->weights);
  GeneratorConfig cfg;
  cfg.num_blocks = 0;
  cfg.gpu_memory_utilization = 1e-9;  // a few bytes of the host's memory
  const std::string msg =
      error_of([&] { Generator gen(model, cfg); }, ErrorCode::kResourceExhausted);
  EXPECT_NE(msg.find("no room for the KV cache"), std::string::npos) << msg;
  EXPECT_NE(msg.find("gpu_memory_utilization"), std::string::npos) << msg;
  EXPECT_NE(msg.find("512-token chunk needs"), std::string::npos) << msg;
}

TEST_F(KvSizingTest, ACacheLargerThanMemoryIsAnErrorNotBadAlloc) {
  auto backend = make_cpu_backend(1);
  LlamaModel model(*backend, bundle_->weights);
  GeneratorConfig cfg;
  cfg.num_blocks = 1 << 30;  // 1G blocks x 20 KiB: 20 TiB
  const std::string msg =
      error_of([&] { Generator gen(model, cfg); }, ErrorCode::kResourceExhausted);
  EXPECT_NE(msg.find("a KV cache of 1073741824 blocks of 16 tokens needs 20.0 TiB"),
            std::string::npos)
      << msg;
  EXPECT_NE(msg.find("of host memory is free"), std::string::npos) << msg;
  // The backend is still usable: a cache that fits is allocated afterwards.
  cfg.num_blocks = 64;
  Generator gen(model, cfg);
  EXPECT_EQ(backend->kv_shape().num_blocks, 64);
}

TEST_F(KvSizingTest, BadUtilizationIsRefused) {
  for (double u : {0.0, -0.5, 1.5}) {
    GeneratorConfig cfg;
    cfg.num_blocks = 0;
    cfg.gpu_memory_utilization = u;
    const std::string msg = error_of([&] { cfg.validate(); }, ErrorCode::kInvalidArgument);
    EXPECT_NE(msg.find("gpu_memory_utilization must be in (0, 1]"), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace arbor
