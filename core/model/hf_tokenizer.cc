#include "core/model/hf_tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/util/file.h"

namespace kvrt::model {

namespace {

using json = nlohmann::json;

// ---- UTF-8 ----

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

// Length of the valid UTF-8 sequence at s[i], or 0 when it is not one; *subpart is then the
// length of its maximal subpart (Unicode's "substitution of maximal subparts", which Rust's
// from_utf8_lossy and the WHATWG TextDecoder both follow: one U+FFFD for each).
size_t utf8_sequence(std::string_view s, size_t i, size_t* subpart) {
  const auto byte = [&](size_t k) { return static_cast<uint8_t>(s[k]); };
  const uint8_t lead = byte(i);
  *subpart = 1;
  if (lead < 0x80) return 1;
  size_t need;
  uint8_t lo = 0x80, hi = 0xBF;  // the second byte's range; later bytes are 80..BF
  if (lead >= 0xC2 && lead <= 0xDF) {
    need = 1;
  } else if (lead >= 0xE0 && lead <= 0xEF) {
    need = 2;
    if (lead == 0xE0) lo = 0xA0;
    if (lead == 0xED) hi = 0x9F;
  } else if (lead >= 0xF0 && lead <= 0xF4) {
    need = 3;
    if (lead == 0xF0) lo = 0x90;
    if (lead == 0xF4) hi = 0x8F;
  } else {
    return 0;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) return 0;
    const uint8_t b = byte(i + k);
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return 0;
    *subpart = k + 1;
  }
  return need + 1;
}

// bytes with every invalid sequence replaced by U+FFFD, as the reference decoders do.
void append_utf8_lossy(std::string_view bytes, std::string* out) {
  for (size_t i = 0; i < bytes.size();) {
    size_t subpart;
    const size_t n = utf8_sequence(bytes, i, &subpart);
    if (n == 0) {
      out->append(kReplacementChar);
      i += subpart;
    } else {
      out->append(bytes.substr(i, n));
      i += n;
    }
  }
}

bool valid_utf8(std::string_view s) {
  for (size_t i = 0; i < s.size();) {
    size_t subpart;
    const size_t n = utf8_sequence(s, i, &subpart);
    if (n == 0) return false;
    i += n;
  }
  return true;
}

// The code point at s[i] of valid UTF-8, and its length.
char32_t decode_at(std::string_view s, size_t i, size_t* len) {
  utf8proc_int32_t cp;
  *len = static_cast<size_t>(utf8proc_iterate(reinterpret_cast<const uint8_t*>(s.data()) + i,
                                              static_cast<utf8proc_ssize_t>(s.size() - i), &cp));
  return static_cast<char32_t>(cp);
}

void append_code_point(char32_t cp, std::string* out) {
  uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

// Unicode White_Space, what Rust's char::is_whitespace and regex \s accept.
bool is_white_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

// Rust regex's \w: letters, marks, digits and connector punctuation.
bool is_word_char(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_PC:
      return true;
    default:
      return c == 0x200C || c == 0x200D;  // Join_Control
  }
}

// The code point that ends s (valid UTF-8, not empty).
char32_t last_code_point(std::string_view s) {
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<uint8_t>(s[i]) & 0xC0) == 0x80) --i;
  size_t len;
  return decode_at(s, i, &len);
}

// ---- Regular expressions (PCRE2, UTF + UCP, JIT) ----

struct Span {
  size_t begin, end;
};

// Per-thread match state: PCRE2's compiled code is shared, match data and JIT stacks are not.
struct MatchState {
  MatchState()
      : data(pcre2_match_data_create(1, nullptr)),
        context(pcre2_match_context_create(nullptr)),
        // Look-aheads over long whitespace runs recurse deeply: allow 64 MiB, reserved lazily.
        stack(pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr)) {
    pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
  MatchState(const MatchState&) = delete;
  MatchState& operator=(const MatchState&) = delete;
  pcre2_match_data* data;
  pcre2_match_context* context;
  pcre2_jit_stack* stack;
};

class Regex {
 public:
  // where names the JSON key in errors.
  static Result<std::shared_ptr<const Regex>> compile(const std::string& pattern,
                                                      const std::string& where) {
    int error = 0;
    PCRE2_SIZE offset = 0;
    pcre2_code* code =
        pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                      PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &error, &offset, nullptr);
    if (code == nullptr) {
      PCRE2_UCHAR message[256];
      pcre2_get_error_message(error, message, sizeof(message));
      return Status::InvalidArgument(where + ": regex /" + pattern +
                                     "/ does not compile at offset " + std::to_string(offset) +
                                     ": " + reinterpret_cast<const char*>(message));
    }
    // Without JIT (an unsupported CPU) pcre2_match interprets the same pattern.
    (void)pcre2_jit_compile(code, PCRE2_JIT_COMPLETE);
    return std::shared_ptr<const Regex>(new Regex(code));
  }
  ~Regex() { pcre2_code_free(code_); }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The non-empty, non-overlapping matches of the pattern in text (valid UTF-8), left to right.
  void find_all(std::string_view text, std::vector<Span>* out) const {
    thread_local MatchState state;
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0;
    uint32_t options = 0;
    while (pos <= text.size()) {
      const int rc = pcre2_match(code_, subject, text.size(), pos, options | PCRE2_NO_UTF_CHECK,
                                 state.data, state.context);
      if (rc == PCRE2_ERROR_NOMATCH) {
        if (options == 0 || pos == text.size()) break;
        // An empty match here and nothing longer: step over one character.
        size_t len;
        decode_at(text, pos, &len);
        pos += len;
        options = 0;
        continue;
      }
      // Any other failure (a match limit) leaves the rest of the text unmatched.
      if (rc < 0) break;
      const PCRE2_SIZE* ovector = pcre2_get_ovector_pointer(state.data);
      const size_t begin = ovector[0], end = ovector[1];
      if (end > begin) out->push_back({begin, end});
      pos = end;
      options = end == begin ? PCRE2_NOTEMPTY_ATSTART | PCRE2_ANCHORED : 0;
    }
  }

  // text with every match replaced by content.
  std::string replace_all(std::string_view text, std::string_view content) const {
    std::vector<Span> matches;
    find_all(text, &matches);
    std::string out;
    size_t at = 0;
    for (const Span& m : matches) {
      out.append(text.substr(at, m.begin - at)).append(content);
      at = m.end;
    }
    out.append(text.substr(at));
    return out;
  }

 private:
  explicit Regex(pcre2_code* code) : code_(code) {}
  pcre2_code* code_;
};

