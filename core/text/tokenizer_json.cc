#include "core/text/tokenizer_json.h"

#include <algorithm>
#include <tuple>
#include <utility>
#include <vector>

#include "core/text/tokenizer_json/tokenizer_json.h"
#include "core/util/file.h"

namespace kvrt::text {

namespace {

using tokenizer_json::AddedToken;
using tokenizer_json::AddedTokenMatcher;
using tokenizer_json::BpeModel;
using tokenizer_json::decode_chain;
using tokenizer_json::DecoderStep;
using tokenizer_json::json;
using tokenizer_json::normalize;
using tokenizer_json::NormalizerStep;
using tokenizer_json::Pattern;
using tokenizer_json::Piece;
using tokenizer_json::pre_tokenize;
using tokenizer_json::PreTokenizerStep;
using tokenizer_json::read_decoder;
using tokenizer_json::read_normalizer;
using tokenizer_json::read_post_processor;
using tokenizer_json::read_pre_tokenizer;
using tokenizer_json::Reader;
using tokenizer_json::Segment;

// ---- The tokenizer: a tokenizer.json's stages assembled ----

class HfTokenizer final : public Tokenizer {
 public:
  using Tokenizer::decode;

  std::vector<int32_t> encode(std::string_view input, bool add_special_tokens) const override {
    // The reference takes Unicode strings: bytes that are not UTF-8 read as U+FFFD.
    std::string repaired;
    input = valid_utf8_or_repaired(input, &repaired);
    std::vector<int32_t> ids;
    if (add_special_tokens) ids = prefix_;
    std::vector<Segment> raw, normalized_segments;
    raw_matcher_.split(input, &raw);
    std::vector<Piece> pieces;
    for (const Segment& segment : raw) {
      if (segment.id >= 0) {
        ids.push_back(segment.id);
        continue;
      }
      std::string text(input.substr(segment.begin, segment.end - segment.begin));
      normalize(normalizer_, &text);
      normalized_segments.clear();
      normalized_matcher_.split(text, &normalized_segments);
      for (const Segment& part : normalized_segments) {
        if (part.id >= 0) {
          ids.push_back(part.id);
          continue;
        }
        pieces.clear();
        pieces.push_back({text.substr(part.begin, part.end - part.begin),
                          segment.begin == 0 && part.begin == 0});
        pre_tokenize(pre_tokenizer_, &pieces);
        for (const Piece& piece : pieces) model_.tokenize_word(piece.text, &ids);
      }
    }
    if (add_special_tokens) ids.insert(ids.end(), suffix_.begin(), suffix_.end());
    return ids;
  }

  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options) const override {
    std::vector<std::string> tokens;
    tokens.reserve(ids.size());
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size() || pieces_[id].empty()) continue;
      if (options.skip_special_tokens && special_[id]) continue;
      tokens.push_back(pieces_[id]);
    }
    std::string text;
    if (decoder_.empty()) {
      // No decoder: the reference joins the tokens with spaces.
      for (size_t i = 0; i < tokens.size(); ++i) text += (i ? " " : "") + tokens[i];
    } else {
      decode_chain(decoder_, &tokens);
      for (const std::string& t : tokens) text += t;
    }
    if (clean_up_spaces_) clean_up_tokenization(&text);
    return text;
  }

  bool is_special(int32_t id) const override {
    return id >= 0 && id < vocab_size() && special_[id];
  }
  std::string piece(int32_t id) const override {
    return id >= 0 && id < vocab_size() ? pieces_[id] : std::string();
  }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t vocab_size() const override { return static_cast<int32_t>(pieces_.size()); }

  Status load(const json& root, const TokenizerConfig& config, const Reader& r);

 private:
  // transformers' clean_up_tokenization: no space before punctuation and English contractions.
  static void clean_up_tokenization(std::string* text) {
    static const std::pair<std::string_view, std::string_view> kRules[] = {
        {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : kRules)
      *text = Pattern{std::string(from), nullptr}.replace_all(*text, to);
  }

  Result<int32_t> token_id(const std::string& token) const;

  BpeModel model_;
  std::vector<std::string> pieces_;  // id -> text for decoding ("" for an unused id)
  std::vector<bool> special_;

  std::vector<AddedToken> added_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::vector<DecoderStep> decoder_;
  std::vector<int32_t> prefix_, suffix_;  // what add_special_tokens puts around the text
  int32_t bos_id_ = -1, eos_id_ = -1;
  bool clean_up_spaces_ = false;
};

Result<int32_t> HfTokenizer::token_id(const std::string& token) const {
  for (const AddedToken& t : added_) {
    if (t.content == token) return t.id;
  }
  if (const int32_t id = model_.find(token); id >= 0) return id;
  return Status::NotFound(token);
}

