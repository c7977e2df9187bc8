// tiktoken.model reading, and tiktoken's encoding: specials, Kimi's text cuts, the split pattern
// and byte-pair merging by rank.
#include "core/text/tiktoken.h"

#include <array>
#include <functional>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/text/tokenizer_config.h"
#include "core/text/tokenizer_json/tokenizer_json.h"

namespace kvrt::text {

namespace {

using tokenizer_json::AddedToken;
using tokenizer_json::AddedTokenMatcher;
using tokenizer_json::PieceCache;
using tokenizer_json::Regex;
using tokenizer_json::Segment;
using tokenizer_json::Span;
using tokenizer_json::StringHash;

// Kimi's tokenizer reserves this many ids after the ranks for special tokens
// (TikTokenTokenizer.num_reserved_special_tokens; vocab_size = ranks + 256).
constexpr int32_t kReservedSpecialTokens = 256;

// Kimi's pat_str (tokenization_kimi.py) for PCRE2. tiktoken runs it with Rust's regex syntax,
// which PCRE2 reads differently in two places, so it is rewritten here to mean the same:
// - "[X&&[^\p{Han}]]" is a class intersection there and two literal '&' in PCRE2; it becomes
//   "(?:(?!\p{sc=Han})[X])" (a character of X that is not Han);
// - a bare \p{Han} is Script=Han there and Script_Extensions=Han in PCRE2 (where "、" is Han, so
//   "我、" would be one piece); \p{sc=Han} is the script proper.
// Both show on a small vocabulary in tests/data/tokenizers/kimi-tiktoken.json ("synthetic").
constexpr std::string_view kKimiPattern =
    R"(\p{sc=Han}+)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{sc=Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])*)"
    R"((?:(?!\p{sc=Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])+(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|[^\r\n\p{L}\p{N}]?(?:(?!\p{sc=Han})[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}])+)"
    R"((?:(?!\p{sc=Han})[\p{Ll}\p{Lm}\p{Lo}\p{M}])*(?i:'s|'t|'re|'ve|'m|'ll|'d)?)"
    R"(|\p{N}{1,3})"
    R"(| ?[^\s\p{L}\p{N}]+[\r\n]*)"
    R"(|\s*[\r\n]+)"
    R"(|\s+(?!\S))"
    R"(|\s+)";

// Kimi's encode() (like Meta's Llama 3 tokenizer) cuts a text before tiktoken sees it: into
// 400,000-character chunks, and each run of more than 25,000 whitespace or non-whitespace
// characters (Python's str.isspace) after its 25,000th character. The cuts change ids only in
// texts that long, but they do change them there.
constexpr size_t kMaxChunkChars = 400'000;
constexpr size_t kMaxRunChars = 25'000;

// Python's str.isspace: Unicode White_Space and the information separators U+001C..U+001F.
bool is_python_space(char32_t c) {
  return tokenizer_json::is_white_space(c) || (c >= 0x1C && c <= 0x1F);
}

// text (valid UTF-8) as Kimi's encode() cuts it.
std::vector<std::string_view> kimi_cuts(std::string_view text) {
  std::vector<std::string_view> parts;
  size_t start = 0, chunk_chars = 0, run = 0;
  bool run_is_space = false;
  for (size_t at = 0; at < text.size();) {
    size_t len;
    const char32_t c = decode_utf8(text, at, &len);
    if (chunk_chars == kMaxChunkChars) {
      parts.push_back(text.substr(start, at - start));
      start = at;
      chunk_chars = 0;
    }
    const bool space = is_python_space(c);
    if (chunk_chars == 0) {  // a chunk starts a run of its own
      run = 0;
      run_is_space = space;
    }
    if (space != run_is_space) {
      run = 1;
      run_is_space = space;
    } else if (++run > kMaxRunChars) {
      parts.push_back(text.substr(start, at - start));
      start = at;
      run = 1;
    }
    ++chunk_chars;
    at += len;
  }
  parts.push_back(text.substr(start));
  return parts;
}

// Strict base64 (RFC 4648, standard alphabet, padded): *out gets the bytes; false on anything
// else.
bool decode_base64(std::string_view in, std::string* out) {
  static const std::array<int8_t, 256> kValue = [] {
    std::array<int8_t, 256> v;
    v.fill(-1);
    const std::string_view alphabet =
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    for (size_t i = 0; i < alphabet.size(); ++i) v[static_cast<uint8_t>(alphabet[i])] = i;
    return v;
  }();
  if (in.empty() || in.size() % 4 != 0) return false;
  size_t padding = 0;
  while (padding < 2 && in[in.size() - 1 - padding] == '=') ++padding;
  out->clear();
  uint32_t bits = 0;
  int bit_count = 0;
  for (size_t i = 0; i + padding < in.size(); ++i) {
    const int8_t v = kValue[static_cast<uint8_t>(in[i])];
    if (v < 0) return false;
    bits = ((bits << 6) | static_cast<uint32_t>(v)) & 0xFFFF;
    bit_count += 6;
    if (bit_count >= 8) {
      bit_count -= 8;
      out->push_back(static_cast<char>((bits >> bit_count) & 0xFF));
    }
  }
  // The bits a padded group leaves over are zero in canonical base64.
  return (bits & ((1u << bit_count) - 1)) == 0;
}

class TiktokenTokenizer final : public Tokenizer {
 public:
  using Tokenizer::decode;

