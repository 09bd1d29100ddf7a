// Step graphs on the GPU (CudaBackendOptions::cuda_graphs, StepGraphCache): greedy decoding
// through the Generator with recorded-and-replayed decode / verify steps must give exactly the
// tokens of op-by-op steps: a batch of requests of different lengths whose contexts cross the
// 512-key split boundaries of batch-invariant attention while their recordings replay (the
// padded grid and the always-on split merge), requests finishing at different steps (the batch
// shrinks: new keys), and speculation (n-gram; EAGLE where the test data has a draft) against
// plain greedy without graphs. The tests also check that recordings were made and replayed.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <map>
#include <random>
#include <thread>
#include <tuple>

#include "engine/backend/cuda/cuda_backend.h"
#include "engine/core/error.h"
#include "engine/draft/eagle_checkpoint.h"
#include "engine/draft/eagle_draft_model.h"
#include "engine/model/llama_model.h"
#include "engine/model/model_loader.h"
#include "engine/runner/generator.h"
#include "engine/spec/eagle_proposer.h"
#include "engine/spec/proposer_factory.h"
#include "tests/common/token_maps.h"
#include "tests/cuda/cuda_test_util.h"

namespace arbor {
namespace {

HostTensor random_tensor(std::mt19937& rng, std::vector<int64_t> shape, float scale,
                         float offset = 0.f) {
  HostTensor t(std::move(shape));
  std::uniform_real_distribution<float> d(-scale, scale);
  for (auto& x : t.data) x = offset + d(rng);
  return t;
}

// A random Llama-3-style model (GQA 8 / 2 heads, llama3 RoPE), as in cuda_model_test.cc.
ModelWeights random_model(int64_t head_dim, uint32_t seed) {
  std::mt19937 rng(seed);
  ModelWeights w;
  ModelConfig& c = w.config;
  c.vocab_size = 512;
  c.num_heads = 8;
  c.num_kv_heads = 2;
  c.head_dim = head_dim;
  c.hidden_size = c.num_heads * head_dim;
  c.intermediate_size = c.hidden_size * 3 / 2;
  c.num_layers = 2;
  c.rope_theta = 500000.0;
  c.rope_scaling.type = "llama3";
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.original_max_position = 64;
  c.max_position = 4096;
  const int64_t h = c.hidden_size, f = c.intermediate_size, q = c.num_heads * head_dim,
                kv = c.num_kv_heads * head_dim;
  const float sh = std::sqrt(3.f / static_cast<float>(h)),
              sf = std::sqrt(3.f / static_cast<float>(f));
  w.embed = random_tensor(rng, {c.vocab_size, h}, 1.f);
  for (int64_t l = 0; l < c.num_layers; ++l) {
    LayerWeights lw;
    lw.attn_norm = random_tensor(rng, {h}, 0.2f, 1.f);
    lw.wq = random_tensor(rng, {q, h}, sh * 2);
    lw.wk = random_tensor(rng, {kv, h}, sh * 2);
    lw.wv = random_tensor(rng, {kv, h}, sh);
    lw.wo = random_tensor(rng, {h, q}, sh);
    lw.ffn_norm = random_tensor(rng, {h}, 0.2f, 1.f);
    lw.w_gate = random_tensor(rng, {f, h}, sh);
    lw.w_up = random_tensor(rng, {f, h}, sh);
    lw.w_down = random_tensor(rng, {h, f}, sf);
    w.layers.push_back(std::move(lw));
  }
  w.final_norm = random_tensor(rng, {h}, 0.2f, 1.f);
  w.lm_head = random_tensor(rng, {c.vocab_size, h}, sh * 4);
  return w;
}

const ModelWeights& weights_of(const std::string& name) {
  static std::map<std::string, ModelWeights> cache;
  auto it = cache.find(name);
  if (it != cache.end()) return it->second;
  ModelWeights w;
  if (name == "stories260K")
    w = load_model_weights(testing::stories260k_path());
  else if (name == "random_d64")
    w = random_model(64, 64);
  else
    w = random_model(128, 128);
  return cache.emplace(name, std::move(w)).first->second;
}

struct GpuModel {
  std::unique_ptr<Backend> backend;
  std::unique_ptr<LlamaModel> model;
};

GpuModel make_model(const ModelWeights& w, bool graphs) {
  CudaBackendOptions o;
  o.cuda_graphs = graphs;
  GpuModel m;
  m.backend = make_cuda_backend(o);
  m.model = std::make_unique<LlamaModel>(*m.backend, w);
  return m;
}

class CudaGraphs : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ARBOR_REQUIRE_GPU();
    if (GetParam() == "stories260K" && !std::filesystem::exists(testing::stories260k_path()))
      GTEST_SKIP() << "stories260K not found at " << testing::stories260k_path();
  }

  // Requests of different lengths: three cross 512 keys while decoding (and 1024 for one),
  // the short ones finish first; half are repetitive (n-gram proposals get accepted).
  std::vector<GenerationRequest> requests(int64_t vocab) const {
    std::vector<GenerationRequest> reqs;
    std::mt19937 rng(99);
    std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(vocab) - 1);
    const std::vector<std::pair<int, int>> shapes = {{490, 48}, {7, 20},    {505, 40},
                                                     {250, 56}, {1010, 30}, {33, 64}};
    for (size_t i = 0; i < shapes.size(); ++i) {
      GenerationRequest r;
      r.prompt.push_back(1);
      std::vector<int32_t> motif;
      for (int k = 0; k < 3 + static_cast<int>(i); ++k) motif.push_back(tok(rng));
      while (static_cast<int>(r.prompt.size()) < shapes[i].first)
        r.prompt.push_back(i % 2 == 0 ? motif[r.prompt.size() % motif.size()] : tok(rng));
      r.sampling.temperature = 0;
      r.max_tokens = shapes[i].second;
      r.ignore_eos = true;
      reqs.push_back(std::move(r));
    }
    return reqs;
  }

  static GeneratorConfig config() {
    GeneratorConfig gc;
    gc.num_blocks = 640;
    gc.block_size = 16;
    gc.max_step_tokens = 512;
    return gc;
  }

  // The reference: plain greedy decoding of `reqs` without step graphs.
  static std::vector<GenerationResult> plain_without_graphs(
      const ModelWeights& w, const std::vector<GenerationRequest>& reqs);
};

