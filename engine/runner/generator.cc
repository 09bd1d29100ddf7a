#include "engine/runner/generator.h"

#include <algorithm>
#include <chrono>
#include <deque>

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
  positive("tree_budget.max_nodes", tree_budget.max_nodes);
  if (tree_budget.max_depth < 0)
    throw_error(ErrorCode::kInvalidArgument,
                "tree_budget.max_depth must be >= 0, got " + std::to_string(tree_budget.max_depth));
}

namespace {

KvCacheConfig kv_config(const GeneratorConfig& c) {
  KvCacheConfig k;
  k.num_blocks = c.num_blocks;
  k.block_size = c.block_size;
  k.enable_prefix_caching = c.prefix_caching;
  return k;
}

// One request's life in the loop. Invariant between steps: the KV cache holds the first
// `computed` tokens of `context` (= prompt + generated); once the prompt is done,
// computed == context.size() - 1 and the last token is the next tree's root.
struct Active {
  size_t index = 0;
  const GenerationRequest* req = nullptr;
  Sampler sampler;
  Rng rng;
  SeqId seq = -1;
  bool speculate = false;
  std::vector<int32_t> context;
  int32_t computed = 0;
  GenerationResult result;

  Active(size_t i, const GenerationRequest& r, bool spec)
      : index(i),
        req(&r),
        sampler(r.sampling),
        rng(sampler.make_rng()),
        speculate(spec),
        context(r.prompt) {}
  bool decoding() const {
    return computed + 1 == static_cast<int32_t>(context.size()) && !result.tokens.empty();
  }
};

// What one step asked of one request.
struct Planned {
  size_t owner = 0;       // index into running
  bool tree = false;      // decode/verify item (else a prefill chunk)
  DraftTree draft;        // tree items
  int32_t first_row = 0;  // first flat row of the item
};

}  // namespace

Generator::Generator(LlamaModel& model, const GeneratorConfig& config, Proposer* proposer)
    : model_(model),
      config_((config.validate(), config)),
      proposer_(proposer),
      kv_(kv_config(config)) {
  model_.backend().allocate_kv(model_.kv_shape(config_.num_blocks, config_.block_size));
}