// A Split/Replace pattern: {"String": "..."} (literal) or {"Regex": "..."}.
struct Pattern {
  std::string literal;
  std::shared_ptr<const Regex> regex;

  void find_all(std::string_view text, std::vector<Span>* out) const {
    if (regex) return regex->find_all(text, out);
    if (literal.empty()) return;
    for (size_t at = text.find(literal); at != std::string_view::npos;
         at = text.find(literal, at + literal.size())) {
      out->push_back({at, at + literal.size()});
    }
  }
  std::string replace_all(std::string_view text, std::string_view content) const {
    if (regex) return regex->replace_all(text, content);
    std::string out;
    if (literal.empty()) return std::string(text);
    size_t at = 0;
    for (size_t found = text.find(literal); found != std::string_view::npos;
         found = text.find(literal, at)) {
      out.append(text.substr(at, found - at)).append(content);
      at = found + literal.size();
    }
    out.append(text.substr(at));
    return out;
  }
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
    if (!out->empty() && valid_utf8(*out)) decode_at(*out, 0, &len);
    if (out->empty() || len != out->size()) {
      return invalid(key + "." + field, "is not a single character");
    }
    return Status::Ok();
  }
};

// ---- Normalizers ----

struct NormalizerStep {
  enum class Kind { kUnicode, kLowercase, kReplace, kPrepend } kind;
  int utf8proc_options = 0;  // kUnicode: NFC, NFKC, NFD or NFKD
  Pattern pattern;           // kReplace
  std::string content;       // kReplace: the replacement; kPrepend: the prefix
};

void normalize(const std::vector<NormalizerStep>& steps, std::string* text) {
  for (const NormalizerStep& step : steps) {
    switch (step.kind) {
      case NormalizerStep::Kind::kUnicode: {
        // ASCII is already in every normalization form.
        if (std::all_of(text->begin(), text->end(),
                        [](char c) { return static_cast<uint8_t>(c) < 0x80; })) {
          break;
        }
        utf8proc_uint8_t* out = nullptr;
        const utf8proc_ssize_t n =
            utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text->data()),
                         static_cast<utf8proc_ssize_t>(text->size()), &out,
                         static_cast<utf8proc_option_t>(step.utf8proc_options));
        // utf8proc fails only on invalid UTF-8 (encode repairs it first) or out of memory.
        if (n >= 0) text->assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
        std::free(out);
        break;
      }
      case NormalizerStep::Kind::kLowercase: {
        std::string out;
        out.reserve(text->size());
        for (size_t i = 0; i < text->size();) {
          size_t len;
          const char32_t cp = decode_at(*text, i, &len);
          append_code_point(
              static_cast<char32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(cp))), &out);
          i += len;
        }
        *text = std::move(out);
        break;
      }
      case NormalizerStep::Kind::kReplace:
        *text = step.pattern.replace_all(*text, step.content);
        break;
      case NormalizerStep::Kind::kPrepend:
        if (!text->empty()) text->insert(0, step.content);
        break;
    }
  }
}

Status read_normalizer_one(const Reader& r, const json& j, const std::string& key,
                           const std::string& type, std::vector<NormalizerStep>* out) {
  NormalizerStep step;
  if (type == "NFC" || type == "NFKC" || type == "NFD" || type == "NFKD") {
    step.kind = NormalizerStep::Kind::kUnicode;
    const bool compat = type == "NFKC" || type == "NFKD";
    const bool compose = type == "NFC" || type == "NFKC";
    step.utf8proc_options = UTF8PROC_STABLE | (compose ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE) |
                            (compat ? UTF8PROC_COMPAT : 0);
  } else if (type == "Lowercase") {
    step.kind = NormalizerStep::Kind::kLowercase;
  } else if (type == "Replace") {
    step.kind = NormalizerStep::Kind::kReplace;
    if (Status s = r.get_pattern(j, key, &step.pattern); !s.ok()) return s;
    if (Status s = r.get_string(j, "content", key, &step.content); !s.ok()) return s;
  } else if (type == "Prepend") {
    step.kind = NormalizerStep::Kind::kPrepend;
    if (Status s = r.get_string(j, "prepend", key, &step.content); !s.ok()) return s;
  } else {
    return r.unsupported(key + ".type", "\"" + type + "\"");
  }
  out->push_back(std::move(step));
  return Status::Ok();
}

Status read_normalizer(const Reader& r, const json& j, const std::string& key,
                       std::vector<NormalizerStep>* out) {
  return r.read_flattened(j, key, "normalizers",
                          [&](const json& part, const std::string& at, const std::string& type) {
                            return read_normalizer_one(r, part, at, type, out);
                          });
}

// ---- Pre-tokenizers ----

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
const std::array<std::string, 256>& byte_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      append_code_point(static_cast<char32_t>(printable ? b : 256 + n++), &t[b]);
    }
    return t;
  }();
  return table;
}