void expect_equal(const std::vector<GenerationResult>& got,
                  const std::vector<GenerationResult>& want, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int equal = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(got[i].tokens, want[i].tokens) << what << ", request " << i;
    equal += got[i].tokens == want[i].tokens;
  }
  std::printf("  %-44s %d/%zu requests equal\n", what.c_str(), equal, got.size());
}

std::vector<GenerationResult> CudaGraphs::plain_without_graphs(
    const ModelWeights& w, const std::vector<GenerationRequest>& reqs) {
  GpuModel off = make_model(w, false);
  Generator plain(*off.model, config());
  return plain.run(reqs);
}

std::string describe(const StepGraphStats& s) {
  return std::to_string(s.captures) + " captures, " + std::to_string(s.replays) + " replays, " +
         std::to_string(s.eager) + " eager, " + std::to_string(s.capture_failures) + " failed, " +
         std::to_string(s.invalidations) + " invalidations";
}

TEST_P(CudaGraphs, GreedyDecodeWithGraphsEqualsWithout) {
  const ModelWeights& w = weights_of(GetParam());
  const auto reqs = requests(w.config.vocab_size);
  GpuModel off = make_model(w, false), on = make_model(w, true);
  ASSERT_FALSE(off.model->step_graphs());
  ASSERT_TRUE(on.model->step_graphs());
  Generator g_off(*off.model, config()), g_on(*on.model, config());
  const auto want = g_off.run(reqs);
  const auto got = g_on.run(reqs);
  const StepGraphStats s = on.model->step_graph_stats();
  std::printf("  %-16s plain decode with graphs: %s\n", GetParam().c_str(), describe(s).c_str());
  expect_equal(got, want, GetParam() + " plain: graphs on == off");
  EXPECT_EQ(off.model->step_graph_stats().replays + off.model->step_graph_stats().captures, 0);
  EXPECT_GT(s.captures, 0);
  EXPECT_EQ(s.capture_failures, 0);
  // Most decode steps replay: the batch shrinks five times, the block tables and the attention
  // grid change only at bucket boundaries.
  EXPECT_GT(s.replays, s.captures) << describe(s);

  // The same model again, its recordings warm: a second run replays from its first steps.
  const auto again = g_on.run(reqs);
  expect_equal(again, want, GetParam() + " plain: second run on warm graphs");

  // A new engine on the same model (a KV cache of the same shape, as spec-bench's runs and a
  // server restarted in-process make): the cache takes the old one's memory, the recordings
  // stay valid, and it records nothing new.
  const StepGraphStats before = on.model->step_graph_stats();
  Generator g_new(*on.model, config());
  const auto fresh = g_new.run(reqs);
  expect_equal(fresh, want, GetParam() + " plain: a new engine on warm graphs");
  const StepGraphStats after = on.model->step_graph_stats();
  EXPECT_EQ(after.invalidations, before.invalidations) << describe(after);
  EXPECT_EQ(after.captures, before.captures) << describe(after);
  EXPECT_GT(after.replays, before.replays) << describe(after);
  // Another shape moves the cache: the recordings over the old one are dropped.
  GeneratorConfig other = config();
  other.num_blocks = 320;
  Generator g_other(*on.model, other);
  expect_equal(g_other.run(reqs), want, GetParam() + " plain: another cache shape");
  EXPECT_GT(on.model->step_graph_stats().invalidations, after.invalidations);
}

TEST_P(CudaGraphs, SpeculativeGreedyWithGraphsEqualsPlain) {
  const ModelWeights& w = weights_of(GetParam());
  const auto reqs = requests(w.config.vocab_size);
  const auto want = plain_without_graphs(w, reqs);

  std::vector<std::pair<std::string, std::string>> methods = {{"ngram", ""}};
  // EAGLE-3's capture layers are copied into one step tensor, so its verify steps replay too.
  for (const std::string method : {"eagle", "eagle3"}) {
    const std::string heads =
        testing::test_data_dir() + "/spec/random/" + method + "_" + GetParam();
    if (std::filesystem::exists(heads)) methods.push_back({method, heads});
  }
  for (const auto& [method, heads] : methods) {
    // EAGLE's draft on the host, then on a CUDA backend launching into the target's stream
    // with step graphs of its own (as arbor serve / generate / spec-bench make it).
    for (const bool draft_on_target_stream : {false, true}) {
      if (draft_on_target_stream && method == "ngram") continue;
      SpecConfig sc;
      sc.method = parse_spec_method(method);
      sc.head_path = heads;
      sc.total_tokens = 16;  // small trees: shapes repeat, so verify steps get recorded too
      sc.ngram_max_nodes = 8;
      GpuModel on = make_model(w, true);
      std::unique_ptr<Backend> draft_backend;
      if (draft_on_target_stream) {
        draft_backend = make_cuda_backend_on_stream_of(CudaBackendOptions{}, *on.backend);
        ASSERT_EQ(static_cast<CudaBackend&>(*draft_backend).stream_handle(),
                  static_cast<CudaBackend&>(*on.backend).stream_handle());
      }
      auto proposer = make_proposer(sc, w, std::move(draft_backend));
      Generator spec(*on.model, config(), proposer.get());
      const auto got = spec.run(reqs);
      const StepGraphStats s = on.model->step_graph_stats();
      const std::string what =
          method + (draft_on_target_stream ? " (draft on the target's stream)" : "");
      std::printf(
          "  %-16s %s speculation with graphs: %s; draft: %s; acceptance %.2f tokens/step\n",
          GetParam().c_str(), what.c_str(), describe(s).c_str(),
          describe(proposer->draft_graph_stats()).c_str(),
          spec.stats().acceptance.mean_emitted_per_step());
      expect_equal(got, want, GetParam() + " " + what + " + graphs == plain without");
      EXPECT_GT(s.replays, 0) << what;
      if (method != "ngram") {
        EXPECT_GT(spec.stats().path_feedback_steps, 0) << what;
      }
      if (draft_on_target_stream) {
        EXPECT_GT(proposer->draft_graph_stats().replays, 0) << what;
      }
      EXPECT_EQ(s.capture_failures, 0) << what;
    }
  }
}

