// A template's source as tokens: the reference's preprocessing (trim_blocks, lstrip_blocks,
// {% generation %} tags), then text, statements, expressions and comments.
#include <algorithm>
#include <charconv>

#include "core/text/jinja/jinja.h"

namespace kvrt::text::jinja {

std::string where(std::string_view source, size_t at) {
  at = std::min(at, source.size());
  const size_t line =
      1 + static_cast<size_t>(std::count(source.begin(), source.begin() + at, '\n'));
  return "chat template, line " + std::to_string(line) + " (byte " + std::to_string(at) + ")";
}

namespace {

// The source with one trailing newline dropped, lstrip_blocks and trim_blocks applied and
// {% generation %} tags removed, as the reference's preprocess() does with its regular
// expressions; `origin` holds each kept byte's offset in the source.
struct Preprocessed {
  std::string text;
  std::vector<size_t> origin;
};

Preprocessed preprocess(std::string_view src) {
  Preprocessed p;
  if (!src.empty() && src.back() == '\n') src.remove_suffix(1);
  // /^[ \t]*({[#%-])/gm: the spaces before a block or comment that opens a line.
  Preprocessed a;
  for (size_t i = 0; i < src.size();) {
    const bool line_start = i == 0 || src[i - 1] == '\n' || src[i - 1] == '\r' ||
                            (i >= 3 && (src.substr(i - 3, 3) == "\xE2\x80\xA8" ||
                                        src.substr(i - 3, 3) == "\xE2\x80\xA9"));
    if (line_start) {
      size_t j = i;
      while (j < src.size() && (src[j] == ' ' || src[j] == '\t')) ++j;
      if (j > i && j + 1 < src.size() && src[j] == '{' &&
          (src[j + 1] == '#' || src[j + 1] == '%' || src[j + 1] == '-')) {
        i = j;
      }
    }
    a.text.push_back(src[i]);
    a.origin.push_back(i);
    ++i;
  }
  // /([#%-]})\n/g: the newline after a block or comment.
  Preprocessed b;
  for (size_t i = 0; i < a.text.size(); ++i) {
    b.text.push_back(a.text[i]);
    b.origin.push_back(a.origin[i]);
    if (i + 2 < a.text.size() && (a.text[i] == '#' || a.text[i] == '%' || a.text[i] == '-') &&
        a.text[i + 1] == '}' && a.text[i + 2] == '\n') {
      b.text.push_back('}');
      b.origin.push_back(a.origin[i + 1]);
      i += 2;
    }
  }
  // /{%(-?)\s*(?:end)?generation\s*(-?)%}(\s*)/gs: transformers' generation tags.
  const std::string_view t = b.text;
  auto skip_space = [&t](size_t k) {
    while (k < t.size()) {
      size_t len = 0;
      if (!is_js_space(decode_utf8(t, k, &len))) break;
      k += len;
    }
    return k;
  };
  size_t last = 0;
  for (size_t at = t.find("{%"); at != std::string_view::npos; at = t.find("{%", at + 1)) {
    if (at < last) continue;
    size_t k = at + 2;
    const bool lstrip = k < t.size() && t[k] == '-';
    if (lstrip) ++k;
    k = skip_space(k);
    if (t.substr(k, 3) == "end") k += 3;
    if (t.substr(k, 10) != "generation") continue;
    k = skip_space(k + 10);
    const bool rstrip = k < t.size() && t[k] == '-';
    if (rstrip) ++k;
    if (t.substr(k, 2) != "%}") continue;
    k += 2;
    const size_t after_end = skip_space(k);
    size_t end = at;
    while (lstrip && end > last) {
      size_t start = end - 1;
      while (start > last && (static_cast<unsigned char>(t[start]) & 0xC0) == 0x80) --start;
      size_t len = 0;
      if (!is_js_space(decode_utf8(t, start, &len))) break;
      end = start;
    }
    p.text.append(t.substr(last, end - last));
    p.origin.insert(p.origin.end(), b.origin.begin() + static_cast<std::ptrdiff_t>(last),
                    b.origin.begin() + static_cast<std::ptrdiff_t>(end));
    if (!rstrip) {
      p.text.append(t.substr(k, after_end - k));
      p.origin.insert(p.origin.end(), b.origin.begin() + static_cast<std::ptrdiff_t>(k),
                      b.origin.begin() + static_cast<std::ptrdiff_t>(after_end));
    }
    last = after_end;
  }
  p.text.append(t.substr(last));
  p.origin.insert(p.origin.end(), b.origin.begin() + static_cast<std::ptrdiff_t>(last),
                  b.origin.end());
  return p;
}

class Lexer {
 public:
  Lexer(std::string_view source, Preprocessed p) : source_(source), p_(std::move(p)) {}