  Status read_model(std::string_view model, const std::string& name);
  Status configure(const TokenizerConfig& config, const std::string& config_name);

  std::vector<int32_t> encode(std::string_view input, bool add_special_tokens) const override {
    // Kimi's encode takes a Python str: bytes that are not UTF-8 read as U+FFFD.
    std::string repaired;
    input = valid_utf8_or_repaired(input, &repaired);
    std::vector<int32_t> ids;
    if (add_special_tokens && add_bos_) ids.push_back(bos_id_);
    std::vector<Segment> segments;
    std::vector<Span> pieces;
    for (std::string_view part : kimi_cuts(input)) {
      segments.clear();
      specials_matcher_.split(part, &segments);
      for (const Segment& segment : segments) {
        if (segment.id >= 0) {
          ids.push_back(segment.id);
          continue;
        }
        const std::string_view text = part.substr(segment.begin, segment.end - segment.begin);
        pieces.clear();
        pattern_->find_all(text, &pieces);
        for (const Span& p : pieces) encode_piece(text.substr(p.begin, p.end - p.begin), &ids);
      }
    }
    if (add_special_tokens && add_eos_) ids.push_back(eos_id_);
    return ids;
  }

  std::string decode(std::span<const int32_t> ids, const DecodeOptions& options) const override {
    std::string bytes;
    for (int32_t id : ids) {
      if (id < 0 || id >= vocab_size()) continue;
      if (options.skip_special_tokens && is_special(id)) continue;
      bytes += tokens_[id];
    }
    std::string text;
    append_utf8_lossy(bytes, &text);
    return text;
  }

  bool is_special(int32_t id) const override { return id >= num_ranks() && id < vocab_size(); }
  // A rank's bytes as transformers shows Kimi's tokens (GPT-2's byte-to-character table); a
  // special's name.
  std::string piece(int32_t id) const override {
    if (id < 0 || id >= vocab_size()) return "";
    if (is_special(id)) return tokens_[id];
    std::string out;
    for (char b : tokens_[id]) out += tokenizer_json::byte_chars()[static_cast<uint8_t>(b)];
    return out;
  }
  int32_t bos_id() const override { return bos_id_; }
  int32_t eos_id() const override { return eos_id_; }
  int32_t vocab_size() const override { return static_cast<int32_t>(tokens_.size()); }

 private:
  int32_t num_ranks() const { return vocab_size() - kReservedSpecialTokens; }

  // tiktoken on one piece of the split: its rank when it is a token, else its bytes merged pair
  // by pair, always the adjacent pair whose concatenation has the lowest rank (the leftmost of
  // equals), until no adjacent pair is a token.
  void encode_piece(std::string_view piece, std::vector<int32_t>* ids) const {
    if (const auto it = ranks_.find(piece); it != ranks_.end()) {
      ids->push_back(it->second);
      return;
    }
    if (cache_.append(piece, ids)) return;
    const size_t first = ids->size();
    merge_bytes(piece, ids);
    cache_.remember(piece, *ids, first);
  }