Status HfTokenizer::load(const json& root, const TokenizerConfig& config, const Reader& r) {
  if (!root.is_object()) return r.invalid("the file", "is not a JSON object");
  // root's member, or null when absent (by reference: the model's vocabulary is large).
  const auto member = [&root](const char* key) -> const json& {
    static const json kNull;
    const auto it = root.find(key);
    return it == root.end() ? kNull : *it;
  };
  if (Status s = model_.read(member("model"), r, &pieces_); !s.ok()) return s;

  // Added tokens: their ids may extend the vocabulary.
  if (const auto it = root.find("added_tokens"); it != root.end() && !it->is_null()) {
    if (!it->is_array()) return r.invalid("added_tokens", "is not a list");
    for (size_t i = 0; i < it->size(); ++i) {
      const json& t = (*it)[i];
      const std::string key = "added_tokens[" + std::to_string(i) + "]";
      AddedToken token;
      if (!t.is_object() || !t.contains("id") || !t["id"].is_number_integer() ||
          t["id"].get<int64_t>() < 0 || t["id"].get<int64_t>() >= (1 << 30)) {
        return r.invalid(key + ".id", "is not a token id");
      }
      token.id = t["id"].get<int32_t>();
      if (Status s = r.get_string(t, "content", key, &token.content); !s.ok()) return s;
      for (auto [field, out] :
           {std::pair("single_word", &token.single_word), std::pair("lstrip", &token.lstrip),
            std::pair("rstrip", &token.rstrip), std::pair("normalized", &token.normalized),
            std::pair("special", &token.special)}) {
        if (Status s = r.get_bool(t, field, key, out); !s.ok()) return s;
      }
      added_.push_back(std::move(token));
    }
  }
  for (const AddedToken& t : added_) {
    if (static_cast<size_t>(t.id) >= pieces_.size()) pieces_.resize(static_cast<size_t>(t.id) + 1);
    pieces_[t.id] = t.content;
  }
  special_.assign(pieces_.size(), false);
  for (const AddedToken& t : added_) special_[t.id] = t.special;

  if (Status s = read_normalizer(r, member("normalizer"), "normalizer", &normalizer_); !s.ok()) {
    return s;
  }
  if (Status s = read_pre_tokenizer(r, member("pre_tokenizer"), "pre_tokenizer", &pre_tokenizer_);
      !s.ok()) {
    return s;
  }
  if (Status s = read_decoder(r, member("decoder"), "decoder", &decoder_); !s.ok()) {
    return s;
  }
  if (Status s = read_post_processor(r, member("post_processor"), "post_processor", vocab_size(),
                                     &prefix_, &suffix_);
      !s.ok()) {
    return s;
  }
  // Normalized added tokens match the normalized text, the others the text as given.
  for (const AddedToken& t : added_) {
    if (t.normalized) {
      std::string pattern = t.content;
      normalize(normalizer_, &pattern);
      normalized_matcher_.add(pattern, &t);
    } else {
      raw_matcher_.add(t.content, &t);
    }
  }
  raw_matcher_.sort();
  normalized_matcher_.sort();

  const std::string config_name = "tokenizer_config.json";
  for (auto [token, key, id] : {std::tuple(&config.bos_token, "bos_token", &bos_id_),
                                std::tuple(&config.eos_token, "eos_token", &eos_id_)}) {
    if (!token->has_value()) continue;
    Result<int32_t> found = token_id(**token);
    if (!found.ok()) {
      return Status::ConfigError(r.name + ": " + config_name + "'s " + key + " \"" + **token +
                                 "\" is not a token of this tokenizer.json");
    }
    *id = *found;
  }
  clean_up_spaces_ = config.clean_up_tokenization_spaces.value_or(false);
  // LlamaTokenizerFast (and its relatives) rebuild the post-processor from add_bos_token and
  // add_eos_token: BOS A EOS, each only when asked.
  static const char* kLlamaClasses[] = {"LlamaTokenizer",     "LlamaTokenizerFast",
                                        "CodeLlamaTokenizer", "CodeLlamaTokenizerFast",
                                        "GemmaTokenizer",     "GemmaTokenizerFast"};
  if (config.tokenizer_class && std::find(std::begin(kLlamaClasses), std::end(kLlamaClasses),
                                          *config.tokenizer_class) != std::end(kLlamaClasses)) {
    prefix_.clear();
    suffix_.clear();
    if (config.add_bos_token.value_or(true)) {
      if (bos_id_ < 0) {
        return Status::ConfigError(r.name + ": " + config_name +
                                   " asks for add_bos_token without a bos_token");
      }
      prefix_.push_back(bos_id_);
    }
    if (config.add_eos_token.value_or(false)) {
      if (eos_id_ < 0) {
        return Status::ConfigError(r.name + ": " + config_name +
                                   " asks for add_eos_token without an eos_token");
      }
      suffix_.push_back(eos_id_);
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> parse_hf_tokenizer(std::string_view text,
                                                      const TokenizerConfig& config,
                                                      const std::string& name) {
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::InvalidArgument(name + ": not valid JSON");
  auto tokenizer = std::make_unique<HfTokenizer>();
  if (Status s = tokenizer->load(root, config, Reader{name}); !s.ok()) {
    return s;
  }
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

Result<std::unique_ptr<Tokenizer>> load_hf_tokenizer(const std::string& json_path,
                                                     const std::string& config_path) {
  Result<std::string> text = util::read_file(json_path, kTokenizerFile);
  if (!text.ok()) return text.status();
  Result<TokenizerConfig> config = read_tokenizer_config_if_any(config_path);
  if (!config.ok()) return config.status();
  return parse_hf_tokenizer(*text, *config, json_path);
}

}  // namespace kvrt::text
