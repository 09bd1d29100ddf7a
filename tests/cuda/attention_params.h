// Kernel-level launches of paged tree attention in tests and benchmarks: the step metadata and
// the plan's arrays of a PagedTreeAttentionParams, each uploaded through the caller's `upload`
// (host vector -> device pointer, owned by the caller).
#pragma once

#include <cmath>
#include <cstdint>
#include <vector>

#include "kernels/attention/paged_tree_attention.h"

namespace arbor::testing {

// Shapes of a layer (sm_scale = 1 / sqrt(head_dim)).
struct AttentionShape {
  int32_t num_q_heads, num_kv_heads, head_dim, block_size;
};

// The step: requests qo_indptr.size() - 1, tokens qo_indptr.back(), block tables of
// max_blocks_per_request entries per request.
template <typename Upload>
void set_step_params(kernels::PagedTreeAttentionParams& p, const AttentionShape& shape,
                     const std::vector<int32_t>& qo_indptr,
                     const std::vector<int32_t>& committed_len,
                     const std::vector<int32_t>& block_tables, int32_t max_blocks_per_request,
                     const std::vector<uint32_t>& tree_mask,
                     const std::vector<int32_t>& mask_indptr, Upload&& upload) {
  p.num_q_heads = shape.num_q_heads;
  p.num_kv_heads = shape.num_kv_heads;
  p.head_dim = shape.head_dim;
  p.block_size = shape.block_size;
  p.sm_scale = 1.f / std::sqrt(static_cast<float>(shape.head_dim));
  p.num_requests = static_cast<int32_t>(qo_indptr.size()) - 1;
  p.num_tokens = qo_indptr.back();
  p.max_blocks_per_request = max_blocks_per_request;
  p.qo_indptr = static_cast<const int32_t*>(upload(qo_indptr));
  p.committed_len = static_cast<const int32_t*>(upload(committed_len));
  p.block_tables = static_cast<const int32_t*>(upload(block_tables));
  p.tree_mask = static_cast<const uint32_t*>(upload(tree_mask));
  p.mask_indptr = static_cast<const int32_t*>(upload(mask_indptr));
}

// The planner's inputs for that step (host arrays, which must outlive the call to the planner);
// splits, SM count and kernel choices stay the caller's.
inline kernels::AttentionPlanInputs step_plan_inputs(const AttentionShape& shape,
                                                     const std::vector<int32_t>& qo_indptr,
                                                     const std::vector<int32_t>& committed_len) {
  kernels::AttentionPlanInputs in;
  in.qo_indptr = qo_indptr.data();
  in.committed_len = committed_len.data();
  in.num_requests = static_cast<int32_t>(qo_indptr.size()) - 1;
  in.num_q_heads = shape.num_q_heads;
  in.num_kv_heads = shape.num_kv_heads;
  in.head_dim = shape.head_dim;
  return in;
}

template <typename Upload>
void set_plan_params(kernels::PagedTreeAttentionParams& p, const kernels::AttentionPlan& plan,
                     Upload&& upload) {
  p.tensor_core = plan.tensor_core;
  p.wgmma = plan.wgmma;
  p.wide = plan.wide;
  p.work = static_cast<const kernels::AttentionWorkItem*>(upload(plan.work));
  p.num_work = static_cast<int32_t>(plan.work.size());
  p.request_splits = static_cast<const int32_t*>(upload(plan.request_splits));
  p.request_kv_chunk = static_cast<const int32_t*>(upload(plan.request_kv_chunk));
  p.request_partial_row = static_cast<const int32_t*>(upload(plan.request_partial_row));
  p.needs_merge = plan.needs_merge;
  p.max_splits = plan.max_splits_used;
}

}  // namespace arbor::testing
