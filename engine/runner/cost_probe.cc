#include "engine/runner/cost_probe.h"

#include <algorithm>
#include <chrono>
#include <string>

#include "engine/core/error.h"
#include "engine/verify/tree_mask.h"

namespace arbor {

void CostProbeOptions::validate() const {
  auto ascending_positive = [](const std::vector<int32_t>& v, const char* name) {
    if (v.empty())
      throw_error(ErrorCode::kInvalidArgument, std::string("cost probe: ") + name + " is empty");
    for (size_t i = 0; i < v.size(); ++i)
      if (v[i] < 1 || (i > 0 && v[i] <= v[i - 1]))
        throw_error(ErrorCode::kInvalidArgument,
                    std::string("cost probe: ") + name + " must be positive and ascending, got " +
                        std::to_string(v[i]) + " at " + std::to_string(i));
  };
  ascending_positive(batches, "batches");
  ascending_positive(tree_sizes, "tree_sizes");
  if (context < 0)
    throw_error(ErrorCode::kInvalidArgument,
                "cost probe: context must be >= 0, got " + std::to_string(context));
  if (warmup < 0 || iters < 1)
    throw_error(ErrorCode::kInvalidArgument, "cost probe: needs warmup >= 0 and iters >= 1");
  if (!(budget_s > 0)) throw_error(ErrorCode::kInvalidArgument, "cost probe: budget_s must be > 0");
}

namespace {

// B requests, each a binary tree of t nodes (node i's parent (i - 1) / 2) after `context`
// committed tokens, request r in blocks [r * per_request, (r + 1) * per_request).
StepInputs probe_step(int32_t batch, int32_t t, int32_t context, int32_t block_size,
                      int32_t per_request, int64_t vocab) {
  StepInputs s;
  s.max_blocks_per_request = per_request;
  s.qo_indptr.push_back(0);
  s.mask_indptr.push_back(0);
  std::vector<int32_t> parents(static_cast<size_t>(t));
  for (int32_t i = 0; i < t; ++i) parents[i] = i == 0 ? -1 : (i - 1) / 2;
  const std::vector<int32_t> depth = tree_depths(parents);
  const std::vector<uint32_t> mask = t > 1 ? pack_ancestor_mask(parents) : std::vector<uint32_t>();
  for (int32_t r = 0; r < batch; ++r) {
    const int64_t base = static_cast<int64_t>(r) * per_request * block_size;
    for (int32_t i = 0; i < t; ++i) {
      s.logits_rows.push_back(s.num_tokens());
      s.token_ids.push_back(static_cast<int32_t>((r * 131 + i * 7 + 1) % vocab));
      s.positions.push_back(context + depth[i]);
      s.slot_mapping.push_back(base + context + i);
    }
    s.qo_indptr.push_back(s.num_tokens());
    s.tree_mask.insert(s.tree_mask.end(), mask.begin(), mask.end());
    s.mask_indptr.push_back(static_cast<int32_t>(s.tree_mask.size()));
    s.committed_len.push_back(context);
    for (int32_t b = 0; b < per_request; ++b) s.block_tables.push_back(r * per_request + b);
  }
  return s;
}

}  // namespace

std::map<int32_t, std::vector<CostCurvePoint>> measure_verify_cost(
    LlamaModel& model, const Proposer* proposer, const CostProbeOptions& o, int32_t max_step_tokens,
    int32_t max_running, int32_t max_tree) {
  o.validate();
  const KvCacheShape& kv = model.backend().kv_shape();
  const auto block_size = static_cast<int32_t>(kv.block_size);
  const int64_t vocab = model.config().vocab_size;
  ForwardRequest want;
  want.argmax_only = true;
  if (proposer != nullptr) {
    want.final_hidden = proposer->needs_hidden();
    want.capture_layers = proposer->capture_layers();
  }
  const bool graphs = model.step_graphs();
  using Clock = std::chrono::steady_clock;
  const auto start = Clock::now();
  std::map<int32_t, std::vector<CostCurvePoint>> curves;
  ForwardOutput out;
  bool out_of_time = false;
  for (int32_t b : o.batches) {
    if (b > max_running || out_of_time) break;
    std::vector<CostCurvePoint> points;
    for (int32_t t : o.tree_sizes) {
      if (t > max_tree || int64_t{b} * t > max_step_tokens) break;
      const int32_t per_request = (o.context + t + block_size - 1) / block_size;
      if (int64_t{b} * per_request > kv.num_blocks) break;
      if (std::chrono::duration<double>(Clock::now() - start).count() > o.budget_s) {
        out_of_time = true;
        break;
      }
      const StepInputs step = probe_step(b, t, o.context, block_size, per_request, vocab);
      std::vector<double> ms;
      for (int32_t it = 0; it < o.warmup + o.iters; ++it) {
        const auto t0 = Clock::now();
        model.forward(step, &out, want);  // argmax_only: waits for the ids
        const double d = std::chrono::duration<double, std::milli>(Clock::now() - t0).count();
        if (it >= o.warmup) ms.push_back(d);
      }
      std::nth_element(ms.begin(), ms.begin() + ms.size() / 2, ms.end());
      points.push_back({b * t, ms[ms.size() / 2]});
    }
    if (!points.empty()) curves[b] = std::move(points);
  }
  if (graphs) {  // the probe's recordings: dropped, so serving starts from an empty cache
    model.set_step_graphs(false);
    model.set_step_graphs(true);
  }
  return curves;
}

}  // namespace arbor
