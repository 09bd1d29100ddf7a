// Benchmark support: the time of one launch with the L2 cold, as a decode step finds its weights
// (a memset of a buffer larger than the L2 before each run). Used by model_bench --linear and
// the GEMM probes.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <vector>

namespace arbor::testing {

// Median of 10 timed runs of `launch` on `stream` after 2 untimed ones, us; with `cold`,
// flush_bytes of `flush` are overwritten before each run. Exits on a CUDA error.
template <typename Launch>
double median_launch_us(cudaStream_t stream, void* flush, size_t flush_bytes, Launch&& launch,
                        bool cold = true) {
  auto ok = [](cudaError_t e) {
    if (e != cudaSuccess) {
      std::fprintf(stderr, "CUDA error in timing: %s\n", cudaGetErrorString(e));
      std::exit(1);
    }
  };
  cudaEvent_t e0, e1;
  ok(cudaEventCreate(&e0));
  ok(cudaEventCreate(&e1));
  std::vector<double> t;
  for (int it = 0; it < 12; ++it) {
    if (cold) ok(cudaMemsetAsync(flush, it, flush_bytes, stream));
    ok(cudaEventRecord(e0, stream));
    launch();
    ok(cudaEventRecord(e1, stream));
    ok(cudaEventSynchronize(e1));
    float ms = 0;
    ok(cudaEventElapsedTime(&ms, e0, e1));
    if (it >= 2) t.push_back(ms * 1e3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace arbor::testing