// Adaptive trees change each request's budget from step to step; with step graphs the engine
// rounds a decode step's token count up to a bucket (budgets raised, trees padded:
// EngineConfig::pad_trees), so verify steps replay a few recordings. Lossless on the GPU for
// trees grown on the host (n-gram), on the device (EAGLE's draft on a CUDA backend) and for
// Medusa's heads on a CUDA backend, whose tree tokens stay there (the extra children's ids come
// from the host, DeviceTokens::index -1); the recordings with and without the padding are
// printed.
class CudaAdaptiveGraphs : public CudaGraphs {};  // stories260K: its trained heads

TEST_P(CudaAdaptiveGraphs, AdaptiveTreesPaddedToBucketsEqualPlain) {
  const ModelWeights& w = weights_of(GetParam());
  const auto reqs = requests(w.config.vocab_size);
  const auto want = plain_without_graphs(w, reqs);
  const std::string heads = testing::test_data_dir() + "/heads/stories260K/";
  for (const auto& [method, dir] : std::vector<std::pair<std::string, std::string>>{
           {"ngram", ""}, {"eagle", heads + "eagle"}, {"medusa", heads + "medusa"}}) {
    for (const int32_t pad : {-1, 0}) {
      SpecConfig sc;
      sc.method = parse_spec_method(method);
      sc.head_path = dir;
      GpuModel on = make_model(w, true);
      auto proposer = make_proposer(
          sc, w,
          method == "ngram" ? nullptr
                            : make_cuda_backend_on_stream_of(CudaBackendOptions{}, *on.backend));
      GeneratorConfig gc = config();
      gc.adaptive_trees = true;
      gc.pad_trees = pad;
      gc.tree_budget = {16, 4};
      gc.cost.fixed_ms = 4.0;  // tree tokens cheap, not free: budgets differ per request
      gc.cost.per_token_ms = method == "ngram" ? 0.02 : 0.3;
      gc.cost.online = false;
      Generator spec(*on.model, gc, proposer.get());
      const auto got = spec.run(reqs);
      const StepGraphStats s = on.model->step_graph_stats();
      const std::string what = method + (pad == -1 ? ", adaptive, padded" : ", adaptive, unpadded");
      std::printf("  %-16s %s: %s; %lld tree tokens, %.2f tokens/step\n", GetParam().c_str(),
                  what.c_str(), describe(s).c_str(),
                  static_cast<long long>(spec.stats().tree_tokens),
                  spec.stats().acceptance.mean_emitted_per_step());
      expect_equal(got, want, GetParam() + " " + what + " == plain");
      EXPECT_EQ(s.capture_failures, 0) << what;
      EXPECT_GT(s.replays, 0) << what;
    }
  }
}

// A backend on another's stream (make_cuda_backend_on_stream_of) shares it, orders with it
// without events, and keeps working after the backend whose stream it took is gone.
TEST(CudaSharedStream, OutlivesThePeerAndKeepsOrder) {
  ARBOR_REQUIRE_GPU();
  auto target = make_cuda_backend();
  auto draft = make_cuda_backend_on_stream_of(CudaBackendOptions{}, *target);
  auto& t = static_cast<CudaBackend&>(*target);
  auto& d = static_cast<CudaBackend&>(*draft);
  ASSERT_EQ(t.stream_handle(), d.stream_handle());
  std::mt19937 rng(3);
  const HostTensor x = random_tensor(rng, {4, 64}, 1.f);
  std::vector<float> twice(x.data.size());
  for (size_t i = 0; i < twice.size(); ++i) twice[i] = x.data[i] + x.data[i];
  // Written by the target, read by the draft after wait_for (no event on one stream).
  const Tensor on_target = target->persistent(4, 64);
  target->upload(x.data.data(), on_target);
  draft->wait_for(*target);
  const Tensor sum = draft->persistent(4, 64);
  draft->add(on_target, on_target, sum);
  std::vector<float> back(x.data.size());
  draft->download(sum, back.data());
  EXPECT_EQ(back, twice);
  target.reset();  // the stream stays with the draft
  const Tensor mine = draft->persistent(4, 64);
  draft->upload(x.data.data(), mine);
  draft->add(mine, mine, sum);
  std::fill(back.begin(), back.end(), 0.f);
  draft->download(sum, back.data());
  EXPECT_EQ(back, twice);
  EXPECT_THROW(make_cuda_backend_on_stream_of(CudaBackendOptions{}, *make_cpu_backend(1)), Error);
}

// Graph timing (set_graph_timing) on two backends sharing a stream: each replay's device time,
// and the device time before it since the previous replay on the stream, counted against the
// backend replaying, as its own (same) or the other's (other). The host sleeps between the
// launches, so the device waits at least that long (the host clock is the reference); a gap
// over 1 ms (a step run op by op) is not counted.
TEST(CudaSharedStream, GraphTimingCountsTheDeviceGapsBetweenReplays) {
  ARBOR_REQUIRE_GPU();
  auto target = make_cuda_backend();
  auto draft = make_cuda_backend_on_stream_of(CudaBackendOptions{}, *target);
  const Tensor x = target->persistent(64, 256), y = target->persistent(64, 256);
  const std::vector<float> ones(64 * 256, 1.f);
  target->upload(ones.data(), x);
  const auto record = [&](Backend& b) {
    b.begin_step_capture();
    b.add(x, x, y);
    return b.end_step_capture();
  };
  const int64_t on_target = record(*target), on_draft = record(*draft);
  ASSERT_GE(on_target, 0);
  ASSERT_GE(on_draft, 0);
  target->set_graph_timing(true);
  draft->set_graph_timing(true);
  const TransferStats t0 = target->transfer_stats(), d0 = draft->transfer_stats();
  using Clock = std::chrono::steady_clock;
  double slept_ms[3] = {};
  const auto sleep = [&](int i) {
    const auto a = Clock::now();
    std::this_thread::sleep_for(std::chrono::microseconds(200));
    slept_ms[i] = std::chrono::duration<double, std::milli>(Clock::now() - a).count();
  };
  target->replay_step_graph(on_target);  // the first: no replay before it
  sleep(0);
  draft->replay_step_graph(on_draft);  // after the target's
  sleep(1);
  draft->replay_step_graph(on_draft);  // after its own
  sleep(2);
  target->replay_step_graph(on_target);  // after the draft's
  std::this_thread::sleep_for(std::chrono::milliseconds(3));
  draft->replay_step_graph(on_draft);  // 3 ms later: not counted as a gap
  static_cast<CudaBackend&>(*target).synchronize();
  const TransferStats t = target->transfer_stats() - t0, d = draft->transfer_stats() - d0;
  EXPECT_EQ(t.graphs_timed, 2);
  EXPECT_EQ(d.graphs_timed, 3);
  EXPECT_GT(t.graph_device_ms, 0.0);
  EXPECT_EQ(d.graph_gaps_other, 1);
  EXPECT_EQ(d.graph_gaps_same, 1);
  EXPECT_EQ(t.graph_gaps_other, 1);
  EXPECT_EQ(t.graph_gaps_same, 0);
  // The device waited for the host's sleep, less the replay before it (a few microseconds);
  // at most the host's time between the two launches.
  for (const auto& [gap, i] :
       {std::pair{d.graph_gap_other_ms, 0}, {d.graph_gap_same_ms, 1}, {t.graph_gap_other_ms, 2}}) {
    EXPECT_GT(gap, 0.8 * slept_ms[i]) << i;
    EXPECT_LT(gap, 1.0) << i;
  }
  EXPECT_EQ(t.graph_gap_same_ms, 0.0);
  // The draft goes first: its replays were read, the target's next replay counts no gap
  // against it.
  draft.reset();
  const TransferStats t1 = target->transfer_stats();
  target->replay_step_graph(on_target);
  static_cast<CudaBackend&>(*target).synchronize();
  const TransferStats after = target->transfer_stats() - t1;
  EXPECT_EQ(after.graphs_timed, 1);
  EXPECT_EQ(after.graph_gaps_same + after.graph_gaps_other, 0);
}

