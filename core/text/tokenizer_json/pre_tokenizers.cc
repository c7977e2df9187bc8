// Pre-tokenizers: Split, Digits, ByteLevel (GPT-2's regex and byte-to-character table) and
// Metaspace, in sequence.
#include <algorithm>

#include "core/text/tokenizer_json/tokenizer_json.h"

namespace kvrt::text::tokenizer_json {

namespace {

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

}  // namespace

const std::array<std::string, 256>& byte_chars() {
  static const std::array<std::string, 256> table = [] {
    std::array<std::string, 256> t;
    int n = 0;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      append_utf8(&t[b], static_cast<char32_t>(printable ? b : 256 + n++));
    }
    return t;
  }();
  return table;
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

namespace {

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

}  // namespace

Status read_pre_tokenizer(const Reader& r, const json& j, const std::string& key,
                          std::vector<PreTokenizerStep>* out) {
  return r.read_flattened(j, key, "pretokenizers",
                          [&](const json& part, const std::string& at, const std::string& type) {
                            return read_pre_tokenizer_one(r, part, at, type, out);
                          });
}

}  // namespace kvrt::text::tokenizer_json
