// Benchmark support: the time of one launch with the L2 cold, as a decode step finds its weights
// (a memset of a buffer larger than the L2 before each run), used by model_bench --linear and
// the GEMM probes; the benchmarks' comma-separated integer options.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <vector>

namespace arbor::testing {

// "1,8,32" -> {1, 8, 32}.
inline std::vector<int> parse_int_list(const std::string& s) {
  std::vector<int> v;
  std::stringstream ss(s);
  for (std::string item; std::getline(ss, item, ',');) v.push_back(std::atoi(item.c_str()));
  return v;
}

// Exits with `what` and the CUDA error unless e is cudaSuccess (benchmarks and probes).
inline void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}

// Times `runs` launches of `launch` on `stream` (events around each) after `untimed` ones and
// returns the timed ones in us, sorted. `before` (untimed) runs ahead of every launch. Exits on a
// CUDA error.
template <typename Launch, typename Before>
std::vector<double> sorted_launch_us(cudaStream_t stream, int runs, int untimed, Launch&& launch,
                                     Before&& before) {
  cudaEvent_t e0, e1;
  check_cuda(cudaEventCreate(&e0), "timing event");
  check_cuda(cudaEventCreate(&e1), "timing event");
  std::vector<double> t;
  for (int it = 0; it < untimed + runs; ++it) {
    before(it);
    check_cuda(cudaEventRecord(e0, stream), "timing event");
    launch();
    check_cuda(cudaEventRecord(e1, stream), "timing event");
    check_cuda(cudaEventSynchronize(e1), "timing");
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, e0, e1), "timing");
    if (it >= untimed) t.push_back(ms * 1e3);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(t.begin(), t.end());
  return t;
}

// Median of 10 timed runs of `launch` on `stream` after 2 untimed ones, us; with `cold`,
// flush_bytes of `flush` are overwritten before each run. `prepare` (untimed) runs between the
// flush and the timed launch. Exits on a CUDA error.
template <typename Launch, typename Prepare = void (*)()>
double median_launch_us(
    cudaStream_t stream, void* flush, size_t flush_bytes, Launch&& launch, bool cold = true,
    Prepare&& prepare = [] {}) {
  const std::vector<double> t = sorted_launch_us(stream, 10, 2, launch, [&](int it) {
    if (cold) check_cuda(cudaMemsetAsync(flush, it, flush_bytes, stream), "L2 flush");
    prepare();
  });
  return t[t.size() / 2];
}

}  // namespace arbor::testing