// The inverse: code point -> byte, -1 for a code point that stands for no byte.
int char_byte(char32_t cp) {
  static const std::unordered_map<char32_t, int> table = [] {
    std::unordered_map<char32_t, int> t;
    for (int b = 0; b < 256; ++b) {
      size_t len;
      t[decode_at(byte_chars()[b], 0, &len)] = b;
    }
    return t;
  }();
  const auto it = table.find(cp);
  return it == table.end() ? -1 : it->second;
}

// Splits piece at the matches, as the reference's split with a delimiter behaviour; pieces that
// end up empty are dropped.
void split_piece(const Piece& piece, const Pattern& pattern, SplitBehavior behavior, bool invert,
                 std::vector<Piece>* out) {
  std::vector<Span> found;
  pattern.find_all(piece.text, &found);
  // The whole text as alternating runs: (span, is_match).
  std::vector<std::pair<Span, bool>> runs;
  size_t at = 0;
  for (const Span& m : found) {
    if (m.begin > at) runs.push_back({{at, m.begin}, invert});
    runs.push_back({m, !invert});
    at = m.end;
  }
  if (at < piece.text.size()) runs.push_back({{at, piece.text.size()}, invert});

  std::vector<Span> spans;
  switch (behavior) {
    case SplitBehavior::kRemoved:
      for (const auto& [span, is_match] : runs) {
        if (!is_match) spans.push_back(span);
      }
      break;
    case SplitBehavior::kIsolated:
      for (const auto& run : runs) spans.push_back(run.first);
      break;
    case SplitBehavior::kMergedWithPrevious: {
      bool previous_match = false;
      for (const auto& [span, is_match] : runs) {
        if (is_match && !previous_match && !spans.empty()) {
          spans.back().end = span.end;
        } else {
          spans.push_back(span);
        }
        previous_match = is_match;
      }
      break;
    }
    case SplitBehavior::kMergedWithNext: {
      bool previous_match = false;
      for (auto it = runs.rbegin(); it != runs.rend(); ++it) {
        if (it->second && !previous_match && !spans.empty()) {
          spans.back().begin = it->first.begin;
        } else {
          spans.push_back(it->first);
        }
        previous_match = it->second;
      }
      std::reverse(spans.begin(), spans.end());
      break;
    }
    case SplitBehavior::kContiguous: {
      bool previous_match = false;
      for (const auto& [span, is_match] : runs) {
        if (is_match == previous_match && !spans.empty()) {
          spans.back().end = span.end;
        } else {
          spans.push_back(span);
        }
        previous_match = is_match;
      }
      break;
    }
  }
  for (const Span& s : spans) {
    if (s.end > s.begin) {
      out->push_back({piece.text.substr(s.begin, s.end - s.begin), piece.at_start && s.begin == 0});
    }
  }
}

void pre_tokenize(const std::vector<PreTokenizerStep>& steps, std::vector<Piece>* pieces) {
  std::vector<Piece> next;
  for (const PreTokenizerStep& step : steps) {
    next.clear();
    for (Piece& piece : *pieces) {
      switch (step.kind) {
        case PreTokenizerStep::Kind::kSplit:
          split_piece(piece, step.pattern, step.behavior, step.invert, &next);
          break;
        case PreTokenizerStep::Kind::kByteLevel: {
          if (step.add_prefix_space && piece.text.compare(0, 1, " ") != 0) {
            piece.text.insert(0, " ");
          }
          const size_t first = next.size();
          if (step.use_regex) {
            split_piece(piece, step.pattern, SplitBehavior::kIsolated, false, &next);
          } else {
            next.push_back(std::move(piece));
          }
          const auto& table = byte_chars();
          for (size_t i = first; i < next.size(); ++i) {
            std::string mapped;
            mapped.reserve(next[i].text.size() * 2);
            for (char c : next[i].text) mapped += table[static_cast<uint8_t>(c)];
            next[i].text = std::move(mapped);
          }
          break;
        }
        case PreTokenizerStep::Kind::kMetaspace: {
          Piece replaced{Pattern{" ", nullptr}.replace_all(piece.text, step.replacement),
                         piece.at_start};
          const bool starts =
              replaced.text.compare(0, step.replacement.size(), step.replacement) == 0;
          if (!starts && (step.prepend == PrependScheme::kAlways ||
                          (step.prepend == PrependScheme::kFirst && piece.at_start))) {
            replaced.text.insert(0, step.replacement);
          }
          if (step.split) {
            split_piece(replaced, Pattern{step.replacement, nullptr},
                        SplitBehavior::kMergedWithNext, false, &next);
          } else if (!replaced.text.empty()) {
            next.push_back(std::move(replaced));
          }
          break;
        }
      }
    }
    pieces->swap(next);
  }
}

// Metaspace's prepend_scheme; older files have add_prefix_space instead.
Status read_prepend_scheme(const Reader& r, const json& j, const std::string& key,
                           PrependScheme* out) {
  bool add_prefix_space = true;
  if (Status s = r.get_bool(j, "add_prefix_space", key, &add_prefix_space); !s.ok()) return s;
  *out = add_prefix_space ? PrependScheme::kAlways : PrependScheme::kNever;
  if (!j.contains("prepend_scheme")) return Status::Ok();
  std::string scheme;
  if (Status s = r.get_string(j, "prepend_scheme", key, &scheme); !s.ok()) return s;
  if (scheme == "first") {
    *out = PrependScheme::kFirst;
  } else if (scheme == "always") {
    *out = PrependScheme::kAlways;
  } else if (scheme == "never") {
    *out = PrependScheme::kNever;
  } else {
    return r.unsupported(key + ".prepend_scheme", "\"" + scheme + "\"");
  }
  return Status::Ok();
}

