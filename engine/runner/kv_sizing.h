// The KV cache sized from the memory there is (EngineConfig::num_blocks = 0), as vLLM's
// gpu_memory_utilization: after the weights are loaded, one profiling step of the largest size
// the engine runs (max_step_tokens tokens, logits for every row) leaves the activations' peak
// held (the CUDA scratch arena keeps it; on the CPU backend, which frees its scratch every step,
// the peak is LlamaModel::activation_bytes of that step, not run), and the cache takes
//
//   total * gpu_memory_utilization - (total - free) - reserve
//
// of the backend's memory (MemoryInfo: device memory on CUDA; host memory on the CPU, where
// `total` is the memory available when the engine starts, since the host is shared with other
// processes). `reserve` holds back what the profiling step does not allocate: the logits copy of
// a step that returns logprobs, the sampling workspace of max_running requests, and 256 MiB for
// step graphs, the draft model's activations and library workspaces. On the CPU backend the
// cache is also capped at max_running requests of the full context.
#pragma once

#include <cstdint>
#include <string>

#include "engine/backend/backend.h"
#include "engine/model/llama_model.h"

namespace arbor {

struct KvSizing {
  int64_t num_blocks = 0;
  int64_t block_size = 0;
  int64_t block_bytes = 0;    // K and V of one block, every layer
  int64_t budget_bytes = 0;   // what the cache may take
  int64_t reserve_bytes = 0;  // held back beyond the profiled peak
  bool capped = false;        // at max_running full contexts (CPU)
  MemoryInfo memory;          // after the profiling step
  double utilization = 0;
  int64_t base_bytes = 0;  // what utilization applies to: device total, or host available
};

// Runs the profiling step on `model` (which allocates a small KV cache for it; the caller then
// allocates the real one) and returns the number of blocks. Throws kResourceExhausted naming
// the sizes when the memory left holds less than one max_step_tokens chunk.
KvSizing size_kv_cache(LlamaModel& model, double utilization, int32_t block_size,
                       int32_t max_step_tokens, int32_t max_running, const ForwardRequest& want);

// One line for the start-up log: the capacity in blocks, tokens and full-context requests, and
// where the memory went ("KV cache: 325120 blocks x 16 tokens = 5201920 tokens (112.3 GiB):
// 635 requests of the full 8192-token context; 0.90 of 139.8 GiB of device 0 (NVIDIA H200),
// 14.2 GiB used by weights and activations, 256.0 MiB held back").
std::string describe_kv_capacity(const KvCacheShape& shape, int64_t cache_bytes,
                                 int64_t max_context, const KvSizing* sized);

}  // namespace arbor
