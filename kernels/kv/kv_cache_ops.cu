// KV write (fp32 activations -> 16-bit cache rows at slots) and compaction (gather to staging,
// then scatter), with 16-byte moves when rows allow it.
#include "kernels/common/device_utils.cuh"
#include "kernels/common/pdl_launch.cuh"
#include "kernels/kv/kv_cache_ops.h"

namespace arbor::kernels {

namespace {

constexpr int kThreads = 256;

unsigned blocks_for(int64_t n) {
  const int64_t b = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(b < 65535 * 16 ? b : 65535 * 16);
}

__global__ void write_kv_kernel(const WriteKvParams p) {
  pdl_wait_then_trigger();  // programmatic dependent launch (pdl_launch.cuh)
  const int64_t n = p.num_tokens * p.width;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t t = i / p.width, c = i % p.width;
    const int64_t dst = p.slots[t] * p.width + c;
    store_elem(p.k_plane, p.cache_type, dst, load_elem(p.k, p.src_type, i));
    store_elem(p.v_plane, p.cache_type, dst, load_elem(p.v, p.src_type, i));
  }
}

// Moves `Vec`-sized units; width_units = width * 2 bytes / sizeof(Vec).
template <typename Vec, bool kGather>
__global__ void copy_kv_kernel(const CopyKvParams p, int64_t width_units) {
  Vec* cache = static_cast<Vec*>(p.cache);
  Vec* staging = static_cast<Vec*>(p.staging);
  const int64_t n = p.num_planes * p.num_pairs * width_units;
  for (int64_t i = static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t c = i % width_units;
    const int64_t pair = (i / width_units) % p.num_pairs;
    const int64_t plane = i / (width_units * p.num_pairs);
    const int64_t slot = kGather ? p.src_slots[pair] : p.dst_slots[pair];
    Vec* row = cache + (plane * p.num_slots + slot) * width_units + c;
    if (kGather)
      staging[i] = *row;
    else
      *row = staging[i];
  }
}

template <typename Vec>
cudaError_t copy_kv_typed(const CopyKvParams& p, cudaStream_t stream) {
  const int64_t units = p.width * 2 / static_cast<int64_t>(sizeof(Vec));
  const unsigned blocks = blocks_for(p.num_planes * p.num_pairs * units);
  copy_kv_kernel<Vec, true><<<blocks, kThreads, 0, stream>>>(p, units);
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) return e;
  copy_kv_kernel<Vec, false><<<blocks, kThreads, 0, stream>>>(p, units);
  return cudaGetLastError();
}

}  // namespace

cudaError_t launch_write_kv(const WriteKvParams& p, cudaStream_t stream) {
  if (p.num_tokens * p.width == 0) return cudaSuccess;
  return launch_pdl(write_kv_kernel, dim3(blocks_for(p.num_tokens * p.width)), dim3(kThreads), 0,
                    stream, p);
}

cudaError_t launch_copy_kv(const CopyKvParams& p, cudaStream_t stream) {
  if (p.num_pairs == 0 || p.num_planes == 0) return cudaSuccess;
  if (p.width % 8 == 0) return copy_kv_typed<uint4>(p, stream);
  if (p.width % 2 == 0) return copy_kv_typed<uint32_t>(p, stream);
  return copy_kv_typed<uint16_t>(p, stream);
}

}  // namespace arbor::kernels
