// Sampling / verification step cost: Backend::sample_trees on the GPU (logits stay on the device,
// ids come back) vs the host path it replaces (download [M, vocab] fp32 logits, then verify() per
// item on the host: sample_trees_on_host). Random peaked logits, random trees, one uniform set.
//
//   sampling_bench [--vocab 128256] [--iters 20]
// Prints a markdown table: items x nodes per item x parameters -> median ms of each path.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <random>
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/verify/device_verify.h"

namespace arbor {
namespace {

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Params {
  const char* name;
  TreeSampleParams p;
};

TreeSampleBatch make_batch(std::mt19937& rng, int items, int nodes, const TreeSampleParams& p,
                           int64_t vocab) {
  TreeSampleBatch b;
  b.node_indptr = {0};
  b.ctx_indptr = {0};
  b.uniform_indptr = {0};
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (int i = 0; i < items; ++i) {
    b.params.push_back(p);
    for (int j = 0; j < nodes; ++j) {
      b.parent.push_back(j == 0 ? -1 : static_cast<int32_t>(rng() % static_cast<unsigned>(j)));
      b.token.push_back(static_cast<int32_t>(rng() % static_cast<unsigned>(vocab)));
      b.logits_row.push_back(i * nodes + j);
      b.q_row.push_back(-1);
      b.uniforms.push_back(u(rng));
    }
    b.node_indptr.push_back(b.num_nodes());
    if (p.repetition_penalty != 1.0f) {
      std::vector<int32_t> ids;
      for (int k = 0; k < 512; ++k) ids.push_back(static_cast<int32_t>(rng() % vocab));
      std::sort(ids.begin(), ids.end());
      ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
      for (int32_t id : ids) {
        b.ctx_token.push_back(id);
        b.ctx_output_count.push_back(static_cast<int32_t>(rng() % 3));
      }
    }
    b.ctx_indptr.push_back(static_cast<int32_t>(b.ctx_token.size()));
    b.uniform_indptr.push_back(static_cast<int32_t>(b.uniforms.size()));
  }
  return b;
}

int run(int argc, char** argv) {
  int64_t vocab = 128256;
  int iters = 10;
  for (int i = 1; i + 1 < argc; i += 2) {
    const std::string k = argv[i];
    if (k == "--vocab")
      vocab = std::atoll(argv[i + 1]);
    else if (k == "--iters")
      iters = std::atoi(argv[i + 1]);
  }
  CudaBackendOptions o;
  CudaBackend backend(o);
  CudaBackend* gpu = &backend;
  std::mt19937 rng(1);
  std::vector<Params> params(4);
  params[0] = {"greedy", {}};
  params[0].p.greedy = 1;
  params[1] = {"temperature 0.7", {}};
  params[1].p.temperature = 0.7f;
  params[2] = {"t 0.7, top-p 0.9", {}};
  params[2].p.temperature = 0.7f;
  params[2].p.top_p = 0.9f;
  params[3] = {"t 0.7, top-k 50, top-p 0.9, rep 1.1", {}};
  params[3].p.temperature = 0.7f;
  params[3].p.top_k = 50;
  params[3].p.top_p = 0.9f;
  params[3].p.repetition_penalty = 1.1f;
  std::printf("vocab %lld, median of %d\n\n", static_cast<long long>(vocab), iters);
  std::printf(
      "| items | nodes each | parameters | sample_trees (GPU) ms | download + host verify ms | "
      "speed-up |\n|---|---|---|---|---|---|\n");
  std::normal_distribution<float> normal(0.f, 2.f);
  for (const auto& [items, nodes] : std::vector<std::pair<int, int>>{
           {1, 1}, {1, 16}, {1, 64}, {8, 1}, {8, 16}, {32, 1}, {32, 8}, {64, 1}}) {
    const int64_t rows = static_cast<int64_t>(items) * nodes;
    std::vector<float> logits(static_cast<size_t>(rows * vocab));
    for (auto& x : logits) x = normal(rng);
    for (const Params& pr : params) {
      const TreeSampleBatch batch = make_batch(rng, items, nodes, pr.p, vocab);
      std::vector<double> dev, host;
      for (int it = 0; it < iters + 2; ++it) {
        gpu->reset_scratch();
        Tensor t = gpu->scratch(rows, vocab);
        gpu->upload(logits.data(), t);  // fresh logits (processed in place)
        gpu->synchronize();
        TreeSampleResult r;
        auto t0 = std::chrono::steady_clock::now();
        gpu->sample_trees(t, batch, &r);
        auto t1 = std::chrono::steady_clock::now();
        std::vector<float> h(static_cast<size_t>(rows * vocab));
        gpu->upload(logits.data(), t);
        gpu->synchronize();
        auto t2 = std::chrono::steady_clock::now();
        gpu->download(t, h.data());
        TreeSampleResult rh;
        sample_trees_on_host(h, vocab, batch, &rh);
        auto t3 = std::chrono::steady_clock::now();
        if (it >= 2) {
          dev.push_back(std::chrono::duration<double, std::milli>(t1 - t0).count());
          host.push_back(std::chrono::duration<double, std::milli>(t3 - t2).count());
        }
      }
      const double d = median(dev), h = median(host);
      std::printf("| %d | %d | %s | %.3f | %.3f | %.1fx |\n", items, nodes, pr.name, d, h, h / d);
      std::fflush(stdout);
    }
  }
  return 0;
}

}  // namespace
}  // namespace arbor

int main(int argc, char** argv) {
  return arbor::run(argc, argv);
}
