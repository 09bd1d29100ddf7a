// Reads HF tokenizers' tokenizer.json (+ tokenizer_config.json) into a TokenizerSpec. Only the
// configurations used by Llama-family checkpoints are accepted; anything else is refused with
// an error that names the field, so a tokenizer is never silently approximated.
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>

#include "engine/core/error.h"
#include "engine/tokenizer/tokenizer_loaders.h"

namespace arbor {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

constexpr const char* kMetaspace = "\xE2\x96\x81";  // "▁"

// The pre-tokenizer regexes of known tokenizer.json files, by our pre-tokenizer name.
const std::map<std::string, std::string>& known_split_regexes() {
  static const std::map<std::string, std::string> kRegexes = {
      {R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)", "gpt2"},
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       "llama3"},
      {R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
       "qwen2"},
  };
  return kRegexes;
}

std::string describe(const json& j) {
  std::string s = j.dump(-1, ' ', false, json::error_handler_t::replace);
  if (s.size() > 300) s = s.substr(0, 300) + "...";
  return s;
}

// Id of a token text, -1 if none: added (non-normal) tokens first, then the vocabulary.
int32_t find_token(const TokenizerSpec& spec, const std::string& text) {
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.types[i] != TokenType::kNormal && spec.tokens[i] == text) {
      return static_cast<int32_t>(i);
    }
  }
  for (size_t i = 0; i < spec.tokens.size(); ++i) {
    if (spec.tokens[i] == text) return static_cast<int32_t>(i);
  }
  return -1;
}

json read_json_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw_error(ErrorCode::kNotFound, path.string() + ": cannot open");
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  json j = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) throw_error(ErrorCode::kCorruptData, path.string() + ": not valid JSON");
  return j;
}

// Reads tokenizer.json.
class HfTokenizerJson {
 public:
  HfTokenizerJson(const fs::path& file, const json& root) : file_(file.string()), root_(root) {}

  [[noreturn]] void fail(ErrorCode code, const std::string& msg) const {
    throw_error(code, file_ + ": " + msg);
  }

  const json& at(const json& obj, const char* key, const std::string& where) const {
    if (!obj.is_object() || !obj.contains(key))
      fail(ErrorCode::kCorruptData, where + " is missing");
    return obj.at(key);
  }

  std::string string_field(const json& obj, const char* key, const std::string& where) const {
    const json& v = at(obj, key, where);
    if (!v.is_string()) {
      fail(ErrorCode::kCorruptData, where + " is " + describe(v) + ", expected a string");
    }
    return v.get<std::string>();
  }

  bool bool_field(const json& obj, const char* key, bool fallback) const {
    if (!obj.is_object() || !obj.contains(key) || obj.at(key).is_null()) return fallback;
    if (!obj.at(key).is_boolean()) {
      fail(ErrorCode::kCorruptData,
           std::string(key) + " is " + describe(obj.at(key)) + ", expected true or false");
    }
    return obj.at(key).get<bool>();
  }

  TokenizerSpec parse() {
    const json& model = at(root_, "model", "model");
    const std::string type = model.value("type", std::string("BPE"));
    if (type != "BPE") {
      fail(ErrorCode::kUnsupported, "model.type is '" + type + "', only 'BPE' is supported");
    }
    for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
      if (model.contains(key) && !model[key].is_null() && model[key] != "") {
        fail(ErrorCode::kUnsupported,
             std::string("model.") + key + " is " + describe(model[key]) + ", expected empty");
      }
    }
    if (model.contains("dropout") && model["dropout"].is_number() &&
        model["dropout"].get<double>() != 0.0) {
      fail(ErrorCode::kUnsupported,
           "model.dropout is " + describe(model["dropout"]) + ": BPE dropout is for training only");
    }
    read_vocab(model);
    read_merges(model);

