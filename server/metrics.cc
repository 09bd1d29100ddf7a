#include "server/metrics.h"

#include <cmath>
#include <sstream>

#include "engine/core/error.h"

namespace arbor {

Metrics::Metrics() {
  absl::MutexLock lock(&mu_);
  const std::vector<double> latency = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                       1,     2.5,  5,     10,   30,  60};
  const std::vector<double> per_token = {0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
                                         0.1,   0.25,   0.5,   1,    2.5};
  define("arbor_requests_total", "counter", "Requests finished, by outcome.");
  define("arbor_requests_rejected_total", "counter", "Requests refused before running.");
  define("arbor_prompt_tokens_total", "counter", "Prompt tokens of finished requests.");
  define("arbor_generation_tokens_total", "counter", "Tokens generated.");
  define("arbor_time_to_first_token_seconds", "histogram",
         "Time from arrival to the first generated token.", latency);
  define("arbor_time_per_output_token_seconds", "histogram",
         "Mean time between generated tokens after the first, per request.", per_token);
  define("arbor_e2e_request_latency_seconds", "histogram", "Arrival to last token.", latency);
  define("arbor_kv_blocks_used", "gauge", "KV cache blocks referenced by running sequences.");
  define("arbor_kv_blocks_free", "gauge",
         "KV cache blocks an allocation can take (never used, or cached and unreferenced).");
  define("arbor_kv_blocks_total", "gauge", "KV cache blocks in the pool.");
  define("arbor_kv_cache_usage_ratio", "gauge", "Used / total KV blocks.");
  define("arbor_kv_sequences", "gauge", "Sequences holding KV blocks.");
  define("arbor_queue_depth", "gauge",
         "Sequences waiting to run: not admitted yet, or preempted and waiting to be recomputed.");
  define("arbor_running_sequences", "gauge", "Sequences prefilling or decoding.");
  define("arbor_admission_lookahead_tokens", "gauge",
         "Tokens of growth per running sequence that admission leaves room for.");
  define("arbor_engine_steps_total", "counter", "Forward steps run.");
  define("arbor_preemptions_total", "counter", "Sequences preempted (recomputed later).");
  define("arbor_spec_draft_offered_total", "counter",
         "Verify steps that tested a draft node at this tree depth.");
  define("arbor_spec_draft_accepted_total", "counter",
         "Verify steps that accepted a draft node at this tree depth.");
  define("arbor_spec_verify_steps_total", "counter",
         "Decode steps that verified a tree (> 1 node).");
  define("arbor_spec_emitted_tokens_total", "counter", "Tokens emitted by tree verify steps.");
  define("arbor_spec_speculating_sequences", "gauge",
         "Running sequences that may draft trees (the adaptive policy has not turned them off).");
  define("arbor_spec_draft_seconds_total", "counter", "Proposer time drafting trees.");
  define("arbor_spec_feedback_seconds_total", "counter",
         "Proposer time folding accepted tokens into its state.");
  define("arbor_engine_step_seconds_total", "counter",
         "Forward time of engine steps, by what they carried: prefill, decode or mixed.");
  define("arbor_step_graphs_total", "counter",
         "Graph-eligible steps by outcome: replay (an earlier recording relaunched), capture "
         "(recorded and launched), eager (run op by op while its shape was not steady), failed "
         "(recording refused, ran op by op).");
}

void Metrics::define(const std::string& name, const std::string& type, const std::string& help,
                     std::vector<double> bounds) {
  Family f;
  f.type = type;
  f.help = help;
  f.bounds = std::move(bounds);
  f.buckets.assign(f.bounds.size(), 0);
  families_[name] = std::move(f);
}

void Metrics::inc(const std::string& name, double v, const std::string& labels) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  ARBOR_CHECK(it != families_.end(), "unknown metric " + name);
  it->second.samples[labels] += v;
}

void Metrics::set(const std::string& name, double v, const std::string& labels) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  ARBOR_CHECK(it != families_.end(), "unknown metric " + name);
  it->second.samples[labels] = v;
}

void Metrics::observe(const std::string& name, double v) {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  ARBOR_CHECK(it != families_.end() && it->second.type == "histogram", "unknown histogram " + name);
  Family& f = it->second;
  for (size_t i = 0; i < f.bounds.size(); ++i)
    if (v <= f.bounds[i]) {
      f.buckets[i]++;
      break;
    }
  f.sum += v;
  f.count++;
}

double Metrics::value(const std::string& name, const std::string& labels) const {
  absl::MutexLock lock(&mu_);
  auto it = families_.find(name);
  if (it == families_.end()) return 0;
  if (it->second.type == "histogram") return static_cast<double>(it->second.count);
  auto s = it->second.samples.find(labels);
  return s == it->second.samples.end() ? 0 : s->second;
}

namespace {
std::string num(double v) {
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  std::ostringstream o;
  o.precision(12);
  o << v;
  return o.str();
}
}  // namespace

std::string Metrics::render() const {
  absl::MutexLock lock(&mu_);
  std::ostringstream o;
  for (const auto& [name, f] : families_) {
    o << "# HELP " << name << ' ' << f.help << '\n' << "# TYPE " << name << ' ' << f.type << '\n';
    if (f.type == "histogram") {
      uint64_t cum = 0;
      for (size_t i = 0; i < f.bounds.size(); ++i) {
        cum += f.buckets[i];
        o << name << "_bucket{le=\"" << num(f.bounds[i]) << "\"} " << cum << '\n';
      }
      o << name << "_bucket{le=\"+Inf\"} " << f.count << '\n';
      o << name << "_sum " << num(f.sum) << '\n' << name << "_count " << f.count << '\n';
      continue;
    }
    if (f.samples.empty()) o << name << " 0\n";
    for (const auto& [labels, v] : f.samples)
      o << name << (labels.empty() ? "" : "{" + labels + "}") << ' ' << num(v) << '\n';
  }
  return o.str();
}

}  // namespace arbor