INSTANTIATE_TEST_SUITE_P(Models, CudaGraphs,
                         ::testing::Values("stories260K", "random_d64", "random_d128"),
                         [](const auto& info) { return info.param; });
INSTANTIATE_TEST_SUITE_P(Models, CudaAdaptiveGraphs, ::testing::Values("stories260K"),
                         [](const auto& info) { return info.param; });

// The EAGLE draft's own step graphs (its layer and head on a CUDA backend): tree expansions (one
// token per row, every row to the head) recorded and replayed, between feedback forwards
// (committed feature rows, each sequence's last row to the head) that run op by op, against the
// same draft without graphs, bit for bit: layer outputs, top-k ids and values. The expansion's
// shape repeats, so it is recorded at its second sighting and replayed after; a feedback of the
// same token count and head rows must not replay it.
class CudaDraftGraphs : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    ARBOR_REQUIRE_GPU();
    ASSERT_TRUE(std::filesystem::exists(testing::stories260k_path()))
        << "stories260K not found at " << testing::stories260k_path();
  }
};

// The random EAGLE draft of tests/data/spec/random named `name` (eagle3_*: EAGLE-3) for
// stories260K; "<name>_token_map": that EAGLE-1/2 draft restricted to a token map (every third
// id of the vocabulary, highest first: a non-contiguous draft vocabulary in another order).
EagleWeights random_draft(const std::string& name) {
  const std::string suffix = "_token_map";
  const bool mapped = name.size() > suffix.size() &&
                      name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
  const std::string dir = mapped ? name.substr(0, name.size() - suffix.size()) : name;
  const EagleVersion version =
      dir.rfind("eagle3", 0) == 0 ? EagleVersion::kEagle3 : EagleVersion::kEagle1;
  EagleWeights w = load_eagle_checkpoint(testing::test_data_dir() + "/spec/random/" + dir, version);
  if (mapped) restrict_draft_vocab(&w, test::every_third_descending(w.config.vocab_size));
  return w;
}

TEST_P(CudaDraftGraphs, EagleDraftReplaysEqualEagerSteps) {
  const ModelWeights& w = weights_of("stories260K");
  const EagleWeights ck = random_draft(GetParam());
  auto make_draft = [&](bool graphs) {
    CudaBackendOptions o;
    o.cuda_graphs = graphs;
    return std::make_unique<EagleDraftModel>(make_cuda_backend(o), ck, w.embed, w.output_weight(),
                                             KvCacheConfig{256, 16, false});
  };
  auto off = make_draft(false), on = make_draft(true);
  const int64_t fw = on->feature_width(), h = on->hidden_size();
  const int32_t vocab = static_cast<int32_t>(w.config.vocab_size), k = 4;
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> feat(-1.f, 1.f);
  std::uniform_int_distribution<int32_t> tok(3, vocab - 1);
  auto random_tokens = [&](int n) {
    std::vector<int32_t> t(static_cast<size_t>(n));
    for (auto& x : t) x = tok(rng);
    return t;
  };
  auto random_features = [&](int64_t n, int64_t width) {
    std::vector<float> f(static_cast<size_t>(n * width));
    for (auto& x : f) x = feat(rng);
    return f;
  };
  auto expect_same_top = [](const TopKRows& a, const TopKRows& b, const std::string& what) {
    EXPECT_EQ(a.ids, b.ids) << what;
    EXPECT_EQ(a.values, b.values) << what;
  };
  struct Seqs {
    SeqId a, b;
  };
  const Seqs s_off{off->create_sequence(), off->create_sequence()};
  const Seqs s_on{on->create_sequence(), on->create_sequence()};
  int32_t len = 0;  // both sequences advance together
  for (int round = 0; round < 4; ++round) {
    for (int per_seq : {1, 3}) {  // feedbacks of 2 and 6 tokens, 2 head rows
      const auto ta = random_tokens(per_seq), tb = random_tokens(per_seq);
      const auto fa = random_features(per_seq, fw), fb = random_features(per_seq, fw);
      std::vector<std::vector<TopKRows>> tops(2);
      std::vector<std::vector<float>> outs;
      int which = 0;
      for (auto* m : {off.get(), on.get()}) {
        const Seqs& s = m == off.get() ? s_off : s_on;
        const EagleDraftModel::AppendItem items[2] = {{s.a, ta, fa, len}, {s.b, tb, fb, len}};
        outs.push_back(m->append_batch(items, k, &tops[static_cast<size_t>(which++)]));
      }
      const std::string what = GetParam() + " feedback round " + std::to_string(round) + " of " +
                               std::to_string(per_seq) + " tokens per sequence";
      EXPECT_EQ(outs[0], outs[1]) << what;
      ASSERT_EQ(tops[0].size(), 2u);
      ASSERT_EQ(tops[1].size(), 2u);
      for (size_t i = 0; i < 2; ++i) expect_same_top(tops[0][i], tops[1][i], what);
      len += per_seq;
    }
    // An expansion of both sequences: 2 tokens, 2 head rows, like the 1-token feedback above.
    const auto t = random_tokens(2);
    const auto hidden = random_features(2, h);
    std::vector<TopKRows> tops(2);
    std::vector<std::vector<float>> outs;
    int which = 0;
    for (auto* m : {off.get(), on.get()}) {
      const Seqs& s = m == off.get() ? s_off : s_on;
      const SeqId parents[2] = {s.a, s.b};
      std::vector<SeqId> children;
      outs.push_back(
          m->expand(parents, t, hidden, len, &children, k, &tops[static_cast<size_t>(which++)]));
      for (SeqId c : children) m->free_sequence(c);
    }
    const std::string what = GetParam() + " expansion round " + std::to_string(round);
    EXPECT_EQ(outs[0], outs[1]) << what;
    expect_same_top(tops[0], tops[1], what);
  }
  const StepGraphStats st = on->step_graph_stats();
  EXPECT_EQ(off->step_graph_stats().captures + off->step_graph_stats().replays, 0);
  // Three shapes, each seen four times: run eagerly at its first sighting, recorded at the
  // second, replayed at the third and fourth (the block-table width is the same bucket
  // throughout): the expansion, and the feedbacks of 2 rows and of 6 (as one-token requests,
  // padded to 8 rows); each feedback's 2 head rows are its items' last rows.
  EXPECT_EQ(st.eager, 3) << GetParam();
  EXPECT_EQ(st.captures, 3) << GetParam();
  EXPECT_EQ(st.replays, 6) << GetParam();
  EXPECT_EQ(st.capture_failures, 0) << GetParam();
}