constexpr const char* kGpt2Regex =
    R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

Status read_pre_tokenizer_one(const Reader& r, const json& j, const std::string& key,
                              const std::string& type, std::vector<PreTokenizerStep>* out) {
  PreTokenizerStep step;
  if (type == "Split") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    if (Status s = r.get_pattern(j, key, &step.pattern); !s.ok()) return s;
    std::string behavior;
    if (Status s = r.get_string(j, "behavior", key, &behavior); !s.ok()) return s;
    static const std::pair<const char*, SplitBehavior> kBehaviors[] = {
        {"Removed", SplitBehavior::kRemoved},
        {"Isolated", SplitBehavior::kIsolated},
        {"MergedWithPrevious", SplitBehavior::kMergedWithPrevious},
        {"MergedWithNext", SplitBehavior::kMergedWithNext},
        {"Contiguous", SplitBehavior::kContiguous}};
    const auto* found = std::find_if(std::begin(kBehaviors), std::end(kBehaviors),
                                     [&](const auto& b) { return behavior == b.first; });
    if (found == std::end(kBehaviors)) {
      return r.unsupported(key + ".behavior", "\"" + behavior + "\"");
    }
    step.behavior = found->second;
    if (Status s = r.get_bool(j, "invert", key, &step.invert); !s.ok()) return s;
  } else if (type == "Digits") {
    step.kind = PreTokenizerStep::Kind::kSplit;
    bool individual = false;
    if (Status s = r.get_bool(j, "individual_digits", key, &individual); !s.ok()) return s;
    Result<std::shared_ptr<const Regex>> re = Regex::compile(R"(\p{N})", key);
    if (!re.ok()) return re.status();
    step.pattern.regex = *re;
    step.behavior = individual ? SplitBehavior::kIsolated : SplitBehavior::kContiguous;
  } else if (type == "ByteLevel") {
    step.kind = PreTokenizerStep::Kind::kByteLevel;
    step.add_prefix_space = true;  // the reference's defaults
    step.use_regex = true;
    if (Status s = r.get_bool(j, "add_prefix_space", key, &step.add_prefix_space); !s.ok()) {
      return s;
    }
    if (Status s = r.get_bool(j, "use_regex", key, &step.use_regex); !s.ok()) return s;
    if (step.use_regex) {
      Result<std::shared_ptr<const Regex>> re = Regex::compile(kGpt2Regex, key);
      if (!re.ok()) return re.status();
      step.pattern.regex = *re;
    }
  } else if (type == "Metaspace") {
    step.kind = PreTokenizerStep::Kind::kMetaspace;
    if (Status s = r.get_char(j, "replacement", key, &step.replacement); !s.ok()) return s;
    if (Status s = r.get_bool(j, "split", key, &step.split); !s.ok()) return s;
    if (Status s = read_prepend_scheme(r, j, key, &step.prepend); !s.ok()) return s;
  } else {
    return r.unsupported(key + ".type", "\"" + type + "\"");
  }
  out->push_back(std::move(step));
  return Status::Ok();
}

Status read_pre_tokenizer(const Reader& r, const json& j, const std::string& key,
                          std::vector<PreTokenizerStep>* out) {
  return r.read_flattened(j, key, "pretokenizers",
                          [&](const json& part, const std::string& at, const std::string& type) {
                            return read_pre_tokenizer_one(r, part, at, type, out);
                          });
}

// ---- Decoders ----

struct DecoderStep {
  enum class Kind { kByteLevel, kByteFallback, kMetaspace, kFuse, kStrip, kReplace } kind;
  std::string content;         // kStrip: the character; kReplace: the replacement
  size_t start = 0, stop = 0;  // kStrip
  Pattern pattern;             // kReplace
  std::string replacement;     // kMetaspace
  PrependScheme prepend = PrependScheme::kAlways;
};

// "<0x0A>" -> 0x0A; -1 for any other token.
int byte_token(std::string_view token) {
  if (token.size() != 6 || token.compare(0, 3, "<0x") != 0 || token[5] != '>') return -1;
  int value = 0;
  for (char c : token.substr(3, 2)) {
    value <<= 4;
    if (c >= '0' && c <= '9') {
      value |= c - '0';
    } else if (c >= 'A' && c <= 'F') {
      value |= c - 'A' + 10;
    } else {
      return -1;
    }
  }
  return value;
}

