// Benchmark support: the two physical rates every performance floor in docs/ is a fraction of,
// measured on the GPU the benchmark runs on (DESIGN.md "Performance method"): the
// device-to-device copy bandwidth (read + write bytes of a 1 GiB cudaMemcpyAsync) and the bf16
// GEMM rate (cuBLAS, 8192^3, fp32 accumulation). On the H100 they measure ~3.0 TB/s and
// 865-889 TFLOP/s, on the H200 4.17-4.21 TB/s and 870-885 TFLOP/s (docs/performance.md
// "Machines and floors"); a floor computed from one GPU's constants would flatter every kernel
// on a GPU that copies faster. Medians of warm runs (cold_timing.h). Used by
// attention_bench and model_bench.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstdlib>

#include "tests/cuda/cold_timing.h"

namespace arbor::testing {

namespace rates_detail {
inline void ok(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(1);
  }
}
}  // namespace rates_detail

// Bytes per second, counting the read and the write of a 1 GiB device-to-device copy.
inline double measure_copy_bandwidth(cudaStream_t s) {
  using rates_detail::ok;
  const size_t bytes = size_t{1} << 30;
  void *a = nullptr, *b = nullptr;
  ok(cudaMalloc(&a, bytes), "copy bw");
  ok(cudaMalloc(&b, bytes), "copy bw");
  ok(cudaMemsetAsync(a, 1, bytes, s), "copy bw");
  const double sec =
      1e-6 * median_launch_us(
                 s, nullptr, 0,
                 [&] { ok(cudaMemcpyAsync(b, a, bytes, cudaMemcpyDeviceToDevice, s), "copy bw"); },
                 /*cold=*/false);
  cudaFree(a);
  cudaFree(b);
  return 2.0 * bytes / sec;
}

// FLOP/s of an 8192 x 8192 x 8192 bf16 GEMM with fp32 accumulation (cuBLAS's default algorithm),
// inputs filled with small non-zero values.
inline double measure_bf16_gemm_rate(cudaStream_t s) {
  using rates_detail::ok;
  const int n = 8192;
  const size_t elems = static_cast<size_t>(n) * n;
  void *a = nullptr, *b = nullptr, *c = nullptr;
  ok(cudaMalloc(&a, elems * 2), "gemm rate");
  ok(cudaMalloc(&b, elems * 2), "gemm rate");
  ok(cudaMalloc(&c, elems * 2), "gemm rate");
  ok(cudaMemsetAsync(a, 0x3c, elems * 2, s), "gemm rate");  // bf16 0x3c3c ~ 0.0115
  ok(cudaMemsetAsync(b, 0x3c, elems * 2, s), "gemm rate");
  cublasHandle_t h = nullptr;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS || cublasSetStream(h, s) != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "cuBLAS init failed (gemm rate)\n");
    std::exit(1);
  }
  const float alpha = 1.f, beta = 0.f;
  const double sec =
      1e-6 * median_launch_us(
                 s, nullptr, 0,
                 [&] {
                   if (cublasGemmEx(h, CUBLAS_OP_N, CUBLAS_OP_N, n, n, n, &alpha, a, CUDA_R_16BF, n,
                                    b, CUDA_R_16BF, n, &beta, c, CUDA_R_16BF, n, CUBLAS_COMPUTE_32F,
                                    CUBLAS_GEMM_DEFAULT) != CUBLAS_STATUS_SUCCESS) {
                     std::fprintf(stderr, "cublasGemmEx failed (gemm rate)\n");
                     std::exit(1);
                   }
                 },
                 /*cold=*/false);
  cublasDestroy(h);
  cudaFree(a);
  cudaFree(b);
  cudaFree(c);
  return 2.0 * n * n * static_cast<double>(n) / sec;
}

}  // namespace arbor::testing
