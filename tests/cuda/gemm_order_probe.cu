// Probe (an experiment, not a test): does the invariant cuBLASLt GEMM sum each element in the
// same order as an m16n8k16 chain over K (ascending 16-k steps from a zero accumulator)?
// Compares, bitwise, the backend's invariant cuBLASLt linear (batch_invariant_gemm = 0), the own
// kernel (= 1) and hand-written chains that differ in how the k of each step map onto the MMA's
// slots: standard, permuted within each 16-k step, and regrouped (a step takes k from two 16-k
// groups, as the first chunked kernel did). Result on the H100 (cuBLAS 13, 2026-11-24,
// docs/kernels.md): cuBLASLt == own kernel == both chains that keep each step's 16 k together,
// bitwise, at all four Llama-3-8B shapes; the regrouped chain differs in ~90% of the elements.
// The chunked GEMM's kernels rely on the first two facts.
//   gemm_order_probe
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdio>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "kernels/common/device_utils.cuh"

namespace arbor {
// gemm_order_probe_backend.cc (the backend's headers need C++20).
std::vector<float> probe_backend_linear(int gemm, const std::vector<float>& x,
                                        const std::vector<float>& w, int M, int K, int O,
                                        std::string* algo);
}  // namespace arbor

using arbor::kernels::mma_16816;

namespace {

// mode 0: standard slots (4-byte loads: k 2t,2t+1 | 2t+8,2t+9)
// mode 1: the 16 k of a step in permuted slots (8-byte loads: lane t holds k 4t..4t+3)
// mode 2: the chunked kernel's grouping (16-byte loads over 32 k: step A gets k 8t..8t+3)
template <int kMode>
__global__ void chain_kernel(const uint16_t* x, const uint16_t* w, float* out, int M, int K,
                             int O) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, g = lane / 4, t = lane % 4;
  const int r0 = (blockIdx.x * 4 + warp) * 16, n0 = blockIdx.y * 8;
  if (r0 >= O) return;
  const uint16_t* wl = w + (size_t)(r0 + g) * K;
  const uint16_t* wh = w + (size_t)(r0 + g + 8) * K;
  const int tok = n0 + g;
  const uint16_t* xr = x + (size_t)(tok < M ? tok : 0) * K;
  float acc[4] = {0.f, 0.f, 0.f, 0.f};
  auto ld4 = [](const uint16_t* p) { return *reinterpret_cast<const uint32_t*>(p); };
  for (int k0 = 0; k0 < K; k0 += 32) {
    for (int h = 0; h < 2; ++h) {
      uint32_t a[4], b0, b1;
      if (kMode == 0) {
        const int k = k0 + 16 * h;
        a[0] = ld4(wl + k + 2 * t);
        a[1] = ld4(wh + k + 2 * t);
        a[2] = ld4(wl + k + 2 * t + 8);
        a[3] = ld4(wh + k + 2 * t + 8);
        b0 = ld4(xr + k + 2 * t);
        b1 = ld4(xr + k + 2 * t + 8);
      } else {  // mode 1: k 4t.. of this step; mode 2: k 8t + 4h.. of the 32-k block
        const int k = kMode == 1 ? k0 + 16 * h + 4 * t : k0 + 8 * t + 4 * h;
        a[0] = ld4(wl + k);
        a[1] = ld4(wh + k);
        a[2] = ld4(wl + k + 2);
        a[3] = ld4(wh + k + 2);
        b0 = ld4(xr + k);
        b1 = ld4(xr + k + 2);
      }
      if (tok >= M) b0 = b1 = 0;
      mma_16816<__nv_bfloat16>(acc, a, b0, b1);
    }
  }
  const int tk = n0 + 2 * t;
  if (tk < M) {
    out[(size_t)tk * O + r0 + g] = acc[0];
    out[(size_t)tk * O + r0 + g + 8] = acc[2];
  }
  if (tk + 1 < M) {
    out[(size_t)(tk + 1) * O + r0 + g] = acc[1];
    out[(size_t)(tk + 1) * O + r0 + g + 8] = acc[3];
  }
}

uint16_t bf16_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return static_cast<uint16_t>((b + 0x7fff + ((b >> 16) & 1)) >> 16);
}
float bits_f(uint16_t h) {
  uint32_t b = uint32_t{h} << 16;
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}

}  // namespace

int main() {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.f, 1.f);
  struct Shape {
    int O, K;
  };
  for (Shape sh : {Shape{4096, 4096}, Shape{1024, 4096}, Shape{28672, 4096}, Shape{4096, 14336}}) {
    const int M = 64;
    std::vector<uint16_t> xb(size_t(M) * sh.K), wb(size_t(sh.O) * sh.K);
    std::vector<float> xh(xb.size()), wh(wb.size());
    for (size_t i = 0; i < xb.size(); ++i) {
      xb[i] = bf16_bits(nd(rng));
      xh[i] = bits_f(xb[i]);
    }
    for (size_t i = 0; i < wb.size(); ++i) {
      wb[i] = bf16_bits(nd(rng) * 0.02f);
      wh[i] = bits_f(wb[i]);
    }
    std::vector<std::vector<float>> res;
    for (int gemm : {0, 1}) {
      std::string algo;
      res.push_back(arbor::probe_backend_linear(gemm, xh, wh, M, sh.K, sh.O, &algo));
      if (gemm == 0) std::printf("O %d K %d cublasLt algo: %s\n", sh.O, sh.K, algo.c_str());
    }
    uint16_t *dx, *dw;
    float* dout;
    cudaMalloc(&dx, xb.size() * 2);
    cudaMalloc(&dw, wb.size() * 2);
    cudaMalloc(&dout, size_t(M) * sh.O * 4);
    cudaMemcpy(dx, xb.data(), xb.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, wb.data(), wb.size() * 2, cudaMemcpyHostToDevice);
    const dim3 grid((sh.O + 63) / 64, (M + 7) / 8);
    for (int mode = 0; mode < 3; ++mode) {
      cudaMemset(dout, 0xff, size_t(M) * sh.O * 4);
      if (mode == 0) chain_kernel<0><<<grid, 128>>>(dx, dw, dout, M, sh.K, sh.O);
      if (mode == 1) chain_kernel<1><<<grid, 128>>>(dx, dw, dout, M, sh.K, sh.O);
      if (mode == 2) chain_kernel<2><<<grid, 128>>>(dx, dw, dout, M, sh.K, sh.O);
      std::vector<float> y(size_t(M) * sh.O);
      cudaMemcpy(y.data(), dout, y.size() * 4, cudaMemcpyDeviceToHost);
      res.push_back(y);
    }
    const char* names[] = {"cublasLt", "own(gemm1)", "chain std", "chain perm16", "chain perm32"};
    for (int a = 0; a < 5; ++a)
      for (int c = a + 1; c < 5; ++c) {
        size_t diff = 0;
        double maxrel = 0;
        for (size_t i = 0; i < res[a].size(); ++i) {
          if (std::memcmp(&res[a][i], &res[c][i], 4) != 0) {
            ++diff;
            maxrel = std::max(
                maxrel, (double)std::fabs(res[a][i] - res[c][i]) / (std::fabs(res[a][i]) + 1e-6));
          }
        }
        std::printf("  %-12s vs %-12s: %zu of %zu differ (max rel %.2e)\n", names[a], names[c],
                    diff, res[a].size(), maxrel);
      }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dout);
  }
  std::printf("cuda: %s\n", cudaGetErrorString(cudaGetLastError()));
  return 0;
}
