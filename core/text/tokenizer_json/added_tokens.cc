// Added tokens: leftmost-longest matching of their contents, widened by lstrip/rstrip and
// held to word boundaries by single_word.
#include <utf8proc.h>

#include "core/text/tokenizer_json/tokenizer_json.h"

namespace kvrt::text::tokenizer_json {

bool is_white_space(char32_t c) {
  return (c >= 0x9 && c <= 0xD) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F ||
         c == 0x3000;
}

namespace {

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
  return decode_utf8(s, i, &len);
}

}  // namespace

void AddedTokenMatcher::split(std::string_view text, std::vector<Segment>* out) const {
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
        if (!is_white_space(decode_utf8(text, p, &len))) break;
        begin = p;
      }
    }
    if (match->token->rstrip) {
      while (end < text.size()) {
        size_t len;
        if (!is_white_space(decode_utf8(text, end, &len))) break;
        end += len;
      }
    }
    if (begin > emitted) out->push_back({emitted, begin, -1});
    out->push_back({begin, end, match->token->id});
    emitted = at = end;
  }
  if (emitted < text.size()) out->push_back({emitted, text.size(), -1});
}

bool AddedTokenMatcher::accepts(std::string_view text, size_t at, const Entry& e) {
  if (!e.token->single_word) return true;
  const size_t end = at + e.pattern.size();
  if (at > 0 && is_word_char(last_code_point(text.substr(0, at)))) return false;
  size_t len;
  return end == text.size() || !is_word_char(decode_utf8(text, end, &len));
}

}  // namespace kvrt::text::tokenizer_json