  // The merging of encode_piece with a heap rather than tiktoken's scan of every pair per merge:
  // O(n log n) for a long piece (a 25,000-character run), the same merges in the same order.
  void merge_bytes(std::string_view piece, std::vector<int32_t>* ids) const {
    // Part i starts at byte i and, while alive, runs to the start of the next live part.
    struct Part {
      size_t next;   // piece.size() for the last part
      size_t prev;   // SIZE_MAX for the first part
      int32_t rank;  // rank of this part joined with the next, or -1
      bool alive;
    };
    const size_t n = piece.size();
    std::vector<Part> parts(n);
    const auto pair_rank = [&](size_t i) -> int32_t {
      if (parts[i].next >= n) return -1;
      const size_t end = parts[parts[i].next].next;
      const auto it = ranks_.find(piece.substr(i, end - i));
      return it == ranks_.end() ? -1 : it->second;
    };
    // (rank, start): the lowest rank first, the leftmost of equal ranks first.
    using Entry = std::pair<int32_t, size_t>;
    std::priority_queue<Entry, std::vector<Entry>, std::greater<>> heap;
    for (size_t i = 0; i < n; ++i) parts[i] = {i + 1, i == 0 ? SIZE_MAX : i - 1, -1, true};
    for (size_t i = 0; i < n; ++i) {
      parts[i].rank = pair_rank(i);
      if (parts[i].rank >= 0) heap.push({parts[i].rank, i});
    }
    while (!heap.empty()) {
      const auto [rank, i] = heap.top();
      heap.pop();
      // A stale entry: the part was merged away, or its pair grew since (a longer string, so
      // another rank: a live part's current rank is never pushed twice).
      if (!parts[i].alive || parts[i].rank != rank) continue;
      const size_t gone = parts[i].next;
      parts[gone].alive = false;
      parts[i].next = parts[gone].next;
      if (parts[i].next < n) parts[parts[i].next].prev = i;
      for (size_t changed : {i, parts[i].prev}) {
        if (changed == SIZE_MAX) continue;
        parts[changed].rank = pair_rank(changed);
        if (parts[changed].rank >= 0) heap.push({parts[changed].rank, changed});
      }
    }
    for (size_t i = 0; i < n; i = parts[i].next) {
      // Every part is a token: a single byte (read_model checks all 256 are) or a merge.
      ids->push_back(ranks_.find(piece.substr(i, parts[i].next - i))->second);
    }
  }

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> ranks_;  // bytes -> rank
  std::vector<std::string> tokens_;  // id -> a rank's bytes or a special's name
  std::vector<AddedToken> specials_;
  AddedTokenMatcher specials_matcher_;
  std::shared_ptr<const Regex> pattern_;
  int32_t bos_id_ = -1, eos_id_ = -1;
  bool add_bos_ = false, add_eos_ = false;
  PieceCache cache_;
};

Status TiktokenTokenizer::read_model(std::string_view model, const std::string& name) {
  struct Line {
    std::string bytes;
    int64_t rank;
    size_t number;
  };
  std::vector<Line> lines;
  size_t number = 0;
  for (size_t at = 0; at < model.size();) {
    size_t end = model.find('\n', at);
    if (end == std::string_view::npos) end = model.size();
    std::string_view line = model.substr(at, end - at);
    at = end + 1;
    ++number;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    if (line.empty()) continue;  // as tiktoken's loader skips them
    const auto bad = [&](const std::string& why) {
      return Status::InvalidArgument(name + ": line " + std::to_string(number) + ": " + why);
    };
    const size_t space = line.find_first_of(" \t");
    const size_t rank_at = line.find_first_not_of(" \t", space);
    if (space == std::string_view::npos || rank_at == std::string_view::npos ||
        line.find_first_of(" \t", rank_at) != std::string_view::npos) {
      return bad("is not \"<base64 token> <rank>\"");
    }
    const std::string_view rank_text = line.substr(rank_at);
    if (rank_text.size() > 9 || rank_text.find_first_not_of("0123456789") != std::string::npos) {
      return bad("rank \"" + std::string(rank_text.substr(0, 20)) +
                 "\" is not a number below 10^9");
    }
    Line entry{"", std::stoll(std::string(rank_text)), number};
    if (!decode_base64(line.substr(0, space), &entry.bytes)) {
      return bad("token \"" + std::string(line.substr(0, std::min<size_t>(space, 40))) +
                 "\" is not base64");
    }
    lines.push_back(std::move(entry));
  }
  if (lines.empty()) return Status::InvalidArgument(name + ": no tokens");
  const auto n = static_cast<int64_t>(lines.size());
  // Kimi's special ids follow the ranks (len(ranks) + k): ranks must be exactly 0..n-1.
  std::vector<size_t> line_of_rank(lines.size(), 0);
  tokens_.assign(lines.size() + kReservedSpecialTokens, "");
  ranks_.reserve(lines.size());
  for (Line& line : lines) {
    const std::string at = name + ": line " + std::to_string(line.number) + ": ";
    if (line.rank >= n) {
      return Status::InvalidArgument(at + "rank " + std::to_string(line.rank) +
                                     ", but the file has " + std::to_string(n) +
                                     " tokens (ranks must be 0.." + std::to_string(n - 1) + ")");
    }
    if (line_of_rank[line.rank] != 0) {
      return Status::InvalidArgument(at + "rank " + std::to_string(line.rank) +
                                     " is already given on line " +
                                     std::to_string(line_of_rank[line.rank]));
    }
    const auto [it, added] = ranks_.emplace(line.bytes, static_cast<int32_t>(line.rank));
    if (!added) {
      return Status::InvalidArgument(at + "the token is already given on line " +
                                     std::to_string(line_of_rank[it->second]));
    }
    line_of_rank[line.rank] = line.number;
    tokens_[line.rank] = std::move(line.bytes);
  }
  // Byte-pair merging starts from single bytes: without all 256 some text has no encoding.
  for (int b = 0; b < 256; ++b) {
    if (!ranks_.contains(std::string(1, static_cast<char>(b)))) {
      return Status::InvalidArgument(name + ": no token for the byte " + std::to_string(b) +
                                     ", which byte-pair merging starts from");
    }
  }
  Result<std::shared_ptr<const Regex>> pattern = Regex::compile(std::string(kKimiPattern), name);
  if (!pattern.ok()) return pattern.status();
  pattern_ = *pattern;
  return Status::Ok();
}

Status TiktokenTokenizer::configure(const TokenizerConfig& config, const std::string& config_name) {
  const int32_t first = num_ranks();
  for (const auto& [id, content] : config.added_tokens_decoder) {
    if (id < first || id >= vocab_size()) {
      return Status::ConfigError(
          config_name + ": added_tokens_decoder[\"" + std::to_string(id) + "\"] (\"" + content +
          "\") is not one of the " + std::to_string(kReservedSpecialTokens) +
          " special ids after the tiktoken model's ranks (" + std::to_string(first) + ".." +
          std::to_string(vocab_size() - 1) + ")");
    }
  }
  std::unordered_map<std::string, int32_t> special_ids;
  specials_.reserve(kReservedSpecialTokens);  // the matcher points into it
  for (int32_t id = first; id < vocab_size(); ++id) {
    const auto named = config.added_tokens_decoder.find(id);
    tokens_[id] = named != config.added_tokens_decoder.end()
                      ? named->second
                      : "<|reserved_token_" + std::to_string(id) + "|>";
    if (const auto [it, added] = special_ids.emplace(tokens_[id], id); !added) {
      return Status::ConfigError(config_name + ": added_tokens_decoder names \"" + tokens_[id] +
                                 "\" for both " + std::to_string(it->second) + " and " +
                                 std::to_string(id));
    }
    AddedToken token;
    token.id = id;
    token.content = tokens_[id];
    token.special = true;
    specials_.push_back(std::move(token));
  }
  for (const AddedToken& t : specials_) specials_matcher_.add(t.content, &t);
  specials_matcher_.sort();

  // Kimi's TikTokenTokenizer defaults: bos_token "[BOS]", eos_token "[EOS]".
  for (auto [token, key, fallback, id] :
       {std::tuple(&config.bos_token, "bos_token", "[BOS]", &bos_id_),
        std::tuple(&config.eos_token, "eos_token", "[EOS]", &eos_id_)}) {
    const std::string wanted = token->value_or(fallback);
    const auto it = special_ids.find(wanted);
    if (it != special_ids.end()) {
      *id = it->second;
    } else if (token->has_value()) {
      return Status::ConfigError(config_name + ": " + key + " \"" + wanted +
                                 "\" is not a special token of the tiktoken model");
    }
  }
  // What add_special_tokens adds: Kimi's tokenizer adds nothing (transformers' encode goes
  // through PreTrainedTokenizer.build_inputs_with_special_tokens, which Kimi does not override,
  // and its tokenizer_config.json has no add_bos_token), so BOS and EOS only when the config
  // asks, as LlamaTokenizer's add_bos_token / add_eos_token would.
  add_bos_ = config.add_bos_token.value_or(false);
  add_eos_ = config.add_eos_token.value_or(false);
  for (auto [wanted, key, id] : {std::tuple(add_bos_, "add_bos_token", bos_id_),
                                 std::tuple(add_eos_, "add_eos_token", eos_id_)}) {
    if (wanted && id < 0) {
      return Status::ConfigError(config_name + ": " + key +
                                 " is true, but the tiktoken model has no such token");
    }
  }
  return Status::Ok();
}

}  // namespace

Result<std::unique_ptr<Tokenizer>> load_tiktoken(const std::string& model_path,
                                                 const std::string& config_path) {
  Result<std::string> model = util::read_file(model_path, kTiktokenFile);
  if (!model.ok()) return model.status();
  Result<TokenizerConfig> config = read_tokenizer_config_if_any(config_path);
  if (!config.ok()) return config.status();
  // Without a tokenizer_config.json, what the specials lack is the model's doing.
  return parse_tiktoken(*model, *config, model_path,
                        config_path.empty() ? model_path : config_path);
}

Result<std::unique_ptr<Tokenizer>> parse_tiktoken(std::string_view model,
                                                  const TokenizerConfig& config,
                                                  const std::string& model_name,
                                                  const std::string& config_name) {
  auto tokenizer = std::make_unique<TiktokenTokenizer>();
  if (Status s = tokenizer->read_model(model, model_name); !s.ok()) return s;
  if (Status s = tokenizer->configure(config, config_name); !s.ok()) return s;
  return std::unique_ptr<Tokenizer>(std::move(tokenizer));
}

}  // namespace kvrt::text
