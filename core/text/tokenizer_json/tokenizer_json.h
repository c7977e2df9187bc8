// The parts of a tokenizer.json, shared by the files that read and run each stage, as Hugging
// Face's tokenizers lays them out: patterns and key-naming JSON reading (pattern.cc),
// normalizers, pre-tokenizers, the BPE model, added tokens, decoders and post-processors.
// Nothing here is used outside core/text.
#pragma once

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/text/utf8.h"
#include "core/util/status.h"

namespace kvrt::text::tokenizer_json {

using json = nlohmann::json;

// ---- Regular expressions (PCRE2, UTF + UCP, JIT) and patterns (pattern.cc) ----

struct Span {
  size_t begin, end;
};

class Regex {
 public:
  // where names the JSON key in errors.
  static Result<std::shared_ptr<const Regex>> compile(const std::string& pattern,
                                                      const std::string& where);
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The non-empty, non-overlapping matches of the pattern in text (valid UTF-8), left to right.
  void find_all(std::string_view text, std::vector<Span>* out) const;
  // text with every match replaced by content.
  std::string replace_all(std::string_view text, std::string_view content) const;

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

// A Split/Replace pattern: {"String": "..."} (literal) or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;

  void find_all(std::string_view text, std::vector<Span>* out) const;
  std::string replace_all(std::string_view text, std::string_view content) const;
};

// ---- JSON reading with errors that name the key ----

// A tokenizer.json being read: the file's name for messages.
struct Reader {
  const std::string& name;

  Status unsupported(const std::string& key, const std::string& what) const {
    return Status::Unsupported(name + ": " + key + " " + what + " is not supported by kvrt");
  }
  Status invalid(const std::string& key, const std::string& what) const {
    return Status::InvalidArgument(name + ": " + key + " " + what);
  }
  Status get_string(const json& j, const char* field, const std::string& key,
                    std::string* out) const {
    const auto it = j.find(field);
    if (it == j.end() || !it->is_string()) return invalid(key + "." + field, "is not a string");
    *out = it->get<std::string>();
    return Status::Ok();
  }
  // A boolean field; absent or null keeps *out.
  Status get_bool(const json& j, const char* field, const std::string& key, bool* out) const {
    const auto it = j.find(field);
    if (it == j.end() || it->is_null()) return Status::Ok();
    if (!it->is_boolean()) return invalid(key + "." + field, "is not a boolean");
    *out = it->get<bool>();
    return Status::Ok();
  }
  Result<std::string> type_of(const json& j, const std::string& key) const {
    if (!j.is_object()) return invalid(key, "is not an object");
    std::string type;
    if (Status s = get_string(j, "type", key, &type); !s.ok()) return s;
    return type;
  }
  // {"String": s} or {"Regex": r} at j[field].
  Status get_pattern(const json& j, const std::string& key, Pattern* out) const {
    const auto it = j.find("pattern");
    const std::string at = key + ".pattern";
    if (it == j.end() || !it->is_object()) return invalid(at, "is not an object");
    if (it->contains("String") && (*it)["String"].is_string()) {
      out->literal = (*it)["String"].get<std::string>();
      return Status::Ok();
    }
    if (it->contains("Regex") && (*it)["Regex"].is_string()) {
      Result<std::shared_ptr<const Regex>> re =
          Regex::compile((*it)["Regex"].get<std::string>(), name + ": " + at + ".Regex");
      if (!re.ok()) return re.status();
      out->regex = *re;
      return Status::Ok();
    }
    return invalid(at, "has neither a \"String\" nor a \"Regex\" string");
  }
  // j: one component or a {"type": "Sequence", <list>: [...]} of them, nested sequences
  // flattened (applying a sequence is applying its parts in order); read_one(j, key, type) reads
  // each part. null is an absent component.
  template <class ReadOne>
  Status read_flattened(const json& j, const std::string& key, const char* list,
                        const ReadOne& read_one) const {
    if (j.is_null()) return Status::Ok();
    Result<std::string> type = type_of(j, key);
    if (!type.ok()) return type.status();
    if (*type != "Sequence") return read_one(j, key, *type);
    const auto it = j.find(list);
    if (it == j.end() || !it->is_array()) return invalid(key + "." + list, "is not a list");
    for (size_t i = 0; i < it->size(); ++i) {
      const std::string at = key + "." + list + "[" + std::to_string(i) + "]";
      if (Status s = read_flattened((*it)[i], at, list, read_one); !s.ok()) return s;
    }
    return Status::Ok();
  }
  // A single code point string (Metaspace's replacement, Strip's content).
  Status get_char(const json& j, const char* field, const std::string& key,
                  std::string* out) const {
    if (Status s = get_string(j, field, key, out); !s.ok()) return s;
    size_t len = 0;
    if (!out->empty() && valid_utf8(*out)) decode_utf8(*out, 0, &len);
    if (out->empty() || len != out->size()) {
      return invalid(key + "." + field, "is not a single character");
    }
    return Status::Ok();
  }
};

// ---- Normalizers (normalizers.cc) ----

struct NormalizerStep {
  enum class Kind { kUnicode, kLowercase, kReplace, kPrepend } kind;
  int utf8proc_options = 0;  // kUnicode: NFC, NFKC, NFD or NFKD
  Pattern pattern;           // kReplace
  std::string content;       // kReplace: the replacement; kPrepend: the prefix
};

void normalize(const std::vector<NormalizerStep>& steps, std::string* text);
Status read_normalizer(const Reader& r, const json& j, const std::string& key,
                       std::vector<NormalizerStep>* out);

// ---- Pre-tokenizers (pre_tokenizers.cc) ----

// A piece of text being pre-tokenized; at_start: it begins at the text's first character (what
// Metaspace's prepend_scheme "first" asks).
struct Piece {
  std::string text;
  bool at_start;
};

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };
enum class PrependScheme { kFirst, kAlways, kNever };