  Result<std::vector<Token>> run() {
    const std::string_view s = p_.text;
    while (pos_ < s.size()) {
      const Tok last = tokens_.empty() ? Tok::kEnd : tokens_.back().kind;
      if (tokens_.empty() || last == Tok::kCloseStatement || last == Tok::kCloseExpression ||
          last == Tok::kComment) {
        size_t end = pos_;
        while (true) {
          end = s.find('{', end);
          if (end == std::string_view::npos) {
            end = s.size();
            break;
          }
          if (end + 1 < s.size() && (s[end + 1] == '%' || s[end + 1] == '{' || s[end + 1] == '#')) {
            break;
          }
          ++end;
        }
        if (end > pos_) {
          push(Tok::kText, std::string(s.substr(pos_, end - pos_)), pos_);
          pos_ = end;
          continue;
        }
      }
      if (s[pos_] == '{' && pos_ + 1 < s.size()) {
        const char next = s[pos_ + 1];
        if (next == '#') {
          const size_t open = pos_;
          pos_ += 2;
          const bool strip_before = pos_ < s.size() && s[pos_] == '-';
          if (strip_before) ++pos_;
          const size_t end = s.find("#}", pos_);
          if (end == std::string_view::npos) return error(open, "a comment without its closing #}");
          const bool strip_after = end > pos_ && s[end - 1] == '-';
          if (strip_before) strip_trailing_space();
          push(Tok::kComment, "", open);
          pos_ = end + 2;
          if (strip_after) skip_space();
          continue;
        }
        if (pos_ + 2 < s.size() && s[pos_ + 2] == '-' && (next == '%' || next == '{')) {
          strip_trailing_space();
          push(next == '%' ? Tok::kOpenStatement : Tok::kOpenExpression, next == '%' ? "{%" : "{{",
               pos_);
          if (next == '{') curly_depth_ = 0;
          pos_ += 3;
          continue;
        }
      }
      // Whitespace inside a tag.
      while (pos_ < s.size()) {
        size_t len = 0;
        if (!is_js_space(decode_utf8(s, pos_, &len))) break;
        pos_ += len;
      }
      if (pos_ >= s.size()) return error(s.size(), "the template ends inside a tag");
      const char c = s[pos_];
      if (c == '-' && pos_ + 2 < s.size() && s[pos_ + 2] == '}' &&
          (s[pos_ + 1] == '%' || s[pos_ + 1] == '}')) {
        push(s[pos_ + 1] == '%' ? Tok::kCloseStatement : Tok::kCloseExpression,
             s[pos_ + 1] == '%' ? "%}" : "}}", pos_);
        pos_ += 3;
        skip_space();
        continue;
      }
      if (c == '-' || c == '+') {
        if (last == Tok::kText || tokens_.empty())
          return error(pos_, std::string("unexpected '") + c + "'");
        const bool binary =
            last == Tok::kName || last == Tok::kNumber || last == Tok::kString ||
            (last == Tok::kOp && (tokens_.back().text == ")" || tokens_.back().text == "]"));
        if (!binary) {
          const size_t at = pos_++;
          std::string num = digits();
          if (!num.empty() && pos_ + 1 < s.size() && s[pos_] == '.' && is_digit(s[pos_ + 1])) {
            ++pos_;
            num += "." + digits();
          }
          if (num.empty()) {
            push(Tok::kOp, std::string(1, c), at);
          } else {
            push(Tok::kNumber, std::string(1, c) + num, at);
          }
          continue;
        }
      }
      if (Status st = operator_token(); !st.ok()) return st;
      if (matched_) continue;
      if (c == '\'' || c == '"') {
        Result<std::string> str = string_literal(c);
        if (!str.ok()) return str.status();
        continue;
      }
      if (is_digit(c)) {
        const size_t at = pos_;
        std::string num = digits();
        if (last != Tok::kOp || tokens_.back().text != ".") {
          if (pos_ + 1 < s.size() && s[pos_] == '.' && is_digit(s[pos_ + 1])) {
            ++pos_;
            num += "." + digits();
          }
        }
        push(Tok::kNumber, num, at);
        continue;
      }
      if (is_word_char(c)) {
        const size_t at = pos_;
        while (pos_ < s.size() && is_word_char(s[pos_])) ++pos_;
        push(Tok::kName, std::string(s.substr(at, pos_ - at)), at);
        continue;
      }
      size_t len = 0;
      decode_utf8(s, pos_, &len);
      return error(pos_, "unexpected character '" + std::string(s.substr(pos_, len)) + "'");
    }
    tokens_.push_back({Tok::kEnd, "", source_.size()});
    return std::move(tokens_);
  }

