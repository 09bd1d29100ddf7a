// Content hash of one FULL KV block for automatic prefix sharing: the hash chains the parent
// block's hash with the block's token ids, so equal hashes name equal whole prefixes (vLLM's
// prefix-caching key). Pure function; the pool stores (parent hash, tokens) to rule out
// token-level collisions on lookup.
#pragma once

#include <cstdint>
#include <span>

namespace arbor {

// Parent hash of a sequence's first block.
inline constexpr uint64_t kRootBlockHash = 0x6a09e667f3bcc908ull;

// Hash of a full block whose predecessor block has hash `parent_hash` (kRootBlockHash for the
// first block) and whose slots hold `tokens` ([block_size] token ids). Deterministic across
// platforms and runs.
uint64_t hash_block(uint64_t parent_hash, std::span<const int32_t> tokens);

}  // namespace arbor