    TokenizerSpec& spec = spec_;
    spec.add_bos = false;  // unless the post-processor or tokenizer_config.json says so
    spec.ignore_merges = bool_field(model, "ignore_merges", false);
    const json& pre = root_.contains("pre_tokenizer") ? root_["pre_tokenizer"] : json();
    const json& normalizer = root_.contains("normalizer") ? root_["normalizer"] : json();
    if (contains_type(pre, "ByteLevel")) {
      spec.kind = TokenizerKind::kByteLevelBpe;
      spec.add_space_prefix = false;
      read_byte_level(pre, normalizer);
    } else {
      spec.kind = TokenizerKind::kSentencePieceBpe;
      read_sentencepiece(pre, normalizer, bool_field(model, "byte_fallback", false));
    }
    if (model.contains("unk_token") && model["unk_token"].is_string()) {
      spec.unk_id = id_of(model["unk_token"].get<std::string>(), "model.unk_token");
      spec.types[static_cast<size_t>(spec.unk_id)] = TokenType::kUnknown;
    }
    read_post_processor();
    return std::move(spec_);
  }

 private:
  int32_t id_of(const std::string& text, const std::string& where) const {
    const int32_t id = find_token(spec_, text);
    if (id < 0) fail(ErrorCode::kCorruptData, where + " '" + text + "' is not in the vocabulary");
    return id;
  }

  static bool contains_type(const json& node, const std::string& type) {
    if (!node.is_object()) return false;
    if (node.value("type", std::string()) == type) return true;
    for (const char* list : {"pretokenizers", "normalizers", "processors"}) {
      if (node.contains(list) && node[list].is_array()) {
        for (const json& child : node[list]) {
          if (contains_type(child, type)) return true;
        }
      }
    }
    return false;
  }

  static std::vector<json> flatten(const json& node, const char* list) {
    if (node.is_null()) return {};
    if (node.value("type", std::string()) == "Sequence" && node.contains(list)) {
      std::vector<json> out;
      for (const json& child : node[list]) {
        for (json& leaf : flatten(child, list)) out.push_back(std::move(leaf));
      }
      return out;
    }
    return {node};
  }

  void read_vocab(const json& model) {
    const json& vocab = at(model, "vocab", "model.vocab");
    if (!vocab.is_object()) fail(ErrorCode::kCorruptData, "model.vocab is not an object");
    std::map<int64_t, std::pair<std::string, TokenType>> by_id;
    for (auto it = vocab.begin(); it != vocab.end(); ++it) {
      if (!it.value().is_number_integer() || it.value().get<int64_t>() < 0) {
        fail(ErrorCode::kCorruptData, "model.vocab['" + it.key() + "'] is " + describe(it.value()) +
                                          ", expected an id >= 0");
      }
      by_id[it.value().get<int64_t>()] = {it.key(), TokenType::kNormal};
    }
    if (root_.contains("added_tokens") && root_["added_tokens"].is_array()) {
      for (const json& added : root_["added_tokens"]) {
        const std::string content = string_field(added, "content", "added_tokens[].content");
        const json& id = at(added, "id", "added_tokens[].id");
        if (!id.is_number_integer() || id.get<int64_t>() < 0) {
          fail(ErrorCode::kCorruptData, "added token '" + content + "' has id " + describe(id));
        }
        by_id[id.get<int64_t>()] = {content, bool_field(added, "special", false)
                                                 ? TokenType::kControl
                                                 : TokenType::kUserDefined};
      }
    }
    if (by_id.empty()) fail(ErrorCode::kCorruptData, "model.vocab is empty");
    const int64_t n = by_id.rbegin()->first + 1;
    if (n != static_cast<int64_t>(by_id.size())) {
      int64_t missing = 0;
      while (by_id.count(missing)) ++missing;
      fail(ErrorCode::kCorruptData, "no token has id " + std::to_string(missing) +
                                        " (ids go up to " + std::to_string(n - 1) + ")");
    }
    for (auto& [id, entry] : by_id) {
      spec_.tokens.push_back(std::move(entry.first));
      spec_.types.push_back(entry.second);
    }
  }

  void read_merges(const json& model) {
    if (!model.contains("merges")) return;
    const json& merges = model["merges"];
    if (!merges.is_array()) fail(ErrorCode::kCorruptData, "model.merges is not an array");
    spec_.merges.reserve(merges.size());
    for (size_t i = 0; i < merges.size(); ++i) {
      const json& m = merges[i];
      if (m.is_string()) {
        spec_.merges.push_back(m.get<std::string>());
      } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
        const std::string a = m[0].get<std::string>(), b = m[1].get<std::string>();
        if (a.find(' ') != std::string::npos || b.find(' ') != std::string::npos) {
          fail(ErrorCode::kUnsupported, "model.merges[" + std::to_string(i) + "] " + describe(m) +
                                            " has a piece with a space");
        }
        spec_.merges.push_back(a + " " + b);
      } else {
        fail(ErrorCode::kCorruptData, "model.merges[" + std::to_string(i) + "] is " + describe(m) +
                                          ", expected \"a b\" or [\"a\", \"b\"]");
      }
    }
  }

  void read_byte_level(const json& pre, const json& normalizer) {
    // NFC is accepted as the identity: exact for text already in NFC (nearly all text); input
    // in other normal forms may tokenize differently from HF.
    for (const json& n : flatten(normalizer, "normalizers")) {
      if (n.value("type", std::string()) != "NFC") {
        fail(ErrorCode::kUnsupported, "normalizer " + describe(n) + " with a byte-level model");
      }
    }
    const std::vector<json> stages = flatten(pre, "pretokenizers");
    const json& last = stages.back();
    if (last.value("type", std::string()) != "ByteLevel") {
      fail(ErrorCode::kUnsupported,
           "pre_tokenizer " + describe(pre) + ": ByteLevel is not the last stage");
    }
    if (bool_field(last, "add_prefix_space", false)) {
      fail(ErrorCode::kUnsupported, "pre_tokenizer ByteLevel with add_prefix_space true");
    }
    const bool use_regex = bool_field(last, "use_regex", true);
    std::string name;
    if (stages.size() == 1 && use_regex) {
      name = "gpt2";
    } else if (stages.size() == 2 && use_regex &&
               stages[0].value("type", std::string()) == "Digits" &&
               bool_field(stages[0], "individual_digits", false)) {
      name = "smollm";
    } else if (stages.size() == 2 && !use_regex &&
               stages[0].value("type", std::string()) == "Split") {
      const json& split = stages[0];
      const json pattern = split.value("pattern", json());
      const std::string behavior = split.value("behavior", std::string());
      if (!pattern.is_object() || !pattern.contains("Regex") || !pattern["Regex"].is_string()) {
        fail(ErrorCode::kUnsupported,
             "pre_tokenizer Split pattern " + describe(pattern) + " is not a regex");
      }
      const std::string regex = pattern["Regex"].get<std::string>();
      auto it = known_split_regexes().find(regex);
      if (it == known_split_regexes().end()) {
        fail(ErrorCode::kUnsupported,
             "pre_tokenizer Split regex '" + regex +
                 "' is not one of the known patterns (gpt2, llama3, qwen2)");
      }
      if (behavior != "Isolated" || bool_field(split, "invert", false)) {
        fail(ErrorCode::kUnsupported, "pre_tokenizer Split behavior '" + behavior + "' (invert " +
                                          describe(split.value("invert", json())) +
                                          "), expected Isolated, not inverted");
      }
      name = it->second;
    } else {
      fail(ErrorCode::kUnsupported,
           "pre_tokenizer " + describe(pre) + " is not a known byte-level configuration");
    }
    spec_.pre_tokenizer = name;
  }

  void read_sentencepiece(const json& pre, const json& normalizer, bool byte_fallback) {
    spec_.add_space_prefix = false;
    bool replaces_spaces = false;
    for (const json& n : flatten(normalizer, "normalizers")) {
      const std::string type = n.value("type", std::string());
      if (type == "Prepend" && n.value("prepend", std::string()) == kMetaspace) {
        spec_.add_space_prefix = true;
        spec_.space_prefix_mode = SpacePrefixMode::kEverySegment;
      } else if (type == "Replace" && n.value("content", std::string()) == kMetaspace &&
                 n.contains("pattern") && n["pattern"].value("String", std::string()) == " ") {
        replaces_spaces = true;
      } else {
        fail(ErrorCode::kUnsupported, "normalizer " + describe(n) + " with a SentencePiece model");
      }
    }
    for (const json& p : flatten(pre, "pretokenizers")) {
      if (p.value("type", std::string()) != "Metaspace" ||
          p.value("replacement", std::string()) != kMetaspace) {
        fail(ErrorCode::kUnsupported,
             "pre_tokenizer " + describe(p) + " with a SentencePiece model");
      }
      if (!p.contains("split") || bool_field(p, "split", true)) {
        fail(ErrorCode::kUnsupported, "pre_tokenizer Metaspace that splits on spaces");
      }
      replaces_spaces = true;
      std::string scheme = p.value("prepend_scheme", std::string());
      if (scheme.empty()) scheme = bool_field(p, "add_prefix_space", true) ? "always" : "never";
      if (scheme == "always") {
        spec_.add_space_prefix = true;
        spec_.space_prefix_mode = SpacePrefixMode::kMetaspaceAlways;
      } else if (scheme == "first") {
        spec_.add_space_prefix = true;
        spec_.space_prefix_mode = SpacePrefixMode::kMetaspaceFirst;
      } else if (scheme != "never") {
        fail(ErrorCode::kUnsupported, "Metaspace prepend_scheme '" + scheme + "'");
      }
    }
    if (!replaces_spaces) {
      fail(ErrorCode::kUnsupported,
           "neither a ByteLevel pre-tokenizer nor SentencePiece-style \"▁\" spaces (normalizer " +
               describe(normalizer) + ", pre_tokenizer " + describe(pre) + ")");
    }
    if (byte_fallback) {
      for (size_t i = 0; i < spec_.tokens.size(); ++i) {
        const std::string& t = spec_.tokens[i];
        if (spec_.types[i] == TokenType::kNormal && t.size() == 6 && t.compare(0, 3, "<0x") == 0 &&
            t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
            std::isxdigit(static_cast<unsigned char>(t[4]))) {
          spec_.types[i] = TokenType::kByte;
        }
      }
    }
  }

  // TemplateProcessing whose single-sequence template starts with a special token: that token is
  // prepended (BOS), as for Llama 2 / Llama 3 tokenizer.json files.
  void read_post_processor() {
    if (!root_.contains("post_processor")) return;
    for (const json& p : flatten(root_["post_processor"], "processors")) {
      if (p.value("type", std::string()) != "TemplateProcessing") continue;
      const json single = p.value("single", json());
      if (!single.is_array() || single.empty() || !single[0].contains("SpecialToken")) continue;
      const std::string token = single[0]["SpecialToken"].value("id", std::string());
      spec_.bos_id = id_of(token, "post_processor special token");
      spec_.add_bos = true;
      return;
    }
  }

  std::string file_;
  const json& root_;
  TokenizerSpec spec_;
};

