#include "engine/backend/tree_sampling.h"

#include <algorithm>
#include <cmath>
#include <string>

#include "engine/backend/backend.h"
#include "engine/core/error.h"

namespace arbor {
namespace {

[[noreturn]] void bad(const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "sample_trees: " + what);
}

std::string at(const char* field, size_t i) {
  return std::string(field) + "[" + std::to_string(i) + "]";
}

void check_indptr(const std::vector<int32_t>& indptr, const char* name, size_t items,
                  size_t total) {
  if (indptr.size() != items + 1)
    bad(std::string(name) + " has " + std::to_string(indptr.size()) + " entries, expected " +
        std::to_string(items + 1));
  if (indptr[0] != 0) bad(at(name, 0) + " is " + std::to_string(indptr[0]) + ", expected 0");
  for (size_t i = 0; i < items; ++i)
    if (indptr[i + 1] < indptr[i]) bad(at(name, i + 1) + " decreases");
  if (static_cast<size_t>(indptr[items]) != total)
    bad(at(name, items) + " is " + std::to_string(indptr[items]) + " but there are " +
        std::to_string(total) + " entries");
}

void check_params(const TreeSampleParams& p, size_t i) {
  const std::string where = "params[" + std::to_string(i) + "].";
  // Written so that NaN fails.
  if (p.greedy == 0 && !(p.temperature > 0.0f && std::isfinite(p.temperature)))
    bad(where + "temperature is " + std::to_string(p.temperature) + " (sampled items need > 0)");
  if (!(p.top_p > 0.0f && p.top_p <= 1.0f))
    bad(where + "top_p is " + std::to_string(p.top_p) + ", not in (0, 1]");
  if (!(p.min_p >= 0.0f && p.min_p <= 1.0f))
    bad(where + "min_p is " + std::to_string(p.min_p) + ", not in [0, 1]");
  if (!(p.repetition_penalty > 0.0f && std::isfinite(p.repetition_penalty)))
    bad(where + "repetition_penalty is " + std::to_string(p.repetition_penalty));
  if (!std::isfinite(p.presence_penalty) || !std::isfinite(p.frequency_penalty))
    bad(where + "presence / frequency penalty is not finite");
}

}  // namespace