struct PreTokenizerStep {
  enum class Kind { kSplit, kByteLevel, kMetaspace } kind;
  Pattern pattern;  // kSplit; kByteLevel's regex when use_regex
  SplitBehavior behavior = SplitBehavior::kIsolated;
  bool invert = false;
  bool add_prefix_space = false;  // kByteLevel
  bool use_regex = false;         // kByteLevel
  std::string replacement;        // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;
  bool split = true;  // kMetaspace
};

// GPT-2's byte-to-character table: printable bytes stand for themselves, the others for U+0100..
const std::array<std::string, 256>& byte_chars();
void pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::vector<Piece>* pieces);
// Metaspace's prepend_scheme; older files have add_prefix_space instead.
Status read_prepend_scheme(const Reader& r, const json& j, const std::string& key,
                           PrependScheme* out);
Status read_pre_tokenizer(const Reader& r, const json& j, const std::string& key,
                          std::vector<PreTokenizerStep>* out);

// ---- Encoded pieces, remembered (the BPE model here, tiktoken.cc) ----

// Hashes std::string keys and looks them up by std::string_view.
struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

// The ids of pieces (pre-tokens) already merged, shared by every thread that encodes: pieces of
// up to 256 bytes, up to 65,536 of them (then no more are added), so memory stays bounded.
class PieceCache {
 public:
  // Appends piece's ids to *ids and returns true when it is remembered.
  bool append(std::string_view piece, std::vector<int32_t>* ids) const {
    if (piece.size() > kMaxPieceBytes) return false;
    std::lock_guard<std::mutex> lock(mutex_);
    const auto it = ids_.find(piece);
    if (it == ids_.end()) return false;
    ids->insert(ids->end(), it->second.begin(), it->second.end());
    return true;
  }
  // Remembers ids[first..] as piece's ids.
  void remember(std::string_view piece, const std::vector<int32_t>& ids, size_t first) const {
    if (piece.size() > kMaxPieceBytes) return;
    std::lock_guard<std::mutex> lock(mutex_);
    if (ids_.size() < kMaxPieces)
      ids_.emplace(piece, std::vector<int32_t>(ids.begin() + first, ids.end()));
  }

