// Host hash-map lookups on the step's path: std::unordered_map (what the engine, scheduler, KV
// manager and proposers use) against absl::flat_hash_map, at the sizes and key patterns they
// see: request / sequence ids (small, sequential; a batch of 64) and prefix-block hashes
// (64-bit, random; a pool of 4096 blocks, half the lookups missing). docs/server.md cites it.
//   ./build/tests/bench/host_map_bench --benchmark_min_time=0.2
#include <benchmark/benchmark.h>

#include <cstdint>
#include <memory>
#include <random>
#include <unordered_map>
#include <vector>

#include <absl/container/flat_hash_map.h>

namespace {

struct Entry {  // a per-request record of the size the engine's tables hold (a pointer)
  std::unique_ptr<int64_t> state = std::make_unique<int64_t>(0);
};

template <class Map>
void BM_RequestTable(benchmark::State& state) {
  const int64_t batch = state.range(0);
  Map table;
  std::vector<uint64_t> ids;
  for (int64_t i = 0; i < batch; ++i) {
    ids.push_back(1000 + static_cast<uint64_t>(i) * 3);  // ids as the engine hands them out
    table[ids.back()] = Entry{};
  }
  for (auto _ : state)
    for (uint64_t id : ids) benchmark::DoNotOptimize(table.find(id)->second.state.get());
  state.SetItemsProcessed(state.iterations() * batch);
}

template <class Map>
void BM_PrefixBlocks(benchmark::State& state) {
  const int64_t blocks = state.range(0);
  std::mt19937_64 rng(7);
  Map cache;
  std::vector<uint64_t> probes;
  for (int64_t i = 0; i < blocks; ++i) {
    const uint64_t h = rng();
    cache[h] = static_cast<int32_t>(i);
    if (i % 2 == 0) probes.push_back(h);  // hits
    probes.push_back(rng());              // misses
  }
  for (auto _ : state)
    for (uint64_t h : probes) benchmark::DoNotOptimize(cache.find(h) != cache.end());
  state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(probes.size()));
}

using StdTable = std::unordered_map<uint64_t, Entry>;
using AbslTable = absl::flat_hash_map<uint64_t, Entry>;
using StdBlocks = std::unordered_map<uint64_t, int32_t>;
using AbslBlocks = absl::flat_hash_map<uint64_t, int32_t>;

BENCHMARK_TEMPLATE(BM_RequestTable, StdTable)->Arg(8)->Arg(64)->Arg(256);
BENCHMARK_TEMPLATE(BM_RequestTable, AbslTable)->Arg(8)->Arg(64)->Arg(256);
BENCHMARK_TEMPLATE(BM_PrefixBlocks, StdBlocks)->Arg(4096)->Arg(65536);
BENCHMARK_TEMPLATE(BM_PrefixBlocks, AbslBlocks)->Arg(4096)->Arg(65536);

}  // namespace

BENCHMARK_MAIN();