void validate_tree_sample_batch(const TreeSampleBatch& b, int64_t vocab, int64_t logits_rows) {
  if (vocab <= 0) bad("vocab " + std::to_string(vocab));
  const size_t items = b.params.size();
  const size_t nodes = b.token.size();
  for (size_t i = 0; i < items; ++i) check_params(b.params[i], i);
  check_indptr(b.node_indptr, "node_indptr", items, nodes);
  if (b.parent.size() != nodes || b.logits_row.size() != nodes)
    bad("parent / logits_row / token sizes differ (" + std::to_string(b.parent.size()) + ", " +
        std::to_string(b.logits_row.size()) + ", " + std::to_string(nodes) + ")");
  if (!b.q_row.empty() && b.q_row.size() != nodes)
    bad("q_row has " + std::to_string(b.q_row.size()) + " entries for " + std::to_string(nodes) +
        " nodes");
  if (b.q.size() % static_cast<size_t>(vocab) != 0)
    bad("q holds " + std::to_string(b.q.size()) + " values, not a multiple of vocab " +
        std::to_string(vocab));
  const int64_t q_rows = static_cast<int64_t>(b.q.size()) / vocab;
  check_indptr(b.ctx_indptr, "ctx_indptr", items, b.ctx_token.size());
  if (b.ctx_output_count.size() != b.ctx_token.size())
    bad("ctx_output_count has " + std::to_string(b.ctx_output_count.size()) + " entries for " +
        std::to_string(b.ctx_token.size()) + " context tokens");
  if (!b.bias_indptr.empty() || !b.bias_token.empty())
    check_indptr(b.bias_indptr, "bias_indptr", items, b.bias_token.size());
  if (b.bias_value.size() != b.bias_token.size())
    bad("bias_value has " + std::to_string(b.bias_value.size()) + " entries for " +
        std::to_string(b.bias_token.size()) + " bias tokens");
  check_indptr(b.uniform_indptr, "uniform_indptr", items, b.uniforms.size());
  for (size_t i = 0; i < items; ++i) {
    const int32_t first = b.node_indptr[i], t = b.node_indptr[i + 1] - first;
    if (t < 1 || t > kMaxTreeSampleNodes)
      bad("item " + std::to_string(i) + " has " + std::to_string(t) + " nodes, outside [1, " +
          std::to_string(kMaxTreeSampleNodes) + "]");
    for (int32_t j = 0; j < t; ++j) {
      const size_t g = static_cast<size_t>(first + j);
      const int32_t p = b.parent[g];
      if (j == 0 ? p != -1 : (p < 0 || p >= j))
        bad("item " + std::to_string(i) + " node " + std::to_string(j) + " has parent " +
            std::to_string(p) + (j == 0 ? " (the root's is -1)" : " (must be in [0, node))"));
      if (b.token[g] < 0 || b.token[g] >= vocab)
        bad(at("token", g) + " is " + std::to_string(b.token[g]) + ", outside [0, " +
            std::to_string(vocab) + ")");
      if (b.logits_row[g] < 0 || b.logits_row[g] >= logits_rows)
        bad(at("logits_row", g) + " is " + std::to_string(b.logits_row[g]) + ", outside [0, " +
            std::to_string(logits_rows) + ")");
      if (!b.q_row.empty() && (b.q_row[g] < -1 || b.q_row[g] >= q_rows))
        bad(at("q_row", g) + " is " + std::to_string(b.q_row[g]) + ", outside [-1, " +
            std::to_string(q_rows) + ")");
      if (j > 0 && !b.q_row.empty() && b.q_row[static_cast<size_t>(first + p)] >= 0 &&
          b.q_row[static_cast<size_t>(first + p)] < q_rows) {
        const int64_t qr = b.q_row[static_cast<size_t>(first + p)];
        if (!(b.q[static_cast<size_t>(qr * vocab + b.token[g])] > 0.0f))
          bad("item " + std::to_string(i) + " node " + std::to_string(j) + ": token " +
              std::to_string(b.token[g]) + " has q = 0 in its parent's q row " +
              std::to_string(qr) + " (it could not have been drawn)");
      }
    }
    const int32_t uniforms = b.uniform_indptr[i + 1] - b.uniform_indptr[i];
    if (b.params[i].greedy == 0 && uniforms < t)
      bad("item " + std::to_string(i) + " is sampled with " + std::to_string(t) +
          " nodes but has " + std::to_string(uniforms) + " uniforms");
    for (int32_t c = b.ctx_indptr[i]; c < b.ctx_indptr[i + 1]; ++c) {
      const size_t cc = static_cast<size_t>(c);
      if (b.ctx_token[cc] < 0 || b.ctx_token[cc] >= vocab)
        bad(at("ctx_token", cc) + " is " + std::to_string(b.ctx_token[cc]) + ", outside [0, " +
            std::to_string(vocab) + ")");
      if (c > b.ctx_indptr[i] && b.ctx_token[cc] <= b.ctx_token[cc - 1])
        bad("ctx_token of item " + std::to_string(i) + " is not strictly ascending at " +
            std::to_string(c));
      if (b.ctx_output_count[cc] < 0) bad(at("ctx_output_count", cc) + " is negative");
    }
    if (b.bias_indptr.empty()) continue;
    if (b.bias_indptr[i + 1] - b.bias_indptr[i] > kMaxTreeSampleBiasEntries)
      bad("item " + std::to_string(i) + " has " +
          std::to_string(b.bias_indptr[i + 1] - b.bias_indptr[i]) +
          " logit bias entries, at most " + std::to_string(kMaxTreeSampleBiasEntries));
    for (int32_t e = b.bias_indptr[i]; e < b.bias_indptr[i + 1]; ++e) {
      const size_t ee = static_cast<size_t>(e);
      if (b.bias_token[ee] < 0 || b.bias_token[ee] >= vocab)
        bad(at("bias_token", ee) + " is " + std::to_string(b.bias_token[ee]) + ", outside [0, " +
            std::to_string(vocab) + ")");
      if (e > b.bias_indptr[i] && b.bias_token[ee] <= b.bias_token[ee - 1])
        bad("bias_token of item " + std::to_string(i) + " is not strictly ascending at " +
            std::to_string(e));
      if (!(b.bias_value[ee] >= -kMaxTreeSampleBias && b.bias_value[ee] <= kMaxTreeSampleBias))
        bad(at("bias_value", ee) + " is " + std::to_string(b.bias_value[ee]) + ", outside [-" +
            std::to_string(static_cast<int>(kMaxTreeSampleBias)) + ", " +
            std::to_string(static_cast<int>(kMaxTreeSampleBias)) + "]");
    }
  }
  for (size_t u = 0; u < b.uniforms.size(); ++u)
    if (!(b.uniforms[u] >= 0.0 && b.uniforms[u] < 1.0))
      bad(at("uniforms", u) + " is " + std::to_string(b.uniforms[u]) + ", outside [0, 1)");
  if (const std::string e = token_source_problem(b.token_source, b.token_source_index, nodes);
      !e.empty())
    bad(e);
  if (const std::string e =
          token_source_problem(b.token_source, b.parent_source_index, nodes, "parent_source_index");
      !e.empty())
    bad(e);
}

std::string token_source_problem(const Tensor& source, std::span<const int64_t> index,
                                 size_t entries, const char* name) {
  if (index.empty()) return "";
  const std::string n = name;
  if (index.size() != entries)
    return n + " has " + std::to_string(index.size()) + " entries for " + std::to_string(entries);
  if (source.data == nullptr || source.dtype != DType::kI32)
    return n + " without an int32 token_source";
  for (size_t i = 0; i < entries; ++i)
    if (index[i] < -1 || index[i] >= source.numel())
      return n + "[" + std::to_string(i) + "] = " + std::to_string(index[i]) + " is outside [-1, " +
             std::to_string(source.numel()) + ")";
  return "";
}