 private:
  static constexpr size_t kMaxPieceBytes = 256;
  static constexpr size_t kMaxPieces = 1 << 16;
  mutable std::mutex mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> ids_;
};

// ---- The model: BPE (bpe.cc) ----

class BpeModel {
 public:
  // Reads tokenizer.json's "model"; *pieces gets each id's vocabulary entry ("" for an unused
  // id).
  Status read(const json& model, const Reader& r, std::vector<std::string>* pieces);
  // The BPE model on one pre-token: its characters (or, with byte_fallback, the bytes of those
  // missing from the vocabulary), merged by rank.
  void tokenize_word(const std::string& word, std::vector<int32_t>* ids) const;
  // The id of a vocabulary entry, or -1.
  int32_t find(std::string_view token) const {
    const auto it = vocab_.find(token);
    return it == vocab_.end() ? -1 : it->second;
  }

 private:
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool removed;
  };

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // -> rank, new id
  std::array<int32_t, 256> byte_ids_{};  // "<0xXX>" ids for byte_fallback, -1 if missing
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  PieceCache cache_;
};

// ---- Added tokens (added_tokens.cc) ----

// Unicode White_Space, what Rust's char::is_whitespace and regex \s accept.
bool is_white_space(char32_t c);

struct AddedToken {
  int32_t id;
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = false, special = false;
};

struct Segment {
  size_t begin, end;
  int32_t id;  // the added token, or -1 for text between them
};

// Leftmost-longest matching of a set of added tokens, as the reference's Aho-Corasick automaton.
class AddedTokenMatcher {
 public:
  // pattern: the string each token matches (its content, or its normalized content).
  void add(const std::string& pattern, const AddedToken* token) {
    if (pattern.empty()) return;
    by_first_byte_[static_cast<uint8_t>(pattern[0])].push_back({pattern, token});
  }
  // After the last add: the longest candidate first.
  void sort() {
    for (auto& list : by_first_byte_) {
      std::stable_sort(list.begin(), list.end(), [](const Entry& a, const Entry& b) {
        return a.pattern.size() > b.pattern.size();
      });
    }
  }
  bool empty() const {
    return std::all_of(std::begin(by_first_byte_), std::end(by_first_byte_),
                       [](const auto& l) { return l.empty(); });
  }

  // text as segments: the matched tokens (widened by lstrip/rstrip over white space) and the
  // text between them.
  void split(std::string_view text, std::vector<Segment>* out) const;

 private:
  struct Entry {
    std::string pattern;
    const AddedToken* token;
  };
  // single_word: the match must not touch a word character on either side.
  static bool accepts(std::string_view text, size_t at, const Entry& e);
  std::vector<Entry> by_first_byte_[256];
};

// ---- Decoders (decoders.cc) ----

struct DecoderStep {
  enum class Kind { kByteLevel, kByteFallback, kMetaspace, kFuse, kStrip, kReplace } kind;
  std::string content;         // kStrip: the character; kReplace: the replacement
  size_t start = 0, stop = 0;  // kStrip
  Pattern pattern;             // kReplace
  std::string replacement;     // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;
};

void decode_chain(const std::vector<DecoderStep>& steps, std::vector<std::string>* tokens);
Status read_decoder(const Reader& r, const json& j, const std::string& key,
                    std::vector<DecoderStep>* out);

// ---- Post-processors (post_processors.cc) ----

// tokenizer.json's "post_processor" (sequences flatten: each wraps what the previous ones
// produced): the ids add_special_tokens puts before the text go to the front of *prefix, those
// after it to the end of *suffix. Ids must be below vocab_size.
Status read_post_processor(const Reader& r, const json& j, const std::string& key,
                           int32_t vocab_size, std::vector<int32_t>* prefix,
                           std::vector<int32_t>* suffix);

}  // namespace kvrt::text::tokenizer_json
