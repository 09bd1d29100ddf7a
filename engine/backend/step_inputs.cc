#include "engine/backend/backend.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <numbers>

#include "engine/core/error.h"

namespace arbor {

namespace {
[[noreturn]] void bad_step(const std::string& msg) {
  throw_error(ErrorCode::kInvalidArgument, "invalid step: " + msg);
}
}  // namespace

void StepInputs::validate(const KvCacheShape& kv) const {
  const size_t n = token_ids.size();
  if (positions.size() != n || slot_mapping.size() != n)
    bad_step("token_ids has " + std::to_string(n) + " entries but positions has " +
             std::to_string(positions.size()) + " and slot_mapping " +
             std::to_string(slot_mapping.size()));
  const int32_t r = num_requests();
  if (r <= 0) bad_step("qo_indptr must have at least 2 entries");
  if (qo_indptr[0] != 0 || qo_indptr[r] != static_cast<int32_t>(n))
    bad_step("qo_indptr must start at 0 and end at num_tokens " + std::to_string(n));
  if (committed_len.size() != static_cast<size_t>(r))
    bad_step("committed_len has " + std::to_string(committed_len.size()) + " entries, expected " +
             std::to_string(r));
  if (mask_indptr.size() != static_cast<size_t>(r) + 1)
    bad_step("mask_indptr has " + std::to_string(mask_indptr.size()) + " entries, expected " +
             std::to_string(r + 1));
  if (block_tables.size() != static_cast<size_t>(r) * static_cast<size_t>(max_blocks_per_request))
    bad_step("block_tables has " + std::to_string(block_tables.size()) + " entries, expected " +
             std::to_string(r) + " x " + std::to_string(max_blocks_per_request));
  const int64_t total_slots = kv.num_blocks * kv.block_size;
  for (int32_t q = 0; q < r; ++q) {
    const int32_t t = qo_indptr[q + 1] - qo_indptr[q];
    if (t <= 0) bad_step("request " + std::to_string(q) + " has no query rows");
    const int64_t kv_len = static_cast<int64_t>(committed_len[q]) + t;
    const int64_t blocks_needed = (kv_len + kv.block_size - 1) / kv.block_size;
    if (blocks_needed > max_blocks_per_request)
      bad_step("request " + std::to_string(q) + " needs " + std::to_string(blocks_needed) +
               " blocks for " + std::to_string(kv_len) + " keys but the block table holds " +
               std::to_string(max_blocks_per_request));
    for (int64_t b = 0; b < blocks_needed; ++b) {
      const int32_t id = block_tables[static_cast<size_t>(q) * max_blocks_per_request + b];
      if (id < 0 || id >= kv.num_blocks)
        bad_step("request " + std::to_string(q) + " block table entry " + std::to_string(b) +
                 " is " + std::to_string(id) + ", cache has " + std::to_string(kv.num_blocks) +
                 " blocks");
    }
    const int32_t words = mask_indptr[q + 1] - mask_indptr[q];
    const int32_t expect = t * ((t + 31) / 32);
    if (words != 0 && words != expect)
      bad_step("request " + std::to_string(q) + " has " + std::to_string(words) +
               " mask words, expected 0 (causal) or " + std::to_string(expect));
  }
  if (mask_indptr[r] > static_cast<int32_t>(tree_mask.size()))
    bad_step("mask_indptr ends at " + std::to_string(mask_indptr[r]) + " but tree_mask has " +
             std::to_string(tree_mask.size()) + " words");
  for (size_t i = 0; i < n; ++i)
    if (slot_mapping[i] < 0 || slot_mapping[i] >= total_slots)
      bad_step("slot_mapping[" + std::to_string(i) + "] = " + std::to_string(slot_mapping[i]) +
               " is outside the cache's " + std::to_string(total_slots) + " slots");
  if (const std::string e = token_source_problem(token_source, token_source_index, n); !e.empty())
    bad_step(e);
  if (const std::string e =
          token_source_problem(token_source, parent_source_index, n, "parent_source_index");
      !e.empty())
    bad_step(e);
  if (!key_path_base.empty() || !key_path_indptr.empty() || !key_path.empty()) {
    if (key_path_base.size() != static_cast<size_t>(r) ||
        key_path_indptr.size() != static_cast<size_t>(r) + 1 || key_path_indptr[0] != 0 ||
        key_path_indptr[r] != static_cast<int32_t>(key_path.size()))
      bad_step("key paths: key_path_base has " + std::to_string(key_path_base.size()) +
               " entries and key_path_indptr " + std::to_string(key_path_indptr.size()) + " for " +
               std::to_string(r) + " requests and " + std::to_string(key_path.size()) +
               " path entries");
    for (int32_t q = 0; q < r; ++q) {
      const int32_t base = key_path_base[q];
      const int32_t keys = committed_len[q] + qo_indptr[q + 1] - qo_indptr[q];
      if (mask_indptr[q + 1] != mask_indptr[q] || base < 0 || base > keys ||
          key_path_indptr[q + 1] - key_path_indptr[q] < keys - base)
        bad_step("request " + std::to_string(q) + ": key path of " +
                 std::to_string(key_path_indptr[q + 1] - key_path_indptr[q]) +
                 " entries from key " + std::to_string(base) + " for " + std::to_string(keys) +
                 " keys (a causal request's keys from its base on)");
      const int64_t covered = static_cast<int64_t>(max_blocks_per_request) * kv.block_size;
      if (base + static_cast<int64_t>(key_path_span) > covered)
        bad_step("request " + std::to_string(q) + ": key path span " +
                 std::to_string(key_path_span) + " from key " + std::to_string(base) +
                 " is past its block table's " + std::to_string(covered) + " keys");
      for (int32_t b = 0; b * kv.block_size < base + key_path_span; ++b) {
        const int32_t id = block_tables[static_cast<size_t>(q) * max_blocks_per_request + b];
        if (id < 0 || id >= kv.num_blocks)
          bad_step("request " + std::to_string(q) + " block table entry " + std::to_string(b) +
                   " is " + std::to_string(id) + " inside its key path span");
      }
    }
    for (size_t i = 0; i < key_path.size(); ++i)
      if (key_path[i] < 0 || key_path[i] >= key_path_span)
        bad_step("key_path[" + std::to_string(i) + "] = " + std::to_string(key_path[i]) +
                 " is outside [0, key_path_span " + std::to_string(key_path_span) + ")");
  }
  for (size_t i = 0; i < logits_rows.size(); ++i)
    if (logits_rows[i] < 0 || logits_rows[i] >= static_cast<int32_t>(n))
      bad_step("logits_rows[" + std::to_string(i) + "] = " + std::to_string(logits_rows[i]) +
               " is outside the batch's " + std::to_string(n) + " rows");
}

void StepInputs::resolve_sources() {
  const auto* source = static_cast<const int32_t*>(token_source.data);
  for (size_t n = 0; n < token_source_index.size(); ++n)
    if (token_source_index[n] >= 0) token_ids[n] = source[token_source_index[n]];
  if (parent_source_index.empty()) return;
  // The rule of kernels/sampling/device_tree.cu's tree layout.
  for (int32_t r = 0; r < num_requests(); ++r) {
    const int32_t q0 = qo_indptr[static_cast<size_t>(r)];
    const int32_t t = qo_indptr[static_cast<size_t>(r) + 1] - q0;
    bool any = false;
    for (int32_t i = 0; i < t; ++i)
      any = any || parent_source_index[static_cast<size_t>(q0 + i)] >= 0;
    if (t <= 1 || !any) continue;
    const int32_t words = (t + 31) / 32;
    uint32_t* mask = tree_mask.data() + mask_indptr[static_cast<size_t>(r)];
    std::vector<int32_t> parent(static_cast<size_t>(t), -1);
    for (int32_t i = 1; i < t; ++i) {
      const int64_t idx = parent_source_index[static_cast<size_t>(q0 + i)];
      int32_t p = 0;
      if (idx >= 0) {
        p = source[idx];
      } else {
        const uint32_t* row = mask + static_cast<size_t>(i) * static_cast<size_t>(words);
        for (int32_t w = i / 32; w >= 0; --w) {
          uint32_t m = row[w];
          if (w == i / 32) m &= (1u << (i % 32)) - 1u;
          if (m != 0) {
            p = w * 32 + 31 - std::countl_zero(m);
            break;
          }
        }
      }
      parent[static_cast<size_t>(i)] = p >= 0 && p < i ? p : 0;
    }
    const int32_t root_position = positions[static_cast<size_t>(q0)];
    for (int32_t i = 0; i < t; ++i) {
      uint32_t* row = mask + static_cast<size_t>(i) * static_cast<size_t>(words);
      std::fill(row, row + words, 0u);
      int32_t depth = 0;
      for (int32_t a = i;; a = parent[static_cast<size_t>(a)], ++depth) {
        row[a / 32] |= 1u << (a % 32);
        if (a == 0) break;
      }
      positions[static_cast<size_t>(q0 + i)] = root_position + depth;
    }
  }
}

std::vector<double> rope_inv_freq(const RopeParams& p) {
  const int64_t half = p.head_dim / 2;
  std::vector<double> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    inv[i] = 1.0 / std::pow(p.theta, static_cast<double>(2 * i) / static_cast<double>(p.head_dim));
  if (p.scaling == "linear") {
    for (double& f : inv) f /= p.factor;
  } else if (p.scaling == "llama3") {
    // Llama 3.1: long wavelengths are scaled by 1/factor, short ones kept, the band between
    // interpolated (transformers' _compute_llama3_parameters).
    const double low_wavelen = p.original_max_position / p.low_freq_factor;
    const double high_wavelen = p.original_max_position / p.high_freq_factor;
    for (double& f : inv) {
      const double wavelen = 2 * std::numbers::pi / f;
      if (wavelen < high_wavelen) continue;
      if (wavelen > low_wavelen) {
        f = f / p.factor;
      } else {
        const double smooth = (p.original_max_position / wavelen - p.low_freq_factor) /
                              (p.high_freq_factor - p.low_freq_factor);
        f = (1 - smooth) * f / p.factor + smooth * f;
      }
    }
  }
  return inv;
}

}  // namespace arbor