// tokenizer_config.json: a token is a string or an AddedToken object {"content": ...}.
std::string config_token_text(const json& v) {
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return {};
}

void read_tokenizer_config(const fs::path& dir, TokenizerSpec* spec) {
  const fs::path config_path = dir / "tokenizer_config.json";
  if (fs::exists(config_path)) {
    const json config = read_json_file(config_path);
    const std::string where = config_path.string() + ": ";
    struct Field {
      const char* key;
      int32_t* id;
    };
    for (const Field& f : {Field{"bos_token", &spec->bos_id}, Field{"eos_token", &spec->eos_id},
                           Field{"unk_token", &spec->unk_id}, Field{"pad_token", &spec->pad_id}}) {
      if (!config.contains(f.key) || config[f.key].is_null()) continue;
      const std::string text = config_token_text(config[f.key]);
      if (text.empty()) {
        throw_error(ErrorCode::kCorruptData,
                    where + f.key + " is " + describe(config[f.key]) + ", expected a token");
      }
      *f.id = find_token(*spec, text);
      if (*f.id < 0) {
        throw_error(ErrorCode::kCorruptData,
                    where + f.key + " '" + text + "' is not in the tokenizer's vocabulary");
      }
    }
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean()) {
      spec->add_bos = config["add_bos_token"].get<bool>();
    }
    if (config.contains("chat_template")) {
      const json& t = config["chat_template"];
      if (t.is_string()) {
        spec->chat_template = t.get<std::string>();
      } else if (t.is_array()) {  // named templates: take "default", else the first
        for (const json& named : t) {
          if (!named.is_object() || !named.contains("template")) continue;
          if (spec->chat_template.empty() || named.value("name", std::string()) == "default") {
            spec->chat_template = named["template"].get<std::string>();
          }
        }
      }
    }
  }
  const fs::path jinja_path = dir / "chat_template.jinja";  // newer transformers save it apart
  if (spec->chat_template.empty() && fs::exists(jinja_path)) {
    std::ifstream in(jinja_path, std::ios::binary);
    spec->chat_template.assign(std::istreambuf_iterator<char>(in),
                               std::istreambuf_iterator<char>());
  }
}

}  // namespace

TokenizerSpec load_hf_tokenizer(const std::string& dir_or_file) {
  fs::path file(dir_or_file);
  if (fs::is_directory(file)) file /= "tokenizer.json";
  if (!fs::exists(file)) throw_error(ErrorCode::kNotFound, file.string() + ": no such file");
  const json root = read_json_file(file);
  try {
    HfTokenizerJson reader(file, root);
    TokenizerSpec spec = reader.parse();
    read_tokenizer_config(file.parent_path(), &spec);
    return spec;
  } catch (const json::exception& e) {  // a field of an unexpected JSON type
    throw_error(ErrorCode::kCorruptData, file.string() + ": " + e.what());
  }
}

}  // namespace arbor
