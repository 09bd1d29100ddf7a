#include "engine/spec/proposer_factory.h"

#include <filesystem>

#include "engine/core/error.h"
#include "engine/spec/eagle_proposer.h"
#include "engine/spec/medusa_proposer.h"
#include "engine/spec/ngram_proposer.h"
#include "engine/spec/tree_choices.h"

namespace arbor {

const char* spec_method_name(SpecMethod method) {
  switch (method) {
    case SpecMethod::kOff:
      return "off";
    case SpecMethod::kMedusa:
      return "medusa";
    case SpecMethod::kEagle:
      return "eagle";
    case SpecMethod::kEagle3:
      return "eagle3";
    case SpecMethod::kNgram:
      return "ngram";
  }
  return "?";
}

SpecMethod parse_spec_method(const std::string& name) {
  for (SpecMethod m : {SpecMethod::kOff, SpecMethod::kMedusa, SpecMethod::kEagle,
                       SpecMethod::kEagle3, SpecMethod::kNgram})
    if (name == spec_method_name(m)) return m;
  throw_error(ErrorCode::kInvalidArgument,
              "unknown speculation method '" + name + "' (off, medusa, eagle, eagle3, ngram)");
}

void SpecConfig::validate() const {
  auto need = [](bool ok, const std::string& field, int64_t v, const std::string& rule) {
    if (!ok)
      throw_error(ErrorCode::kInvalidArgument,
                  "spec " + field + " is " + std::to_string(v) + ", need " + rule);
  };
  const bool heads = method == SpecMethod::kMedusa || method == SpecMethod::kEagle ||
                     method == SpecMethod::kEagle3;
  if (heads && head_path.empty())
    throw_error(ErrorCode::kInvalidArgument, std::string("spec head_path is empty: method ") +
                                                 spec_method_name(method) +
                                                 " needs the heads' checkpoint path");
  need(medusa_top_k >= 1, "medusa_top_k", medusa_top_k, ">= 1");
  need(total_tokens >= 1, "total_tokens", total_tokens, ">= 1");
  need(depth >= 0, "depth", depth, ">= 0");
  need(top_k >= 1, "top_k", top_k, ">= 1");
  need(draft_kv_blocks >= 1, "draft_kv_blocks", draft_kv_blocks, ">= 1");
  need(draft_block_size >= 1, "draft_block_size", draft_block_size, ">= 1");
  need(grow_on_device >= -1 && grow_on_device <= 1, "grow_on_device", grow_on_device,
       "-1 (auto), 0 or 1");
  need(pick_on_device >= -1 && pick_on_device <= 1, "pick_on_device", pick_on_device,
       "-1 (auto), 0 or 1");
  need(draft_vocab >= 0, "draft_vocab", draft_vocab, ">= 0 (0: the whole token map)");
  if ((!token_map.empty() || draft_vocab > 0) && method == SpecMethod::kEagle3)
    throw_error(ErrorCode::kInvalidArgument,
                "spec token_map / draft_vocab apply to eagle (EAGLE-1/2) drafts; eagle3 heads "
                "carry their own draft vocabulary");
  if (draft_vocab > 0 && token_map == "none")
    throw_error(ErrorCode::kInvalidArgument,
                "spec draft_vocab is " + std::to_string(draft_vocab) +
                    " but token_map is none: a reduced draft vocabulary needs a token map");
  need(min_ngram >= 1, "min_ngram", min_ngram, ">= 1");
  need(max_ngram >= min_ngram, "max_ngram", max_ngram,
       ">= min_ngram (" + std::to_string(min_ngram) + ")");
  need(ngram_max_depth >= 1, "ngram_max_depth", ngram_max_depth, ">= 1");
  need(ngram_max_nodes >= 1, "ngram_max_nodes", ngram_max_nodes, ">= 1");
  need(num_threads >= 0, "num_threads", num_threads, ">= 0");
}

std::string resolve_token_map(const SpecConfig& config) {
  if (config.method != SpecMethod::kEagle || config.token_map == "none") return "";
  if (!config.token_map.empty()) return config.token_map;
  const std::filesystem::path beside =
      std::filesystem::path(config.head_path) / kDefaultTokenMapName;
  if (std::filesystem::is_regular_file(beside)) return beside.string();
  if (config.draft_vocab > 0)
    throw_error(ErrorCode::kInvalidArgument,
                "spec draft_vocab is " + std::to_string(config.draft_vocab) + " but " +
                    config.head_path + " has no " + kDefaultTokenMapName +
                    " and no token_map was given");
  return "";
}

std::unique_ptr<Proposer> make_proposer(const SpecConfig& config, const ModelWeights& target,
                                        std::unique_ptr<Backend> draft_backend) {
  config.validate();
  switch (config.method) {
    case SpecMethod::kOff:
      return nullptr;
    case SpecMethod::kMedusa: {
      MedusaHeads heads = load_medusa_heads(config.head_path, target.output_weight());
      TreeChoicesLimits limits;
      limits.top_k = config.medusa_top_k;
      limits.max_nodes = 1 << 16;
      limits.max_depth = 1024;  // MedusaProposer checks the depth against the heads
      return std::make_unique<MedusaProposer>(std::move(heads),
                                              resolve_static_tree(config.tree, limits),
                                              std::move(draft_backend), config.paths_on_device);
    }
    case SpecMethod::kEagle:
    case SpecMethod::kEagle3: {
      const EagleVersion version =
          config.method == SpecMethod::kEagle3 ? EagleVersion::kEagle3 : EagleVersion::kEagle1;
      EagleOptions options;
      options.tree = {config.total_tokens, config.depth, config.top_k};
      options.draft_kv = {config.draft_kv_blocks, config.draft_block_size, false};
      options.num_threads = config.num_threads;
      options.grow_on_backend = config.grow_on_device;
      options.pick_on_backend = config.pick_on_device;
      options.paths_on_device = config.paths_on_device;
      options.grow_before_wait = config.grow_before_wait;
      EagleWeights weights = load_eagle_checkpoint(config.head_path, version);
      const std::string map = resolve_token_map(config);
      if (!map.empty())
        restrict_draft_vocab(&weights,
                             load_token_map(map, target.config.vocab_size, config.draft_vocab));
      return std::make_unique<EagleProposer>(weights, target, options, std::move(draft_backend));
    }
    case SpecMethod::kNgram: {
      NgramOptions options;
      options.min_ngram = config.min_ngram;
      options.max_ngram = config.max_ngram;
      options.max_depth = config.ngram_max_depth;
      options.max_nodes = config.ngram_max_nodes;
      return std::make_unique<NgramProposer>(options, target.config.vocab_size);
    }
  }
  ARBOR_CHECK(false, "unhandled speculation method");
  return nullptr;
}

}  // namespace arbor
