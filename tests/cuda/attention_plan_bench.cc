// Host time of the attention planner (kernels/attention/attention_plan.cc) for the step shapes
// of SmolLM2's EAGLE draft and verify steps (9 query heads, 3 KV heads, head_dim 64, the
// batch-invariant plan with 256-key splits, 300 committed keys): 10 decode rows, and one tree of
// 16 or 60 nodes (a binary-heap-shaped mask). Host only: no GPU needed.
//
//   attention_plan_bench [--iters 2000]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "kernels/attention/paged_tree_attention.h"

int main(int argc, char** argv) {
  using arbor::kernels::AttentionPlan;
  using arbor::kernels::AttentionPlanInputs;
  int iters = 2000;
  for (int i = 1; i + 1 < argc; i += 2)
    if (std::string(argv[i]) == "--iters") iters = std::max(1, std::atoi(argv[i + 1]));
  std::printf("| step | work items | us per plan |\n|---|---|---|\n");
  for (int tree : {0, 16, 60}) {
    std::vector<int32_t> qo{0}, committed, mask_indptr{0};
    std::vector<uint32_t> mask;
    if (tree == 0) {
      for (int r = 0; r < 10; ++r) {
        qo.push_back(qo.back() + 1);
        committed.push_back(300);
        mask_indptr.push_back(0);
      }
    } else {
      qo.push_back(tree);
      committed.push_back(300);
      const int words = (tree + 31) / 32;
      for (int i = 0; i < tree; ++i)
        for (int w = 0; w < words; ++w) {
          uint32_t m = 0;
          for (int j = 0; j < 32; ++j)
            for (int a = i; a >= 0; a = a == 0 ? -1 : (a - 1) / 2)  // i and its ancestors
              if (a == w * 32 + j) m |= 1u << j;
          mask.push_back(m);
        }
      mask_indptr.push_back(tree * words);
    }
    AttentionPlanInputs in;
    in.qo_indptr = qo.data();
    in.committed_len = committed.data();
    in.num_requests = static_cast<int32_t>(committed.size());
    in.num_q_heads = 9;
    in.num_kv_heads = 3;
    in.head_dim = 64;
    in.num_sms = 132;
    in.wgmma = true;
    in.batch_invariant = true;
    in.tree_mask = mask.data();
    in.mask_indptr = mask_indptr.data();
    in.num_tokens = qo.back();
    in.invariant_chunk_tiles = 4;
    size_t items = 0;
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < iters; ++i)
      items += arbor::kernels::plan_paged_tree_attention(in).work.size();
    const auto t1 = std::chrono::steady_clock::now();
    std::printf("| %s | %zu | %.2f |\n",
                tree == 0 ? "10 decode rows" : (std::to_string(tree) + "-node tree").c_str(),
                items / iters, std::chrono::duration<double, std::micro>(t1 - t0).count() / iters);
  }
  return 0;
}
