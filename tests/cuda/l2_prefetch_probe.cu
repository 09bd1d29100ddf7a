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

#include "kernels/common/device_utils.cuh"
#include "kernels/gemm/chain_gemm.h"
#include "tests/cuda/cold_timing.h"

using namespace arbor;

namespace {

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
  using testing::check_cuda;
  const size_t flush_bytes = 256u << 20;
  void* flush = nullptr;
  check_cuda(cudaMalloc(&flush, flush_bytes), "flush");
  cudaStream_t st;
  check_cuda(cudaStreamCreate(&st), "stream");
  struct Shape {
    const char* name;
    int64_t o, k;
  };
  for (const Shape sh : {Shape{"o 4096x4096", 4096, 4096}, Shape{"qkv 6144x4096", 6144, 4096},
                         Shape{"down 4096x14336", 4096, 14336}}) {
    const size_t wbytes = static_cast<size_t>(sh.o * sh.k) * 2;
    void *w = nullptr, *x = nullptr, *y = nullptr;
    check_cuda(cudaMalloc(&w, wbytes), "w");
    check_cuda(cudaMalloc(&x, sh.k * 2), "x");
    check_cuda(cudaMalloc(&y, sh.o * 4), "y");
    check_cuda(cudaMemset(w, 0x11, wbytes), "w fill");
    check_cuda(cudaMemset(x, 0x22, sh.k * 2), "x fill");
    const kernels::ChainGemmParams p{x, w, static_cast<float*>(y), 1, sh.k, sh.o};
    if (!kernels::chain_gemm_supported(p)) {
      std::printf("%s: chain GEMM unsupported\n", sh.name);
      cudaFree(w);
      cudaFree(x);
      cudaFree(y);
      continue;
    }
    const int64_t pf_bytes = std::min<int64_t>(wbytes, 40ll << 20);
    auto gemm = [&] { check_cuda(kernels::launch_chain_gemm(p, st), "gemm"); };
    auto prefetched = [&](int ctas) {
      return [&, ctas] {
        prefetch_kernel<<<ctas, 128, 0, st>>>(w, pf_bytes);
        spin_kernel<<<1, 32, 0, st>>>(30000);
      };
    };
    const double us[4] = {
        testing::median_launch_us(st, flush, flush_bytes, gemm),
        testing::median_launch_us(st, flush, flush_bytes, gemm, false),  // after the last run
        testing::median_launch_us(st, flush, flush_bytes, gemm, true, prefetched(8)),
        testing::median_launch_us(st, flush, flush_bytes, gemm, true, prefetched(32))};
    static const char* names[] = {"cold", "warm", "prefetched (8 CTAs)", "prefetched (32 CTAs)"};
    for (int mode = 0; mode < 4; ++mode)
      std::printf("%-16s %-22s %7.1f us  (%.2f TB/s)\n", sh.name, names[mode], us[mode],
                  wbytes / (us[mode] * 1e-6) / 1e12);
    cudaFree(w);
    cudaFree(x);
    cudaFree(y);
  }
  return 0;
}