 private:
  size_t origin(size_t at) const { return at < p_.origin.size() ? p_.origin[at] : source_.size(); }
  void push(Tok kind, std::string text, size_t at) {
    tokens_.push_back({kind, std::move(text), origin(at)});
  }
  Status error(size_t at, const std::string& what) const {
    return Status::InvalidArgument(where(source_, origin(at)) + ": " + what);
  }
  void strip_trailing_space() {
    if (tokens_.empty() || tokens_.back().kind != Tok::kText) return;
    tokens_.back().text = js_trim(tokens_.back().text, false, true);
    if (tokens_.back().text.empty()) tokens_.pop_back();
  }
  void skip_space() {
    const std::string_view s = p_.text;
    while (pos_ < s.size()) {
      size_t len = 0;
      if (!is_js_space(decode_utf8(s, pos_, &len))) break;
      pos_ += len;
    }
  }
  std::string digits() {
    const size_t at = pos_;
    while (pos_ < p_.text.size() && is_digit(p_.text[pos_])) ++pos_;
    return p_.text.substr(at, pos_ - at);
  }
  Status operator_token() {
    static const char* const kOps[] = {"{%", "%}", "{{", "}}", "(",  ")",  "{",  "}",  "[", "]",
                                       ",",  ".",  ":",  "|",  "<=", ">=", "==", "!=", "<", ">",
                                       "+",  "-",  "~",  "**", "*",  "//", "/",  "%",  "="};
    matched_ = false;
    const std::string_view s = p_.text;
    for (const char* op : kOps) {
      const std::string_view o(op);
      if (o == "}}" && curly_depth_ > 0) continue;
      if (s.substr(pos_, o.size()) != o) continue;
      Tok kind = Tok::kOp;
      if (o == "{%") kind = Tok::kOpenStatement;
      if (o == "%}") kind = Tok::kCloseStatement;
      if (o == "{{") {
        kind = Tok::kOpenExpression;
        curly_depth_ = 0;
      }
      if (o == "}}") kind = Tok::kCloseExpression;
      if (o == "{") ++curly_depth_;
      if (o == "}") --curly_depth_;
      push(kind, std::string(o), pos_);
      pos_ += o.size();
      matched_ = true;
      return Status::Ok();
    }
    return Status::Ok();
  }
  Result<std::string> string_literal(char quote) {
    const std::string_view s = p_.text;
    const size_t open = pos_++;
    std::string out;
    while (true) {
      if (pos_ >= s.size()) return error(open, "a string without its closing quote");
      const char c = s[pos_++];
      if (c == quote) break;
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (pos_ >= s.size()) return error(open, "a string without its closing quote");
      const char e = s[pos_++];
      if (e == 'x' || e == 'u') {
        const size_t n = e == 'x' ? 2 : 4;
        const std::string_view hex = s.substr(pos_, n);
        uint32_t cp = 0;
        const auto r = std::from_chars(hex.data(), hex.data() + hex.size(), cp, 16);
        if (hex.size() != n || r.ptr != hex.data() + hex.size()) {
          return error(pos_ - 2, "an invalid escape \\" + std::string(1, e) + std::string(hex));
        }
        append_utf8(&out, cp);
        pos_ += n;
        continue;
      }
      static const std::pair<char, char> kEscapes[] = {{'n', '\n'},  {'t', '\t'}, {'r', '\r'},
                                                       {'b', '\b'},  {'f', '\f'}, {'v', '\v'},
                                                       {'\'', '\''}, {'"', '"'},  {'\\', '\\'}};
      bool known = false;
      for (const auto& [from, to] : kEscapes) {
        if (e == from) {
          out.push_back(to);
          known = true;
        }
      }
      if (!known) return error(pos_ - 2, std::string("an unknown escape \\") + e);
    }
    tokens_.push_back({Tok::kString, out, origin(open)});
    return out;
  }

  std::string_view source_;
  Preprocessed p_;
  size_t pos_ = 0;
  int curly_depth_ = 0;
  bool matched_ = false;
  std::vector<Token> tokens_;
};

}  // namespace

Result<std::vector<Token>> lex(std::string_view source) {
  Lexer lexer(source, preprocess(source));
  return lexer.run();
}

}  // namespace kvrt::text::jinja
