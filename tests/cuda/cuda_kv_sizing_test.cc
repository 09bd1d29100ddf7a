// The KV cache sized from device memory (EngineConfig::num_blocks 0, runner/kv_sizing.h) on the
// CUDA backend: after the engine starts, the device's memory in use is gpu_memory_utilization of
// its total less the documented reserve (cudaMemGetInfo, read here, not through the backend);
// the output equals a fixed-size cache's; a cache larger than the device is an error naming the
// sizes.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <string>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/core/error.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/runner/generator.h"
#include "tests/cuda/cuda_test_util.h"

namespace arbor {
namespace {

int64_t device_used_bytes(int64_t* total) {
  size_t free = 0, all = 0;
  EXPECT_EQ(cudaMemGetInfo(&free, &all), cudaSuccess);
  *total = static_cast<int64_t>(all);
  return static_cast<int64_t>(all - free);
}

TEST(CudaKvSizing, CacheFillsTheUtilizationOfDeviceMemory) {
  ARBOR_REQUIRE_GPU();
  const ModelWeights w = load_model_weights(testing::stories260k_path());
  auto backend = make_cuda_backend();
  LlamaModel model(*backend, w);
  GeneratorConfig cfg;
  cfg.num_blocks = 0;
  cfg.gpu_memory_utilization = 0.5;
  cfg.max_step_tokens = 512;
  cfg.max_running = 64;
  Generator gen(model, cfg);
  int64_t total = 0;
  const int64_t used = device_used_bytes(&total);
  const int64_t block_bytes = 2 * 5 * 16 * 4 * 8 * 2;  // K and V, 5 layers, 16 x 4 x 8 bf16
  EXPECT_EQ(backend->kv_cache_bytes(model.kv_shape(1, 16)), block_bytes);
  // The reserve (kv_sizing.h): logits copy and sampling workspace, (512 + 64) x 512 fp32, and
  // 256 MiB.
  const int64_t reserve = (512 + 64) * 512 * 4 + (int64_t{256} << 20);
  const int64_t target = static_cast<int64_t>(0.5 * static_cast<double>(total)) - reserve;
  std::printf("  device %.1f GiB: %.2f GiB in use with the cache (target %.2f GiB), %d blocks\n",
              total / 1073741824.0, used / 1073741824.0, target / 1073741824.0,
              gen.kv().stats().num_blocks);
  // Other processes do not share the lent GPU; one block of rounding, 64 MiB for what the
  // driver allocates lazily.
  EXPECT_LE(used, target + (int64_t{64} << 20));
  EXPECT_GE(used, target - block_bytes - (int64_t{64} << 20));
  EXPECT_NE(gen.engine().kv_capacity().find("sized as 0.50 of the"), std::string::npos)
      << gen.engine().kv_capacity();

  // The same tokens as a small fixed cache on another backend.
  GenerationRequest r;
  r.prompt = {1, 403, 407, 261};
  r.max_tokens = 64;
  r.ignore_eos = true;
  r.sampling.temperature = 0;
  const auto got = gen.run({r, r});
  auto fixed_backend = make_cuda_backend();
  LlamaModel fixed_model(*fixed_backend, w);
  GeneratorConfig fixed_cfg;
  fixed_cfg.num_blocks = 64;
  Generator fixed(fixed_model, fixed_cfg);
  const auto want = fixed.run({r, r});
  EXPECT_EQ(got[1].tokens, want[1].tokens);
  EXPECT_EQ(got[1].tokens.size(), 64u);
}

TEST(CudaKvSizing, ACacheLargerThanTheDeviceIsAnErrorNamingTheSizes) {
  ARBOR_REQUIRE_GPU();
  const ModelWeights w = load_model_weights(testing::stories260k_path());
  auto backend = make_cuda_backend();
  LlamaModel model(*backend, w);
  GeneratorConfig cfg;
  cfg.num_blocks = 16000000;
  cfg.block_size = 1024;  // 16M x 1024 tokens x 640 B (K and V, 5 layers, 4 x 8 bf16): 9.5 TiB
  try {
    Generator gen(model, cfg);
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_EQ(e.code(), ErrorCode::kResourceExhausted) << msg;
    EXPECT_NE(msg.find("a KV cache of 16000000 blocks of 1024 tokens needs 9.5 TiB"),
              std::string::npos)
        << msg;
    EXPECT_NE(msg.find("memory is free"), std::string::npos) << msg;
    EXPECT_NE(msg.find("device 0 ("), std::string::npos) << msg;
  }
}

}  // namespace
}  // namespace arbor
