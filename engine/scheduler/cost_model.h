// The verify-step cost model the tree-budget policy plans with: the wall time of one forward
// step as a function of the batch (requests in the step) and the total tokens it scores (prefill
// chunk tokens + every tree's nodes). Seeded from a measured curve (configs/verify_cost_*.json,
// written by the GPU model benchmark) or a linear prior, and corrected online from the steps the
// engine actually runs, so it also fits a machine nobody measured.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace arbor {

struct CostCurvePoint {
  int32_t tokens = 0;
  double ms = 0;
};

struct CostModelConfig {
  // Measured curves by batch size: step milliseconds at total tree tokens (ascending). Empty:
  // the linear prior fixed_ms + per_token_ms * tokens.
  std::map<int32_t, std::vector<CostCurvePoint>> curves;
  double fixed_ms = 1.0;
  double per_token_ms = 1.0;
  bool online = true;     // blend in measured step times
  double ema = 0.2;       // weight of a new observation
  int32_t min_obs = 3;    // observations before a bucket overrides the prior
  void validate() const;  // throws kInvalidArgument naming the field
};

// Parses {"gpu": ..., "batch": {"1": [[tokens, ms], ...], ...}} or
// {"fixed_ms": a, "per_token_ms": b}; throws naming the file and the bad field.
CostModelConfig load_cost_model(const std::string& path);
// "batch 1: 1->1.005 2->1.017 ...; batch 8: ..." (total tokens -> ms), for logs.
std::string format_cost_curves(const std::map<int32_t, std::vector<CostCurvePoint>>& curves);

class CostModel {
 public:
  explicit CostModel(CostModelConfig config = {});
  // Predicted step milliseconds.
  double step_ms(int32_t batch, int32_t tokens) const;
  // The curve (or the linear prior) alone, without the online correction: fixed in time, so it
  // compares steps measured at different batches and moments.
  double prior_ms(int32_t batch, int32_t tokens) const;
  // A step that ran: corrects the prediction near (batch, tokens).
  void observe(int32_t batch, int32_t tokens, double ms);
  // Whether (batch, tokens)'s own bucket has min_obs observations (always true offline).
  bool measured(int32_t batch, int32_t tokens) const;
  const CostModelConfig& config() const { return config_; }
  static int32_t bucket_of(int32_t v);  // floor(log2(v)) bucket (v >= 1)

 private:
  struct Bucket {
    double ratio = 1.0;  // measured / prior, EMA
    int32_t count = 0;
  };
  CostModelConfig config_;
  std::map<std::pair<int32_t, int32_t>, Bucket> buckets_;  // (batch bucket, token bucket)
};

}  // namespace arbor
