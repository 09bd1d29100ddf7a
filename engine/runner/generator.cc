#include "engine/runner/generator.h"

#include <algorithm>
#include <chrono>
#include <deque>
#include <optional>

#include "engine/core/error.h"
#include "engine/runner/batch_builder.h"

namespace arbor {

void GeneratorConfig::validate() const {
  auto positive = [](const char* name, int64_t v) {
    if (v <= 0)
      throw_error(ErrorCode::kInvalidArgument,
                  std::string(name) + " must be positive, got " + std::to_string(v));
  };
  positive("num_blocks", num_blocks);
  positive("block_size", block_size);
  positive("max_step_tokens", max_step_tokens);
  positive("max_running", max_running);
}

namespace {

KvCacheConfig kv_config(const GeneratorConfig& c) {
  KvCacheConfig k;
  k.num_blocks = c.num_blocks;
  k.block_size = c.block_size;
  k.enable_prefix_caching = c.prefix_caching;
  return k;
}

// One request's life in the loop.
struct Active {
  size_t index = 0;
  const GenerationRequest* req = nullptr;
  Sampler sampler;
  Rng rng;
  SeqId seq = -1;
  std::vector<int32_t> context;  // prompt + generated so far (what the KV must hold)
  int32_t computed = 0;          // leading context tokens whose K/V are in the cache
  GenerationResult result;