// EAGLE-2 trees grown on the device (EagleOptions::grow_on_backend: every frontier chosen on the
// GPU, key paths into slots reserved after the committed rows, every depth in one step, one wait
// at the end) are the trees of the host loop (a forked sequence per node, the frontier chosen on
// the host after each depth's wait), for four requests of different lengths (one past a 64-key
// tile, budgets of different depths) over several rounds of random feedback,
// with and without step graphs; once its shapes have been seen, the draft waits for the device
// once per propose_batch (the final download: the backlog's forward leaves its outputs and
// their top-k on the device as the roots) where the host loop waits for the backlog's outputs,
// their top-k and once per depth.
TEST_P(CudaDraftGraphs, EagleTreesGrownOnTheDeviceEqualTheHostLoop) {
  const ModelWeights& w = weights_of("stories260K");
  const EagleWeights ck = random_draft(GetParam());
  for (bool graphs : {false, true}) {
    auto make = [&](int on_backend, int pick = 0) {
      EagleOptions o;
      o.tree = {24, 4, 5};
      o.draft_kv = {256, 16, false};
      o.grow_on_backend = on_backend;
      o.pick_on_backend = pick;
      CudaBackendOptions bo;
      bo.cuda_graphs = graphs;
      return std::make_unique<EagleProposer>(ck, w, o, make_cuda_backend(bo));
    };
    // picked: grown and picked on the device (Backend::draft_frontier_trees; no wait at all).
    auto host = make(0), device = make(1), picked = make(1, 1);
    const std::unique_ptr<Backend> reader = make_cuda_backend();  // the engine's part
    picked->set_tree_reader(reader.get());
    const int64_t h = w.config.hidden_size;
    const int32_t vocab = static_cast<int32_t>(w.config.vocab_size);
    std::mt19937 rng(5);
    std::uniform_real_distribution<float> feat(-2.f, 2.f);
    std::uniform_int_distribution<int32_t> tok(3, vocab - 1);
    const std::vector<RequestId> ids = {1, 2, 3, 8};  // 8: past 64 keys (a second KV tile)
    std::map<RequestId, int32_t> pos;
    std::map<RequestId, std::vector<int32_t>> prompts;
    std::map<RequestId, int32_t> next;
    for (RequestId id : ids) {
      std::vector<int32_t>& prompt = prompts[id];
      prompt.resize(static_cast<size_t>(5 + 7 * id));
      for (auto& t : prompt) t = tok(rng);
      host->begin(id, prompt);
      device->begin(id, prompt);
      picked->begin(id, prompt);
      pos[id] = 0;
    }
    const size_t layers = host->capture_layers().size();
    int64_t waits = 0, picked_waits = 0, calls = 0;
    for (int round = 0; round < 12; ++round) {
      for (RequestId id : ids) {
        const int32_t n = round == 0 ? 5 + 7 * static_cast<int32_t>(id) : 1 + round % 3;
        std::vector<int32_t> tokens(static_cast<size_t>(n));
        for (auto& t : tokens) t = tok(rng);
        if (round == 0)
          tokens = prompts[id];  // the prefill's rows
        else
          tokens[0] = next[id];  // the root the last feedback named
        std::vector<float> hidden(static_cast<size_t>(n * h));
        for (auto& x : hidden) x = feat(rng);
        std::vector<std::vector<float>> captured(layers, std::vector<float>(hidden.size()));
        for (auto& c : captured)
          for (auto& x : c) x = feat(rng);
        TargetFeedback fb;
        fb.request = id;
        fb.start = pos[id];
        fb.tokens = tokens;
        if (host->needs_hidden()) fb.hidden = hidden;
        for (const auto& c : captured) fb.captured.emplace_back(c);
        fb.next_token = next[id] = tok(rng);
        host->observe(fb);
        device->observe(fb);
        picked->observe(fb);
        pos[id] += n;
      }
      const std::vector<std::pair<RequestId, TreeBudget>> want = {
          {1, TreeBudget{24, 6}},
          {2, TreeBudget{round % 2 ? 12 : 24, 6}},
          {3, TreeBudget{24, 3}},
          {8, TreeBudget{24, 6}}};
      const std::vector<DraftTree> a = host->propose_batch(want);
      const TransferStats before = device->draft_transfer_stats();
      const std::vector<DraftTree> b = device->propose_batch(want);
      const TransferStats picked_before = picked->draft_transfer_stats();
      std::vector<DraftTree> c = picked->propose_batch(want);
      if (round >= 6) {  // shapes seen before (the first sightings tune GEMMs, with waits)
        waits += (device->draft_transfer_stats() - before).syncs;
        picked_waits += (picked->draft_transfer_stats() - picked_before).syncs;
        ++calls;
      }
      for (DraftTree& t : c) {  // read the picked trees' tokens and parents back
        ASSERT_EQ(t.device.parent_index.size(), static_cast<size_t>(t.size()));
        std::vector<int64_t> index = t.device.index;
        index.insert(index.end(), t.device.parent_index.begin(), t.device.parent_index.end());
        std::vector<int32_t> ids;
        t.device.owner->download_ids(t.device.ids, index, &ids);
        for (int32_t n = 1; n < t.size(); ++n) {
          t.token[static_cast<size_t>(n)] = ids[static_cast<size_t>(n)];
          t.parent[static_cast<size_t>(n)] = ids[static_cast<size_t>(t.size() + n)];
        }
      }
      ASSERT_EQ(a.size(), b.size());
      for (size_t i = 0; i < a.size(); ++i) {
        const std::string what = GetParam() + (graphs ? " graphs" : " eager") + " round " +
                                 std::to_string(round) + " request " + std::to_string(i);
        EXPECT_EQ(a[i].token, b[i].token) << what;
        EXPECT_EQ(a[i].parent, b[i].parent) << what;
        EXPECT_GT(b[i].size(), 1) << what;
        EXPECT_EQ(a[i].token, c[i].token) << what << " picked on the device";
        EXPECT_EQ(a[i].parent, c[i].parent) << what << " picked on the device";
      }
    }
    std::printf("  %s %s: %.1f device waits per propose_batch grown on the device\n",
                GetParam().c_str(), graphs ? "graphs" : "eager",
                static_cast<double>(waits) / static_cast<double>(calls));
    EXPECT_LE(waits, calls);
    EXPECT_EQ(picked_waits, 0) << "trees picked on the device: the draft never waits";
    if (graphs) {  // every depth in one recording, replayed once the shape repeats
      const StepGraphStats st = device->draft_graph_stats();
      EXPECT_GT(st.replays, 0) << describe(st);
      EXPECT_EQ(st.capture_failures, 0) << describe(st);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Drafts, CudaDraftGraphs,
                         ::testing::Values("eagle_stories260K", "eagle3_stories260K",
                                           "eagle_stories260K_token_map"),
                         [](const auto& info) { return info.param; });

// EAGLE with its trees grown and picked on the GPU (the trained stories260K heads, the draft on
// a CUDA backend, batch-invariant target): the verify step lays the trees out from the draft's
// memory (positions, masks and the attention plan's node paths rebuilt on the device), and the
// greedy tokens equal plain decoding's and those of the trees picked on the host, with the same
// number of steps; a step waits for the device once in steady state (the host pick: twice). The
// verified paths run through the draft from the verify step's device results before its wait
// (EagleOptions::paths_on_device, the default on a GPU) or after it from the host's copy, and the
// next trees grown before the wait too (EagleOptions::grow_before_wait, -1: on a GPU): the same
// trees, so the same tokens and steps.
TEST(CudaDraftPicks, EagleTreesPickedOnTheDeviceVerifyWithOneWait) {
  const ModelWeights& w = weights_of("stories260K");
  std::vector<GenerationRequest> reqs;
  std::mt19937 rng(11);
  std::uniform_int_distribution<int32_t> tok(3, static_cast<int32_t>(w.config.vocab_size) - 1);
  for (int i = 0; i < 6; ++i) {
    GenerationRequest r;
    r.prompt = {1};
    for (int j = 0; j < 4 + 3 * i; ++j) r.prompt.push_back(tok(rng));
    r.sampling.temperature = 0;
    r.max_tokens = 48;
    r.ignore_eos = true;
    reqs.push_back(r);
  }
  GeneratorConfig gc;
  gc.num_blocks = 256;
  gc.block_size = 16;
  gc.max_step_tokens = 256;
  auto backend = make_cuda_backend();
  LlamaModel model(*backend, w);
  const auto plain = Generator(model, gc).run(reqs);
  std::vector<int64_t> steps;
  // {pick on the device, paths on the device, next trees grown before the wait}
  for (auto [pick, paths, early] :
       {std::tuple{0, -1, 0}, std::tuple{1, 0, 0}, std::tuple{1, -1, 0}, std::tuple{1, -1, -1}}) {
    SpecConfig sc;
    sc.method = SpecMethod::kEagle;
    sc.head_path = testing::test_data_dir() + "/heads/stories260K/eagle";
    sc.total_tokens = 16;
    sc.depth = 3;
    sc.top_k = 4;
    sc.pick_on_device = pick;
    sc.paths_on_device = paths;
    sc.grow_before_wait = early;
    auto proposer = make_proposer(sc, w, make_cuda_backend());
    Generator(model, gc, proposer.get()).run(reqs);  // warm-up: GEMM tuning, recordings
    Generator g(model, gc, proposer.get());
    const TransferStats x0 = backend->transfer_stats() + proposer->draft_transfer_stats();
    const StepGraphStats d0 = proposer->draft_graph_stats();
    const auto got = g.run(reqs);
    const TransferStats x = backend->transfer_stats() + proposer->draft_transfer_stats() - x0;
    const StepGraphStats d = proposer->draft_graph_stats();
    std::printf("  draft graphs: %lld eager, %lld recorded, %lld replayed; syncs: target %lld\n",
                static_cast<long long>(d.eager - d0.eager),
                static_cast<long long>(d.captures - d0.captures),
                static_cast<long long>(d.replays - d0.replays),
                static_cast<long long>(backend->transfer_stats().syncs));
    const std::string what = std::string(pick ? "picked on the device" : "picked on the host") +
                             (paths == 0 ? ", paths from the host" : ", paths on the device") +
                             (early != 0 ? ", grown before the wait" : "");
    for (size_t i = 0; i < reqs.size(); ++i)
      EXPECT_EQ(got[i].tokens, plain[i].tokens) << what << ", request " << i;
    const double per_step = static_cast<double>(x.syncs) / static_cast<double>(g.stats().steps);
    std::printf("  EAGLE %s: %lld steps, %.2f host syncs per step, %.2f tokens per step\n",
                what.c_str(), static_cast<long long>(g.stats().steps), per_step,
                g.stats().acceptance.mean_emitted_per_step());
    EXPECT_GT(g.stats().acceptance.mean_emitted_per_step(), 1.2) << what;
    if (pick) {
      EXPECT_GT(g.stats().device_token_steps, g.stats().steps / 2);
      EXPECT_GT(g.stats().draft_device_seconds, 0.0) << "the draft's device time, read back";
      // One wait per step, the prefill's features aside; with the paths on the device also one
      // for a step that mixes trees rooted there with rows waiting on the host (a request that
      // decoded without a tree the step before: those rows' outputs come to the host), 4 in
      // these 29 steps (1.02 waits per step in spec-bench's steady state either way).
      EXPECT_LE(x.syncs, g.stats().steps + (paths == 0 ? 4 : 8))
          << "one wait per step (the prefill's features aside)";
    }
    if (paths != 0)
      EXPECT_GT(g.stats().device_path_steps, g.stats().steps / 2) << what;
    else
      EXPECT_EQ(g.stats().device_path_steps, 0) << what;
    const auto& eagle = dynamic_cast<const EagleProposer&>(*proposer);
    const int64_t early_trees = eagle.trees_grown_before_wait();
    std::printf("  %lld steps took trees grown before the wait (both runs)\n",
                static_cast<long long>(early_trees));
    if (early != 0)
      EXPECT_GT(early_trees, g.stats().steps / 2) << what;
    else
      EXPECT_EQ(early_trees, 0) << what;
    steps.push_back(g.stats().steps);
  }
  for (size_t i = 1; i < steps.size(); ++i)
    EXPECT_EQ(steps[0], steps[i]) << "the same trees take the same steps";
}

// Op-level: one decode step recorded, then replayed with new metadata (next tokens, one more
// committed key, a request crossing a split boundary) gives the logits of the same steps run
// op by op, bit for bit (same kernels, same launch values read from device memory).
// The op-level tests' pair: random_d128 without and with step graphs, each with a KV cache of
// 256 blocks of 16.
struct ModelPair {
  GpuModel off, on;
};
ModelPair op_level_pair(const ModelWeights& w) {
  ModelPair p{make_model(w, false), make_model(w, true)};
  for (GpuModel* m : {&p.off, &p.on}) m->backend->allocate_kv(m->model->kv_shape(256, 16));
  return p;
}

// Request r's block table: blocks [r * width, (r + 1) * width) in a scrambled order (stride
// coprime to width).
std::vector<int32_t> scrambled_table(int r, int width, int stride) {
  std::vector<int32_t> t;
  for (int b = 0; b < width; ++b) t.push_back(r * width + (b * stride) % width);
  return t;
}

constexpr int64_t kTestBlock = 16;

// A step with no request yet, block tables `width` wide.
StepInputs empty_step(int width) {
  StepInputs s;
  s.qo_indptr = {0};
  s.mask_indptr = {0};
  s.max_blocks_per_request = width;
  return s;
}

// The cache slot of logical key `pos` under `table`.
int64_t slot_of(const std::vector<int32_t>& table, int32_t pos) {
  return int64_t{table[static_cast<size_t>(pos / kTestBlock)]} * kTestBlock + pos % kTestBlock;
}

// Closes the request whose tokens (and mask words) were appended last: after `committed` keys,
// its block table `table`.
void end_request(StepInputs* s, int32_t committed, const std::vector<int32_t>& table) {
  s->qo_indptr.push_back(static_cast<int32_t>(s->token_ids.size()));
  s->mask_indptr.push_back(static_cast<int32_t>(s->tree_mask.size()));
  s->committed_len.push_back(committed);
  s->block_tables.insert(s->block_tables.end(), table.begin(), table.end());
}

// A causal step: request r appends t_new[r] random tokens (ids 3..511) after committed[r] keys,
// its block table scrambled_table(r, width, stride); one logits row per request (its last token).
StepInputs causal_step(const std::vector<int32_t>& committed, const std::vector<int32_t>& t_new,
                       int width, int stride, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> tok(3, 511);
  StepInputs s = empty_step(width);
  for (size_t r = 0; r < committed.size(); ++r) {
    const auto table = scrambled_table(static_cast<int>(r), width, stride);
    for (int32_t i = 0; i < t_new[r]; ++i) {
      const int32_t pos = committed[r] + i;
      s.token_ids.push_back(tok(rng));
      s.positions.push_back(pos);
      s.slot_mapping.push_back(slot_of(table, pos));
    }
    s.logits_rows.push_back(static_cast<int32_t>(s.token_ids.size()) - 1);
    end_request(&s, committed[r], table);
  }
  return s;
}

// A verify step: request r (of sizes.size()) scores a random tree of sizes[r] nodes (ids
// 3..511) after committed[r] keys, its block table scrambled_table(r, width, stride); every node
// a logits row.
StepInputs tree_step(const std::vector<int32_t>& committed, const std::vector<int32_t>& sizes,
                     int width, int stride, std::mt19937& rng) {
  std::uniform_int_distribution<int32_t> tok(3, 511);
  StepInputs s = empty_step(width);
  for (size_t r = 0; r < sizes.size(); ++r) {
    const auto table = scrambled_table(static_cast<int>(r), width, stride);
    const int32_t t = sizes[r], c = committed[r];
    std::vector<int32_t> parent(static_cast<size_t>(t), -1), depth(static_cast<size_t>(t), 0);
    std::vector<uint32_t> rows(static_cast<size_t>(t), 0);
    for (int32_t i = 0; i < t; ++i) {
      if (i > 0) {
        parent[static_cast<size_t>(i)] = std::uniform_int_distribution<int32_t>(0, i - 1)(rng);
        depth[static_cast<size_t>(i)] = depth[static_cast<size_t>(parent[i])] + 1;
        rows[static_cast<size_t>(i)] = rows[static_cast<size_t>(parent[i])];
      }
      rows[static_cast<size_t>(i)] |= 1u << i;
      s.token_ids.push_back(tok(rng));
      s.positions.push_back(c + depth[static_cast<size_t>(i)]);
      s.slot_mapping.push_back(slot_of(table, c + i));
      s.logits_rows.push_back(static_cast<int32_t>(s.token_ids.size()) - 1);
    }
    s.tree_mask.insert(s.tree_mask.end(), rows.begin(), rows.end());  // one word per row
    end_request(&s, c, table);
  }
  return s;
}

// Prefills `committed[r]` keys of each request r on both models, identically.
void prefill_pair(ModelPair& p, const std::vector<int32_t>& committed, int width,
                  std::mt19937& rng) {
  const StepInputs s =
      causal_step(std::vector<int32_t>(committed.size(), 0), committed, width, 5, rng);
  for (GpuModel* m : {&p.off, &p.on}) {
    ForwardOutput o;
    m->model->forward(s, &o);
  }
}

// Runs `s` on both models (graphs off, on) and expects the same logits bit for bit.
void expect_bitwise_pair(ModelPair& p, const StepInputs& s, size_t rows, int64_t vocab,
                         const std::string& what) {
  ForwardOutput a, b;
  p.off.model->forward(s, &a);
  p.on.model->forward(s, &b);
  ASSERT_EQ(a.logits.size(), b.logits.size());
  ASSERT_EQ(a.logits.size(), rows * static_cast<size_t>(vocab));
  EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)))
      << what;
}

