#include "engine/kv_cache/block_hash.h"

namespace arbor {

namespace {
// splitmix64 finaliser: a bijective 64-bit mixer with full avalanche.
uint64_t mix64(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}
}  // namespace

uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent_hash ^ (0x9e3779b97f4a7c15ull * (tokens.size() + 1)));
  for (int32_t t : tokens) h = mix64(h + 0x9e3779b97f4a7c15ull + static_cast<uint32_t>(t));
  return h;
}

}  // namespace arbor
