// Microbenchmark of launch_top_k_log_softmax (the EAGLE draft's and the Medusa heads' top-k of
// each logits row, with its log-softmax value): median kernel time over rows x vocabulary x k,
// the logits in L2 as the LM head's GEMM leaves them (one untimed launch first), events around
// each launch. Also checks every launch's ids against the first launch's (the kernel is
// deterministic).
//
//   top_k_bench [--rows 1,4,10,16,40,64] [--cols 49152,128256] [--k 4,10,16] [--iters 50]
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "kernels/sampling/top_k_rows.h"
#include "tests/cuda/cold_timing.h"

namespace {

using arbor::testing::check_cuda;

}  // namespace

int main(int argc, char** argv) {
  std::vector<int> rows_list = {1, 4, 10, 16, 40, 64}, cols_list = {49152, 128256},
                   k_list = {4, 10, 16};
  int iters = 50;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string a = argv[i];
    if (a == "--rows")
      rows_list = arbor::testing::parse_int_list(argv[i + 1]);
    else if (a == "--cols")
      cols_list = arbor::testing::parse_int_list(argv[i + 1]);
    else if (a == "--k")
      k_list = arbor::testing::parse_int_list(argv[i + 1]);
    else if (a == "--iters")
      iters = std::max(1, std::atoi(argv[i + 1]));
    else {
      std::fprintf(stderr, "unknown option %s\n", a.c_str());
      return 2;
    }
  }
  cudaDeviceProp prop{};
  check_cuda(cudaGetDeviceProperties(&prop, 0), "props");
  std::printf(
      "device: %s, %d SMs\n\n| rows | cols | k | median us | min us |\n|---|---|---|---|---|\n",
      prop.name, prop.multiProcessorCount);
  cudaStream_t stream;
  check_cuda(cudaStreamCreate(&stream), "stream");
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.f, 4.f);
  int failures = 0;
  for (int cols : cols_list)
    for (int rows : rows_list)
      for (int k : k_list) {
        std::vector<float> x(static_cast<size_t>(rows) * cols);
        for (float& v : x) v = normal(rng);
        float* dx = nullptr;
        int32_t* ids = nullptr;
        float* values = nullptr;
        check_cuda(cudaMalloc(&dx, x.size() * 4), "malloc x");
        check_cuda(cudaMalloc(&ids, static_cast<size_t>(rows) * k * 4), "malloc ids");
        check_cuda(cudaMalloc(&values, static_cast<size_t>(rows) * k * 4), "malloc values");
        check_cuda(cudaMemcpy(dx, x.data(), x.size() * 4, cudaMemcpyHostToDevice), "upload");
        void* work = nullptr;
        const size_t work_bytes = arbor::kernels::top_k_workspace_bytes(rows);
        check_cuda(cudaMalloc(&work, work_bytes), "malloc workspace");
        check_cuda(cudaMemset(work, 0, work_bytes), "zero workspace");
        arbor::kernels::TopKRowsParams p;
        p.workspace = work;
        p.x = dx;
        p.ids = ids;
        p.values = values;
        p.rows = rows;
        p.cols = cols;
        p.k = k;
        check_cuda(arbor::kernels::launch_top_k_log_softmax(p, stream), "launch");
        std::vector<int32_t> first(static_cast<size_t>(rows) * k), again(first.size());
        check_cuda(cudaMemcpy(first.data(), ids, first.size() * 4, cudaMemcpyDeviceToHost), "ids");
        const std::vector<double> t = arbor::testing::sorted_launch_us(
            stream, iters, 0,
            [&] { check_cuda(arbor::kernels::launch_top_k_log_softmax(p, stream), "launch"); },
            [](int) {});
        check_cuda(cudaMemcpy(again.data(), ids, again.size() * 4, cudaMemcpyDeviceToHost), "ids");
        // The first row's best id must be its argmax (lowest index among equal maxima).
        const int argmax =
            static_cast<int>(std::max_element(x.begin(), x.begin() + cols) - x.begin());
        if (again != first || first[0] != argmax) ++failures;
        std::printf("| %d | %d | %d | %.1f | %.1f |\n", rows, cols, k, t[t.size() / 2], t[0]);
        cudaFree(dx);
        cudaFree(ids);
        cudaFree(values);
        cudaFree(work);
      }
  std::printf("\n%s\n", failures == 0 ? "ids: stable across launches, row 0's best is its argmax"
                                      : "ids: MISMATCH");
  return failures == 0 ? 0 : 1;
}
