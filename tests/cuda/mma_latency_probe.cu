// Probe (an experiment, not a test): cycles per dependent m16n8k16 bf16 MMA step (the
// accumulator of one feeding the next, the inner loop of the chain GEMM) with 1, 2, 4 or 8
// independent chains per warp, one warp alone and 4-8 warps on every SM. H100 (1980 MHz,
// 2026-11-24): 24.1 cycles per dependent step; 4 chains per warp 25.2 cycles per round
// (6.3 per chain step, the issue limit), 8 chains 52.5-53.1.
//   mma_latency_probe
#include <cuda_runtime.h>

#include <cstdint>
#include <cstdio>

#include "kernels/common/device_utils.cuh"

namespace {

template <int C>
__global__ void chain_kernel(float* out, long long* cycles, int n, uint32_t seed) {
  const uint32_t a[4] = {seed, seed * 3u, seed * 5u, seed * 7u};
  const uint32_t b0 = seed ^ 0x3f803f80u, b1 = seed + 1;
  float acc[C][4] = {};
  const long long t0 = clock64();
  for (int i = 0; i < n; ++i) {
#pragma unroll
    for (int c = 0; c < C; ++c) arbor::kernels::mma_16816<__nv_bfloat16>(acc[c], a, b0, b1);
  }
  const long long t1 = clock64();
  float s = 0;
  for (int c = 0; c < C; ++c) s += acc[c][0] + acc[c][1] + acc[c][2] + acc[c][3];
  out[blockIdx.x * blockDim.x + threadIdx.x] = s;  // keeps the chains alive
  if (threadIdx.x % 32 == 0) cycles[blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32] = t1 - t0;
}

template <int C>
void run(int blocks, int warps) {
  constexpr int kSteps = 4096;
  float* out = nullptr;
  long long* cycles = nullptr;
  cudaMalloc(&out, sizeof(float) * blocks * warps * 32);
  cudaMalloc(&cycles, sizeof(long long) * blocks * warps);
  chain_kernel<C><<<blocks, warps * 32>>>(out, cycles, kSteps, 12345u);  // warm-up
  chain_kernel<C><<<blocks, warps * 32>>>(out, cycles, kSteps, 12345u);
  long long c0 = 0;
  cudaMemcpy(&c0, cycles, sizeof(c0), cudaMemcpyDeviceToHost);
  std::printf(
      "%d chain(s) per warp, %d CTA(s) x %d warp(s): %.1f cycles per round (%.1f per chain "
      "step)\n",
      C, blocks, warps, double(c0) / kSteps, double(c0) / kSteps / C);
  cudaFree(out);
  cudaFree(cycles);
}

}  // namespace

int main() {
  int sms = 0;
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
  run<1>(1, 1);
  run<2>(1, 1);
  run<4>(1, 1);
  run<8>(1, 1);
  run<1>(sms, 4);
  run<1>(sms, 8);
  run<4>(sms, 4);
  std::printf("cuda: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
