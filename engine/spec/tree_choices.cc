#include "engine/spec/tree_choices.h"

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "engine/core/error.h"

namespace arbor {
namespace {

// Medusa's default tree (medusa/model/medusa_choices.py, mc_sim_7b_63), as listed in DESIGN.md.
const TreeChoices& mc_sim_7b_63() {
  static const TreeChoices kChoices = {
      {0},       {0, 0},    {1},       {0, 1},    {2},          {0, 0, 0}, {1, 0},    {0, 2},
      {3},       {0, 3},    {4},       {0, 4},    {2, 0},       {0, 5},    {0, 0, 1}, {5},
      {0, 6},    {6},       {0, 7},    {0, 1, 0}, {1, 1},       {7},       {0, 8},    {0, 0, 2},
      {3, 0},    {0, 9},    {8},       {9},       {1, 0, 0},    {0, 2, 0}, {1, 2},    {0, 0, 3},
      {4, 0},    {2, 1},    {0, 0, 4}, {0, 0, 5}, {0, 0, 0, 0}, {0, 1, 1}, {0, 0, 6}, {0, 3, 0},
      {5, 0},    {1, 3},    {0, 0, 7}, {0, 0, 8}, {0, 0, 9},    {6, 0},    {0, 4, 0}, {1, 4},
      {7, 0},    {0, 1, 2}, {2, 0, 0}, {3, 1},    {2, 2},       {8, 0},    {0, 5, 0}, {1, 5},
      {1, 0, 1}, {0, 2, 1}, {9, 0},    {0, 6, 0}, {0, 0, 0, 1}, {1, 6},    {0, 7, 0}};
  return kChoices;
}

std::string path_string(const std::vector<int32_t>& path) {
  std::string s = "[";
  for (size_t i = 0; i < path.size(); ++i) s += (i ? "," : "") + std::to_string(path[i]);
  return s + "]";
}

[[noreturn]] void invalid(const std::string& name, const std::string& what) {
  throw_error(ErrorCode::kInvalidArgument, "tree '" + name + "': " + what);
}

// Parses "<prefix>-A-B-..." into positive integers; false if `name` has another shape.
bool parse_dash_numbers(const std::string& name, const std::string& prefix,
                        std::vector<int32_t>* numbers) {
  if (name.rfind(prefix + "-", 0) != 0) return false;
  numbers->clear();
  std::stringstream rest(name.substr(prefix.size() + 1));
  std::string item;
  while (std::getline(rest, item, '-')) {
    if (item.empty() || item.size() > 6 ||
        !std::all_of(item.begin(), item.end(), [](char c) { return c >= '0' && c <= '9'; }))
      return false;
    numbers->push_back(std::stoi(item));
    if (numbers->back() <= 0) return false;
  }
  return !numbers->empty();
}

TreeChoices json_to_choices(const nlohmann::json& doc, const std::string& name) {
  const nlohmann::json* list = &doc;
  if (doc.is_object()) {
    if (!doc.contains("choices")) invalid(name, "JSON object has no \"choices\" member");
    list = &doc["choices"];
  }
  if (!list->is_array()) invalid(name, "expected a JSON list of paths, found " + list->dump());
  TreeChoices choices;
  for (size_t i = 0; i < list->size(); ++i) {
    const nlohmann::json& entry = (*list)[i];
    if (!entry.is_array())
      invalid(name, "entry " + std::to_string(i) + " is " + entry.dump() + ", not a list of ranks");
    std::vector<int32_t> path;
    for (const nlohmann::json& r : entry) {
      if (!r.is_number_integer())
        invalid(name, "path " + entry.dump() + " (entry " + std::to_string(i) +
                          ") holds a non-integer rank " + r.dump());
      const int64_t v = r.get<int64_t>();
      if (v < -1'000'000 || v > 1'000'000)
        invalid(name, "path " + entry.dump() + " has rank " + std::to_string(v) + " out of range");
      path.push_back(static_cast<int32_t>(v));
    }
    choices.push_back(std::move(path));
  }
  return choices;
}

}  // namespace

int32_t StaticTree::max_depth() const {
  return depth.empty() ? 0 : *std::max_element(depth.begin(), depth.end());
}

std::vector<int32_t> StaticTree::ranks_needed_per_depth() const {
  std::vector<int32_t> needed(static_cast<size_t>(max_depth()), 0);
  for (int32_t i = 1; i < size(); ++i)
    needed[depth[i] - 1] = std::max(needed[depth[i] - 1], rank[i] + 1);
  return needed;
}

StaticTree build_static_tree(const TreeChoices& choices, const std::string& name,
                             const TreeChoicesLimits& limits) {
  if (static_cast<int64_t>(choices.size()) + 1 > limits.max_nodes)
    invalid(name, std::to_string(choices.size()) + " paths make " +
                      std::to_string(choices.size() + 1) + " nodes with the root, max_nodes is " +
                      std::to_string(limits.max_nodes));
  std::map<std::vector<int32_t>, size_t> seen;  // path -> position in `choices`
  for (size_t i = 0; i < choices.size(); ++i) {
    const std::vector<int32_t>& path = choices[i];
    const std::string where = "path " + path_string(path) + " (entry " + std::to_string(i) + ")";
    if (path.empty()) invalid(name, "entry " + std::to_string(i) + " is an empty path");
    if (static_cast<int64_t>(path.size()) > limits.max_depth)
      invalid(name, where + " has depth " + std::to_string(path.size()) + ", max_depth is " +
                        std::to_string(limits.max_depth));
    for (int32_t r : path)
      if (r < 0 || r >= limits.top_k)
        invalid(name, where + " has rank " + std::to_string(r) +
                          " outside [0, top_k = " + std::to_string(limits.top_k) + ")");
    if (auto it = seen.find(path); it != seen.end())
      invalid(name, where + " duplicates entry " + std::to_string(it->second));
    if (path.size() > 1) {
      const std::vector<int32_t> parent(path.begin(), path.end() - 1);
      if (!seen.count(parent)) {
        const auto later = std::find(choices.begin() + i, choices.end(), parent);
        if (later == choices.end())
          invalid(name, where + " has no parent: " + path_string(parent) + " is not listed");
        invalid(name, where + " is listed before its parent " + path_string(parent) + " (entry " +
                          std::to_string(later - choices.begin()) + ")");
      }
    }
    seen.emplace(path, i);
  }

  TreeChoices sorted = choices;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    return a.size() != b.size() ? a.size() < b.size() : a < b;
  });
  StaticTree tree;
  tree.name = name;
  tree.path.push_back({});
  tree.parent.push_back(-1);
  tree.depth.push_back(0);
  tree.rank.push_back(-1);
  std::map<std::vector<int32_t>, int32_t> index;  // path -> node index
  index[{}] = 0;
  for (const std::vector<int32_t>& path : sorted) {
    const int32_t node = tree.size();
    tree.parent.push_back(index.at(std::vector<int32_t>(path.begin(), path.end() - 1)));
    tree.depth.push_back(static_cast<int32_t>(path.size()));
    tree.rank.push_back(path.back());
    tree.path.push_back(path);
    index[path] = node;
  }
  for (const std::vector<int32_t>& path : choices) tree.listed.push_back(index.at(path));
  return tree;
}