std::vector<GenerationResult> Generator::run(const std::vector<GenerationRequest>& requests,
                                             const TokenCallback& on_token) {
  const int64_t vocab = model_.config().vocab_size;
  const int64_t hidden_size = model_.config().hidden_size;
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
    const int64_t need = static_cast<int64_t>(r.prompt.size()) + r.max_tokens +
                         (proposer_ && r.speculate ? config_.tree_budget.max_nodes : 0);
    if (need > capacity)
      throw_error(ErrorCode::kResourceExhausted,
                  "request " + std::to_string(i) + " needs " + std::to_string(need) +
                      " KV slots but the cache holds " + std::to_string(capacity) +
                      " (raise the number of KV blocks)");
    r.sampling.validate();
  }

  ForwardRequest want;
  if (proposer_) {
    want.final_hidden = proposer_->needs_hidden();
    want.capture_layers = proposer_->capture_layers();
  }

  std::vector<GenerationResult> results(requests.size());
  std::deque<Active> waiting;
  for (size_t i = 0; i < requests.size(); ++i)
    waiting.emplace_back(i, requests[i], proposer_ != nullptr && requests[i].speculate);
  std::vector<Active> running;

  auto release = [&](Active& a) {
    kv_.free_sequence(a.seq);
    a.seq = -1;
    if (a.speculate) proposer_->end(static_cast<RequestId>(a.index));
  };
  auto finish = [&](Active& a, const char* reason) {
    a.result.finish_reason = reason;
    release(a);
    results[a.index] = std::move(a.result);
  };

  while (!waiting.empty() || !running.empty()) {
    // Admit waiting requests (FIFO) while a prompt's blocks fit.
    while (!waiting.empty() && static_cast<int32_t>(running.size()) < config_.max_running) {
      Active& a = waiting.front();
      const int32_t need =
          static_cast<int32_t>((a.context.size() + config_.block_size - 1) / config_.block_size);
      if (kv_.num_free_blocks() < need && !running.empty()) break;
      // A proposer needs the target's features of every position, so speculating requests
      // do not skip cached prefix tokens.
      const auto created = a.speculate ? kv_.create_sequence() : kv_.create_sequence(a.context);
      a.seq = created.seq;
      a.computed = created.cached_tokens;
      a.result.cached_prompt_tokens += created.cached_tokens;
      if (a.speculate) proposer_->begin(static_cast<RequestId>(a.index), a.context);
      running.push_back(std::move(a));
      waiting.pop_front();
    }

    // Plan the step: decode/verify items first (one tree each), then prefill chunks within the
    // token budget.
    std::vector<size_t> order(running.size());
    for (size_t i = 0; i < running.size(); ++i) order[i] = i;
    std::stable_sort(order.begin(), order.end(), [&](size_t x, size_t y) {
      return running[x].decoding() > running[y].decoding();
    });
    // Reserves slots; copy-on-write copies run before the step writes K/V.
    auto reserve = [&](SeqId seq, int32_t n) {
      ReservePlan plan;
      if (!kv_.reserve(seq, n, &plan)) return false;
      if (!plan.copies.empty())
        model_.backend().copy_kv(plan.copies.src_slots, plan.copies.dst_slots);
      return true;
    };
    std::vector<StepItem> items;
    std::vector<Planned> planned;
    int32_t budget = config_.max_step_tokens;
    bool any_prefill = false, any_decode = false;
    for (size_t i : order) {
      Active& a = running[i];
      Planned p;
      p.owner = i;
      StepItem item;
      item.seq = a.seq;
      if (a.decoding()) {
        p.tree = true;
        p.draft = a.speculate
                      ? proposer_->propose(static_cast<RequestId>(a.index), config_.tree_budget)
                      : DraftTree::root_only(a.context.back());
        ARBOR_CHECK(!p.draft.token.empty() && p.draft.token[0] == a.context.back(),
                    "proposer tree root differs from the request's newest token");
        if (p.draft.size() > budget && !items.empty()) continue;  // next step
        if (!reserve(a.seq, p.draft.size())) {
          p.draft = DraftTree::root_only(a.context.back());  // no room for a tree: plain decode
          if (!reserve(a.seq, 1)) continue;
        }
        item.tokens = p.draft.token;
        if (p.draft.size() > 1) {
          item.parents = p.draft.parent;
          item.all_logits = true;
        }
        any_decode = true;
      } else {
        const int32_t remaining = static_cast<int32_t>(a.context.size()) - a.computed;
        const int32_t n = std::min(remaining, budget);
        if (n <= 0) continue;
        if (!reserve(a.seq, n)) continue;
        item.tokens.assign(a.context.begin() + a.computed, a.context.begin() + a.computed + n);
        any_prefill = true;
      }
      budget -= static_cast<int32_t>(item.tokens.size());
      items.push_back(std::move(item));
      planned.push_back(std::move(p));
    }
    if (items.empty()) {
      // Nothing fits: preempt the newest request (recomputed later) to free its blocks.
      Active& a = running.back();
      if (running.size() == 1)
        throw_error(ErrorCode::kResourceExhausted,
                    "request " + std::to_string(a.index) + " does not fit in the KV cache");
      release(a);
      a.computed = 0;
      a.result.preemptions++;
      waiting.push_front(std::move(a));
      running.pop_back();
      continue;
    }
    StepInputs step;
    const std::vector<int32_t> first_logit = BatchBuilder::build(kv_, items, &step);
    for (size_t k = 0; k < items.size(); ++k) planned[k].first_row = step.qo_indptr[k];

    const auto t0 = std::chrono::steady_clock::now();
    ForwardOutput out;
    model_.forward(step, &out, want);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    stats_.steps++;
    (any_prefill && any_decode ? stats_.mixed_seconds
     : any_prefill             ? stats_.prefill_seconds
                               : stats_.decode_seconds) += secs;

    auto hidden_rows = [&](int32_t first_row, const std::vector<int32_t>& rows) {
      std::vector<float> h;
      if (!want.final_hidden) return h;
      h.reserve(rows.size() * hidden_size);
      for (int32_t r : rows) {
        const float* src = out.hidden.data() + (first_row + r) * hidden_size;
        h.insert(h.end(), src, src + hidden_size);
      }
      return h;
    };
    auto captured_rows = [&](int32_t first_row, const std::vector<int32_t>& rows) {
      std::vector<std::vector<float>> c(out.captured.size());
      for (size_t l = 0; l < out.captured.size(); ++l)
        for (int32_t r : rows) {
          const float* src = out.captured[l].data() + (first_row + r) * hidden_size;
          c[l].insert(c[l].end(), src, src + hidden_size);
        }
      return c;
    };
    auto feed = [&](Active& a, int32_t start, const std::vector<int32_t>& tokens,
                    const std::vector<float>& h, const std::vector<std::vector<float>>& cap,
                    int32_t next) {
      if (!a.speculate) return;
      TargetFeedback fb;
      fb.request = static_cast<RequestId>(a.index);
      fb.start = start;
      fb.tokens = tokens;
      fb.hidden = h;
      for (const auto& c : cap) fb.captured.emplace_back(c);
      fb.next_token = next;
      proposer_->observe(fb);
    };

    std::vector<size_t> done;
    for (size_t k = 0; k < items.size(); ++k) {
      Planned& p = planned[k];
      Active& a = running[p.owner];
      const int32_t start = a.computed;
      std::vector<int32_t> emitted;
      if (!p.tree) {
        const int32_t n = static_cast<int32_t>(items[k].tokens.size());
        const CommitPlan commit = kv_.commit_all(a.seq, items[k].tokens);
        if (!commit.copies.empty())
          model_.backend().copy_kv(commit.copies.src_slots, commit.copies.dst_slots);
        a.computed += n;
        stats_.prefill_tokens += n;
        std::vector<int32_t> rows(n);
        for (int32_t i = 0; i < n; ++i) rows[i] = i;
        int32_t next = -1;
        if (a.computed < static_cast<int32_t>(a.context.size())) {
          next = a.context[a.computed];  // prompt continues in a later chunk
        } else {
          std::span<const float> logits(out.logits.data() + first_logit[k] * vocab,
                                        static_cast<size_t>(vocab));
          next = a.sampler.sample_token(logits, a.req->prompt, a.result.tokens, a.rng);
          emitted.push_back(next);
        }
        feed(a, start, items[k].tokens, hidden_rows(p.first_row, rows),
             captured_rows(p.first_row, rows), next);
      } else {
        const int32_t t = p.draft.size();
        stats_.tree_tokens += t;
        std::span<const float> logits(out.logits.data() + first_logit[k] * vocab,
                                      static_cast<size_t>(t * vocab));
        const std::span<const int32_t> ctx(a.context);
        const size_t prompt_len = a.req->prompt.size();
        // Recomputed requests carry generated tokens in the context: split at the prompt.
        const VerifyResult v = verify(p.draft, logits, vocab, a.sampler, ctx.subspan(0, prompt_len),
                                      ctx.subspan(prompt_len), a.rng, config_.verify);
        a.result.acceptance.add(v);
        std::vector<int32_t> node_tokens;
        for (int32_t node : v.accepted_nodes) node_tokens.push_back(p.draft.token[node]);
        const CommitPlan commit = kv_.plan_commit(a.seq, v.accepted_nodes, node_tokens);
        kv_.apply(commit);
        if (!commit.copies.empty())
          model_.backend().copy_kv(commit.copies.src_slots, commit.copies.dst_slots);
        a.computed += static_cast<int32_t>(v.accepted_nodes.size());
        emitted = v.accepted_tokens;
        emitted.push_back(v.bonus_token);
        feed(a, start, node_tokens, hidden_rows(p.first_row, v.accepted_nodes),
             captured_rows(p.first_row, v.accepted_nodes), v.bonus_token);
      }
      // Emit in order, stopping at a stop token or max_tokens.
      const char* reason = nullptr;
      for (int32_t tok : emitted) {
        a.result.tokens.push_back(tok);
        a.context.push_back(tok);
        stats_.decode_tokens++;
        if (on_token) on_token(a.index, tok);
        const bool stop = (!a.req->ignore_eos && tok == eos) ||
                          std::find(a.req->stop_token_ids.begin(), a.req->stop_token_ids.end(),
                                    tok) != a.req->stop_token_ids.end();
        if (stop) {
          reason = "stop";
          break;
        }
        if (static_cast<int32_t>(a.result.tokens.size()) >= a.req->max_tokens) {
          reason = "length";
          break;
        }
      }
      if (reason) {
        finish(a, reason);
        done.push_back(p.owner);
      }
    }
    std::sort(done.rbegin(), done.rend());
    for (size_t i : done) running.erase(running.begin() + static_cast<std::ptrdiff_t>(i));
  }
  return results;
}

}  // namespace arbor
