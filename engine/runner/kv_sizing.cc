#include "engine/runner/kv_sizing.h"

#include <algorithm>
#include <cstdio>

#include "engine/core/error.h"

namespace arbor {

namespace {

// One request's prefill chunk of `tokens` tokens from position 0, logits for every row.
StepInputs profile_step(int32_t tokens, int32_t block_size, int64_t vocab) {
  StepInputs s;
  const int32_t blocks = (tokens + block_size - 1) / block_size;
  s.max_blocks_per_request = blocks;
  s.qo_indptr = {0, tokens};
  s.mask_indptr = {0, 0};
  s.committed_len = {0};
  for (int32_t b = 0; b < blocks; ++b) s.block_tables.push_back(b);
  for (int32_t i = 0; i < tokens; ++i) {
    s.token_ids.push_back(static_cast<int32_t>((i * 7 + 1) % vocab));
    s.positions.push_back(i);
    s.slot_mapping.push_back(i);
    s.logits_rows.push_back(i);
  }
  return s;
}

}  // namespace

KvSizing size_kv_cache(LlamaModel& model, double utilization, int32_t block_size,
                       int32_t max_step_tokens, int32_t max_running, const ForwardRequest& want) {
  if (!(utilization > 0 && utilization <= 1))
    throw_error(ErrorCode::kInvalidArgument,
                "gpu_memory_utilization must be in (0, 1], got " + std::to_string(utilization));
  Backend& b = model.backend();
  const ModelConfig& c = model.config();
  const bool host = b.name() == "cpu";
  KvSizing k;
  k.utilization = utilization;
  k.block_size = block_size;
  k.block_bytes = b.kv_cache_bytes(model.kv_shape(1, block_size));
  // A tensor-parallel group on the host: every rank's cache and activations come from the same
  // memory (on GPUs each rank sizes from its own device, rank 0's standing for all).
  const int64_t host_ranks = host ? model.tensor_parallel() : 1;
  k.block_bytes *= host_ranks;
  // What a host-memory backend may take is judged against the memory available before the
  // profiling step (the rest of the machine uses the rest).
  const MemoryInfo before = b.memory_info();

  const int32_t tokens = static_cast<int32_t>(
      std::min<int64_t>(max_step_tokens, std::max<int64_t>(c.max_position, 1)));
  const int32_t probe_blocks = (tokens + block_size - 1) / block_size;
  int64_t probe_cache = 0;
  if (host) {
    // The CPU backend frees its activations after every step: the peak is what one step of
    // `tokens` rows with every row's logits allocates, held back without running that step (a
    // start-up forward of max_step_tokens tokens costs seconds on a CPU).
    k.memory = before;
    k.memory.free_bytes -= host_ranks * model.activation_bytes(tokens, tokens, want);
  } else {
    model.allocate_kv(model.kv_shape(probe_blocks, block_size));
    probe_cache = b.kv_cache_bytes(model.kv_shape(probe_blocks, block_size));
    ForwardRequest profile = want;
    profile.argmax_only = true;
    profile.sample = nullptr;
    ForwardOutput out;
    model.forward(profile_step(tokens, block_size, c.vocab_size), &out, profile);
    k.memory = b.memory_info();
  }

  k.reserve_bytes = (int64_t{tokens} + max_running) * c.vocab_size * 4 + (int64_t{256} << 20);
  int64_t budget;
  if (host) {  // the activations' peak is out of k.memory.free_bytes already
    budget = static_cast<int64_t>(static_cast<double>(before.free_bytes) * utilization) -
             (before.free_bytes - k.memory.free_bytes) - k.reserve_bytes;
  } else {  // the profiling cache is given back with the replacement
    const int64_t used = k.memory.total_bytes - k.memory.free_bytes;
    budget = static_cast<int64_t>(static_cast<double>(k.memory.total_bytes) * utilization) - used +
             probe_cache - k.reserve_bytes;
  }
  k.budget_bytes = budget;
  k.base_bytes = host ? before.free_bytes : k.memory.total_bytes;
  int64_t blocks = budget > 0 ? budget / k.block_bytes : 0;
  if (host) {
    const int64_t per_request = (c.max_position + block_size - 1) / block_size;
    const int64_t cap = per_request * max_running;
    if (blocks > cap) {
      blocks = cap;
      k.capped = true;
    }
  }
  blocks = std::min<int64_t>(blocks, int64_t{1} << 24);
  if (blocks < probe_blocks)
    throw_error(ErrorCode::kResourceExhausted,
                "no room for the KV cache: gpu_memory_utilization " + std::to_string(utilization) +
                    " of " + format_bytes(k.base_bytes) + " of " + k.memory.where +
                    (host ? " memory available" : " memory") + " leaves " +
                    format_bytes(std::max<int64_t>(budget, 0)) + " after the weights, the " +
                    std::to_string(tokens) + "-token step's activations and " +
                    format_bytes(k.reserve_bytes) + " held back; one " + std::to_string(tokens) +
                    "-token chunk needs " + format_bytes(probe_blocks * k.block_bytes) +
                    " (raise gpu_memory_utilization, lower max_step_tokens, or set kv_blocks)");
  k.num_blocks = blocks;
  return k;
}

std::string describe_kv_capacity(const KvCacheShape& shape, int64_t cache_bytes,
                                 int64_t max_context, const KvSizing* sized) {
  const int64_t tokens = shape.num_blocks * shape.block_size;
  const int64_t per_request = (max_context + shape.block_size - 1) / shape.block_size;
  char buf[512];
  std::snprintf(buf, sizeof buf,
                "KV cache: %lld blocks x %lld tokens = %lld tokens (%s): %.1f requests of the "
                "full %lld-token context at once",
                static_cast<long long>(shape.num_blocks), static_cast<long long>(shape.block_size),
                static_cast<long long>(tokens), format_bytes(cache_bytes).c_str(),
                per_request > 0 ? static_cast<double>(shape.num_blocks) / per_request : 0.0,
                static_cast<long long>(max_context));
  std::string s = buf;
  if (sized == nullptr) return s + "; kv_blocks as configured";
  const MemoryInfo& m = sized->memory;
  const bool host = m.where == "host";
  std::snprintf(buf, sizeof buf, "; sized as %.2f of the %s of %s memory %s", sized->utilization,
                format_bytes(sized->base_bytes).c_str(), m.where.c_str(),
                host ? "available at start-up" : "in all");
  s += buf;
  if (!host)
    s += ", " + format_bytes(m.total_bytes - m.free_bytes) +
         " in use after the weights and a profiled step";
  s += ", " + format_bytes(sized->reserve_bytes) + " held back";
  if (sized->capped) s += ", capped at max_running requests of the full context";
  return s;
}

}  // namespace arbor