TEST(CudaGraphsModel, ReplayWithChangingMetadataIsBitwiseEager) {
  ARBOR_REQUIRE_GPU();
  const ModelWeights& w = weights_of("random_d128");
  auto [off, on] = op_level_pair(w);
  // Two requests: contexts 500 and 40, prefilled identically on both.
  std::mt19937 rng(5);
  const std::vector<int32_t> lens = {500, 40};
  const StepInputs prefill = causal_step({0, 0}, lens, 48, 7, rng);
  for (GpuModel* m : {&off, &on}) {
    ForwardOutput o;
    m->model->forward(prefill, &o);
  }
  std::vector<int32_t> committed = lens;
  int compared = 0;
  for (int step = 0; step < 24; ++step) {  // request 0 crosses 512 keys at step 12
    const StepInputs s = causal_step(committed, {1, 1}, 48, 7, rng);
    ForwardOutput a, b;
    off.model->forward(s, &a);
    on.model->forward(s, &b);
    ASSERT_EQ(a.logits.size(), b.logits.size());
    EXPECT_EQ(0, std::memcmp(a.logits.data(), b.logits.data(), a.logits.size() * sizeof(float)))
        << "step " << step;
    ++compared;
    for (int32_t& c : committed) ++c;
  }
  const StepGraphStats st = on.model->step_graph_stats();
  std::printf("  random_d128 op-level decode: %d steps bitwise equal; %s\n", compared,
              describe(st).c_str());
  EXPECT_EQ(st.captures, 1) << describe(st);      // one key for all 24 steps (buckets hold)
  EXPECT_EQ(st.replays, 24 - 2) << describe(st);  // one eager step, one recording
}

