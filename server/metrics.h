// Prometheus text-format metrics: counters, gauges and histograms with fixed label sets,
// rendered by /metrics. Thread-safe (one mutex; updates are a few per step or request).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include <absl/base/thread_annotations.h>
#include <absl/synchronization/mutex.h>

namespace arbor {

class Metrics {
 public:
  Metrics();
  // name{labels} += v. `labels` is the Prometheus label text without braces ("status=\"ok\"").
  void inc(const std::string& name, double v = 1, const std::string& labels = "");
  void set(const std::string& name, double v, const std::string& labels = "");
  void observe(const std::string& name, double v);  // histogram
  // The whole exposition, with # HELP / # TYPE lines.
  std::string render() const;
  double value(const std::string& name, const std::string& labels = "") const;

 private:
  struct Family {
    std::string type;  // counter | gauge | histogram
    std::string help;
    std::map<std::string, double> samples;  // labels -> value
    std::vector<double> bounds;             // histogram bucket upper bounds
    std::vector<uint64_t> buckets;          // cumulative counts are computed at render
    double sum = 0;
    uint64_t count = 0;
  };
  void define(const std::string& name, const std::string& type, const std::string& help,
              std::vector<double> bounds = {}) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  mutable absl::Mutex mu_;
  std::map<std::string, Family> families_ ABSL_GUARDED_BY(mu_);
};

}  // namespace arbor
