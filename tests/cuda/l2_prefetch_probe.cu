// Probe (an experiment, not a test): does pulling a decode GEMM's weights into L2 ahead of it
// (cp.async.bulk.prefetch) make the GEMM faster? For each Llama-3-8B decode shape at one token row,
// the chain GEMM's time (us, median of 10): cold (256 MiB overwritten before), warm (right after
// the same GEMM), and prefetched (cold, then a prefetch of the first min(bytes, 40 MiB) of the
// weights by 8 CTAs, then a 30 us spin standing in for the attention, then the timed GEMM).
//   l2_prefetch_probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

#include "kernels/common/device_utils.cuh"
#include "kernels/gemm/chain_gemm.h"

using namespace arbor;

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Each CTA asks for its share of [base, base + bytes) in 16 KiB bulk prefetches (fire and
// forget: nothing waits for the data).
__global__ void prefetch_kernel(const void* base, int64_t bytes) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  constexpr int64_t kPiece = 16 << 10;
  const char* const b = static_cast<const char*>(base);
  const int64_t stride = static_cast<int64_t>(gridDim.x) * blockDim.x * kPiece;
  for (int64_t off = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) * kPiece;
       off < bytes; off += stride) {
    const uint32_t n = static_cast<uint32_t>(bytes - off < kPiece ? bytes - off : kPiece);
    asm volatile("cp.async.bulk.prefetch.L2.global [%0], %1;" ::"l"(b + off), "r"(n) : "memory");
  }
#endif
}

__global__ void spin_kernel(long long ns) {
  const unsigned long long t0 = kernels::global_timer_ns();
  while (kernels::global_timer_ns() - t0 < static_cast<unsigned long long>(ns)) {
  }
}

}  // namespace

int main() {
  const size_t flush_bytes = 256u << 20;
  void* flush = nullptr;
  check(cudaMalloc(&flush, flush_bytes), "flush");
  cudaStream_t st;
  check(cudaStreamCreate(&st), "stream");
  cudaEvent_t e0, e1;
  check(cudaEventCreate(&e0), "event");
  check(cudaEventCreate(&e1), "event");
  struct Shape {
    const char* name;
    int64_t o, k;
  };
  for (const Shape sh : {Shape{"o 4096x4096", 4096, 4096}, Shape{"qkv 6144x4096", 6144, 4096},
                         Shape{"down 4096x14336", 4096, 14336}}) {
    const size_t wbytes = static_cast<size_t>(sh.o * sh.k) * 2;
    void *w = nullptr, *x = nullptr, *y = nullptr;
    check(cudaMalloc(&w, wbytes), "w");
    check(cudaMalloc(&x, sh.k * 2), "x");
    check(cudaMalloc(&y, sh.o * 4), "y");
    check(cudaMemset(w, 0x11, wbytes), "w fill");
    check(cudaMemset(x, 0x22, sh.k * 2), "x fill");
    const kernels::ChainGemmParams p{x, w, static_cast<float*>(y), 1, sh.k, sh.o};
    if (!kernels::chain_gemm_supported(p)) {
      std::printf("%s: chain GEMM unsupported\n", sh.name);
      continue;
    }
    const int64_t pf_bytes = std::min<int64_t>(wbytes, 40ll << 20);
    for (int mode = 0; mode < 4; ++mode) {
      std::vector<double> t;
      for (int it = 0; it < 12; ++it) {
        if (mode != 1) check(cudaMemsetAsync(flush, it, flush_bytes, st), "memset");
        if (mode == 1) check(kernels::launch_chain_gemm(p, st), "warm-up gemm");
        if (mode == 2) prefetch_kernel<<<8, 128, 0, st>>>(w, pf_bytes);
        if (mode == 3) prefetch_kernel<<<32, 128, 0, st>>>(w, pf_bytes);
        if (mode >= 2) spin_kernel<<<1, 32, 0, st>>>(30000);
        check(cudaEventRecord(e0, st), "record");
        check(kernels::launch_chain_gemm(p, st), "gemm");
        check(cudaEventRecord(e1, st), "record");
        check(cudaEventSynchronize(e1), "sync");
        float ms = 0;
        check(cudaEventElapsedTime(&ms, e0, e1), "elapsed");
        if (it >= 2) t.push_back(ms * 1e3);
      }
      std::sort(t.begin(), t.end());
      static const char* names[] = {"cold", "warm", "prefetched (8 CTAs)", "prefetched (32 CTAs)"};
      std::printf("%-16s %-22s %7.1f us  (%.2f TB/s)\n", sh.name, names[mode], t[t.size() / 2],
                  wbytes / (t[t.size() / 2] * 1e-6) / 1e12);
    }
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
  }
  return 0;
}