// Op-level: verify steps whose 16 tree tokens split differently into two requests' trees
// ((1, 15), (8, 8), (13, 3), ...) with random shapes share one key (the step's token count,
// not the per-request sizes, CudaBackend::set_step keeping the masks last) and replay one
// recording, with logits bit for bit those of the same steps run op by op.
TEST(CudaGraphsModel, TreesSplittingOneTotalDifferentlyReplayOneGraph) {
  ARBOR_REQUIRE_GPU();
  const ModelWeights& w = weights_of("random_d128");
  ModelPair pair = op_level_pair(w);
  std::mt19937 rng(9);
  const int32_t width = 48;
  const std::vector<int32_t> committed = {300, 90};
  prefill_pair(pair, committed, width, rng);
  const std::vector<std::pair<int32_t, int32_t>> splits = {
      {8, 8}, {8, 8}, {1, 15}, {15, 1}, {13, 3}, {4, 12}, {9, 7}, {2, 14}, {11, 5}, {6, 10}};
  for (size_t step = 0; step < splits.size(); ++step) {
    const std::vector<int32_t> sizes = {splits[step].first, splits[step].second};
    expect_bitwise_pair(pair, tree_step(committed, sizes, width, 5, rng), 16, w.config.vocab_size,
                        "step " + std::to_string(step) + ": trees of " + std::to_string(sizes[0]) +
                            " and " + std::to_string(sizes[1]));
  }
  const StepGraphStats st = pair.on.model->step_graph_stats();
  std::printf("  random_d128 op-level verify, one total split %zu ways: %s\n", splits.size(),
              describe(st).c_str());
  // Only the first two splits are alike: with the per-request sizes in the key nothing would
  // replay. The attention grid (a launch value, in the backend's part of the key) depends on how
  // the planner groups each tree's nodes, so it may take two sizes (two recordings, each made
  // at its key's second sighting and run once as it is made).
  EXPECT_LE(st.captures, 2) << describe(st);
  EXPECT_GE(st.replays, static_cast<int64_t>(splits.size()) - 4) << describe(st);
}