void append_source_index(std::vector<int64_t>* list, std::span<const int64_t> index, size_t before,
                         size_t count) {
  if (!index.empty()) {
    ARBOR_CHECK(index.size() == count, "source indices: " + std::to_string(index.size()) + " for " +
                                           std::to_string(count) + " entries");
    list->resize(before, -1);
    list->insert(list->end(), index.begin(), index.end());
  } else if (!list->empty()) {
    list->resize(before + count, -1);
  }
}

void fill_path_tokens(const TreeSampleBatch& batch, std::span<const int32_t> token,
                      TreeSampleResult* out) {
  out->path_tokens.clear();
  for (int32_t i = 0; i < batch.num_items(); ++i)
    for (int32_t j = out->path_indptr[i]; j < out->path_indptr[i + 1]; ++j)
      out->path_tokens.push_back(
          token[static_cast<size_t>(batch.node_indptr[i] + out->path_nodes[j])]);
}

void Backend::sample_trees(const Tensor&, const TreeSampleBatch&, TreeSampleResult*) {
  throw_error(ErrorCode::kUnsupported,
              "the " + name() + " backend does not sample trees (has_sample_trees() is false)");
}

void gather_path_rows_on_host(const float* source, int64_t cols, const TreeSampleBatch& batch,
                              std::span<const int32_t> node_row, TreeSampleResult* out) {
  ARBOR_CHECK(static_cast<int32_t>(node_row.size()) == batch.num_nodes(),
              "path rows: " + std::to_string(node_row.size()) + " node rows for " +
                  std::to_string(batch.num_nodes()) + " nodes");
  out->path_rows.assign(out->path_nodes.size() * static_cast<size_t>(cols), 0.0f);
  for (int32_t i = 0; i < batch.num_items(); ++i)
    for (int32_t j = out->path_indptr[i]; j < out->path_indptr[i + 1]; ++j) {
      const int64_t row = node_row[static_cast<size_t>(batch.node_indptr[i] + out->path_nodes[j])];
      std::copy_n(source + row * cols, cols,
                  out->path_rows.begin() + static_cast<int64_t>(j) * cols);
    }
}

std::vector<int32_t> path_row_offsets(const TreeSampleBatch& batch) {
  std::vector<int32_t> offset = {0};
  std::vector<int32_t> depth(static_cast<size_t>(batch.num_nodes()), 0);
  for (int32_t i = 0; i < batch.num_items(); ++i) {
    int32_t deepest = 0;
    const int32_t first = batch.node_indptr[i];
    for (int32_t g = first + 1; g < batch.node_indptr[i + 1]; ++g) {
      depth[static_cast<size_t>(g)] = depth[static_cast<size_t>(first + batch.parent[g])] + 1;
      deepest = std::max(deepest, depth[static_cast<size_t>(g)]);
    }
    offset.push_back(offset.back() + deepest + 1);
  }
  return offset;
}

void pad_path_rows_on_host(const TreeSampleBatch& batch, const TreeSampleResult& result,
                           int64_t cols, std::vector<int32_t>* offset, std::vector<float>* rows,
                           std::vector<int32_t>* next) {
  *offset = path_row_offsets(batch);
  const auto total = static_cast<size_t>(offset->back());
  ARBOR_CHECK(result.path_rows.size() == result.path_nodes.size() * static_cast<size_t>(cols),
              "pad_path_rows_on_host: no path rows");
  rows->assign(total * static_cast<size_t>(cols), 0.0f);
  next->assign(total, 0);
  for (int32_t i = 0; i < batch.num_items(); ++i) {
    const int32_t p0 = result.path_indptr[i], len = result.path_indptr[i + 1] - p0;
    const int32_t o0 = (*offset)[i], room = (*offset)[i + 1] - o0;
    ARBOR_CHECK(len >= 1 && len <= room, "pad_path_rows_on_host: a path of " + std::to_string(len) +
                                             " nodes in " + std::to_string(room) + " rows");
    for (int32_t d = 0; d < room; ++d) {
      const int32_t j = p0 + std::min(d, len - 1);
      std::copy_n(result.path_rows.begin() + static_cast<int64_t>(j) * cols, cols,
                  rows->begin() + static_cast<int64_t>(o0 + d) * cols);
      const int32_t after = d + 1 < len ? result.path_tokens[static_cast<size_t>(j + 1)]
                                        : result.bonus[static_cast<size_t>(i)];
      (*next)[static_cast<size_t>(o0 + d)] = std::max(after, 0);
    }
  }
}

void Backend::sample_trees_and_path_rows(const Tensor& logits, const TreeSampleBatch& batch,
                                         const PathRowsRequest& rows, TreeSampleResult* out) {
  sample_trees(logits, batch, out);
  std::vector<float> host(static_cast<size_t>(rows.source.numel()));
  download(rows.source, host.data());
  gather_path_rows_on_host(host.data(), rows.source.cols, batch, rows.node_row, out);
}

}  // namespace arbor
