// Backend::sample_trees on the GPU against the host reference (sample_trees_on_host: verify()
// with the engine's logits processors, itself tested against exact distributions and Hugging
// Face's processors on the CPU): random logits rows, random trees with deterministic and
// sampled (q) children, every sampling parameter, logit biases, shared rows, NaN rows and
// malformed batches; then the engine on the GPU with and without backend sampling.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <functional>
#include <map>
#include <numeric>
#include <random>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/core/error.h"
#include "engine/draft/medusa_device_heads.h"
#include "engine/draft/medusa_heads.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/runner/engine.h"
#include "engine/runner/generator.h"
#include "engine/spec/proposer_factory.h"
#include "engine/verify/device_verify.h"
#include "tests/common/synthetic_medusa.h"
#include "tests/cuda/cuda_test_util.h"

namespace arbor {
namespace {

struct Case {
  int64_t vocab = 0;
  int64_t rows = 0;
  std::vector<float> logits;  // [rows, vocab]
  TreeSampleBatch batch;
};

TreeSampleParams params_variant(int v) {
  TreeSampleParams p;
  switch (v % 9) {
    case 0:
      p.greedy = 1;
      break;
    case 1:
      p.greedy = 1;
      p.repetition_penalty = 1.3f;
      p.presence_penalty = 0.5f;
      p.frequency_penalty = 0.25f;
      break;
    case 2:
      p.temperature = 0.8f;
      break;
    case 3:
      p.top_k = 5;
      break;
    case 4:
      p.temperature = 0.7f;
      p.top_p = 0.8f;
      break;
    case 5:
      p.temperature = 1.3f;
      p.min_p = 0.1f;
      break;
    case 6:
      p.temperature = 0.9f;
      p.top_k = 50;
      p.top_p = 0.9f;
      p.min_p = 0.02f;
      p.repetition_penalty = 1.2f;
      p.presence_penalty = 0.3f;
      p.frequency_penalty = 0.2f;
      break;
    case 7:
      p.top_k = 1;
      break;
    default:
      p.temperature = 1.1f;
      p.top_p = 0.5f;
      p.repetition_penalty = 0.8f;  // < 1 raises seen tokens
      break;
  }
  return p;
}

bool has_penalty(const TreeSampleParams& p) {
  return p.repetition_penalty != 1.0f || p.presence_penalty != 0.0f || p.frequency_penalty != 0.0f;
}

// Peaked random rows (a few boosted tokens) so that draft tokens are often accepted; children
// are mostly boosted tokens of their parent's row. Every third sampled item has sampled (q)
// children at some nodes. Items 0 and 1 share one row (n > 1 choices' first token). Every fourth
// item from item 2 (every parameter variant among them) has a logit bias: its root row's
// favourite banned, its runner-up and a random token pushed up, another random token down, so
// the bias moves both the argmax and the sampled distribution.
Case make_case(std::mt19937& rng, int64_t vocab, int items, int max_nodes) {
  Case c;
  c.vocab = vocab;
  TreeSampleBatch& b = c.batch;
  b.node_indptr = {0};
  b.ctx_indptr = {0};
  b.bias_indptr = {0};
  b.uniform_indptr = {0};
  std::normal_distribution<float> normal(0.f, 2.f);
  std::uniform_int_distribution<int32_t> any_token(0, static_cast<int32_t>(vocab) - 1);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  std::vector<std::vector<int32_t>> boosted;  // per row
  auto new_row = [&]() {
    const size_t base = c.logits.size();
    c.logits.resize(base + static_cast<size_t>(vocab));
    for (int64_t i = 0; i < vocab; ++i) c.logits[base + i] = normal(rng);
    std::vector<int32_t> top;
    for (int k = 0; k < 4; ++k) {
      const int32_t t = any_token(rng);
      c.logits[base + t] += 14.0f - 2.0f * k;
      top.push_back(t);
    }
    boosted.push_back(top);
    return static_cast<int32_t>(c.rows++);
  };
  for (int i = 0; i < items; ++i) {
    const TreeSampleParams p = params_variant(i == 1 ? 2 : i);
    b.params.push_back(p);
    const bool shared = i == 1;  // shares item 0's single row, same parameters
    if (i == 0) b.params.back() = params_variant(2);
    const int t = i <= 1 ? 1 : 1 + static_cast<int>(rng() % static_cast<unsigned>(max_nodes));
    const bool sampled_children = !p.greedy && i % 3 == 0;
    const int32_t first = b.num_nodes();
    std::vector<int32_t> rows;
    for (int j = 0; j < t; ++j) {
      const int32_t parent = j == 0 ? -1 : static_cast<int32_t>(rng() % static_cast<unsigned>(j));
      int32_t token;
      if (j == 0) {
        token = any_token(rng);
      } else if (!b.q_row.empty() && b.q_row[static_cast<size_t>(first + parent)] >= 0) {
        // Drawn from the parent's q row.
        const int32_t qr = b.q_row[static_cast<size_t>(first + parent)];
        const float* q = b.q.data() + static_cast<int64_t>(qr) * vocab;
        double u = uniform(rng), cum = 0.0;
        token = static_cast<int32_t>(vocab - 1);
        for (int64_t x = 0; x < vocab; ++x) {
          cum += q[x];
          if (u < cum && q[x] > 0.f) {
            token = static_cast<int32_t>(x);
            break;
          }
        }
        while (q[token] <= 0.f) --token;
      } else {
        const auto& top = boosted[static_cast<size_t>(rows[static_cast<size_t>(parent)])];
        token = rng() % 10 < 8 ? top[rng() % top.size()] : any_token(rng);
      }
      const int32_t row = shared ? b.logits_row[0] : new_row();
      rows.push_back(row);
      b.parent.push_back(parent);
      b.token.push_back(token);
      b.logits_row.push_back(row);
      int32_t qr = -1;
      if (sampled_children && rng() % 2 == 0) {
        // q: a softened copy of the node's own row (so drafts resemble the target).
        qr = static_cast<int32_t>(b.q.size() / static_cast<size_t>(vocab));
        std::vector<double> e(static_cast<size_t>(vocab));
        double s = 0.0;
        for (int64_t x = 0; x < vocab; ++x) {
          e[x] = std::exp(0.7 * c.logits[static_cast<size_t>(row * vocab + x)]);
          s += e[x];
        }
        for (int64_t x = 0; x < vocab; ++x) b.q.push_back(static_cast<float>(e[x] / s));
      }
      if (b.q_row.size() < b.token.size() - 1) b.q_row.resize(b.token.size() - 1, -1);
      b.q_row.push_back(qr);
    }
    b.node_indptr.push_back(b.num_nodes());
    if (has_penalty(p) || shared) {
      const TreeSampleParams& own = b.params.back();
      if (has_penalty(own)) {
        std::set<int32_t> ids;
        for (int k = 0; k < 40; ++k) ids.insert(any_token(rng));
        for (const auto& top : boosted) ids.insert(top[0]);  // penalise likely tokens too
        for (int32_t id : ids) {
          b.ctx_token.push_back(id);
          b.ctx_output_count.push_back(static_cast<int32_t>(rng() % 4));
        }
      }
    }
    b.ctx_indptr.push_back(static_cast<int32_t>(b.ctx_token.size()));
    if (i % 4 == 2) {
      const std::vector<int32_t>& top = boosted[static_cast<size_t>(rows[0])];
      std::map<int32_t, float> bias = {{top[0], -100.0f}, {top[1], 3.0f}};
      bias.emplace(any_token(rng), 2.5f);
      bias.emplace(any_token(rng), -1.5f);
      for (const auto& [token, value] : bias) {
        b.bias_token.push_back(token);
        b.bias_value.push_back(value);
      }
    }
    b.bias_indptr.push_back(static_cast<int32_t>(b.bias_token.size()));
    if (!b.params.back().greedy)
      for (int j = 0; j < t; ++j) b.uniforms.push_back(uniform(rng));
    b.uniform_indptr.push_back(static_cast<int32_t>(b.uniforms.size()));
  }
  b.q_row.resize(b.token.size(), -1);
  return c;
}

std::string describe(const TreeSampleResult& r, size_t i) {
  std::string s = "path";
  for (int32_t k = r.path_indptr[i]; k < r.path_indptr[i + 1]; ++k)
    s += " " + std::to_string(r.path_nodes[k]) + "(" + std::to_string(r.children_tried[k]) + ")";
  return s + " bonus " + std::to_string(r.bonus[i]) + " used " +
         std::to_string(r.uniforms_used[i]) + " status " + std::to_string(r.status[i]);
}

// Runs the case on the GPU and on the host; returns the number of items that differ.
int compare(Backend& gpu, const Case& c, int* accepted_total, bool print) {
  TreeSampleResult want, got;
  sample_trees_on_host(c.logits, c.vocab, c.batch, &want);
  gpu.reset_scratch();
  Tensor t = gpu.scratch(c.rows, c.vocab);
  gpu.upload(c.logits.data(), t);
  gpu.sample_trees(t, c.batch, &got);
  int differ = 0;
  for (int32_t i = 0; i < c.batch.num_items(); ++i) {
    const std::string a = describe(got, static_cast<size_t>(i)),
                      b = describe(want, static_cast<size_t>(i));
    *accepted_total += want.path_indptr[i + 1] - want.path_indptr[i] - 1;
    if (a != b) {
      ++differ;
      if (print)
        std::printf("  vocab %lld item %d (params %d): gpu %s | host %s\n",
                    static_cast<long long>(c.vocab), i, i % 9, a.c_str(), b.c_str());
    }
  }
  return differ;
}

TEST(CudaSampleTrees, MatchesHostReference) {
  ARBOR_REQUIRE_GPU();
  auto gpu = make_cuda_backend();
  std::mt19937 rng(77);
  int items = 0, differ = 0, accepted = 0;
  for (int64_t vocab : {64, 1000, 32000, 151936}) {
    const int rounds = vocab > 100000 ? 2 : 6;
    for (int round = 0; round < rounds; ++round) {
      const Case c = make_case(rng, vocab, 36, vocab > 100000 ? 12 : 40);
      differ += compare(*gpu, c, &accepted, true);
      items += c.batch.num_items();
    }
  }
  std::printf("  sample_trees: %d items, %d accepted draft tokens, %d differ from the host\n",
              items, accepted, differ);
  EXPECT_GT(accepted, items / 2) << "the cases should accept draft tokens";
  // fp32 probabilities on the GPU vs double on the host: a draw decides differently only when
  // a uniform lands within ~1e-6 of a boundary.
  EXPECT_LE(differ, items / 200);
}

TEST(CudaSampleTrees, BadRowsOnlyMatterWhereTheWalkGoes) {
  ARBOR_REQUIRE_GPU();
  auto gpu = make_cuda_backend();
  std::mt19937 rng(5);
  Case c = make_case(rng, 1000, 18, 8);
  // NaN in item 4's root row (always visited); +inf in the last node row of every other item
  // with more than one node (visited only if the walk gets there); one all -inf row.
  for (int32_t i = 2; i < c.batch.num_items(); ++i) {
    const int32_t first = c.batch.node_indptr[i], last = c.batch.node_indptr[i + 1] - 1;
    float* root = c.logits.data() + static_cast<int64_t>(c.batch.logits_row[first]) * c.vocab;
    if (i == 4) root[3] = NAN;
    if (i == 6) std::fill(root, root + c.vocab, -INFINITY);
    if (i % 2 == 1 && last > first)
      c.logits[static_cast<int64_t>(c.batch.logits_row[last]) * c.vocab + 7] = INFINITY;
  }
  int accepted = 0;
  EXPECT_EQ(compare(*gpu, c, &accepted, true), 0);
  TreeSampleResult r;
  sample_trees_on_host(c.logits, c.vocab, c.batch, &r);
  EXPECT_EQ(r.status[4], 1);
  EXPECT_EQ(r.status[6], 1);
}

TEST(CudaSampleTrees, MalformedBatchesAreRejectedBeforeLaunch) {
  ARBOR_REQUIRE_GPU();
  auto gpu = make_cuda_backend();
  std::mt19937 rng(9);
  const Case good = make_case(rng, 64, 9, 6);
  Tensor t = gpu->scratch(good.rows, good.vocab);
  gpu->upload(good.logits.data(), t);
  auto expect_error = [&](const std::string& what, auto mutate) {
    Case c = good;
    mutate(c.batch);
    TreeSampleResult r;
    try {
      gpu->sample_trees(t, c.batch, &r);
      ADD_FAILURE() << what << ": accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.code(), ErrorCode::kInvalidArgument) << what;
      std::printf("  %-28s -> %s\n", what.c_str(), e.what());
    }
  };
  expect_error("row out of range", [&](TreeSampleBatch& b) { b.logits_row[2] = 1 << 20; });
  expect_error("token out of range", [&](TreeSampleBatch& b) { b.token[3] = 64; });
  expect_error("parent after child", [&](TreeSampleBatch& b) {
    for (size_t g = 0; g < b.parent.size(); ++g)
      if (b.parent[g] > 0) {
        b.parent[g] = static_cast<int32_t>(g) + 5;
        return;
      }
    b.parent[b.parent.size() - 1] = 1000;
  });
  expect_error("too few uniforms", [&](TreeSampleBatch& b) {
    b.uniforms.pop_back();
    b.uniform_indptr.back()--;
  });
  expect_error("tree of 1025 nodes", [&](TreeSampleBatch& b) {
    const int32_t last = b.num_items() - 1;
    for (int j = 0; j < 1100; ++j) {
      b.parent.push_back(0);
      b.token.push_back(1);
      b.logits_row.push_back(0);
      b.q_row.push_back(-1);
    }
    b.node_indptr[static_cast<size_t>(last) + 1] = b.num_nodes();
    b.params[static_cast<size_t>(last)].greedy = 1;
  });
  expect_error("top_p 0", [&](TreeSampleBatch& b) { b.params[2].top_p = 0.0f; });
  expect_error("uniform 1.0", [&](TreeSampleBatch& b) {
    if (!b.uniforms.empty()) b.uniforms[0] = 1.0;
  });
  expect_error("bias token out of range", [&](TreeSampleBatch& b) {
    ASSERT_FALSE(b.bias_token.empty());
    b.bias_token.back() = 64;
  });
  expect_error("bias 150", [&](TreeSampleBatch& b) { b.bias_value[0] = 150.0f; });
  expect_error("unsorted penalty context", [&](TreeSampleBatch& b) {
    b.ctx_token = {5, 3};
    b.ctx_output_count = {0, 1};
    for (size_t i = 1; i < b.ctx_indptr.size(); ++i) b.ctx_indptr[i] = 2;
  });
  // The backend still works afterwards.
  int accepted = 0;
  EXPECT_EQ(compare(*gpu, good, &accepted, true), 0);
}

// Backend::top_k_log_softmax (the EAGLE draft's tree expansion, the Medusa heads) against the
// CPU backend: random rows with repeated values (ties broken by the lower id) at several widths
// and k; rows where most entries are -inf (masked), so that picks include -inf entries; constant
// rows; rows of zeros of both signs (equal values, so the lower ids win).
TEST(CudaSampleTrees, TopKLogSoftmaxMatchesCpu) {
  ARBOR_REQUIRE_GPU();
  auto gpu = make_cuda_backend();
  auto cpu = make_cpu_backend(1);
  std::mt19937 rng(3);
  int checked = 0;
  enum class Kind { kRandom, kMasked, kConstant, kSignedZeros };
  const char* kind_names[] = {"random", "masked", "constant", "signed zeros"};
  // k 1..16: 8 blocks per row, at 8, 16 and 32 entries per thread (up to 32768, 65536 and
  // 131072 columns; 7 leaves some blocks no entry; 20000 puts several entries in each thread).
  // Masked, constant and signed-zero rows leave more than 64 candidates per block, so the blocks
  // take their exact k best instead. k 64, and 131073+ columns: one block per row. Every shape
  // runs twice, and the row count changes between shapes (one backend, so one workspace): each
  // launch must leave the workspace ready for the next, whatever its rows.
  int64_t shape = 0;
  for (int64_t cols :
       {7, 1000, 20000, 32768, 32769, 49151, 49152, 65536, 65537, 128256, 131072, 131073, 151936}) {
    for (int32_t k : {1, 3, 6, 10, 16, 64}) {
      if (k > cols) continue;
      for (Kind kind : {Kind::kRandom, Kind::kMasked, Kind::kConstant, Kind::kSignedZeros}) {
        const bool special_width =
            cols == 1000 || cols == 20000 || cols == 49152 || cols == 131072 || cols == 131073;
        if (kind != Kind::kRandom && (!special_width || (k != 1 && k != 10 && k != 16))) continue;
        const int64_t rows = std::array<int64_t, 4>{5, 1, 12, 3}[shape++ % 4];
        std::vector<float> x(static_cast<size_t>(rows * cols));
        std::normal_distribution<float> normal(0.f, 3.f);
        for (auto& v : x) {
          switch (kind) {
            case Kind::kRandom:
            case Kind::kMasked:
              v = std::round(normal(rng) * 8.f) / 8.f;  // many exact ties
              break;
            case Kind::kConstant:
              v = 0.75f;
              break;
            case Kind::kSignedZeros:
              v = rng() % 2 ? -0.0f : 0.0f;
              break;
          }
        }
        if (kind == Kind::kMasked) {  // about three finite entries per row, at least one
          for (int64_t i = 0; i < rows * cols; ++i)
            if (rng() % static_cast<unsigned>(cols) >= 3) x[static_cast<size_t>(i)] = -INFINITY;
          for (int64_t r = 0; r < rows; ++r)
            x[static_cast<size_t>(r * cols + static_cast<int64_t>(rng() % cols))] = 1.5f;
        }
        const char* what = kind_names[static_cast<int>(kind)];
        gpu->reset_scratch();
        cpu->reset_scratch();
        Tensor tg = gpu->scratch(rows, cols), tc = cpu->scratch(rows, cols);
        gpu->upload(x.data(), tg);
        cpu->upload(x.data(), tc);
        std::vector<int32_t> ig, ic, again;
        std::vector<float> vg, vc, vagain;
        gpu->top_k_log_softmax(tg, k, &ig, &vg);
        gpu->top_k_log_softmax(tg, k, &again, &vagain);
        cpu->top_k_log_softmax(tc, k, &ic, &vc);
        EXPECT_EQ(ig, ic) << cols << " " << k << " " << what;
        EXPECT_EQ(again, ig) << cols << " " << k << " " << what;
        EXPECT_EQ(vagain, vg) << cols << " " << k << " " << what;
        ASSERT_EQ(vg.size(), vc.size());
        for (size_t i = 0; i < vg.size(); ++i) {
          if (std::isinf(vc[i]))
            EXPECT_EQ(vg[i], vc[i]) << cols << " " << k << " " << what;
          else
            EXPECT_NEAR(vg[i], vc[i], 1e-5) << cols << " " << k << " " << what;
        }
        ++checked;
      }
    }
  }
  Tensor t = gpu->scratch(2, 8);
  std::vector<int32_t> ids;
  std::vector<float> values;
  EXPECT_THROW(gpu->top_k_log_softmax(t, 9, &ids, &values), Error);
  EXPECT_THROW(gpu->top_k_log_softmax(t, 0, &ids, &values), Error);
  std::printf("  top_k_log_softmax: %d shapes equal to the CPU backend\n", checked);
}

// Medusa heads on the GPU (bf16 weights) against the host reference (fp32): heads of one
// ResBlock sharing the base LM head run their ResBlocks as one stacked GEMM, whichever heads are
// asked. Every id the GPU picks must be within the host's top-k up to bf16 rounding: its
// host logit at least the host's k-th best minus a tolerance (a wrong row or head layout picks
// ids far below it).
TEST(CudaMedusaHeads, OneBlockHeadsTopKMatchTheHost) {
  ARBOR_REQUIRE_GPU();
  constexpr int64_t kHidden = 128, kVocab = 2000, kHeads = 4;
  testing::NormalTensors random(9);
  const MedusaHeads heads = testing::one_block_medusa_heads(random, kHidden, kVocab, kHeads, 0.1f);
  MedusaDeviceHeads device(make_cuda_backend(), heads);
  int checked = 0;
  testing::check_device_top_k(
      device, heads, random, {1, 5, 12}, {{10, 5, 3, 2}, {8, 4, 2}, {3, 0, 2, 1}},
      [&](int64_t rows, int64_t r, size_t d, const std::vector<int32_t>& k,
          const std::vector<int32_t>& ids, const std::vector<float>& logits) {
        std::vector<float> sorted = logits;
        std::sort(sorted.begin(), sorted.end(), std::greater<float>());
        const float kth = sorted[static_cast<size_t>(k[d] - 1)];
        for (int32_t j = 0; j < k[d]; ++j) {
          const int32_t id = ids[static_cast<size_t>(j)];
          ASSERT_GE(id, 0);
          ASSERT_LT(id, kVocab);
          EXPECT_GE(logits[static_cast<size_t>(id)], kth - 0.1f)
              << "rows " << rows << ", row " << r << ", head " << d << ", rank " << j << ", "
              << k.size() << " heads run";
          ++checked;
        }
      });
  std::printf("  Medusa heads on the GPU: %d candidates within the host's top-k\n", checked);
}

// The engine on the GPU: sampled requests (every parameter) with and without speculation give
// the same tokens for the same seeds whether the step samples on the device (no logits
// downloaded) or downloads the logits and runs verify() on the host.
void expect_backend_sampling_equals_host(const std::string& model_path, const std::string& eagle) {
  const ModelWeights w = load_model_weights(model_path);
  std::vector<GenerationRequest> reqs;
  std::mt19937 rng(11);
  for (int i = 0; i < 12; ++i) {
    GenerationRequest r;
    r.prompt = {1};
    for (int k = 0; k < 8 + i; ++k) r.prompt.push_back(static_cast<int32_t>(3 + rng() % 500));
    const TreeSampleParams p = params_variant(i);
    r.sampling.temperature = p.greedy ? 0.0f : p.temperature;
    r.sampling.top_k = p.top_k;
    r.sampling.top_p = p.top_p;
    r.sampling.min_p = p.min_p;
    r.sampling.repetition_penalty = p.repetition_penalty;
    r.sampling.presence_penalty = p.presence_penalty;
    r.sampling.frequency_penalty = p.frequency_penalty;
    if (i % 4 == 2) r.sampling.logit_bias = {{10, 2.0f}, {20, -100.0f}, {300, 1.5f}};
    r.sampling.seed = 1000 + i;
    r.max_tokens = 64;
    r.ignore_eos = true;
    if (i % 3 == 0) r.logprobs = 2;  // logprobs from the backend too (no logits download)
    reqs.push_back(r);
  }
  std::vector<std::pair<std::string, std::string>> methods = {{"none", ""}, {"ngram", ""}};
  if (std::filesystem::exists(eagle)) methods.push_back({"eagle", eagle});
  struct Run {
    std::vector<std::vector<int32_t>> tokens;
    std::vector<std::vector<TokenLogprob>> logprobs;
    int64_t logits_downloads = 0;
  };
  for (const auto& [method, heads] : methods) {
    std::vector<Run> out;
    for (bool on : {true, false}) {
      auto backend = make_cuda_backend();
      LlamaModel model(*backend, w);
      std::unique_ptr<Proposer> proposer;
      if (method != "none") {
        SpecConfig sc;
        sc.method = parse_spec_method(method);
        sc.head_path = heads;
        proposer = make_proposer(sc, w);
      }
      EngineConfig ec;
      ec.num_blocks = 256;
      ec.backend_sampling = on;
      Engine engine(model, ec, proposer.get());
      for (size_t i = 0; i < reqs.size(); ++i) engine.add(static_cast<ReqId>(i + 1), reqs[i]);
      Run run;
      run.tokens.resize(reqs.size());
      run.logprobs.resize(reqs.size());
      for (int guard = 0; !engine.idle() && guard < 100000; ++guard)
        for (EngineEvent& ev : engine.step()) {
          const size_t i = static_cast<size_t>(ev.id - 1);
          run.tokens[i].insert(run.tokens[i].end(), ev.tokens.begin(), ev.tokens.end());
          run.logprobs[i].insert(run.logprobs[i].end(), ev.logprobs.begin(), ev.logprobs.end());
        }
      EXPECT_TRUE(engine.idle());
      run.logits_downloads = engine.stats().logits_downloads;
      out.push_back(std::move(run));
    }
    int equal = 0;
    double worst_logprob = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      EXPECT_EQ(out[0].tokens[i].size(), 64u);
      equal += out[0].tokens[i] == out[1].tokens[i];
      EXPECT_EQ(out[0].tokens[i], out[1].tokens[i]) << method << " request " << i;
      ASSERT_EQ(out[0].logprobs[i].size(), reqs[i].logprobs >= 0 ? 64u : 0u);
      ASSERT_EQ(out[0].logprobs[i].size(), out[1].logprobs[i].size());
      for (size_t j = 0; j < out[0].logprobs[i].size(); ++j) {
        const TokenLogprob &a = out[0].logprobs[i][j], &b = out[1].logprobs[i][j];
        if (a.token != b.token) break;  // diverged (reported above)
        worst_logprob = std::max(worst_logprob, double(std::fabs(a.logprob - b.logprob)));
        ASSERT_EQ(a.top.size(), b.top.size());
        for (size_t t = 0; t < a.top.size(); ++t)
          worst_logprob =
              std::max(worst_logprob, double(std::fabs(a.top[t].second - b.top[t].second)));
      }
    }
    EXPECT_LT(worst_logprob, 1e-4) << method;
    EXPECT_EQ(out[0].logits_downloads, 0) << "backend sampling downloads no logits";
    EXPECT_GT(out[1].logits_downloads, 0);
    std::printf(
        "  %-6s backend sampling == host sampling: %d/%zu requests, logprobs within %.2g, "
        "logits downloads %lld vs %lld\n",
        method.c_str(), equal, reqs.size(), worst_logprob,
        static_cast<long long>(out[0].logits_downloads),
        static_cast<long long>(out[1].logits_downloads));
  }
}

TEST(CudaSampleTrees, EngineBackendSamplingEqualsHostSampling) {
  ARBOR_REQUIRE_GPU();
  if (!std::filesystem::exists(testing::stories260k_path()))
    GTEST_SKIP() << "stories260K not found at " << testing::stories260k_path();
  expect_backend_sampling_equals_host(testing::stories260k_path(),
                                      testing::test_data_dir() + "/spec/random/eagle_stories260K");
}

// A 49152-token vocabulary: the kept copy of the logits rows is larger than the rest of a
// decode step's scratch, so a copy placed outside the recorded step would overlap it on replay.
TEST(CudaSampleTrees, EngineBackendSamplingEqualsHostSamplingSmolLM2) {
  ARBOR_REQUIRE_GPU();
  if (!std::filesystem::exists(testing::smollm2_path()))
    GTEST_SKIP() << "SmolLM2 GGUF not found at " << testing::smollm2_path()
                 << " (stage it and set ARBOR_SMOLLM2_GGUF)";
  expect_backend_sampling_equals_host(testing::smollm2_path(),
                                      testing::test_data_dir() + "/heads/smollm2/eagle");
}

}  // namespace
}  // namespace arbor