StaticTree parse_tree_choices(std::string_view json_text, const std::string& name,
                              const TreeChoicesLimits& limits) {
  const nlohmann::json doc = nlohmann::json::parse(json_text, nullptr, /*allow_exceptions=*/false);
  if (doc.is_discarded()) invalid(name, "not valid JSON");
  return build_static_tree(json_to_choices(doc, name), name, limits);
}

StaticTree load_tree_choices_file(const std::string& path, const TreeChoicesLimits& limits) {
  std::ifstream in(path);
  if (!in) throw_error(ErrorCode::kNotFound, "cannot read tree choices file " + path);
  std::stringstream text;
  text << in.rdbuf();
  return parse_tree_choices(text.str(), path, limits);
}

TreeChoices named_tree_choices(const std::string& name) {
  if (name == "mc_sim_7b_63") return mc_sim_7b_63();
  std::vector<int32_t> numbers;
  if (parse_dash_numbers(name, "chain", &numbers) && numbers.size() == 1) {
    TreeChoices chain;
    for (int32_t d = 1; d <= numbers[0]; ++d) chain.push_back(std::vector<int32_t>(d, 0));
    return chain;
  }
  if (parse_dash_numbers(name, "product", &numbers)) {
    TreeChoices all;
    TreeChoices frontier = {{}};
    for (int32_t width : numbers) {
      TreeChoices next;
      for (const std::vector<int32_t>& prefix : frontier)
        for (int32_t r = 0; r < width; ++r) {
          next.push_back(prefix);
          next.back().push_back(r);
          if (next.size() + all.size() > 100000)
            invalid(name, "more than 100000 paths (the tree limits would reject it anyway)");
        }
      all.insert(all.end(), next.begin(), next.end());
      frontier = std::move(next);
    }
    return all;
  }
  throw_error(ErrorCode::kInvalidArgument,
              "unknown tree name '" + name +
                  "'; known: mc_sim_7b_63, chain-N, product-K1-K2-... (or a JSON list / file)");
}

StaticTree resolve_static_tree(const std::string& spec, const TreeChoicesLimits& limits) {
  const size_t first = spec.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && (spec[first] == '[' || spec[first] == '{'))
    return parse_tree_choices(spec, "inline choices", limits);
  if (spec == "mc_sim_7b_63" || spec.rfind("chain-", 0) == 0 || spec.rfind("product-", 0) == 0)
    return build_static_tree(named_tree_choices(spec), spec, limits);
  if (!std::ifstream(spec))
    throw_error(ErrorCode::kInvalidArgument,
                "tree '" + spec +
                    "' is neither a known name (mc_sim_7b_63, chain-N, product-K1-K2-...), "
                    "inline JSON, nor a readable file");
  return load_tree_choices_file(spec, limits);
}

DraftTree instantiate(const StaticTree& tree, int32_t root_token,
                      const std::vector<std::vector<int32_t>>& topk_per_depth) {
  const std::vector<int32_t> needed = tree.ranks_needed_per_depth();
  if (topk_per_depth.size() < needed.size())
    throw_error(ErrorCode::kInvalidArgument,
                "tree '" + tree.name + "' has depth " + std::to_string(needed.size()) + " but " +
                    std::to_string(topk_per_depth.size()) + " top-k candidate lists were given");
  for (size_t d = 0; d < needed.size(); ++d)
    if (static_cast<int32_t>(topk_per_depth[d].size()) < needed[d])
      throw_error(ErrorCode::kInvalidArgument,
                  "tree '" + tree.name + "' uses rank " + std::to_string(needed[d] - 1) +
                      " at depth " + std::to_string(d + 1) + " but that depth's top-k list has " +
                      std::to_string(topk_per_depth[d].size()) + " tokens");
  DraftTree out;
  out.parent = tree.parent;
  out.token.resize(static_cast<size_t>(tree.size()));
  out.token[0] = root_token;
  for (int32_t i = 1; i < tree.size(); ++i)
    out.token[i] = topk_per_depth[tree.depth[i] - 1][tree.rank[i]];
  return out;
}

}  // namespace arbor
