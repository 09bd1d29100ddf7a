// Paged KV cache writes and compaction. The cache is one allocation of 2 * num_layers planes
// (layer l's K is plane 2l, its V plane 2l + 1); a plane is [num_slots, width] where width =
// num_kv_heads * head_dim and slot = block_id * block_size + offset.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "kernels/common/kernel_types.h"

namespace arbor::kernels {

// k_plane[slots[n], :] = k[n, :], v_plane[slots[n], :] = v[n, :] (converted to cache_type).
struct WriteKvParams {
  const void* k = nullptr;         // [num_tokens, width] src_type
  const void* v = nullptr;         // [num_tokens, width] src_type
  void* k_plane = nullptr;         // [num_slots, width] cache_type
  void* v_plane = nullptr;         // [num_slots, width] cache_type
  const int64_t* slots = nullptr;  // [num_tokens] device, validated by the caller
  ElemType src_type = ElemType::kF32;
  ElemType cache_type = ElemType::kBF16;
  int64_t num_tokens = 0;
  int64_t width = 0;
};
cudaError_t launch_write_kv(const WriteKvParams& p, cudaStream_t stream);

// Compaction over every plane: plane[dst_slots[i]] = plane[src_slots[i]], done as if all copies
// were simultaneous (every source row is staged before any destination is written: two
// kernels, gather then scatter, ordered on the stream).
struct CopyKvParams {
  void* cache = nullptr;               // [num_planes, num_slots, width] 2-byte elements
  void* staging = nullptr;             // [num_planes, num_pairs, width] scratch
  const int64_t* src_slots = nullptr;  // [num_pairs] device
  const int64_t* dst_slots = nullptr;  // [num_pairs] device
  int64_t num_planes = 0;
  int64_t num_slots = 0;
  int64_t width = 0;
  int64_t num_pairs = 0;
};
cudaError_t launch_copy_kv(const CopyKvParams& p, cudaStream_t stream);

}  // namespace arbor::kernels