  Active(size_t i, const GenerationRequest& r)
      : index(i), req(&r), sampler(r.sampling), rng(sampler.make_rng()), context(r.prompt) {}
};

}  // namespace

Generator::Generator(LlamaModel& model, const GeneratorConfig& config)
    : model_(model), config_((config.validate(), config)), kv_(kv_config(config)) {
  model_.backend().allocate_kv(model_.kv_shape(config_.num_blocks, config_.block_size));
}

std::vector<GenerationResult> Generator::run(const std::vector<GenerationRequest>& requests,
                                             const TokenCallback& on_token) {
  const int64_t vocab = model_.config().vocab_size;
  const int32_t eos = model_.config().eos_token_id;
  const int64_t capacity = static_cast<int64_t>(config_.num_blocks) * config_.block_size;
  for (size_t i = 0; i < requests.size(); ++i) {
    const GenerationRequest& r = requests[i];
    if (r.prompt.empty())
      throw_error(ErrorCode::kInvalidArgument, "request " + std::to_string(i) + " has no prompt");
    for (int32_t t : r.prompt)
      if (t < 0 || t >= vocab)
        throw_error(ErrorCode::kInvalidArgument,
                    "request " + std::to_string(i) + " token id " + std::to_string(t) +
                        " is outside the vocabulary of " + std::to_string(vocab));
    if (r.max_tokens <= 0)
      throw_error(ErrorCode::kInvalidArgument,
                  "max_tokens must be positive, got " + std::to_string(r.max_tokens));
    if (static_cast<int64_t>(r.prompt.size()) + r.max_tokens > capacity)
      throw_error(ErrorCode::kResourceExhausted,
                  "request " + std::to_string(i) + " needs " +
                      std::to_string(r.prompt.size() + r.max_tokens) +
                      " KV slots but the cache holds " + std::to_string(capacity) +
                      " (raise the number of KV blocks)");
    r.sampling.validate();
  }

  std::vector<GenerationResult> results(requests.size());
  std::deque<Active> waiting;
  for (size_t i = 0; i < requests.size(); ++i) waiting.emplace_back(i, requests[i]);
  std::vector<Active> running;

  auto finish = [&](Active& a, const char* reason) {
    a.result.finish_reason = reason;
    kv_.free_sequence(a.seq);
    a.seq = -1;
    results[a.index] = std::move(a.result);
  };

  while (!waiting.empty() || !running.empty()) {
    // Admit waiting requests (FIFO) while a prompt's blocks fit.
    while (!waiting.empty() && static_cast<int32_t>(running.size()) < config_.max_running) {
      Active& a = waiting.front();
      const int32_t need =
          static_cast<int32_t>((a.context.size() + config_.block_size - 1) / config_.block_size);
      if (kv_.num_free_blocks() < need && !running.empty()) break;
      const auto created = kv_.create_sequence(a.context);
      a.seq = created.seq;
      a.computed = created.cached_tokens;
      a.result.cached_prompt_tokens += created.cached_tokens;
      running.push_back(std::move(a));
      waiting.pop_front();
    }

    // Plan the step: decodes first (one token each), then prefill chunks within the budget.
    std::vector<StepItem> items;
    std::vector<size_t> item_owner;  // index into running
    int32_t budget = config_.max_step_tokens;
    bool any_prefill = false, any_decode = false;
    std::vector<size_t> order(running.size());
    for (size_t i = 0; i < running.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      const bool dx = running[x].computed + 1 == static_cast<int32_t>(running[x].context.size());
      const bool dy = running[y].computed + 1 == static_cast<int32_t>(running[y].context.size());
      return dx > dy;
    });
    std::vector<size_t> preempt;
    for (size_t i : order) {
      Active& a = running[i];
      const int32_t remaining = static_cast<int32_t>(a.context.size()) - a.computed;
      const int32_t n = std::min(remaining, budget);
      if (n <= 0) continue;
      ReservePlan plan;
      if (!kv_.reserve(a.seq, n, &plan)) {
        preempt.push_back(i);
        continue;
      }
      if (!plan.copies.empty())
        model_.backend().copy_kv(plan.copies.src_slots, plan.copies.dst_slots);
      StepItem item;
      item.seq = a.seq;
      item.tokens.assign(a.context.begin() + a.computed, a.context.begin() + a.computed + n);
      items.push_back(std::move(item));
      item_owner.push_back(i);
      budget -= n;
      (remaining == 1 && !a.result.tokens.empty() ? any_decode : any_prefill) = true;
    }
    if (items.empty()) {
      if (running.empty()) continue;
      // Nothing fits: preempt the newest request (recompute later) to free its blocks.
      preempt.assign(1, running.size() - 1);
    }
    if (!preempt.empty() && items.empty()) {
      std::sort(preempt.rbegin(), preempt.rend());
      for (size_t i : preempt) {
        Active& a = running[i];
        if (running.size() == 1)
          throw_error(ErrorCode::kResourceExhausted,
                      "request " + std::to_string(a.index) + " does not fit in the KV cache");
        kv_.free_sequence(a.seq);
        a.seq = -1;
        a.computed = 0;
        a.result.preemptions++;
        waiting.push_front(std::move(a));
        running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
      }
      continue;
    }

    StepInputs step;
    BatchBuilder::build(kv_, items, &step);
    const auto t0 = std::chrono::steady_clock::now();
    ForwardOutput out;
    model_.forward(step, &out);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.steps++;
    (any_prefill && any_decode ? stats_.mixed_seconds
     : any_prefill             ? stats_.prefill_seconds
                               : stats_.decode_seconds) += secs;

    std::vector<size_t> done;
    for (size_t k = 0; k < items.size(); ++k) {
      Active& a = running[item_owner[k]];
      const int32_t n = static_cast<int32_t>(items[k].tokens.size());
      const CommitPlan commit = kv_.commit_all(a.seq, items[k].tokens);
      if (!commit.copies.empty())
        model_.backend().copy_kv(commit.copies.src_slots, commit.copies.dst_slots);
      a.computed += n;
      if (a.computed < static_cast<int32_t>(a.context.size())) {
        stats_.prefill_tokens += n;
        continue;  // prompt not finished: no token yet
      }
      if (a.result.tokens.empty()) stats_.prefill_tokens += n;
      std::span<const float> logits(out.logits.data() + k * vocab, static_cast<size_t>(vocab));
      const std::span<const int32_t> prompt(a.req->prompt);
      const int32_t tok = a.sampler.sample_token(logits, prompt, a.result.tokens, a.rng);
      a.result.tokens.push_back(tok);
      a.context.push_back(tok);
      stats_.decode_tokens++;
      if (on_token) on_token(a.index, tok);
      const bool stop = (!a.req->ignore_eos && tok == eos) ||
                        std::find(a.req->stop_token_ids.begin(), a.req->stop_token_ids.end(),
                                  tok) != a.req->stop_token_ids.end();
      if (stop) {
        finish(a, "stop");
        done.push_back(item_owner[k]);
      } else if (static_cast<int32_t>(a.result.tokens.size()) >= a.req->max_tokens) {
        finish(a, "length");
        done.push_back(item_owner[k]);
      }
    }
    std::sort(done.rbegin(), done.rend());
    for (size_t i : done) running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return results;
}

}  // namespace arbor
