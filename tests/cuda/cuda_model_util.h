// Test support for the GPU model tests: random Llama-3-style models with host weights, greedy
// requests whose prompts repeat a motif (n-gram speculation finds it), token comparison.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <initializer_list>
#include <random>
#include <string>
#include <vector>

#include "engine/model/model_weights.h"
#include "engine/runner/generator.h"

namespace arbor::testing {

inline HostTensor random_tensor(std::mt19937& rng, std::vector<int64_t> shape, float scale,
                                float offset = 0.f) {
  HostTensor t(std::move(shape));
  std::uniform_real_distribution<float> d(-scale, scale);
  for (auto& x : t.data) x = offset + d(rng);
  return t;
}

// A random Llama-3-style model (GQA, llama3 RoPE scaling) with the given head_dim.
inline ModelWeights random_model(int64_t head_dim, int64_t heads, int64_t kv_heads, uint32_t seed) {
  std::mt19937 rng(seed);
  ModelWeights w;
  ModelConfig& c = w.config;
  c.vocab_size = 512;
  c.num_heads = heads;
  c.num_kv_heads = kv_heads;
  c.head_dim = head_dim;
  c.hidden_size = heads * head_dim;
  c.intermediate_size = c.hidden_size * 3 / 2;
  c.num_layers = 2;
  c.rope_theta = 500000.0;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.original_max_position = 64;  // so the scaling bands matter at short lengths
  c.max_position = 4096;
  const int64_t h = c.hidden_size, f = c.intermediate_size;
  const float sh = std::sqrt(3.f / static_cast<float>(h)),
              sf = std::sqrt(3.f / static_cast<float>(f));
  w.embed = random_tensor(rng, {c.vocab_size, h}, 1.f);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm = random_tensor(rng, {h}, 0.2f, 1.f);
    lw.wq = random_tensor(rng, {heads * head_dim, h}, sh * 2);
    lw.wk = random_tensor(rng, {kv_heads * head_dim, h}, sh * 2);
    lw.wv = random_tensor(rng, {kv_heads * head_dim, h}, sh);
    lw.wo = random_tensor(rng, {h, heads * head_dim}, sh);
    lw.ffn_norm = random_tensor(rng, {h}, 0.2f, 1.f);
    lw.w_gate = random_tensor(rng, {f, h}, sh);
    lw.w_up = random_tensor(rng, {f, h}, sh);
    lw.w_down = random_tensor(rng, {h, f}, sf);
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = random_tensor(rng, {h}, 0.2f, 1.f);
  w.lm_head = random_tensor(rng, {c.vocab_size, h}, sh * 4);
  return w;
}

// Greedy requests whose prompts (BOS, then a random motif of motif_len ids repeated up to each
// length) give n-gram speculation something to find; the motifs come from an LCG seeded `seed`.
inline std::vector<GenerationRequest> motif_prompts(uint32_t seed,
                                                    std::initializer_list<int> lengths,
                                                    int motif_len, int64_t vocab,
                                                    int32_t max_tokens) {
  std::vector<GenerationRequest> reqs;
  uint32_t x = seed;
  for (int len : lengths) {
    GenerationRequest r;
    r.prompt.push_back(1);
    std::vector<int32_t> motif;
    for (int k = 0; k < motif_len; ++k) {
      x = x * 1664525u + 1013904223u;
      motif.push_back(static_cast<int32_t>(3 + (x >> 8) % (vocab - 3)));
    }
    while (static_cast<int>(r.prompt.size()) < len)
      r.prompt.push_back(motif[r.prompt.size() % static_cast<size_t>(motif_len)]);
    r.sampling.temperature = 0;
    r.max_tokens = max_tokens;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  return reqs;
}

// Expects every request's tokens equal; returns how many were.
inline int expect_equal_tokens(const std::vector<GenerationResult>& got,
                               const std::vector<GenerationResult>& want,
                               const std::string& label) {
  int equal = 0;
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << label << " request " << i;
    equal += got[i].tokens == want[i].tokens;
  }
  return equal;
}

}  // namespace arbor::testing
