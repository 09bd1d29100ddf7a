// Sampling and speculative verification on the device (the CUDA side of Backend::sample_trees,
// engine/backend/tree_sampling.h). Two launches:
//   1. one block per distinct logits row: the item's logit bias, then its penalties (repetition
//      / presence / frequency, context + the node's tree path), then for a greedy item the
//      argmax, for a sampled one temperature, top-k, top-p, min-p and softmax, written in place
//      as fp32 probabilities;
//   2. one block per item: the verifier's walk (greedy matching from the argmax ids, or
//      multi-branch rejection sampling consuming the item's uniforms) writing the accepted
//      path, the tried-children counts, the bonus token and the uniforms used.
// Plain C++ launch function; the host side (cuda_backend.cc) validates the batch first.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace arbor::kernels {

// Same layout as arbor::TreeSampleParams.
struct TreeSampleItemParams {
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
  float repetition_penalty;
  float presence_penalty;
  float frequency_penalty;
  int32_t greedy;
};

struct TreeSampleLaunch {
  float* logits = nullptr;  // [rows, vocab] fp32: processed in place into probabilities
  int64_t vocab = 0;        // < 2^31
  int32_t num_items = 0;
  int32_t num_tasks = 0;                         // distinct logits rows
  const TreeSampleItemParams* params = nullptr;  // [items]
  const int32_t* node_indptr = nullptr;          // [items + 1]
  const int32_t* logits_row = nullptr;           // [nodes]
  const int32_t* parent = nullptr;               // [nodes] item-local, -1 at roots
  const int32_t* token = nullptr;                // [nodes]
  const int32_t* q_row = nullptr;                // [nodes] -1 = deterministic children
  const float* q = nullptr;                      // [q rows, vocab]
  const int32_t* ctx_indptr = nullptr;           // [items + 1]
  const int32_t* ctx_token = nullptr;            // ascending per item
  const int32_t* ctx_output_count = nullptr;
  const int32_t* bias_indptr = nullptr;     // [items + 1] logit bias CSR (nullptr: no bias at all)
  const int32_t* bias_token = nullptr;      // [bias] distinct ids in [0, vocab) per item
  const float* bias_value = nullptr;        // [bias] added to the logit before the penalties
  const int32_t* uniform_indptr = nullptr;  // [items + 1]
  const double* uniforms = nullptr;
  const int32_t* task_node = nullptr;  // [tasks] a global node whose row the task processes
  const int32_t* task_item = nullptr;  // [tasks] that node's item
  int32_t* row_argmax = nullptr;       // [rows] scratch: greedy argmax per row (-1 = invalid)
  int32_t* row_status = nullptr;       // [rows] scratch: 1 = NaN / +inf / no finite value
  float* work = nullptr;               // [items, vocab] scratch: the walk's residual
  // Outputs: item i's path at [node_indptr[i], node_indptr[i] + out_len[i]).
  int32_t* out_path = nullptr;    // [nodes]
  int32_t* out_tried = nullptr;   // [nodes]
  int32_t* out_len = nullptr;     // [items]
  int32_t* out_bonus = nullptr;   // [items]
  int32_t* out_used = nullptr;    // [items]
  int32_t* out_status = nullptr;  // [items]
};

cudaError_t launch_tree_sample(const TreeSampleLaunch& p, cudaStream_t stream);

}  // namespace arbor::kernels
