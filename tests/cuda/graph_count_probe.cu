// Experiment: does a step graph replay more slowly once the process holds more instantiated CUDA
// graphs? (Recording the EAGLE draft's feedback forwards, 27 more graph execs on the draft's own
// backend, made the target's later plain steps ~12% slower in the same process; the answer is
// in docs/kernel_notes.md "CUDA graphs for steady-state decode / verify steps".)
//
// A "step" graph of --step-kernels small kernels (programmatic dependent launches, like a
// decode step's) is timed alone, then after K other graphs of --other-kernels kernels each are
// instantiated and launched once on a second stream, for each K of --counts. Two timings per
// K: back-to-back replays (GPU time per replay, events) and replay + stream synchronise (the
// host's latency per step, as LlamaModel::forward waits for its output). Medians of --reps.
//
//   graph_count_probe [--step-kernels 300] [--other-kernels 25] [--counts 0,8,16,24,32,48,64]
//                     [--reps 200] [--pdl 1]
#include <cuda_runtime.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "kernels/common/device_utils.cuh"
#include "tests/cuda/cold_timing.h"

namespace {

#define CHECK(x)                                                                              \
  do {                                                                                        \
    const cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                                  \
      std::fprintf(stderr, "%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      std::exit(1);                                                                           \
    }                                                                                         \
  } while (0)

// A few microseconds of dependent work on 132 blocks, waiting for its predecessor as the repo's
// kernels do.
__global__ void step_kernel(float* buf, int i) {
  arbor::kernels::grid_dependency_wait();
  arbor::kernels::trigger_dependent_launch();
  float* p = buf + blockIdx.x * blockDim.x + threadIdx.x;
  float v = *p;
#pragma unroll 1
  for (int k = 0; k < 16; ++k) v = v * 0.999f + static_cast<float>(i);
  *p = v;
}

void launch(cudaStream_t s, float* buf, int i, bool pdl) {
  cudaLaunchConfig_t c = {};
  c.gridDim = dim3(132);
  c.blockDim = dim3(128);
  c.stream = s;
  cudaLaunchAttribute a[1];
  a[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a[0].val.programmaticStreamSerializationAllowed = pdl ? 1 : 0;
  c.attrs = a;
  c.numAttrs = 1;
  CHECK(cudaLaunchKernelEx(&c, step_kernel, buf, i));
}

cudaGraphExec_t record(cudaStream_t s, float* buf, int kernels, bool pdl) {
  CHECK(cudaStreamBeginCapture(s, cudaStreamCaptureModeRelaxed));
  for (int i = 0; i < kernels; ++i) launch(s, buf, i, pdl);
  cudaGraph_t g = nullptr;
  CHECK(cudaStreamEndCapture(s, &g));
  cudaGraphExec_t e = nullptr;
  CHECK(cudaGraphInstantiate(&e, g, 0));
  CHECK(cudaGraphDestroy(g));
  return e;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  int step_kernels = 300, other_kernels = 25, reps = 200;
  bool pdl = true;
  std::vector<int> counts = {0, 8, 16, 24, 32, 48, 64};
  for (int i = 1; i < argc; i += 2) {
    const std::string k = argv[i];
    if (i + 1 >= argc) {
      std::fprintf(stderr, "'%s' needs a value\n", argv[i]);
      return 2;
    }
    if (k == "--step-kernels")
      step_kernels = std::atoi(argv[i + 1]);
    else if (k == "--other-kernels")
      other_kernels = std::atoi(argv[i + 1]);
    else if (k == "--reps")
      reps = std::atoi(argv[i + 1]);
    else if (k == "--pdl")
      pdl = std::atoi(argv[i + 1]) != 0;
    else if (k == "--counts")
      counts = arbor::testing::parse_int_list(argv[i + 1]);
    else {
      std::fprintf(stderr, "unknown argument '%s'\n", argv[i]);
      return 2;
    }
  }
  std::sort(counts.begin(), counts.end());  // graphs are only ever added
  cudaDeviceProp prop;
  CHECK(cudaGetDeviceProperties(&prop, 0));
  std::printf("device %s; step graph %d kernels, other graphs %d kernels each, pdl %d\n", prop.name,
              step_kernels, other_kernels, pdl ? 1 : 0);
  float *buf = nullptr, *other_buf = nullptr;
  CHECK(cudaMalloc(&buf, 132 * 128 * sizeof(float)));
  CHECK(cudaMalloc(&other_buf, 132 * 128 * sizeof(float)));
  CHECK(cudaMemset(buf, 0, 132 * 128 * sizeof(float)));
  CHECK(cudaMemset(other_buf, 0, 132 * 128 * sizeof(float)));
  cudaStream_t s = nullptr, s2 = nullptr;
  CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
  CHECK(cudaStreamCreateWithFlags(&s2, cudaStreamNonBlocking));
  const cudaGraphExec_t step = record(s, buf, step_kernels, pdl);
  for (int i = 0; i < 20; ++i) CHECK(cudaGraphLaunch(step, s));
  CHECK(cudaStreamSynchronize(s));
  cudaEvent_t e0, e1;
  CHECK(cudaEventCreate(&e0));
  CHECK(cudaEventCreate(&e1));

  std::vector<cudaGraphExec_t> others;
  std::printf(
      "| other graphs | replay us (back to back) | replay + sync us (host) |\n|---|---|---|\n");
  for (int want : counts) {
    while (static_cast<int>(others.size()) < want) {
      others.push_back(record(s2, other_buf, other_kernels, pdl));
      CHECK(cudaGraphLaunch(others.back(), s2));
    }
    CHECK(cudaStreamSynchronize(s2));
    std::vector<double> gpu, host;
    for (int r = 0; r < 5; ++r) {  // GPU time of 40 back-to-back replays, per replay
      CHECK(cudaEventRecord(e0, s));
      for (int i = 0; i < 40; ++i) CHECK(cudaGraphLaunch(step, s));
      CHECK(cudaEventRecord(e1, s));
      CHECK(cudaEventSynchronize(e1));
      float ms = 0.f;
      CHECK(cudaEventElapsedTime(&ms, e0, e1));
      gpu.push_back(ms * 1e3 / 40);
    }
    for (int r = 0; r < reps; ++r) {
      const auto t0 = std::chrono::steady_clock::now();
      CHECK(cudaGraphLaunch(step, s));
      CHECK(cudaStreamSynchronize(s));
      host.push_back(
          std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count());
    }
    std::printf("| %d | %.1f | %.1f |\n", want, median(gpu), median(host));
  }
  for (cudaGraphExec_t g : others) CHECK(cudaGraphExecDestroy(g));
  CHECK(cudaGraphExecDestroy(step));
  return 0;
}
