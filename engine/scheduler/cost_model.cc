#include "engine/scheduler/cost_model.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>

#include <nlohmann/json.hpp>

#include "engine/core/error.h"

namespace arbor {

void CostModelConfig::validate() const {
  if (!(fixed_ms >= 0) || !(per_token_ms >= 0) || fixed_ms + per_token_ms <= 0)
    throw_error(ErrorCode::kInvalidArgument,
                "cost_model: fixed_ms and per_token_ms must be >= 0 and not both 0, got " +
                    std::to_string(fixed_ms) + " and " + std::to_string(per_token_ms));
  if (!(ema > 0 && ema <= 1))
    throw_error(ErrorCode::kInvalidArgument,
                "cost_model.ema must be in (0, 1], got " + std::to_string(ema));
  if (min_obs < 1)
    throw_error(ErrorCode::kInvalidArgument,
                "cost_model.min_obs must be >= 1, got " + std::to_string(min_obs));
  for (const auto& [batch, points] : curves) {
    const std::string where = "cost_model curve for batch " + std::to_string(batch);
    if (batch < 1) throw_error(ErrorCode::kInvalidArgument, where + ": batch must be >= 1");
    if (points.empty()) throw_error(ErrorCode::kInvalidArgument, where + " has no points");
    for (size_t i = 0; i < points.size(); ++i) {
      if (points[i].tokens < 1 || !(points[i].ms > 0) || !std::isfinite(points[i].ms))
        throw_error(ErrorCode::kInvalidArgument,
                    where + ": point " + std::to_string(i) + " needs tokens >= 1 and ms > 0");
      if (i > 0 && points[i].tokens <= points[i - 1].tokens)
        throw_error(ErrorCode::kInvalidArgument,
                    where + ": tokens must ascend (point " + std::to_string(i) + ")");
    }
  }
}

CostModelConfig load_cost_model(const std::string& path) {
  std::ifstream in(path);
  if (!in) throw_error(ErrorCode::kNotFound, "cost model file " + path + " cannot be opened");
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(in);
  } catch (const std::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "cost model file " + path + ": " + e.what());
  }
  CostModelConfig c;
  try {
    // Curves give total step tokens, or tokens per request when "unit" says so (the GPU model
    // benchmark writes per-request tree sizes).
    const bool per_request = j.contains("unit") && j.at("unit").get<std::string>().find(
                                                       "per request") != std::string::npos;
    if (j.contains("batch")) {
      for (const auto& [batch, points] : j.at("batch").items()) {
        std::vector<CostCurvePoint> curve;
        const int32_t scale = per_request ? std::stoi(batch) : 1;
        for (const auto& p : points)
          curve.push_back({p.at(0).get<int32_t>() * scale, p.at(1).get<double>()});
        c.curves[std::stoi(batch)] = std::move(curve);
      }
    }
    if (j.contains("fixed_ms")) c.fixed_ms = j.at("fixed_ms").get<double>();
    if (j.contains("per_token_ms")) c.per_token_ms = j.at("per_token_ms").get<double>();
  } catch (const std::exception& e) {
    throw_error(ErrorCode::kInvalidArgument, "cost model file " + path + ": " + e.what());
  }
  try {
    c.validate();
  } catch (const Error& e) {
    throw_error(ErrorCode::kInvalidArgument, "cost model file " + path + ": " + e.what());
  }
  return c;
}

std::string format_cost_curves(const std::map<int32_t, std::vector<CostCurvePoint>>& curves) {
  std::string out;
  for (const auto& [batch, points] : curves) {
    out += (out.empty() ? "batch " : "; batch ") + std::to_string(batch) + ":";
    for (const CostCurvePoint& p : points) {
      char buf[48];
      std::snprintf(buf, sizeof(buf), " %d->%.3f", p.tokens, p.ms);
      out += buf;
    }
  }
  return out;
}

CostModel::CostModel(CostModelConfig config) : config_(std::move(config)) {
  config_.validate();
}

namespace {

// Piecewise-linear in tokens; beyond the last point, extrapolate with the last segment's slope.
double interpolate(const std::vector<CostCurvePoint>& c, double tokens) {
  if (c.size() == 1) return c[0].ms * std::max(1.0, tokens / c[0].tokens);
  if (tokens <= c.front().tokens) return c.front().ms;
  for (size_t i = 1; i < c.size(); ++i) {
    if (tokens <= c[i].tokens || i + 1 == c.size()) {
      const double x0 = c[i - 1].tokens, x1 = c[i].tokens;
      double slope = (c[i].ms - c[i - 1].ms) / (x1 - x0);
      if (tokens > x1) slope = std::max(0.0, slope);  // extrapolating: never cheaper
      return c[i - 1].ms + slope * (tokens - x0);
    }
  }
  return c.back().ms;
}

}  // namespace

double CostModel::prior_ms(int32_t batch, int32_t tokens) const {
  if (config_.curves.empty()) return config_.fixed_ms + config_.per_token_ms * tokens;
  // Between the two measured batch sizes around `batch`, interpolate linearly in batch.
  auto hi = config_.curves.lower_bound(batch);
  if (hi == config_.curves.end()) return interpolate(std::prev(hi)->second, tokens);
  if (hi->first == batch || hi == config_.curves.begin()) return interpolate(hi->second, tokens);
  auto lo = std::prev(hi);
  const double w = double(batch - lo->first) / double(hi->first - lo->first);
  return (1 - w) * interpolate(lo->second, tokens) + w * interpolate(hi->second, tokens);
}

int32_t CostModel::bucket_of(int32_t v) {
  int32_t b = 0;
  while (v > 1) {
    v >>= 1;
    ++b;
  }
  return b;
}

double CostModel::step_ms(int32_t batch, int32_t tokens) const {
  const double prior = prior_ms(std::max(batch, 1), std::max(tokens, 1));
  if (!config_.online) return prior;
  // The prior gives the shape; measurements give the level. Use the ratio of the nearest
  // bucket with enough observations (same batch bucket first), so an unmeasured tree size is
  // scaled like its measured neighbours instead of jumping back to the raw prior.
  const int32_t bb = bucket_of(std::max(batch, 1)), tb = bucket_of(std::max(tokens, 1));
  const Bucket* best = nullptr;
  int32_t best_d = 0;
  for (const auto& [key, b] : buckets_) {
    if (b.count < config_.min_obs) continue;
    const int32_t d = 64 * std::abs(key.first - bb) + std::abs(key.second - tb);
    if (!best || d < best_d) {
      best = &b;
      best_d = d;
    }
  }
  return best ? prior * best->ratio : prior;
}

bool CostModel::measured(int32_t batch, int32_t tokens) const {
  if (!config_.online) return true;
  const auto it = buckets_.find({bucket_of(std::max(batch, 1)), bucket_of(std::max(tokens, 1))});
  return it != buckets_.end() && it->second.count >= config_.min_obs;
}

void CostModel::observe(int32_t batch, int32_t tokens, double ms) {
  if (!config_.online || !(ms > 0) || batch < 1 || tokens < 1) return;
  const double ratio = ms / prior_ms(batch, tokens);
  Bucket& b = buckets_[{bucket_of(batch), bucket_of(tokens)}];
  b.ratio = b.count == 0 ? ratio : (1 - config_.ema) * b.ratio + config_.ema * ratio;
  b.count++;
}

}  // namespace arbor