// Op-level: verify steps of 16 tree tokens over 2, 3 or 4 requests share one key. The key
// holds the request capacity (graph_request_capacity: 8 for all three), not the request count,
// since CudaBackend::set_step lays the per-request metadata out for that capacity; as a batch's
// tail loses requests it keeps replaying the full batch's recordings. Logits bit for bit those
// of the same steps run op by op.
TEST(CudaGraphsModel, RequestCountsUnderOneCapacityReplayOneGraph) {
  ARBOR_REQUIRE_GPU();
  const ModelWeights& w = weights_of("random_d128");
  ModelPair pair = op_level_pair(w);
  std::mt19937 rng(13);
  const int32_t width = 48;
  const std::vector<int32_t> committed = {300, 90, 170, 45};
  prefill_pair(pair, committed, width, rng);
  const std::vector<std::vector<int32_t>> splits = {
      {8, 8},  {5, 6, 5}, {4, 4, 4, 4}, {1, 15}, {3, 3, 10}, {7, 1, 2, 6},
      {12, 4}, {9, 2, 5}, {2, 5, 8, 1}, {10, 6}, {1, 14, 1}, {3, 6, 3, 4}};
  for (size_t step = 0; step < splits.size(); ++step)
    expect_bitwise_pair(
        pair, tree_step(committed, splits[step], width, 5, rng), 16, w.config.vocab_size,
        "step " + std::to_string(step) + ": " + std::to_string(splits[step].size()) + " requests");
  const StepGraphStats st = pair.on.model->step_graph_stats();
  std::printf("  random_d128 op-level verify, 16 tree tokens over 2-4 requests: %s\n",
              describe(st).c_str());
  // With the request count in the key, 3 keys: 3 eager steps and 3 recordings, 6 replays.
  EXPECT_LE(st.captures, 2) << describe(st);
  EXPECT_GE(st.replays, static_cast<int64_t>(splits.size()) - 4) << describe(st);
}

}  // namespace
}  // namespace arbor
