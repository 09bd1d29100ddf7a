// Probe (an experiment, not a test): the chain GEMM (kernels/gemm/chain_gemm.h) against the
// backend's invariant cuBLASLt linear at decode sizes, on the Llama-3-8B shapes and two ragged
// ones: bitwise equality of every output, and cold-L2 time (256 MiB memset before each launch,
// median of 10) of cuBLASLt and of each tiling of the chain kernel.
//   chain_gemm_probe [--quick]
//   chain_gemm_probe --one[-chunked] O K N   # 3 launches of the chain (chunked) GEMM, for ncu
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_backend.h"
#include "kernels/gemm/chain_gemm.h"
#include "kernels/gemm/chunked_gemm.h"
#include "tests/cuda/cold_timing.h"

using namespace arbor;

namespace {

uint16_t bf16_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}

}  // namespace

int main(int argc, char** argv) {
  const bool quick = argc > 1 && std::string(argv[1]) == "--quick";
  if (argc == 5 && (std::string(argv[1]) == "--one" || std::string(argv[1]) == "--one-chunked")) {
    const bool chunked = std::string(argv[1]) == "--one-chunked";
    const int O = std::atoi(argv[2]), K = std::atoi(argv[3]), N = std::atoi(argv[4]);
    void *x, *w, *y;
    testing::check_cuda(cudaMalloc(&x, size_t(N) * K * 2), "x");
    testing::check_cuda(cudaMalloc(&w, size_t(O) * K * 2), "w");
    testing::check_cuda(cudaMalloc(&y, size_t(N) * O * 4), "y");
    testing::check_cuda(cudaMemset(x, 0, size_t(N) * K * 2), "x");
    testing::check_cuda(cudaMemset(w, 0, size_t(O) * K * 2), "w");
    for (int i = 0; i < 3; ++i)
      testing::check_cuda(
          chunked ? kernels::launch_chunked_gemm({x, w, static_cast<float*>(y), N, K, O}, nullptr)
                  : kernels::launch_chain_gemm({x, w, static_cast<float*>(y), N, K, O}, nullptr),
          "launch");
    testing::check_cuda(cudaDeviceSynchronize(), "sync");
    return 0;
  }
  struct Shape {
    const char* name;
    int O, K;
  };
  const std::vector<Shape> shapes = {{"q|k|v", 6144, 4096},     {"o", 4096, 4096},
                                     {"gate|up", 28672, 4096},  {"down", 4096, 14336},
                                     {"lm_head", 128256, 4096}, {"ragged", 1000, 4640},
                                     {"smollm2", 1536, 576}};
  // warps (8 weight rows each), ring stages, k per stage
  const int configs[][3] = {{4, 4, 128}, {4, 3, 128}, {4, 6, 128}, {2, 4, 128}, {4, 8, 64},
                            {4, 4, 256}, {4, 8, 128}, {4, 6, 256}, {4, 3, 256}};
  CudaBackendOptions o;
  o.batch_invariant = true;
  CudaBackend b(o);
  auto stream = static_cast<cudaStream_t>(b.stream_handle());
  void* flush = nullptr;
  const size_t flush_bytes = size_t{256} << 20;
  testing::check_cuda(cudaMalloc(&flush, flush_bytes), "flush");
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  int mismatches = 0;
  for (const Shape& sh : shapes) {
    constexpr int kMaxN = 16;
    std::vector<uint16_t> xb(size_t(kMaxN) * sh.K), wb(size_t(sh.O) * sh.K);
    for (auto& v : xb) v = bf16_bits(nd(rng));
    for (auto& v : wb) v = bf16_bits(nd(rng) * 0.02f);
    uint16_t *dx, *dw;
    float *dref, *dout;
    testing::check_cuda(cudaMalloc(&dx, xb.size() * 2), "x");
    testing::check_cuda(cudaMalloc(&dw, wb.size() * 2), "w");
    testing::check_cuda(cudaMalloc(&dref, size_t(kMaxN) * sh.O * 4), "ref");
    testing::check_cuda(cudaMalloc(&dout, size_t(kMaxN) * sh.O * 4), "out");
    testing::check_cuda(cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice), "x");
    testing::check_cuda(cudaMemcpy(dw, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice), "w");
    // A cudaMemcpy from pageable memory may return before its DMA lands, and the backend's
    // non-blocking stream does not wait for it.
    testing::check_cuda(cudaDeviceSynchronize(), "copies");
    const Tensor w{dw, DType::kBF16, sh.O, sh.K};
    auto time_us = [&](const std::function<void()>& f, bool cold = true) {
      return testing::median_launch_us(stream, flush, flush_bytes, f, cold);
    };
    for (int n : {1, 2, 3, 8, 9, 16}) {
      const Tensor x{dx, DType::kBF16, n, sh.K}, y{dref, DType::kF32, n, sh.O};
      b.linear(x, w, Tensor{}, y);
      std::vector<float> ref(size_t(n) * sh.O), got(ref.size());
      testing::check_cuda(
          cudaMemcpyAsync(ref.data(), dref, ref.size() * 4, cudaMemcpyDeviceToHost, stream), "ref");
      testing::check_cuda(cudaStreamSynchronize(stream), "sync");
      const bool timed = !quick && (n == 1 || n == 8 || n == 16);
      std::string line = std::string(sh.name) + " " + std::to_string(sh.O) + "x" +
                         std::to_string(sh.K) + " n " + std::to_string(n);
      if (timed) {
        char buf[64];
        auto lt = [&] { b.linear(x, w, Tensor{}, y); };
        std::snprintf(buf, sizeof buf, " | cublasLt %.1f (warm %.1f)", time_us(lt),
                      time_us(lt, false));
        line += buf;
        const kernels::ChunkedGemmParams cp{dx, dw, dout, n, sh.K, sh.O};
        if (kernels::chunked_gemm_supported(cp)) {
          std::snprintf(buf, sizeof buf, " | chunked %.1f", time_us([&] {
                          testing::check_cuda(kernels::launch_chunked_gemm(cp, stream), "chunked");
                        }));
          line += buf;
        }
      }
      const kernels::ChainGemmParams p{dx, dw, dout, n, sh.K, sh.O};
      for (const auto& c : configs) {
        auto launch = [&] {
          testing::check_cuda(
              kernels::detail::launch_chain_gemm_config(p, c[0], c[1], c[2], stream), "chain");
        };
        testing::check_cuda(cudaMemsetAsync(dout, 0xff, got.size() * 4, stream), "poison");
        launch();
        testing::check_cuda(
            cudaMemcpyAsync(got.data(), dout, got.size() * 4, cudaMemcpyDeviceToHost, stream),
            "got");
        testing::check_cuda(cudaStreamSynchronize(stream), "sync");
        size_t diff = 0;
        for (size_t i = 0; i < got.size(); ++i) diff += std::memcmp(&got[i], &ref[i], 4) != 0;
        mismatches += diff != 0;
        char buf[96];
        std::snprintf(buf, sizeof buf, " | %d/%d/%d: %zu diff", c[0], c[1], c[2], diff);
        line += buf;
        if (timed) {
          std::snprintf(buf, sizeof buf, " %.1f us (warm %.1f)", time_us(launch),
                        time_us(launch, false));
          line += buf;
        }
      }
      std::printf("%s\n", line.c_str());
      std::fflush(stdout);
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dref);
    cudaFree(dout);
  }
  std::printf("configs with differing outputs: %d\n", mismatches);
  return mismatches != 0;
}