void decode_chain(const std::vector<DecoderStep>& steps, std::vector<std::string>* tokens) {
  for (const DecoderStep& step : steps) {
    switch (step.kind) {
      case DecoderStep::Kind::kByteLevel: {
        std::string bytes;
        for (const std::string& token : *tokens) {
          const size_t mark = bytes.size();
          bool all = true;
          for (size_t i = 0; i < token.size();) {
            size_t len;
            const int b = char_byte(decode_at(token, i, &len));
            if (b < 0) {
              all = false;
              break;
            }
            bytes += static_cast<char>(b);
            i += len;
          }
          // A token with a character that stands for no byte passes as its own text.
          if (!all) bytes.replace(mark, std::string::npos, token);
        }
        std::string text;
        append_utf8_lossy(bytes, &text);
        tokens->assign(1, std::move(text));
        break;
      }
      case DecoderStep::Kind::kByteFallback: {
        std::vector<std::string> out;
        std::string pending;  // consecutive byte tokens
        auto flush = [&] {
          if (pending.empty()) return;
          if (valid_utf8(pending)) {
            out.push_back(pending);
          } else {
            // One U+FFFD per byte, as the reference does here.
            for (size_t i = 0; i < pending.size(); ++i) out.emplace_back(kReplacementChar);
          }
          pending.clear();
        };
        for (std::string& token : *tokens) {
          const int b = byte_token(token);
          if (b >= 0) {
            pending += static_cast<char>(b);
            continue;
          }
          flush();
          out.push_back(std::move(token));
        }
        flush();
        *tokens = std::move(out);
        break;
      }
      case DecoderStep::Kind::kMetaspace:
        for (size_t i = 0; i < tokens->size(); ++i) {
          const bool drop = i == 0 && step.prepend != PrependScheme::kNever;
          (*tokens)[i] =
              Pattern{step.replacement, nullptr}.replace_all((*tokens)[i], drop ? "" : " ");
        }
        break;
      case DecoderStep::Kind::kFuse: {
        std::string all;
        for (const std::string& token : *tokens) all += token;
        tokens->assign(1, std::move(all));
        break;
      }
      case DecoderStep::Kind::kStrip:
        for (std::string& token : *tokens) {
          const std::string_view c = step.content;
          size_t begin = 0, end = token.size();
          for (size_t k = 0; k < step.start && token.compare(begin, c.size(), c) == 0; ++k) {
            begin += c.size();
          }
          for (size_t k = 0; k < step.stop && end >= begin + c.size() &&
                             token.compare(end - c.size(), c.size(), c) == 0;
               ++k) {
            end -= c.size();
          }
          token = token.substr(begin, end - begin);
        }
        break;
      case DecoderStep::Kind::kReplace:
        for (std::string& token : *tokens) token = step.pattern.replace_all(token, step.content);
        break;
    }
  }
}

Status read_decoder_one(const Reader& r, const json& j, const std::string& key,
                        const std::string& type, std::vector<DecoderStep>* out) {
  DecoderStep step;
  if (type == "ByteLevel") {
    step.kind = DecoderStep::Kind::kByteLevel;
  } else if (type == "ByteFallback") {
    step.kind = DecoderStep::Kind::kByteFallback;
  } else if (type == "Fuse") {
    step.kind = DecoderStep::Kind::kFuse;
  } else if (type == "Metaspace") {
    step.kind = DecoderStep::Kind::kMetaspace;
    if (Status s = r.get_char(j, "replacement", key, &step.replacement); !s.ok()) return s;
    if (Status s = read_prepend_scheme(r, j, key, &step.prepend); !s.ok()) return s;
  } else if (type == "Strip") {
    step.kind = DecoderStep::Kind::kStrip;
    if (Status s = r.get_char(j, "content", key, &step.content); !s.ok()) return s;
    for (auto [field, value] : {std::pair("start", &step.start), std::pair("stop", &step.stop)}) {
      const auto it = j.find(field);
      if (it == j.end() || !it->is_number_unsigned()) {
        return r.invalid(key + "." + field, "is not a non-negative integer");
      }
      *value = it->get<size_t>();
    }
  } else if (type == "Replace") {
    step.kind = DecoderStep::Kind::kReplace;
    if (Status s = r.get_pattern(j, key, &step.pattern); !s.ok()) return s;
    if (Status s = r.get_string(j, "content", key, &step.content); !s.ok()) return s;
  } else {
    return r.unsupported(key + ".type", "\"" + type + "\"");
  }
  out->push_back(std::move(step));
  return Status::Ok();
}

Status read_decoder(const Reader& r, const json& j, const std::string& key,
                    std::vector<DecoderStep>* out) {
  return r.read_flattened(j, key, "decoders",
                          [&](const json& part, const std::string& at, const std::string& type) {
                            return read_decoder_one(r, part, at, type, out);
                          });
}

// ---- Added tokens ----

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
  void split(std::string_view text, std::vector<Segment>* out) const {
    size_t emitted = 0;  // end of the last segment pushed
    for (size_t at = 0; at < text.size();) {
      const Entry* match = nullptr;
      for (const Entry& e : by_first_byte_[static_cast<uint8_t>(text[at])]) {
        if (text.compare(at, e.pattern.size(), e.pattern) == 0 && accepts(text, at, e)) {
          match = &e;
          break;
        }
      }
      if (match == nullptr) {
        ++at;
        continue;
      }
      size_t begin = at, end = at + match->pattern.size();
      if (match->token->lstrip) {
        while (begin > emitted) {
          size_t p = begin - 1;
          while (p > emitted && (static_cast<uint8_t>(text[p]) & 0xC0) == 0x80) --p;
          size_t len;
          if (!is_white_space(decode_at(text, p, &len))) break;
          begin = p;
        }
      }
      if (match->token->rstrip) {
        while (end < text.size()) {
          size_t len;
          if (!is_white_space(decode_at(text, end, &len))) break;
          end += len;
        }
      }
      if (begin > emitted) out->push_back({emitted, begin, -1});
      out->push_back({begin, end, match->token->id});
      emitted = at = end;
    }
    if (emitted < text.size()) out->push_back({emitted, text.size(), -1});
  }

 private:
  struct Entry {
    std::string pattern;
    const AddedToken* token;
  };
  // single_word: the match must not touch a word character on either side.
  static bool accepts(std::string_view text, size_t at, const Entry& e) {
    if (!e.token->single_word) return true;
    const size_t end = at + e.pattern.size();
    if (at > 0 && is_word_char(last_code_point(text.substr(0, at)))) return false;
    size_t len;
    return end == text.size() || !is_word_char(decode_at(text, end, &len));
  }
  std::vector<Entry> by_first_byte_[256];
};

// ---- The tokenizer ----

class HfTokenizer final : public Tokenizer {
 public:
  using Tokenizer::decode;

  std::vector<int32_t> encode(std::string_view input, bool add_special_tokens) const override {
    std::string repaired;
    if (!valid_utf8(input)) {
      // The reference takes Unicode strings: bytes that are not UTF-8 read as U+FFFD.
      append_utf8_lossy(input, &repaired);
      input = repaired;
    }
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
        for (const Piece& piece : pieces) tokenize_word(piece.text, &ids);
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
  struct Symbol {
    int32_t id;
    int32_t prev, next;
    bool removed;
  };

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  // The BPE model on one pre-token: its characters (or, with byte_fallback, the bytes of those
  // missing from the vocabulary), merged by rank.
  void tokenize_word(const std::string& word, std::vector<int32_t>* ids) const {
    if (word.empty()) return;
    if (ignore_merges_) {
      if (const auto it = vocab_.find(word); it != vocab_.end()) {
        ids->push_back(it->second);
        return;
      }
    }
    const bool cacheable = word.size() <= kMaxCachedWord;
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (const auto it = cache_.find(word); it != cache_.end()) {
        ids->insert(ids->end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<Symbol> symbols;
    symbols.reserve(word.size());
    auto add = [&](int32_t id) {
      const auto n = static_cast<int32_t>(symbols.size());
      symbols.push_back({id, n - 1, n + 1, false});
    };
    int32_t unk = -1;  // a pending unknown (fuse_unk joins consecutive ones)
    std::string s;
    for (size_t i = 0; i < word.size();) {
      size_t len;
      decode_at(word, i, &len);
      s.assign(word, i, len);
      if (i > 0) s.insert(0, continuing_subword_prefix_);
      if (i + len == word.size()) s += end_of_word_suffix_;
      i += len;
      if (const auto it = vocab_.find(s); it != vocab_.end()) {
        if (unk >= 0) add(unk);
        unk = -1;
        add(it->second);
        continue;
      }
      if (byte_fallback_) {
        bool all = true;
        for (char c : s) all = all && byte_ids_[static_cast<uint8_t>(c)] >= 0;
        if (all) {
          for (char c : s) add(byte_ids_[static_cast<uint8_t>(c)]);
          continue;
        }
      }
      if (unk_id_ >= 0) {
        if (unk >= 0 && !fuse_unk_) add(unk);
        unk = unk_id_;
      }
    }
    if (unk >= 0) add(unk);
    if (!symbols.empty()) symbols.back().next = -1;

    // Lowest rank first, then leftmost; entries whose pair has changed since are skipped.
    using Merge = std::tuple<int32_t, int32_t, int32_t>;  // rank, position, new id
    std::priority_queue<Merge, std::vector<Merge>, std::greater<>> queue;
    auto push = [&](int32_t pos) {
      const int32_t next = symbols[pos].next;
      if (next < 0) return;
      if (const auto it = merges_.find(pair_key(symbols[pos].id, symbols[next].id));
          it != merges_.end()) {
        queue.emplace(it->second.first, pos, it->second.second);
      }
    };
    for (int32_t pos = 0; pos + 1 < static_cast<int32_t>(symbols.size()); ++pos) push(pos);
    while (!queue.empty()) {
      const auto [rank, pos, new_id] = queue.top();
      queue.pop();
      Symbol& left = symbols[pos];
      if (left.removed || left.next < 0) continue;
      Symbol& right = symbols[left.next];
      const auto it = merges_.find(pair_key(left.id, right.id));
      if (it == merges_.end() || it->second.second != new_id) continue;
      left.id = new_id;
      right.removed = true;
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = pos;
      if (left.prev >= 0) push(left.prev);
      push(pos);
    }
    const size_t first = ids->size();
    for (const Symbol& sym : symbols) {
      if (!sym.removed) ids->push_back(sym.id);
    }
    if (cacheable) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (cache_.size() < kMaxCacheEntries) {
        cache_.emplace(word, std::vector<int32_t>(ids->begin() + first, ids->end()));
      }
    }
  }

  // transformers' clean_up_tokenization: no space before punctuation and English contractions.
  static void clean_up_tokenization(std::string* text) {
    static const std::pair<std::string_view, std::string_view> kRules[] = {
        {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
        {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
    for (const auto& [from, to] : kRules)
      *text = Pattern{std::string(from), nullptr}.replace_all(*text, to);
  }

  Status read_model(const json& model, const Reader& r);
  // Sequences of post-processors flatten: each wraps what the previous ones produced.
  Status read_post_processor(const json& j, const std::string& key, const Reader& r);
  Status read_one_post_processor(const json& j, const std::string& key, const std::string& type,
                                 const Reader& r);
  Result<int32_t> token_id(const std::string& token) const;

  static constexpr size_t kMaxCachedWord = 256;
  static constexpr size_t kMaxCacheEntries = 1 << 16;

  struct StringHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  std::unordered_map<std::string, int32_t, StringHash, std::equal_to<>> vocab_;
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;  // -> rank, new id
  std::vector<std::string> pieces_;  // id -> text for decoding ("" for an unused id)
  std::vector<bool> special_;
  std::array<int32_t, 256> byte_ids_{};  // "<0xXX>" ids for byte_fallback, -1 if missing
  std::string continuing_subword_prefix_, end_of_word_suffix_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;

  std::vector<AddedToken> added_;
  AddedTokenMatcher raw_matcher_, normalized_matcher_;
  std::vector<NormalizerStep> normalizer_;
  std::vector<PreTokenizerStep> pre_tokenizer_;
  std::vector<DecoderStep> decoder_;
  std::vector<int32_t> prefix_, suffix_;  // what add_special_tokens puts around the text
  int32_t bos_id_ = -1, eos_id_ = -1;
  bool clean_up_spaces_ = false;

  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int32_t>, StringHash, std::equal_to<>> cache_;
};

Status HfTokenizer::read_model(const json& model, const Reader& r) {
  if (!model.is_object()) return r.invalid("model", "is not an object");
  // Files from before "type" existed are BPE when they have merges.
  std::string type = "BPE";
  if (model.contains("type")) {
    if (Status s = r.get_string(model, "type", "model", &type); !s.ok()) return s;
  } else if (!model.contains("merges")) {
    return r.unsupported("model", "without a \"type\" or \"merges\"");
  }
  if (type != "BPE") return r.unsupported("model.type", "\"" + type + "\" (kvrt reads BPE)");
  if (const auto it = model.find("dropout");
      it != model.end() && !it->is_null() && !(it->is_number() && it->get<double>() == 0.0)) {
    return r.unsupported("model.dropout", it->dump());
  }
  const auto vocab = model.find("vocab");
  if (vocab == model.end() || !vocab->is_object())
    return r.invalid("model.vocab", "is not an object");
  int32_t max_id = -1;
  vocab_.reserve(vocab->size());
  for (const auto& [token, id] : vocab->items()) {
    if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= (1 << 30)) {
      return r.invalid("model.vocab[\"" + token + "\"]", "is not a token id");
    }
    vocab_.emplace(token, id.get<int32_t>());
    max_id = std::max(max_id, id.get<int32_t>());
  }
  pieces_.resize(static_cast<size_t>(max_id + 1));
  for (const auto& [token, id] : vocab_) pieces_[id] = token;

  for (auto [field, out] : {std::pair("continuing_subword_prefix", &continuing_subword_prefix_),
                            std::pair("end_of_word_suffix", &end_of_word_suffix_)}) {
    const auto it = model.find(field);
    if (it == model.end() || it->is_null()) continue;
    if (!it->is_string()) return r.invalid(std::string("model.") + field, "is not a string");
    *out = it->get<std::string>();
  }
  for (auto [field, out] :
       {std::pair("fuse_unk", &fuse_unk_), std::pair("byte_fallback", &byte_fallback_),
        std::pair("ignore_merges", &ignore_merges_)}) {
    if (Status s = r.get_bool(model, field, "model", out); !s.ok()) return s;
  }
  if (const auto it = model.find("unk_token"); it != model.end() && !it->is_null()) {
    if (!it->is_string()) return r.invalid("model.unk_token", "is not a string");
    const auto found = vocab_.find(it->get<std::string>());
    if (found == vocab_.end()) return r.invalid("model.unk_token", "is not in model.vocab");
    unk_id_ = found->second;
  }
  byte_ids_.fill(-1);
  if (byte_fallback_) {
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      if (const auto it = vocab_.find(std::string_view(name)); it != vocab_.end()) {
        byte_ids_[b] = it->second;
      }
    }
  }

  const auto merges = model.find("merges");
  if (merges == model.end() || !merges->is_array()) {
    return r.invalid("model.merges", "is not a list");
  }
  merges_.reserve(merges->size());
  std::string merged;
  std::string_view a, b;
  for (size_t rank = 0; rank < merges->size(); ++rank) {
    const json& m = (*merges)[rank];
    const auto key = [rank] { return "model.merges[" + std::to_string(rank) + "]"; };
    if (m.is_string()) {
      // "a b": exactly one space, as the reference requires.
      const std::string& line = m.get_ref<const std::string&>();
      const size_t space = line.find(' ');
      if (space == std::string::npos || line.find(' ', space + 1) != std::string::npos) {
        return r.invalid(key(), "is not \"a b\"");
      }
      a = std::string_view(line).substr(0, space);
      b = std::string_view(line).substr(space + 1);
    } else if (m.is_array() && m.size() == 2 && m[0].is_string() && m[1].is_string()) {
      a = m[0].get_ref<const std::string&>();
      b = m[1].get_ref<const std::string&>();
    } else {
      return r.invalid(key(), "is neither \"a b\" nor [\"a\", \"b\"]");
    }
    const auto ia = vocab_.find(a), ib = vocab_.find(b);
    const bool prefixed =
        b.compare(0, continuing_subword_prefix_.size(), continuing_subword_prefix_) == 0;
    merged.assign(a).append(b.substr(prefixed ? continuing_subword_prefix_.size() : 0));
    const auto im = vocab_.find(merged);
    if (ia == vocab_.end() || ib == vocab_.end() || im == vocab_.end()) {
      return r.invalid(key(), "merges tokens that are not in model.vocab");
    }
    merges_.insert_or_assign(pair_key(ia->second, ib->second),
                             std::pair(static_cast<int32_t>(rank), im->second));
  }
  return Status::Ok();
}

Result<int32_t> HfTokenizer::token_id(const std::string& token) const {
  for (const AddedToken& t : added_) {
    if (t.content == token) return t.id;
  }
  if (const auto it = vocab_.find(token); it != vocab_.end()) return it->second;
  return Status::NotFound(token);
}

Status HfTokenizer::read_post_processor(const json& j, const std::string& key, const Reader& r) {
  return r.read_flattened(j, key, "processors",
                          [&](const json& part, const std::string& at, const std::string& type) {
                            return read_one_post_processor(part, at, type, r);
                          });
}

Status HfTokenizer::read_one_post_processor(const json& j, const std::string& key,
                                            const std::string& type, const Reader& r) {
  if (type == "ByteLevel") return Status::Ok();  // offsets only
  if (type == "TemplateProcessing") {
    const auto single = j.find("single");
    const auto specials = j.find("special_tokens");
    if (single == j.end() || !single->is_array())
      return r.invalid(key + ".single", "is not a list");
    std::vector<int32_t> before, after;
    bool seen_sequence = false;
    for (size_t i = 0; i < single->size(); ++i) {
      const json& item = (*single)[i];
      const std::string at = key + ".single[" + std::to_string(i) + "]";
      if (item.contains("Sequence")) {
        const json& seq = item["Sequence"];
        if (!seq.contains("id") || seq["id"] != "A" || seen_sequence) {
          return r.unsupported(at + ".Sequence", seq.dump() + " (a single text is sequence A)");
        }
        seen_sequence = true;
        continue;
      }
      if (!item.contains("SpecialToken") || !item["SpecialToken"].contains("id") ||
          !item["SpecialToken"]["id"].is_string()) {
        return r.invalid(at,
                         "is neither {\"Sequence\": ...} nor {\"SpecialToken\": {\"id\": ...}}");
      }
      const std::string name = item["SpecialToken"]["id"].get<std::string>();
      if (specials == j.end() || !specials->contains(name) || !(*specials)[name].contains("ids") ||
          !(*specials)[name]["ids"].is_array()) {
        return r.invalid(at, "names \"" + name + "\", which " + key +
                                 ".special_tokens does not list with its ids");
      }
      for (const json& id : (*specials)[name]["ids"]) {
        if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() >= vocab_size()) {
          return r.invalid(key + ".special_tokens[\"" + name + "\"].ids", "holds an invalid id");
        }
        (seen_sequence ? after : before).push_back(id.get<int32_t>());
      }
    }
    prefix_.insert(prefix_.begin(), before.begin(), before.end());
    suffix_.insert(suffix_.end(), after.begin(), after.end());
    return Status::Ok();
  }
  if (type == "BertProcessing" || type == "RobertaProcessing") {
    // {"cls": ["[CLS]", 101], "sep": ["[SEP]", 102]}: cls A sep.
    int32_t ids[2];
    const char* fields[2] = {"cls", "sep"};
    for (int k = 0; k < 2; ++k) {
      const auto it = j.find(fields[k]);
      if (it == j.end() || !it->is_array() || it->size() != 2 || !(*it)[1].is_number_integer() ||
          (*it)[1].get<int64_t>() < 0 || (*it)[1].get<int64_t>() >= vocab_size()) {
        return r.invalid(key + "." + fields[k], "is not [token, id]");
      }
      ids[k] = (*it)[1].get<int32_t>();
    }
    prefix_.insert(prefix_.begin(), ids[0]);
    suffix_.push_back(ids[1]);
    return Status::Ok();
  }
  return r.unsupported(key + ".type", "\"" + type + "\"");
}

Status HfTokenizer::load(const json& root, const TokenizerConfig& config, const Reader& r) {
  if (!root.is_object()) return r.invalid("the file", "is not a JSON object");
  // root's member, or null when absent (by reference: the model's vocabulary is large).
  const auto member = [&root](const char* key) -> const json& {
    static const json kNull;
    const auto it = root.find(key);
    return it == root.end() ? kNull : *it;
  };
  if (Status s = read_model(member("model"), r); !s.ok()) return s;

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
  if (Status s = read_post_processor(member("post_processor"), "post_processor", r); !s.ok()) {
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

// A token setting: a string, an AddedToken object {"content": ...}, or null.
Status read_token(const json& config, const char* key, const std::string& name,
                  std::optional<std::string>* out) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return Status::Ok();
  if (it->is_string()) {
    *out = it->get<std::string>();
    return Status::Ok();
  }
  if (it->is_object() && it->contains("content") && (*it)["content"].is_string()) {
    *out = (*it)["content"].get<std::string>();
    return Status::Ok();
  }
  return Status::InvalidArgument(name + ": " + key +
                                 " is neither a string, null nor an object with a \"content\" "
                                 "string");
}

Status read_bool(const json& config, const char* key, const std::string& name,
                 std::optional<bool>* out) {
  const auto it = config.find(key);
  if (it == config.end() || it->is_null()) return Status::Ok();
  if (!it->is_boolean()) return Status::InvalidArgument(name + ": " + key + " is not a boolean");
  *out = it->get<bool>();
  return Status::Ok();
}

}  // namespace

Result<TokenizerConfig> parse_tokenizer_config(std::string_view text, const std::string& name) {
  const json config = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (config.is_discarded()) return Status::InvalidArgument(name + ": not valid JSON");
  if (!config.is_object()) return Status::InvalidArgument(name + ": not a JSON object");
  TokenizerConfig out;
  for (Status s :
       {read_bool(config, "add_bos_token", name, &out.add_bos_token),
        read_bool(config, "add_eos_token", name, &out.add_eos_token),
        read_bool(config, "clean_up_tokenization_spaces", name, &out.clean_up_tokenization_spaces),
        read_token(config, "bos_token", name, &out.bos_token),
        read_token(config, "eos_token", name, &out.eos_token),
        read_token(config, "tokenizer_class", name, &out.tokenizer_class)}) {
    if (!s.ok()) return s;
  }
  return out;
}

Result<TokenizerConfig> read_tokenizer_config(const std::string& path) {
  Result<std::string> text = util::read_file(path, util::kTokenizerConfigFile);
  if (!text.ok()) return text.status();
  return parse_tokenizer_config(*text, path);
}

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
  Result<std::string> text = util::read_file(json_path, util::kTokenizerFile);
  if (!text.ok()) return text.status();
  TokenizerConfig config;
  if (!config_path.empty()) {
    Result<TokenizerConfig> read = read_tokenizer_config(config_path);
    if (!read.ok()) return read.status();
    config = *read;
  }
  return parse_hf_tokenizer(*text, config, json_path);
}

}  // namespace kvrt::model
