#include "core/server/chat_template.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <utility>

#include "core/util/file.h"

namespace kvrt::server {

namespace {

// ---- limits --------------------------------------------------------------------------------

constexpr int kMaxParseNesting = 64;      // expressions and statements inside one another
constexpr int kMaxExprHeight = 256;       // operators, filters and members applied in a chain
constexpr int kMaxEvalDepth = 1000;       // expressions and statements evaluated inside one another
constexpr int kMaxCallDepth = 64;         // macro calls inside one another
constexpr int kMaxValueNesting = 64;      // lists / dicts / namespaces inside one another (tojson)
constexpr int64_t kMaxRange = 100'000;    // elements of one range()
constexpr uint64_t kBaseSteps = 200'000;  // statements and expressions evaluated, plus
constexpr uint64_t kStepsPerMessage = 10'000;
constexpr uint64_t kBaseBytes = 32ull << 20;  // bytes of strings and lists made, plus
constexpr uint64_t kBytesPerInputByte = 64;   // that many per byte of the messages

// ---- UTF-8 and the reference's whitespace --------------------------------------------------

// The code point at s[i] and its length; a byte that starts no valid sequence reads as U+FFFD.
uint32_t decode_utf8(std::string_view s, size_t i, size_t* len) {
  const auto b = static_cast<unsigned char>(s[i]);
  int n = b < 0x80 ? 1 : (b >> 5) == 6 ? 2 : (b >> 4) == 14 ? 3 : (b >> 3) == 30 ? 4 : 0;
  if (n == 0 || i + n > s.size()) {
    *len = 1;
    return b < 0x80 ? b : 0xFFFD;
  }
  uint32_t cp = n == 1 ? b : b & (0x7F >> n);
  for (int k = 1; k < n; ++k) {
    const auto c = static_cast<unsigned char>(s[i + k]);
    if ((c >> 6) != 2) {
      *len = 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (c & 0x3F);
  }
  *len = static_cast<size_t>(n);
  return cp;
}

void append_utf8(std::string* out, uint32_t cp) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

// JavaScript's \s (what the reference's lexer and String.trim strip).
bool is_js_space(uint32_t c) {
  if (c <= 32) return c == 32 || (c >= 9 && c <= 13);
  return c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
}

// The code points of `s`, each as its bytes.
std::vector<std::string_view> code_points(std::string_view s) {
  std::vector<std::string_view> out;
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    decode_utf8(s, i, &len);
    out.push_back(s.substr(i, len));
    i += len;
  }
  return out;
}

size_t count_code_points(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) {
    size_t len = 0;
    decode_utf8(s, i, &len);
    i += len;
  }
  return n;
}

// Strips what `strip_this` accepts from either end of `s`, a code point at a time.
template <typename Pred>
std::string strip_if(std::string_view s, bool left, bool right, Pred strip_this) {
  size_t b = 0, e = s.size();
  if (left) {
    while (b < e) {
      size_t len = 0;
      if (!strip_this(decode_utf8(s, b, &len))) break;
      b += len;
    }
  }
  if (right) {
    while (e > b) {
      size_t start = e - 1;
      while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t len = 0;
      const uint32_t cp = decode_utf8(s, start, &len);
      if (start + len != e || !strip_this(cp)) break;
      e = start;
    }
  }
  return std::string(s.substr(b, e - b));
}

std::string js_trim(std::string_view s, bool left = true, bool right = true) {
  return strip_if(s, left, right, is_js_space);
}

char ascii_upper(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 'a' && u <= 'z' ? static_cast<char>(u - 'a' + 'A') : c;
}
char ascii_lower(char c) {
  const auto u = static_cast<unsigned char>(c);
  return u >= 'A' && u <= 'Z' ? static_cast<char>(u - 'A' + 'a') : c;
}
bool is_word_char(char c) {
  const auto u = static_cast<unsigned char>(c);
  return (u >= 'a' && u <= 'z') || (u >= 'A' && u <= 'Z') || (u >= '0' && u <= '9') || u == '_';
}
bool is_digit(char c) { return c >= '0' && c <= '9'; }

std::string to_upper(std::string s) {
  for (char& c : s) c = ascii_upper(c);
  return s;
}
std::string to_lower(std::string s) {
  for (char& c : s) c = ascii_lower(c);
  return s;
}
// JavaScript's s.replace(/\b\w/g, toUpperCase): the first word character after a non-word one.
std::string title_case(std::string s) {
  for (size_t i = 0; i < s.size(); ++i) {
    if (is_word_char(s[i]) && (i == 0 || !is_word_char(s[i - 1]))) s[i] = ascii_upper(s[i]);
  }
  return s;
}

// A number as JavaScript's String(number) writes it (shortest round trip).
std::string js_number(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v < 0 ? "-Infinity" : "Infinity";
  if (v == 0) return "0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // d[.ddd]e[+-]xx
  const bool negative = sci[0] == '-';
  if (negative) sci.erase(0, 1);
  const size_t e_at = sci.find('e');
  std::string digits = sci.substr(0, e_at);
  digits.erase(std::remove(digits.begin(), digits.end(), '.'), digits.end());
  const int exp = std::stoi(sci.substr(e_at + 1));
  const int n = static_cast<int>(digits.size());
  std::string out;
  if (exp >= 21 || exp <= -7) {
    out = digits.substr(0, 1);
    if (n > 1) out += "." + digits.substr(1);
    out += std::string("e") + (exp < 0 ? "-" : "+") + std::to_string(std::abs(exp));
  } else if (exp >= 0) {
    if (n <= exp + 1) {
      out = digits + std::string(static_cast<size_t>(exp + 1 - n), '0');
    } else {
      out = digits.substr(0, static_cast<size_t>(exp + 1)) + "." +
            digits.substr(static_cast<size_t>(exp + 1));
    }
  } else {
    out = "0." + std::string(static_cast<size_t>(-exp - 1), '0') + digits;
  }
  return negative ? "-" + out : out;
}

// ---- values --------------------------------------------------------------------------------

struct Namespace;
struct Function;
struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // in insertion order, as JS's Map

struct Value {
  enum class Type : uint8_t {
    kUndefined,
    kNone,
    kBool,
    kInt,
    kFloat,
    kString,
    kList,
    kDict,
    kNamespace,
    kFunction
  };
  Type type = Type::kUndefined;
  union {
    bool b;
    int64_t i;
    double f;
    Namespace* ns;  // owned by the render's Context
  };
  std::shared_ptr<const void> ptr;  // the std::string, List, Dict or Function

  Value() : i(0) {}
  static Value none() {
    Value v;
    v.type = Type::kNone;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.type = Type::kBool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.type = Type::kInt;
    v.i = x;
    return v;
  }
  static Value number(double x) {
    Value v;
    v.type = Type::kFloat;
    v.f = x;
    return v;
  }
  static Value string(std::string x) {
    Value v;
    v.type = Type::kString;
    v.ptr = std::make_shared<const std::string>(std::move(x));
    return v;
  }
  static Value list(List x) {
    Value v;
    v.type = Type::kList;
    v.ptr = std::make_shared<const List>(std::move(x));
    return v;
  }
  static Value dict(Dict x) {
    Value v;
    v.type = Type::kDict;
    v.ptr = std::make_shared<const Dict>(std::move(x));
    return v;
  }
  static Value namespace_of(Namespace* n) {
    Value v;
    v.type = Type::kNamespace;
    v.ns = n;
    return v;
  }
  static Value function(std::shared_ptr<const Function> fn) {
    Value v;
    v.type = Type::kFunction;
    v.ptr = std::move(fn);
    return v;
  }

  bool is(Type t) const { return type == t; }
  bool is_number() const { return type == Type::kInt || type == Type::kFloat; }
  bool is_nullish() const { return type == Type::kNone || type == Type::kUndefined; }
  const std::string& str() const { return *static_cast<const std::string*>(ptr.get()); }
  const List& items() const { return *static_cast<const List*>(ptr.get()); }
  const Dict& entries() const { return *static_cast<const Dict*>(ptr.get()); }
  const Function& fn() const { return *static_cast<const Function*>(ptr.get()); }
  double as_double() const {
    return type == Type::kInt ? static_cast<double>(i) : type == Type::kFloat ? f : b ? 1 : 0;
  }
};

struct Namespace {
  Dict entries;
};

const Value* find(const Dict& d, std::string_view key) {
  for (const auto& [k, v] : d) {
    if (k == key) return &v;
  }
  return nullptr;
}

const char* type_name(const Value& v) {
  switch (v.type) {
    case Value::Type::kUndefined:
      return "undefined";
    case Value::Type::kNone:
      return "none";
    case Value::Type::kBool:
      return "boolean";
    case Value::Type::kInt:
      return "integer";
    case Value::Type::kFloat:
      return "float";
    case Value::Type::kString:
      return "string";
    case Value::Type::kList:
      return "list";
    case Value::Type::kDict:
      return "dict";
    case Value::Type::kNamespace:
      return "namespace";
    case Value::Type::kFunction:
      return "function";
  }
  return "value";
}

bool truthy(const Value& v) {
  switch (v.type) {
    case Value::Type::kBool:
      return v.b;
    case Value::Type::kInt:
      return v.i != 0;
    case Value::Type::kFloat:
      return v.f != 0 && !std::isnan(v.f);
    case Value::Type::kString:
      return !v.str().empty();
    case Value::Type::kList:
      return !v.items().empty();
    case Value::Type::kDict:
      return !v.entries().empty();
    case Value::Type::kNamespace:
    case Value::Type::kFunction:
      return true;
    default:
      return false;
  }
}

// JavaScript's `a == b` on the values the reference compares.
bool loose_equal(const Value& a, const Value& b) {
  if (a.is_nullish() || b.is_nullish()) return a.is_nullish() && b.is_nullish();
  const auto numeric = [](const Value& v) { return v.is_number() || v.is(Value::Type::kBool); };
  if (numeric(a) && numeric(b)) return a.as_double() == b.as_double();
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::Type::kString:
      return a.str() == b.str();
    case Value::Type::kNamespace:
      return a.ns == b.ns;
    default:
      return a.ptr == b.ptr;
  }
}

// JavaScript's `a === b` (list membership).
bool strict_equal(const Value& a, const Value& b) {
  if (a.is_number() && b.is_number()) return a.as_double() == b.as_double();
  if (a.type != b.type) return false;
  switch (a.type) {
    case Value::Type::kUndefined:
    case Value::Type::kNone:
      return true;
    case Value::Type::kBool:
      return a.b == b.b;
    case Value::Type::kString:
      return a.str() == b.str();
    case Value::Type::kNamespace:
      return a.ns == b.ns;
    default:
      return a.ptr == b.ptr;
  }
}

struct JsonOptions {
  int indent = 0;  // 0: on one line
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_separators = false;
  std::string item_separator, key_separator;
  bool undefined_as_null = true;    // false: "undefined", as the reference prints a list
  uint64_t max_bytes = UINT64_MAX;  // an error once the text grows past this
};

void json_string(std::string_view s, bool ensure_ascii, std::string* out) {
  out->push_back('"');
  for (size_t i = 0; i < s.size();) {
    size_t len = 0;
    const uint32_t cp = decode_utf8(s, i, &len);
    char esc[16];
    switch (cp) {
      case '"':
        *out += "\\\"";
        break;
      case '\\':
        *out += "\\\\";
        break;
      case '\b':
        *out += "\\b";
        break;
      case '\f':
        *out += "\\f";
        break;
      case '\n':
        *out += "\\n";
        break;
      case '\r':
        *out += "\\r";
        break;
      case '\t':
        *out += "\\t";
        break;
      default:
        if (cp < 0x20 || (ensure_ascii && cp >= 0x7F)) {
          if (cp >= 0x10000) {
            const uint32_t v = cp - 0x10000;
            std::snprintf(esc, sizeof esc, "\\u%04x\\u%04x", 0xD800 + (v >> 10),
                          0xDC00 + (v & 0x3FF));
          } else {
            std::snprintf(esc, sizeof esc, "\\u%04x", cp);
          }
          *out += esc;
        } else if (cp == 0xFFFD && len == 1) {
          *out += "\xEF\xBF\xBD";  // a stray byte: what the reference's UTF-16 text would hold
        } else {
          out->append(s.substr(i, len));
        }
    }
    i += len;
  }
  out->push_back('"');
}

Status to_json(const Value& v, const JsonOptions& o, int depth, std::string* out) {
  if (out->size() > o.max_bytes) {
    return Status::InvalidArgument("the chat template makes too much text while rendering");
  }
  if (depth > kMaxValueNesting) {
    return Status::InvalidArgument(
        "the chat template's value is nested over 64 deep (or holds "
        "itself) where it is written as JSON");
  }
  const std::string item_sep = o.has_separators ? o.item_separator : o.indent ? "," : ", ";
  const std::string key_sep = o.has_separators ? o.key_separator : ": ";
  const std::string pad = "\n" + std::string(static_cast<size_t>(o.indent * depth), ' ');
  const std::string child_pad = pad + std::string(static_cast<size_t>(o.indent), ' ');
  switch (v.type) {
    case Value::Type::kNone:
      *out += "null";
      return Status::Ok();
    case Value::Type::kUndefined:
      *out += o.undefined_as_null ? "null" : "undefined";
      return Status::Ok();
    case Value::Type::kBool:
      *out += v.b ? "true" : "false";
      return Status::Ok();
    case Value::Type::kInt:
      *out += std::to_string(v.i);
      return Status::Ok();
    case Value::Type::kFloat:
      *out += std::isfinite(v.f) ? js_number(v.f) : "null";
      return Status::Ok();
    case Value::Type::kString:
      json_string(v.str(), o.ensure_ascii, out);
      return Status::Ok();
    case Value::Type::kList: {
      const List& items = v.items();
      *out += '[';
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0) *out += item_sep;
        if (o.indent) *out += child_pad;
        if (Status s = to_json(items[k], o, depth + 1, out); !s.ok()) return s;
      }
      if (o.indent && !items.empty()) *out += pad;
      *out += ']';
      return Status::Ok();
    }
    case Value::Type::kDict:
    case Value::Type::kNamespace: {
      std::vector<const std::pair<std::string, Value>*> entries;
      for (const auto& e : v.is(Value::Type::kDict) ? v.entries() : v.ns->entries) {
        entries.push_back(&e);
      }
      if (o.sort_keys) {
        std::stable_sort(entries.begin(), entries.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      }
      *out += '{';
      for (size_t k = 0; k < entries.size(); ++k) {
        if (k > 0) *out += item_sep;
        if (o.indent) *out += child_pad;
        json_string(entries[k]->first, o.ensure_ascii, out);
        *out += key_sep;
        if (Status s = to_json(entries[k]->second, o, depth + 1, out); !s.ok()) return s;
      }
      if (o.indent && !entries.empty()) *out += pad;
      *out += '}';
      return Status::Ok();
    }
    case Value::Type::kFunction:
      return Status::InvalidArgument("the chat template writes a function as JSON");
  }
  return Status::Ok();
}

// A value as the reference's toString() writes it: {{ x }}, ~, and + with a string.
Result<std::string> text_of(const Value& v, uint64_t max_bytes = UINT64_MAX) {
  switch (v.type) {
    case Value::Type::kString:
      return v.str();
    case Value::Type::kInt:
      return std::to_string(v.i);
    case Value::Type::kFloat:
      if (v.f == 0 && std::signbit(v.f)) return std::string("-0.0");
      if (std::isfinite(v.f) && v.f == std::floor(v.f) && std::fabs(v.f) < 1e21) {
        return js_number(v.f) + ".0";
      }
      return js_number(v.f);
    case Value::Type::kBool:
      return std::string(v.b ? "true" : "false");
    case Value::Type::kNone:
    case Value::Type::kUndefined:
      return std::string();
    case Value::Type::kList:
    case Value::Type::kDict:
    case Value::Type::kNamespace: {
      JsonOptions o;
      o.undefined_as_null = false;
      o.max_bytes = max_bytes;
      std::string out;
      if (Status s = to_json(v, o, 0, &out); !s.ok()) return s;
      return out;
    }
    case Value::Type::kFunction:
      return Status::InvalidArgument("the chat template writes a function as text");
  }
  return std::string();
}

// A primitive as JavaScript's value.toString() (the reference's + and ~ operands).
Result<std::string> primitive_text(const Value& v, const char* op) {
  if (v.is(Value::Type::kFloat)) return js_number(v.f);
  if (v.is(Value::Type::kString) || v.is(Value::Type::kInt) || v.is(Value::Type::kBool)) {
    return text_of(v);
  }
  return Status::InvalidArgument(std::string("the chat template joins a ") + type_name(v) +
                                 " with '" + op + "'");
}

// ---- tokens --------------------------------------------------------------------------------

enum class Tok {
  kText,
  kNumber,
  kString,
  kName,
  kOp,  // ( ) [ ] { } , . : | = + - ~ * / // % ** == != < > <= >=
  kOpenStatement,
  kCloseStatement,
  kOpenExpression,
  kCloseExpression,
  kComment,
  kEnd
};

struct Token {
  Tok kind;
  std::string text;
  size_t at;  // byte offset in the template's source
};

std::string where(std::string_view source, size_t at) {
  at = std::min(at, source.size());
  const size_t line =
      1 + static_cast<size_t>(std::count(source.begin(), source.begin() + at, '\n'));
  return "chat template, line " + std::to_string(line) + " (byte " + std::to_string(at) + ")";
}

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

// ---- the syntax tree -----------------------------------------------------------------------

struct Expr;
using ExprPtr = std::unique_ptr<Expr>;

struct Expr {
  enum class Kind {
    kLiteral,
    kName,     // name
    kMember,   // kids[0].name (attribute) or kids[0][kids[1]] (computed)
    kSlice,    // kids[0][kids[1]:kids[2]:kids[3]], each of 1-3 possibly null
    kCall,     // kids[0](kids[1..]); keywords[i - 1] names a keyword argument
    kFilter,   // kids[0] | name(kids[1..])
    kTest,     // kids[0] is [not] name
    kUnary,    // name ("not", "-", "+") kids[0]
    kBinary,   // kids[0] name kids[1]
    kTernary,  // kids[1] if kids[0] else kids[2]
    kSelect,   // kids[1] if kids[0] (undefined otherwise)
    kList,
    kTuple,
    kDict  // kids alternate key, value
  };
  Kind kind;
  size_t at;
  int height = 1;  // of the tree below, bounded so that no walk of it exhausts the stack
  std::string name;
  Value literal;
  bool computed = false;
  bool negated = false;
  std::vector<ExprPtr> kids;
  std::vector<std::string> keywords;
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;

struct Param {
  std::string name;
  ExprPtr default_value;  // null: required
};

struct Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet, kSetBlock, kMacro, kBreak, kContinue };
  Kind kind;
  size_t at;
  std::string text;  // kText; kMacro: the name
  ExprPtr expr;      // kOutput; kIf's test; kFor's items; kSet's value
  ExprPtr target;    // kSet / kSetBlock / kFor: a name, a tuple of names, or ns.attr
  ExprPtr filter;    // kFor: the "if" selecting items
  Body body, otherwise;
  std::vector<Param> params;  // kMacro
  bool uses_varargs = false, uses_kwargs = false;
};

}  // namespace

struct ChatTemplate::Program {
  std::string source;
  Body body;
};

namespace {

// ---- the parser ----------------------------------------------------------------------------

// Nesting is bounded, so no template can exhaust the stack: one level while a Nesting lives.
class Nesting {
 public:
  Nesting(int& depth, int limit) : depth_(depth), limit_(limit) { ++depth_; }
  ~Nesting() { --depth_; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;
  bool too_deep() const { return depth_ > limit_; }

 private:
  int& depth_;
  int limit_;
};

const char* const kFilters[] = {
    "safe",    "tojson",     "list",       "first",  "last",     "length", "count",   "reverse",
    "sort",    "join",       "string",     "unique", "upper",    "lower",  "title",   "capitalize",
    "trim",    "indent",     "int",        "float",  "abs",      "items",  "default", "d",
    "replace", "selectattr", "rejectattr", "map",    "dictsort", "select", "reject"};
const char* const kTests[] = {"defined", "undefined", "none",     "string",   "number",   "integer",
                              "boolean", "mapping",   "sequence", "iterable", "callable", "odd",
                              "even",    "true",      "false",    "lower",    "upper"};
const char* const kMethods[] = {"strip",   "lstrip", "rstrip", "split",   "startswith", "endswith",
                                "replace", "upper",  "lower",  "title",   "capitalize", "get",
                                "items",   "keys",   "values", "dictsort"};
const char* const kGlobals[] = {"namespace", "range", "raise_exception", "strftime_now"};

template <size_t N>
bool one_of(const char* const (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

class Parser {
 public:
  Parser(std::string_view source, std::vector<Token> tokens)
      : source_(source), t_(std::move(tokens)) {}

  Result<Body> program() {
    Body body;
    while (peek().kind != Tok::kEnd) {
      if (Status s = any(&body); !s.ok()) return s;
    }
    if (Status s = check_calls(body); !s.ok()) return s;
    return body;
  }

 private:
  struct Depth : Nesting {
    explicit Depth(int& depth) : Nesting(depth, kMaxParseNesting) {}
  };

  const Token& peek(size_t ahead = 0) const { return t_[std::min(p_ + ahead, t_.size() - 1)]; }
  Token next() { return p_ + 1 < t_.size() ? t_[p_++] : t_.back(); }
  bool is_op(const char* op, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::kOp && peek(ahead).text == op;
  }
  bool is_name(const char* name, size_t ahead = 0) const {
    return peek(ahead).kind == Tok::kName && peek(ahead).text == name;
  }
  Status error(size_t at, const std::string& what) const {
    return Status::InvalidArgument(where(source_, at) + ": " + what);
  }
  Status error_here(const std::string& what) const {
    if (peek().kind == Tok::kEnd) return error(peek().at, what + " (the template ends first)");
    return error(peek().at, what + ", not '" + peek().text + "'");
  }
  Status expect(Tok kind, const char* what) {
    if (peek().kind != kind) return error_here(std::string("expected ") + what);
    ++p_;
    return Status::Ok();
  }
  // At "{% name" for one of `names`.
  bool at_statement(std::initializer_list<const char*> names) const {
    if (peek().kind != Tok::kOpenStatement || peek(1).kind != Tok::kName) return false;
    for (const char* n : names) {
      if (peek(1).text == n) return true;
    }
    return false;
  }
  Status end_statement(const char* name, size_t opened_at, const char* opener) {
    if (!at_statement({name})) {
      return error(opened_at,
                   std::string("a '{% ") + opener + " %}' without its '{% " + name + " %}'");
    }
    p_ += 2;
    return expect(Tok::kCloseStatement, "'%}'");
  }
  // Statements until one of `enders` (not consumed); an error naming `opener` at the end.
  Status body_until(Body* body, std::initializer_list<const char*> enders, size_t opened_at,
                    const char* opener, const char* closer) {
    while (!at_statement(enders)) {
      if (peek().kind == Tok::kEnd) {
        return error(opened_at,
                     std::string("a '{% ") + opener + " %}' without its '{% " + closer + " %}'");
      }
      if (Status s = any(body); !s.ok()) return s;
    }
    return Status::Ok();
  }

  Status any(Body* body) {
    const Depth depth(depth_);
    if (depth.too_deep()) return error(peek().at, "statements nested over 64 deep");
    const Token& t = peek();
    switch (t.kind) {
      case Tok::kComment:
        ++p_;
        return Status::Ok();
      case Tok::kText: {
        auto n = node(Node::Kind::kText, t.at);
        n->text = t.text;
        ++p_;
        body->push_back(std::move(n));
        return Status::Ok();
      }
      case Tok::kOpenExpression: {
        ++p_;
        auto n = node(Node::Kind::kOutput, t.at);
        Result<ExprPtr> e = expression();
        if (!e.ok()) return e.status();
        n->expr = std::move(*e);
        if (Status s = expect(Tok::kCloseExpression, "'}}'"); !s.ok()) return s;
        body->push_back(std::move(n));
        return Status::Ok();
      }
      case Tok::kOpenStatement:
        return statement(body);
      default:
        return error_here("expected text, '{{', '{%' or '{#'");
    }
  }

  static std::unique_ptr<Node> node(Node::Kind kind, size_t at) {
    auto n = std::make_unique<Node>();
    n->kind = kind;
    n->at = at;
    return n;
  }

  Status statement(Body* body) {
    const size_t at = peek().at;
    ++p_;  // {%
    if (peek().kind != Tok::kName) return error_here("expected a statement's name");
    const std::string name = next().text;
    if (name == "if") {
      auto n = node(Node::Kind::kIf, at);
      if (Status s = if_rest(n.get(), at); !s.ok()) return s;
      if (Status s = end_statement("endif", at, "if"); !s.ok()) return s;
      body->push_back(std::move(n));
      return Status::Ok();
    }
    if (name == "for") return for_statement(body, at);
    if (name == "set") return set_statement(body, at);
    if (name == "macro") return macro_statement(body, at);
    if (name == "break" || name == "continue") {
      if (loops_ == 0) return error(at, "'{% " + name + " %}' outside a for loop");
      if (Status s = expect(Tok::kCloseStatement, "'%}'"); !s.ok()) return s;
      body->push_back(node(name == "break" ? Node::Kind::kBreak : Node::Kind::kContinue, at));
      return Status::Ok();
    }
    static const char* const kEnders[] = {"elif",   "else",     "endif",   "endfor",
                                          "endset", "endmacro", "endcall", "endfilter"};
    if (one_of(kEnders, name)) return error(at, "a '{% " + name + " %}' that closes nothing");
    return error(at, "unsupported statement '{% " + name + " %}'");
  }

  Status if_rest(Node* n, size_t at) {
    Result<ExprPtr> test = expression();
    if (!test.ok()) return test.status();
    n->expr = std::move(*test);
    if (Status s = expect(Tok::kCloseStatement, "'%}'"); !s.ok()) return s;
    if (Status s = body_until(&n->body, {"elif", "else", "endif"}, at, "if", "endif"); !s.ok()) {
      return s;
    }
    if (at_statement({"elif"})) {
      const size_t elif_at = peek().at;
      p_ += 2;
      auto nested = node(Node::Kind::kIf, elif_at);
      const Depth depth(depth_);
      if (depth.too_deep()) return error(elif_at, "elifs chained over 64 deep");
      if (Status s = if_rest(nested.get(), at); !s.ok()) return s;
      n->otherwise.push_back(std::move(nested));
    } else if (at_statement({"else"})) {
      p_ += 2;
      if (Status s = expect(Tok::kCloseStatement, "'%}'"); !s.ok()) return s;
      if (Status s = body_until(&n->otherwise, {"endif"}, at, "if", "endif"); !s.ok()) return s;
    }
    return Status::Ok();
  }

  Status for_statement(Body* body, size_t at) {
    auto n = node(Node::Kind::kFor, at);
    Result<ExprPtr> target = sequence(/*primary=*/true);
    if (!target.ok()) return target.status();
    if (Status s = check_target(**target, false); !s.ok()) return s;
    n->target = std::move(*target);
    if (!is_name("in")) return error_here("expected 'in'");
    ++p_;
    Result<ExprPtr> items = expression();
    if (!items.ok()) return items.status();
    if ((*items)->kind == Expr::Kind::kSelect) {
      n->filter = std::move((*items)->kids[0]);
      n->expr = std::move((*items)->kids[1]);
    } else {
      n->expr = std::move(*items);
    }
    if (Status s = expect(Tok::kCloseStatement, "'%}'"); !s.ok()) return s;
    ++loops_;
    Status s = body_until(&n->body, {"endfor", "else"}, at, "for", "endfor");
    --loops_;
    if (!s.ok()) return s;
    if (at_statement({"else"})) {
      p_ += 2;
      if (Status e = expect(Tok::kCloseStatement, "'%}'"); !e.ok()) return e;
      if (Status e = body_until(&n->otherwise, {"endfor"}, at, "for", "endfor"); !e.ok()) return e;
    }
    if (Status e = end_statement("endfor", at, "for"); !e.ok()) return e;
    body->push_back(std::move(n));
    return Status::Ok();
  }

  // A for's or a set's target: a name, names in a tuple, or (set only) namespace.attribute.
  Status check_target(const Expr& e, bool allow_attribute) const {
    if (e.kind == Expr::Kind::kName) return Status::Ok();
    if (e.kind == Expr::Kind::kTuple) {
      for (const ExprPtr& k : e.kids) {
        if (k->kind != Expr::Kind::kName) return error(k->at, "expected a name to assign to");
      }
      return Status::Ok();
    }
    if (allow_attribute && e.kind == Expr::Kind::kMember && !e.computed) return Status::Ok();
    return error(e.at, allow_attribute ? "expected a name, names or namespace.attribute to set"
                                       : "expected a loop variable (a name or names)");
  }

  Status set_statement(Body* body, size_t at) {
    Result<ExprPtr> target = sequence(false);
    if (!target.ok()) return target.status();
    if (Status s = check_target(**target, true); !s.ok()) return s;
    if (is_op("=")) {
      ++p_;
      auto n = node(Node::Kind::kSet, at);
      n->target = std::move(*target);
      Result<ExprPtr> value = sequence(false);
      if (!value.ok()) return value.status();
      n->expr = std::move(*value);
      if (Status s = expect(Tok::kCloseStatement, "'%}'"); !s.ok()) return s;
      body->push_back(std::move(n));
      return Status::Ok();
    }
    auto n = node(Node::Kind::kSetBlock, at);
    n->target = std::move(*target);
    if (Status s = expect(Tok::kCloseStatement, "'=' or '%}'"); !s.ok()) return s;
    if (Status s = body_until(&n->body, {"endset"}, at, "set", "endset"); !s.ok()) return s;
    if (Status s = end_statement("endset", at, "set"); !s.ok()) return s;
    body->push_back(std::move(n));
    return Status::Ok();
  }

  Status macro_statement(Body* body, size_t at) {
    auto n = node(Node::Kind::kMacro, at);
    if (peek().kind != Tok::kName) return error_here("expected the macro's name");
    n->text = next().text;
    if (Status s = expect_op("("); !s.ok()) return s;
    while (!is_op(")")) {
      if (peek().kind != Tok::kName) return error_here("expected a parameter's name");
      Param param;
      param.name = next().text;
      for (const Param& other : n->params) {
        if (other.name == param.name) return error(at, "the parameter '" + param.name + "' twice");
      }
      if (is_op("=")) {
        ++p_;
        Result<ExprPtr> d = expression();
        if (!d.ok()) return d.status();
        param.default_value = std::move(*d);
      } else if (!n->params.empty() && n->params.back().default_value) {
        return error(at, "a parameter without a default after one with a default");
      }
      n->params.push_back(std::move(param));
      if (is_op(","))
        ++p_;
      else if (!is_op(")"))
        return error_here("expected ',' or ')'");
    }
    ++p_;
    if (Status s = expect(Tok::kCloseStatement, "'%}'"); !s.ok()) return s;
    const size_t body_from = p_;
    const int loops = loops_;
    loops_ = 0;  // a break in a macro breaks no caller's loop
    Status s = body_until(&n->body, {"endmacro"}, at, "macro", "endmacro");
    loops_ = loops;
    if (!s.ok()) return s;
    for (size_t k = body_from; k < p_; ++k) {
      if (t_[k].kind != Tok::kName) continue;
      n->uses_varargs |= t_[k].text == "varargs";
      n->uses_kwargs |= t_[k].text == "kwargs";
      if (t_[k].text == "caller")
        return error(t_[k].at, "unsupported 'caller' ({% call %} blocks)");
    }
    if (Status e = end_statement("endmacro", at, "macro"); !e.ok()) return e;
    macros_.push_back(n->text);
    body->push_back(std::move(n));
    return Status::Ok();
  }

  // Items up to `close` (consumed), separated by commas, each parsed by `item`.
  template <typename Item>
  Status delimited(const char* close, Item item) {
    while (!is_op(close)) {
      if (peek().kind == Tok::kEnd) return error_here(std::string("expected '") + close + "'");
      if (Status s = item(); !s.ok()) return s;
      if (is_op(",")) {
        ++p_;
      } else if (!is_op(close)) {
        return error_here(std::string("expected ',' or '") + close + "'");
      }
    }
    ++p_;
    return Status::Ok();
  }

  Status expect_op(const char* op) {
    if (!is_op(op)) return error_here(std::string("expected '") + op + "'");
    ++p_;
    return Status::Ok();
  }

  // Sets e's height from its children's; an error past kMaxExprHeight.
  Status measure(Expr& e) const {
    for (const ExprPtr& k : e.kids) {
      if (k) e.height = std::max(e.height, k->height + 1);
    }
    if (e.height > kMaxExprHeight) return error(e.at, "an expression over 256 operations deep");
    return Status::Ok();
  }
  Result<ExprPtr> done(ExprPtr e) const {
    if (Status s = measure(*e); !s.ok()) return s;
    return ExprPtr(std::move(e));
  }

  static ExprPtr make(Expr::Kind kind, size_t at) {
    auto e = std::make_unique<Expr>();
    e->kind = kind;
    e->at = at;
    return e;
  }

  // expr[, expr...]: a tuple when there is a comma.
  Result<ExprPtr> sequence(bool primary_only) {
    const size_t at = peek().at;
    Result<ExprPtr> first = primary_only ? primary() : expression();
    if (!first.ok() || !is_op(",")) return first;
    auto tuple = make(Expr::Kind::kTuple, at);
    tuple->kids.push_back(std::move(*first));
    while (is_op(",")) {
      ++p_;
      Result<ExprPtr> e = primary_only ? primary() : expression();
      if (!e.ok()) return e;
      tuple->kids.push_back(std::move(*e));
    }
    return done(std::move(tuple));
  }

  Result<ExprPtr> expression() {
    const Depth depth(depth_);
    if (depth.too_deep()) return error(peek().at, "expressions nested over 64 deep");
    Result<ExprPtr> a = or_expr();
    if (!a.ok() || !is_name("if")) return a;
    const size_t at = peek().at;
    ++p_;
    Result<ExprPtr> test = or_expr();
    if (!test.ok()) return test;
    if (is_name("else")) {
      ++p_;
      Result<ExprPtr> b = expression();
      if (!b.ok()) return b;
      auto e = make(Expr::Kind::kTernary, at);
      e->kids.push_back(std::move(*test));
      e->kids.push_back(std::move(*a));
      e->kids.push_back(std::move(*b));
      return done(std::move(e));
    }
    auto e = make(Expr::Kind::kSelect, at);
    e->kids.push_back(std::move(*test));
    e->kids.push_back(std::move(*a));
    return done(std::move(e));
  }

  Result<ExprPtr> binary(ExprPtr left, std::string op, size_t at, ExprPtr right) {
    auto e = make(Expr::Kind::kBinary, at);
    e->name = std::move(op);
    e->kids.push_back(std::move(left));
    e->kids.push_back(std::move(right));
    return done(std::move(e));
  }

  // One precedence level: operands of `operand` joined left to right by one of `ops` (names such
  // as "and", or operator tokens).
  using Level = Result<ExprPtr> (Parser::*)();
  Result<ExprPtr> chain(Level operand, std::initializer_list<const char*> ops, bool names) {
    Result<ExprPtr> left = (this->*operand)();
    while (left.ok()) {
      const char* op = nullptr;
      for (const char* o : ops) {
        if (names ? is_name(o) : is_op(o)) op = o;
      }
      if (op == nullptr) break;
      const size_t at = next().at;
      Result<ExprPtr> right = (this->*operand)();
      if (!right.ok()) return right;
      left = binary(std::move(*left), op, at, std::move(*right));
    }
    return left;
  }
  Result<ExprPtr> or_expr() { return chain(&Parser::and_expr, {"or"}, true); }
  Result<ExprPtr> and_expr() { return chain(&Parser::not_expr, {"and"}, true); }
  Result<ExprPtr> not_expr() {
    if (!is_name("not")) return comparison();
    const Depth depth(depth_);
    if (depth.too_deep()) return error(peek().at, "expressions nested over 64 deep");
    auto e = make(Expr::Kind::kUnary, next().at);
    e->name = "not";
    Result<ExprPtr> operand = not_expr();
    if (!operand.ok()) return operand;
    e->kids.push_back(std::move(*operand));
    return done(std::move(e));
  }
  Result<ExprPtr> comparison() {
    Result<ExprPtr> left = additive();
    while (left.ok()) {
      std::string op;
      const size_t at = peek().at;
      if (is_name("not") && is_name("in", 1)) {
        p_ += 2;
        op = "not in";
      } else if (is_name("in")) {
        ++p_;
        op = "in";
      } else if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") ||
                 is_op(">=")) {
        op = next().text;
      } else {
        break;
      }
      Result<ExprPtr> right = additive();
      if (!right.ok()) return right;
      left = binary(std::move(*left), op, at, std::move(*right));
    }
    return left;
  }
  Result<ExprPtr> additive() { return chain(&Parser::multiplicative, {"+", "-", "~"}, false); }
  Result<ExprPtr> multiplicative() { return chain(&Parser::power, {"*", "/", "//", "%"}, false); }
  Result<ExprPtr> power() { return chain(&Parser::test, {"**"}, false); }
  Result<ExprPtr> test() {
    Result<ExprPtr> operand = filter();
    while (operand.ok() && is_name("is")) {
      auto e = make(Expr::Kind::kTest, next().at);
      if (is_name("not")) {
        ++p_;
        e->negated = true;
      }
      if (peek().kind != Tok::kName) return error_here("expected a test's name after 'is'");
      const Token name = next();
      if (!one_of(kTests, name.text))
        return error(name.at, "unsupported test 'is " + name.text + "'");
      if (is_op("("))
        return error(name.at, "unsupported test with arguments 'is " + name.text + "(...)'");
      e->name = name.text;
      e->kids.push_back(std::move(*operand));
      operand = done(std::move(e));
    }
    return operand;
  }
  Result<ExprPtr> filter() {
    Result<ExprPtr> operand = unary();
    while (operand.ok() && is_op("|")) {
      ++p_;
      if (peek().kind != Tok::kName) return error_here("expected a filter's name after '|'");
      const Token name = next();
      if (!one_of(kFilters, name.text))
        return error(name.at, "unsupported filter '" + name.text + "'");
      auto e = make(Expr::Kind::kFilter, name.at);
      e->name = name.text;
      e->kids.push_back(std::move(*operand));
      if (is_op("(")) {
        if (Status s = arguments(e.get()); !s.ok()) return s;
      }
      operand = done(std::move(e));
    }
    return operand;
  }
  Result<ExprPtr> unary() {
    if ((peek().kind == Tok::kOp) && (peek().text == "-" || peek().text == "+")) {
      const Depth depth(depth_);
      if (depth.too_deep()) return error(peek().at, "expressions nested over 64 deep");
      auto e = make(Expr::Kind::kUnary, peek().at);
      e->name = next().text;
      Result<ExprPtr> operand = unary();
      if (!operand.ok()) return operand;
      e->kids.push_back(std::move(*operand));
      return done(std::move(e));
    }
    Result<ExprPtr> p = primary();
    if (!p.ok()) return p;
    return postfix(std::move(*p));
  }
  // a.b, a[k], a[i:j:k] and calls, in any order.
  Result<ExprPtr> postfix(ExprPtr object) {
    int chained = 0;
    while (is_op(".") || is_op("[") || is_op("(")) {
      if (++chained > kMaxExprHeight)
        return error(peek().at, "over 256 calls and members in a row");
      if (Status s = measure(*object); !s.ok()) return s;
      const Token op = next();
      if (op.text == "(") {
        --p_;
        auto call = make(Expr::Kind::kCall, op.at);
        call->kids.push_back(std::move(object));
        if (Status s = arguments(call.get()); !s.ok()) return s;
        object = std::move(call);
      } else if (op.text == ".") {
        auto m = make(Expr::Kind::kMember, op.at);
        const Token name = next();
        if (name.kind == Tok::kName) {
          m->name = name.text;
        } else if (name.kind == Tok::kNumber && name.text.find('.') == std::string::npos &&
                   name.text[0] != '-' && name.text[0] != '+') {
          m->computed = true;
          Result<ExprPtr> index = number_literal(name);
          if (!index.ok()) return index;
          m->kids.push_back(std::move(object));
          m->kids.push_back(std::move(*index));
          object = std::move(m);
          continue;
        } else {
          return error(name.at, "expected a name after '.'");
        }
        m->kids.push_back(std::move(object));
        object = std::move(m);
      } else {
        Result<ExprPtr> m = subscript(std::move(object), op.at);
        if (!m.ok()) return m;
        object = std::move(*m);
      }
    }
    return done(std::move(object));
  }
  Result<ExprPtr> subscript(ExprPtr object, size_t at) {
    std::vector<ExprPtr> parts;
    bool slice = false;
    while (!is_op("]")) {
      if (peek().kind == Tok::kEnd) return error_here("expected ']'");
      if (is_op(":")) {
        parts.push_back(nullptr);
        ++p_;
        slice = true;
      } else {
        Result<ExprPtr> e = expression();
        if (!e.ok()) return e;
        parts.push_back(std::move(*e));
        if (is_op(":")) {
          ++p_;
          slice = true;
        } else if (!is_op("]")) {
          return error_here("expected ':' or ']'");
        }
      }
    }
    ++p_;
    if (parts.empty()) return error(at, "an empty subscript '[]'");
    if (!slice) {
      auto m = make(Expr::Kind::kMember, at);
      m->computed = true;
      m->kids.push_back(std::move(object));
      m->kids.push_back(std::move(parts[0]));
      return done(std::move(m));
    }
    if (parts.size() > 3) return error(at, "a slice of over 3 parts");
    auto s = make(Expr::Kind::kSlice, at);
    s->kids.push_back(std::move(object));
    for (size_t k = 0; k < 3; ++k)
      s->kids.push_back(k < parts.size() ? std::move(parts[k]) : nullptr);
    return done(std::move(s));
  }
  // (args) into e->kids[1..], keyword names into e->keywords.
  Status arguments(Expr* e) {
    if (Status s = expect_op("("); !s.ok()) return s;
    bool keyword_seen = false;
    while (!is_op(")")) {
      if (peek().kind == Tok::kEnd) return error_here("expected ')'");
      if (is_op("*") || is_op("**"))
        return error(peek().at, "unsupported argument unpacking '" + peek().text + "'");
      std::string keyword;
      if (peek().kind == Tok::kName && is_op("=", 1)) {
        keyword = next().text;
        ++p_;
        keyword_seen = true;
      } else if (keyword_seen) {
        return error(peek().at, "a positional argument after a keyword argument");
      }
      Result<ExprPtr> a = expression();
      if (!a.ok()) return a.status();
      e->kids.push_back(std::move(*a));
      e->keywords.push_back(keyword);
      if (is_op(","))
        ++p_;
      else if (!is_op(")"))
        return error_here("expected ',' or ')'");
    }
    ++p_;
    return Status::Ok();
  }
  Result<ExprPtr> number_literal(const Token& t) {
    auto e = make(Expr::Kind::kLiteral, t.at);
    if (t.text.find('.') != std::string::npos) {
      e->literal = Value::number(std::strtod(t.text.c_str(), nullptr));
    } else {
      int64_t v = 0;
      const char* b = t.text.data() + (t.text[0] == '+' ? 1 : 0);
      const auto r = std::from_chars(b, t.text.data() + t.text.size(), v);
      if (r.ec != std::errc()) return error(t.at, "the integer " + t.text + " is too large");
      e->literal = Value::integer(v);
    }
    return done(std::move(e));
  }
  Result<ExprPtr> primary() {
    const Depth depth(depth_);
    if (depth.too_deep()) return error(peek().at, "expressions nested over 64 deep");
    const Token t = next();
    switch (t.kind) {
      case Tok::kNumber:
        return number_literal(t);
      case Tok::kString: {
        auto e = make(Expr::Kind::kLiteral, t.at);
        std::string s = t.text;
        while (peek().kind == Tok::kString) s += next().text;
        e->literal = Value::string(std::move(s));
        return done(std::move(e));
      }
      case Tok::kName: {
        auto e = make(Expr::Kind::kName, t.at);
        e->name = t.text;
        return done(std::move(e));
      }
      case Tok::kOp:
        if (t.text == "(") {
          Result<ExprPtr> e = sequence(false);
          if (!e.ok()) return e;
          if (Status s = expect_op(")"); !s.ok()) return s;
          return e;
        }
        if (t.text == "[") {
          auto e = make(Expr::Kind::kList, t.at);
          Status s = delimited("]", [&]() -> Status {
            Result<ExprPtr> item = expression();
            if (!item.ok()) return item.status();
            e->kids.push_back(std::move(*item));
            return Status::Ok();
          });
          if (!s.ok()) return s;
          return done(std::move(e));
        }
        if (t.text == "{") {
          auto e = make(Expr::Kind::kDict, t.at);
          Status s = delimited("}", [&]() -> Status {
            Result<ExprPtr> key = expression();
            if (!key.ok()) return key.status();
            if (Status colon = expect_op(":"); !colon.ok()) return colon;
            Result<ExprPtr> value = expression();
            if (!value.ok()) return value.status();
            e->kids.push_back(std::move(*key));
            e->kids.push_back(std::move(*value));
            return Status::Ok();
          });
          if (!s.ok()) return s;
          return done(std::move(e));
        }
        break;
      default:
        break;
    }
    --p_;
    return error_here("expected an expression");
  }

  // A call of a name is of a global function or of one of the template's macros; a call of
  // a.name is of a method kvrt has. Anything else is refused here, before any rendering.
  Status check_calls(const Body& body) const {
    for (const auto& n : body) {
      for (const Expr* e : {n->expr.get(), n->target.get(), n->filter.get()}) {
        if (Status s = check_calls(e); !s.ok()) return s;
      }
      for (const Param& p : n->params) {
        if (Status s = check_calls(p.default_value.get()); !s.ok()) return s;
      }
      if (Status s = check_calls(n->body); !s.ok()) return s;
      if (Status s = check_calls(n->otherwise); !s.ok()) return s;
    }
    return Status::Ok();
  }
  Status check_calls(const Expr* e) const {
    if (e == nullptr) return Status::Ok();
    if (e->kind == Expr::Kind::kCall) {
      const Expr& callee = *e->kids[0];
      if (callee.kind == Expr::Kind::kName && !one_of(kGlobals, callee.name) &&
          std::find(macros_.begin(), macros_.end(), callee.name) == macros_.end()) {
        return error(callee.at, "unsupported function '" + callee.name + "()'");
      }
      if (callee.kind == Expr::Kind::kMember && !callee.computed &&
          !one_of(kMethods, callee.name)) {
        return error(callee.at, "unsupported method '." + callee.name + "()'");
      }
    }
    for (const ExprPtr& k : e->kids) {
      if (Status s = check_calls(k.get()); !s.ok()) return s;
    }
    return Status::Ok();
  }

  std::string_view source_;
  std::vector<Token> t_;
  size_t p_ = 0;
  int depth_ = 0;
  int loops_ = 0;
  std::vector<std::string> macros_;
};

// ---- rendering -----------------------------------------------------------------------------

struct Env {
  Env* parent = nullptr;
  Dict vars;
  Value lookup(std::string_view name) const {
    for (const Env* e = this; e != nullptr; e = e->parent) {
      if (const Value* v = find(e->vars, name)) return *v;
    }
    return Value{};
  }
  void set(const std::string& name, Value v) {
    for (auto& [k, old] : vars) {
      if (k == name) {
        old = std::move(v);
        return;
      }
    }
    vars.emplace_back(name, std::move(v));
  }
};

struct Function {
  enum class Kind { kMacro, kNamespace, kRange, kRaise, kStrftime, kMethod };
  Kind kind;
  const Node* macro = nullptr;
  Env* env = nullptr;  // the macro's defining scope
  Value self;          // kMethod: the string or dict
  std::string method;
};

struct Args {
  std::vector<Value> positional;
  Dict keywords;
  const Value* get(size_t index, std::string_view keyword) const {
    if (index < positional.size()) return &positional[index];
    return find(keywords, keyword);
  }
};

enum class Flow { kNormal, kBreak, kContinue };

class Renderer {
 public:
  Renderer(const RenderOptions& options, uint64_t steps, uint64_t bytes)
      : options_(options), steps_left_(steps), bytes_left_(bytes) {}

  Env* new_env(Env* parent) {
    envs_.push_back(std::make_unique<Env>());
    envs_.back()->parent = parent;
    return envs_.back().get();
  }

  Status render(const Body& body, Env* env, std::string* out, Flow* flow) {
    for (const auto& n : body) {
      if (Status s = render(*n, env, out, flow); !s.ok()) return s;
      if (*flow != Flow::kNormal) return Status::Ok();
    }
    return Status::Ok();
  }

  Status step() {
    if (steps_left_ == 0) {
      return Status::InvalidArgument("the chat template takes too long to render (over " +
                                     std::to_string(steps_) + " steps)");
    }
    --steps_left_;
    return Status::Ok();
  }
  void set_step_budget(uint64_t steps) { steps_ = steps; }
  static Status too_deep() {
    return Status::InvalidArgument("the chat template evaluates over " +
                                   std::to_string(kMaxEvalDepth) +
                                   " expressions and statements inside one another");
  }

  // Charges `n` bytes made against the render's budget.
  Status made(uint64_t n) {
    if (n > bytes_left_) {
      return Status::InvalidArgument(
          "the chat template makes too much text or too long lists while rendering (over " +
          std::to_string(bytes_ >> 20) + " MiB)");
    }
    bytes_left_ -= n;
    return Status::Ok();
  }
  void set_byte_budget(uint64_t bytes) { bytes_ = bytes; }

  Result<Value> make_string(std::string s) {
    if (Status st = made(s.size()); !st.ok()) return st;
    return Value::string(std::move(s));
  }
  // Charges the per-character views of `s` that code_points() makes.
  Status chars(const std::string& s) { return made(count_code_points(s) * 2 * sizeof(Value)); }
  Result<Value> make_list(List l) {
    if (Status st = made(l.size() * sizeof(Value)); !st.ok()) return st;
    return Value::list(std::move(l));
  }

 private:
  Status render(const Node& n, Env* env, std::string* out, Flow* flow);
  Status assign(const Expr& target, const Value& v, Env* env);
  Result<Value> eval(const Expr& e, Env* env);
  Result<Value> eval_binary(const Expr& e, Env* env);
  Result<Value> eval_member(const Expr& e, Env* env);
  Result<Value> eval_slice(const Expr& e, Env* env);
  Result<Args> eval_args(const Expr& e, size_t first, Env* env);
  Result<Value> call(const Value& fn, Args args);
  Result<Value> call_macro(const Function& f, Args args);
  Result<Value> call_method(const Value& self, const std::string& name, const Args& args);
  Result<Value> apply_filter(const Expr& e, Value operand, Env* env);
  Result<bool> apply_test(const std::string& name, const Value& v);
  Result<Value> attribute(const Value& object, const Value& key);

  const RenderOptions& options_;
  uint64_t steps_left_, bytes_left_;
  uint64_t steps_ = 0, bytes_ = 0;
  int call_depth_ = 0;
  int eval_depth_ = 0;
  std::vector<std::unique_ptr<Env>> envs_;
  std::vector<std::unique_ptr<Namespace>> namespaces_;
};

Status Renderer::render(const Node& n, Env* env, std::string* out, Flow* flow) {
  if (Status s = step(); !s.ok()) return s;
  const Nesting nesting(eval_depth_, kMaxEvalDepth);
  if (nesting.too_deep()) return too_deep();
  switch (n.kind) {
    case Node::Kind::kText:
      if (Status s = made(n.text.size()); !s.ok()) return s;
      out->append(n.text);
      return Status::Ok();
    case Node::Kind::kOutput: {
      Result<Value> v = eval(*n.expr, env);
      if (!v.ok()) return v.status();
      Result<std::string> text = text_of(*v, bytes_left_);
      if (!text.ok()) return text.status();
      if (Status s = made(text->size()); !s.ok()) return s;
      out->append(*text);
      return Status::Ok();
    }
    case Node::Kind::kIf: {
      Result<Value> test = eval(*n.expr, env);
      if (!test.ok()) return test.status();
      return render(truthy(*test) ? n.body : n.otherwise, env, out, flow);
    }
    case Node::Kind::kSet: {
      Result<Value> v = eval(*n.expr, env);
      if (!v.ok()) return v.status();
      return assign(*n.target, *v, env);
    }
    case Node::Kind::kSetBlock: {
      std::string text;
      Flow inner = Flow::kNormal;
      if (Status s = render(n.body, env, &text, &inner); !s.ok()) return s;
      return assign(*n.target, Value::string(std::move(text)), env);
    }
    case Node::Kind::kMacro: {
      auto f = std::make_shared<Function>();
      f->kind = Function::Kind::kMacro;
      f->macro = &n;
      f->env = env;
      env->set(n.text, Value::function(std::move(f)));
      return Status::Ok();
    }
    case Node::Kind::kBreak:
      *flow = Flow::kBreak;
      return Status::Ok();
    case Node::Kind::kContinue:
      *flow = Flow::kContinue;
      return Status::Ok();
    case Node::Kind::kFor: {
      Env* scope = new_env(env);
      Result<Value> seq = eval(*n.expr, scope);
      if (!seq.ok()) return seq.status();
      List candidates;
      switch (seq->type) {
        case Value::Type::kList:
          candidates = seq->items();
          break;
        case Value::Type::kDict:
          for (const auto& [k, v] : seq->entries()) candidates.push_back(Value::string(k));
          break;
        case Value::Type::kString:
          if (Status s = chars(seq->str()); !s.ok()) return s;
          for (std::string_view c : code_points(seq->str()))
            candidates.push_back(Value::string(std::string(c)));
          break;
        case Value::Type::kUndefined:
          break;
        default:
          return Status::InvalidArgument(std::string("the chat template loops over a ") +
                                         type_name(*seq) + ", not a list, dict or string");
      }
      List items;
      for (const Value& item : candidates) {
        if (Status s = step(); !s.ok()) return s;
        if (n.target->kind == Expr::Kind::kTuple) {
          if (!item.is(Value::Type::kList)) {
            return Status::InvalidArgument(std::string("the chat template unpacks a ") +
                                           type_name(item) + " into loop variables");
          }
          if (item.items().size() != n.target->kids.size()) {
            return Status::InvalidArgument(
                std::string("too ") +
                (item.items().size() < n.target->kids.size() ? "few" : "many") +
                " items to unpack into the loop variables");
          }
        }
        if (n.filter) {
          Env* test_scope = new_env(scope);
          if (Status s = assign(*n.target, item, test_scope); !s.ok()) return s;
          Result<Value> keep = eval(*n.filter, test_scope);
          if (!keep.ok()) return keep.status();
          if (!truthy(*keep)) continue;
        }
        items.push_back(item);
      }
      bool iterated = false;
      for (size_t k = 0; k < items.size(); ++k) {
        const int64_t len = static_cast<int64_t>(items.size());
        const int64_t i = static_cast<int64_t>(k);
        Dict loop = {{"index", Value::integer(i + 1)},
                     {"index0", Value::integer(i)},
                     {"revindex", Value::integer(len - i)},
                     {"revindex0", Value::integer(len - i - 1)},
                     {"first", Value::boolean(k == 0)},
                     {"last", Value::boolean(i == len - 1)},
                     {"length", Value::integer(len)},
                     {"previtem", k > 0 ? items[k - 1] : Value{}},
                     {"nextitem", i < len - 1 ? items[k + 1] : Value{}}};
        scope->set("loop", Value::dict(std::move(loop)));
        if (Status s = assign(*n.target, items[k], scope); !s.ok()) return s;
        Flow inner = Flow::kNormal;
        if (Status s = render(n.body, scope, out, &inner); !s.ok()) return s;
        if (inner == Flow::kBreak) break;
        if (inner == Flow::kContinue) continue;
        iterated = true;
      }
      if (!iterated) {
        Flow inner = Flow::kNormal;
        return render(n.otherwise, scope, out, &inner);
      }
      return Status::Ok();
    }
  }
  return Status::Ok();
}

Status Renderer::assign(const Expr& target, const Value& v, Env* env) {
  if (target.kind == Expr::Kind::kName) {
    env->set(target.name, v);
    return Status::Ok();
  }
  if (target.kind == Expr::Kind::kTuple) {
    if (!v.is(Value::Type::kList)) {
      return Status::InvalidArgument(std::string("the chat template unpacks a ") + type_name(v) +
                                     " into names");
    }
    if (v.items().size() != target.kids.size()) {
      return Status::InvalidArgument(std::string("too ") +
                                     (v.items().size() < target.kids.size() ? "few" : "many") +
                                     " items to unpack");
    }
    for (size_t k = 0; k < target.kids.size(); ++k) env->set(target.kids[k]->name, v.items()[k]);
    return Status::Ok();
  }
  Result<Value> object = eval(*target.kids[0], env);
  if (!object.ok()) return object.status();
  if (!object->is(Value::Type::kNamespace)) {
    return Status::InvalidArgument("the chat template sets ." + target.name + " on a " +
                                   type_name(*object) + ", not a namespace");
  }
  Dict& entries = object->ns->entries;
  for (auto& [k, old] : entries) {
    if (k == target.name) {
      old = v;
      return Status::Ok();
    }
  }
  entries.emplace_back(target.name, v);
  return Status::Ok();
}

Result<Args> Renderer::eval_args(const Expr& e, size_t first, Env* env) {
  Args args;
  for (size_t k = first; k < e.kids.size(); ++k) {
    Result<Value> v = eval(*e.kids[k], env);
    if (!v.ok()) return v.status();
    const std::string& keyword = e.keywords[k - first];
    if (keyword.empty()) {
      args.positional.push_back(std::move(*v));
    } else {
      if (find(args.keywords, keyword) != nullptr) {
        return Status::InvalidArgument("the chat template passes the keyword argument '" + keyword +
                                       "' twice");
      }
      args.keywords.emplace_back(keyword, std::move(*v));
    }
  }
  return args;
}

Result<Value> Renderer::eval(const Expr& e, Env* env) {
  if (Status s = step(); !s.ok()) return s;
  const Nesting nesting(eval_depth_, kMaxEvalDepth);
  if (nesting.too_deep()) return too_deep();
  switch (e.kind) {
    case Expr::Kind::kLiteral:
      return e.literal;
    case Expr::Kind::kName:
      return env->lookup(e.name);
    case Expr::Kind::kMember:
      return eval_member(e, env);
    case Expr::Kind::kSlice:
      return eval_slice(e, env);
    case Expr::Kind::kBinary:
      return eval_binary(e, env);
    case Expr::Kind::kCall: {
      Result<Args> args = eval_args(e, 1, env);
      if (!args.ok()) return args.status();
      Result<Value> fn = eval(*e.kids[0], env);
      if (!fn.ok()) return fn;
      return call(*fn, std::move(*args));
    }
    case Expr::Kind::kFilter: {
      Result<Value> operand = eval(*e.kids[0], env);
      if (!operand.ok()) return operand;
      return apply_filter(e, std::move(*operand), env);
    }
    case Expr::Kind::kTest: {
      Result<Value> operand = eval(*e.kids[0], env);
      if (!operand.ok()) return operand;
      Result<bool> r = apply_test(e.name, *operand);
      if (!r.ok()) return r.status();
      return Value::boolean(*r != e.negated);
    }
    case Expr::Kind::kUnary: {
      Result<Value> v = eval(*e.kids[0], env);
      if (!v.ok()) return v;
      if (e.name == "not") return Value::boolean(!truthy(*v));
      const bool minus = e.name == "-";
      if (v->is(Value::Type::kFloat)) return Value::number(minus ? -v->f : v->f);
      if (v->is(Value::Type::kInt) || v->is(Value::Type::kBool)) {
        const int64_t x = v->is(Value::Type::kInt) ? v->i : v->b;
        if (minus && x == INT64_MIN)
          return Status::InvalidArgument("the chat template's integer overflows");
        return Value::integer(minus ? -x : x);
      }
      return Status::InvalidArgument("the chat template applies unary '" + e.name + "' to a " +
                                     type_name(*v));
    }
    case Expr::Kind::kTernary: {
      Result<Value> test = eval(*e.kids[0], env);
      if (!test.ok()) return test;
      return eval(*e.kids[truthy(*test) ? 1 : 2], env);
    }
    case Expr::Kind::kSelect: {
      Result<Value> test = eval(*e.kids[0], env);
      if (!test.ok()) return test;
      if (!truthy(*test)) return Value{};
      return eval(*e.kids[1], env);
    }
    case Expr::Kind::kList:
    case Expr::Kind::kTuple: {
      List items;
      for (const ExprPtr& k : e.kids) {
        Result<Value> v = eval(*k, env);
        if (!v.ok()) return v;
        items.push_back(std::move(*v));
      }
      return make_list(std::move(items));
    }
    case Expr::Kind::kDict: {
      Dict entries;
      for (size_t k = 0; k + 1 < e.kids.size(); k += 2) {
        Result<Value> key = eval(*e.kids[k], env);
        if (!key.ok()) return key;
        if (!key->is(Value::Type::kString)) {
          return Status::InvalidArgument(std::string("the chat template's dict has a ") +
                                         type_name(*key) + " key, not a string");
        }
        Result<Value> v = eval(*e.kids[k + 1], env);
        if (!v.ok()) return v;
        bool replaced = false;
        for (auto& [name, old] : entries) {
          if (name == key->str()) {
            old = *v;
            replaced = true;
          }
        }
        if (!replaced) entries.emplace_back(key->str(), std::move(*v));
      }
      if (Status s = made(entries.size() * sizeof(Value)); !s.ok()) return s;
      return Value::dict(std::move(entries));
    }
  }
  return Value{};
}

Result<Value> Renderer::eval_binary(const Expr& e, Env* env) {
  const std::string& op = e.name;
  Result<Value> lr = eval(*e.kids[0], env);
  if (!lr.ok()) return lr;
  if (op == "and") return truthy(*lr) ? eval(*e.kids[1], env) : lr;
  if (op == "or") return truthy(*lr) ? lr : eval(*e.kids[1], env);
  Result<Value> rr = eval(*e.kids[1], env);
  if (!rr.ok()) return rr;
  const Value& l = *lr;
  const Value& r = *rr;
  if (op == "==") return Value::boolean(loose_equal(l, r));
  if (op == "!=") return Value::boolean(!loose_equal(l, r));
  auto unsupported = [&]() {
    return Status::InvalidArgument(std::string("the chat template applies '") + op + "' to a " +
                                   type_name(l) + " and a " + type_name(r));
  };
  if (l.is_number() && r.is_number() && op != "~" && op != "**") {
    const bool is_float = l.is(Value::Type::kFloat) || r.is(Value::Type::kFloat);
    const double a = l.as_double(), b = r.as_double();
    if (op == "<") return Value::boolean(a < b);
    if (op == ">") return Value::boolean(a > b);
    if (op == "<=") return Value::boolean(a <= b);
    if (op == ">=") return Value::boolean(a >= b);
    if ((op == "/" || op == "//" || op == "%") && b == 0) {
      return Status::InvalidArgument("the chat template divides by zero");
    }
    if (op == "/") return Value::number(a / b);
    if (is_float) {
      if (op == "+") return Value::number(a + b);
      if (op == "-") return Value::number(a - b);
      if (op == "*") return Value::number(a * b);
      if (op == "//") return Value::number(std::floor(a / b));
      if (op == "%") return Value::number(std::fmod(a, b));
    } else {
      int64_t out = 0;
      bool overflow = false;
      if (op == "+") overflow = __builtin_add_overflow(l.i, r.i, &out);
      if (op == "-") overflow = __builtin_sub_overflow(l.i, r.i, &out);
      if (op == "*") overflow = __builtin_mul_overflow(l.i, r.i, &out);
      if (op == "//" || op == "%") {
        if (l.i == INT64_MIN && r.i == -1)
          overflow = true;
        else if (op == "%")
          out = l.i % r.i;  // JavaScript's remainder: the sign of the dividend
        else
          out = l.i / r.i - ((l.i % r.i != 0 && (l.i < 0) != (r.i < 0)) ? 1 : 0);
      }
      if (overflow) return Status::InvalidArgument("the chat template's integer overflows");
      if (op == "+" || op == "-" || op == "*" || op == "//" || op == "%")
        return Value::integer(out);
    }
    return unsupported();
  }
  if (l.is(Value::Type::kUndefined) || r.is(Value::Type::kUndefined)) {
    if (r.is(Value::Type::kUndefined) && (op == "in" || op == "not in")) {
      return Value::boolean(op == "not in");
    }
    if (op == "~" && !l.is(Value::Type::kNone) && !r.is(Value::Type::kNone)) {
      Result<std::string> a =
          l.is(Value::Type::kUndefined) ? std::string() : primitive_text(l, "~");
      if (!a.ok()) return a.status();
      Result<std::string> b =
          r.is(Value::Type::kUndefined) ? std::string() : primitive_text(r, "~");
      if (!b.ok()) return b.status();
      return make_string(*a + *b);
    }
    return Status::InvalidArgument("the chat template applies '" + op +
                                   "' to an undefined value (a missing variable or key)");
  }
  if (l.is(Value::Type::kNone) || r.is(Value::Type::kNone)) {
    return Status::InvalidArgument("the chat template applies '" + op + "' to none");
  }
  if (op == "~") {
    Result<std::string> a = primitive_text(l, "~");
    if (!a.ok()) return a.status();
    Result<std::string> b = primitive_text(r, "~");
    if (!b.ok()) return b.status();
    return make_string(*a + *b);
  }
  if (op == "**") {
    const auto numeric = [](const Value& v) { return v.is_number() || v.is(Value::Type::kBool); };
    if (!numeric(l) || !numeric(r)) return unsupported();
    const double a = l.as_double(), b = r.as_double();
    if (a == 0 && b < 0)
      return Status::InvalidArgument("the chat template raises 0 to a negative power");
    const double p = std::pow(a, b);
    if (!std::isfinite(p))
      return Status::InvalidArgument("the chat template's power is not a finite number");
    if (l.is(Value::Type::kFloat) || r.is(Value::Type::kFloat) || b < 0) return Value::number(p);
    if (std::fabs(p) >= 9.2e18)
      return Status::InvalidArgument("the chat template's integer overflows");
    return Value::integer(static_cast<int64_t>(p));
  }
  if (l.is(Value::Type::kList) && r.is(Value::Type::kList)) {
    if (op != "+") return unsupported();
    List joined = l.items();
    joined.insert(joined.end(), r.items().begin(), r.items().end());
    return make_list(std::move(joined));
  }
  if (r.is(Value::Type::kList) && (op == "in" || op == "not in")) {
    bool found = false;
    for (const Value& x : r.items()) found = found || strict_equal(x, l);
    return Value::boolean(found == (op == "in"));
  }
  if ((l.is(Value::Type::kString) || r.is(Value::Type::kString)) && op == "+") {
    Result<std::string> a = primitive_text(l, "+");
    if (!a.ok()) return a.status();
    Result<std::string> b = primitive_text(r, "+");
    if (!b.ok()) return b.status();
    return make_string(*a + *b);
  }
  if (l.is(Value::Type::kString) && r.is(Value::Type::kString)) {
    if (op == "in") return Value::boolean(r.str().find(l.str()) != std::string::npos);
    if (op == "not in") return Value::boolean(r.str().find(l.str()) == std::string::npos);
    if (op == "<") return Value::boolean(l.str() < r.str());
    if (op == ">") return Value::boolean(l.str() > r.str());
    if (op == "<=") return Value::boolean(l.str() <= r.str());
    if (op == ">=") return Value::boolean(l.str() >= r.str());
  }
  if (l.is(Value::Type::kString) && r.is(Value::Type::kDict) && (op == "in" || op == "not in")) {
    return Value::boolean((find(r.entries(), l.str()) != nullptr) == (op == "in"));
  }
  return unsupported();
}

// The methods of strings and dicts (a.name): a function bound to the value, or undefined.
Value method_of(const Value& self, const std::string& name) {
  static const char* const kStringMethods[] = {"strip",      "lstrip",   "rstrip",    "split",
                                               "startswith", "endswith", "replace",   "upper",
                                               "lower",      "title",    "capitalize"};
  static const char* const kDictMethods[] = {"get", "items", "keys", "values", "dictsort"};
  const bool ok = (self.is(Value::Type::kString) && one_of(kStringMethods, name)) ||
                  (self.is(Value::Type::kDict) && one_of(kDictMethods, name));
  if (!ok) return Value{};
  auto f = std::make_shared<Function>();
  f->kind = Function::Kind::kMethod;
  f->self = self;
  f->method = name;
  return Value::function(std::move(f));
}

Result<Value> Renderer::attribute(const Value& object, const Value& key) {
  switch (object.type) {
    case Value::Type::kDict:
    case Value::Type::kNamespace: {
      if (!key.is(Value::Type::kString)) {
        return Status::InvalidArgument(std::string("the chat template looks up a ") +
                                       type_name(key) + " key in a " + type_name(object));
      }
      const Dict& d = object.is(Value::Type::kDict) ? object.entries() : object.ns->entries;
      if (const Value* v = find(d, key.str())) return *v;
      return method_of(object, key.str());
    }
    case Value::Type::kList:
    case Value::Type::kString: {
      if (key.is(Value::Type::kInt)) {
        if (object.is(Value::Type::kList)) {
          const int64_t n = static_cast<int64_t>(object.items().size());
          const int64_t at = key.i < 0 ? n + key.i : key.i;
          if (at < 0 || at >= n) return Value{};
          return object.items()[static_cast<size_t>(at)];
        }
        if (Status s = chars(object.str()); !s.ok()) return s;
        const std::vector<std::string_view> chars = code_points(object.str());
        const int64_t n = static_cast<int64_t>(chars.size());
        const int64_t at = key.i < 0 ? n + key.i : key.i;
        if (at < 0 || at >= n) return Value{};
        return Value::string(std::string(chars[static_cast<size_t>(at)]));
      }
      if (key.is(Value::Type::kString)) {
        if (key.str() == "length") {
          return Value::integer(static_cast<int64_t>(object.is(Value::Type::kList)
                                                         ? object.items().size()
                                                         : count_code_points(object.str())));
        }
        return method_of(object, key.str());
      }
      return Status::InvalidArgument(std::string("the chat template indexes a ") +
                                     type_name(object) + " with a " + type_name(key));
    }
    default:
      if (!key.is(Value::Type::kString)) {
        return Status::InvalidArgument(std::string("the chat template indexes a ") +
                                       type_name(object) + " with a " + type_name(key));
      }
      return Value{};
  }
}

Result<Value> Renderer::eval_member(const Expr& e, Env* env) {
  Result<Value> object = eval(*e.kids[0], env);
  if (!object.ok()) return object;
  if (!e.computed) return attribute(*object, Value::string(e.name));
  Result<Value> key = eval(*e.kids[1], env);
  if (!key.ok()) return key;
  return attribute(*object, *key);
}

// Python's slice bounds, as the reference's slice() computes them.
template <typename T>
std::vector<T> slice_of(const std::vector<T>& a, const Value& start, const Value& stop,
                        int64_t step) {
  const int64_t n = static_cast<int64_t>(a.size());
  auto given = [](const Value& v) { return v.is(Value::Type::kInt); };
  int64_t b = 0, e = 0;
  if (step > 0) {
    b = !given(start) ? 0 : start.i < 0 ? std::max<int64_t>(n + start.i, 0) : std::min(start.i, n);
    e = !given(stop) ? n : stop.i < 0 ? std::max<int64_t>(n + stop.i, 0) : std::min(stop.i, n);
  } else {
    b = !given(start) ? n - 1
        : start.i < 0 ? std::max<int64_t>(n + start.i, -1)
                      : std::min(start.i, n - 1);
    e = !given(stop)  ? -1
        : stop.i < -1 ? std::max<int64_t>(n + stop.i, -1)
                      : std::min(stop.i, n - 1);
  }
  std::vector<T> out;
  for (int64_t i = b; step > 0 ? i < e : i > e;) {
    out.push_back(a[static_cast<size_t>(i)]);
    if (__builtin_add_overflow(i, step, &i)) break;
  }
  return out;
}

Result<Value> Renderer::eval_slice(const Expr& e, Env* env) {
  Result<Value> object = eval(*e.kids[0], env);
  if (!object.ok()) return object;
  Value bounds[3];
  for (int k = 0; k < 3; ++k) {
    if (!e.kids[k + 1]) continue;
    Result<Value> v = eval(*e.kids[k + 1], env);
    if (!v.ok()) return v;
    if (!v->is(Value::Type::kInt) && !v->is_nullish()) {
      return Status::InvalidArgument(std::string("the chat template slices with a ") +
                                     type_name(*v));
    }
    bounds[k] = *v;
  }
  const int64_t step = bounds[2].is(Value::Type::kInt) ? bounds[2].i : 1;
  if (step == 0) return Status::InvalidArgument("the chat template slices with step 0");
  if (object->is(Value::Type::kList))
    return make_list(slice_of(object->items(), bounds[0], bounds[1], step));
  if (object->is(Value::Type::kString)) {
    if (Status s = chars(object->str()); !s.ok()) return s;
    std::string out;
    for (std::string_view c : slice_of(code_points(object->str()), bounds[0], bounds[1], step))
      out += c;
    return make_string(std::move(out));
  }
  return Status::InvalidArgument(std::string("the chat template slices a ") + type_name(*object));
}

std::string strftime_like_reference(const std::string& format, int64_t now) {
  static const char* const kMonths[] = {"January",   "February", "March",    "April",
                                        "May",       "June",     "July",     "August",
                                        "September", "October",  "November", "December"};
  std::time_t t = now >= 0 ? static_cast<std::time_t>(now) : std::time(nullptr);
  std::tm tm{};
  gmtime_r(&t, &tm);
  auto pad2 = [](int v) { return (v < 10 ? "0" : "") + std::to_string(v); };
  std::string out;
  for (size_t i = 0; i < format.size(); ++i) {
    if (format[i] != '%' || i + 1 >= format.size()) {
      out += format[i];
      continue;
    }
    const char c = format[++i];
    switch (c) {
      case 'Y':
        out += std::to_string(tm.tm_year + 1900);
        break;
      case 'm':
        out += pad2(tm.tm_mon + 1);
        break;
      case 'd':
        out += pad2(tm.tm_mday);
        break;
      case 'b':
        out += std::string(kMonths[tm.tm_mon]).substr(0, 3);
        break;
      case 'B':
        out += kMonths[tm.tm_mon];
        break;
      case 'H':
        out += pad2(tm.tm_hour);
        break;
      case 'M':
        out += pad2(tm.tm_min);
        break;
      case '%':
        out += '%';
        break;
      default:
        out += '%';
        out += c;
    }
  }
  return out;
}

Result<Value> Renderer::call(const Value& fn, Args args) {
  if (!fn.is(Value::Type::kFunction)) {
    return Status::InvalidArgument(std::string("the chat template calls a ") + type_name(fn) +
                                   ", not a function");
  }
  const Function& f = fn.fn();
  switch (f.kind) {
    case Function::Kind::kMacro:
      return call_macro(f, std::move(args));
    case Function::Kind::kMethod:
      return call_method(f.self, f.method, args);
    case Function::Kind::kRaise: {
      std::string why;
      if (!args.positional.empty()) {
        Result<std::string> text = text_of(args.positional[0]);
        if (!text.ok()) return text.status();
        why = *text;
      }
      return Status::InvalidArgument("the model's chat template refuses this conversation: " + why);
    }
    case Function::Kind::kStrftime: {
      if (args.positional.empty() || !args.positional[0].is(Value::Type::kString)) {
        return Status::InvalidArgument("strftime_now() takes a format string");
      }
      return make_string(
          strftime_like_reference(args.positional[0].str(), options_.now_unix_seconds));
    }
    case Function::Kind::kRange: {
      std::vector<int64_t> a;
      for (const Value& v : args.positional) {
        if (!v.is(Value::Type::kInt)) return Status::InvalidArgument("range() takes integers");
        a.push_back(v.i);
      }
      if (a.empty() || a.size() > 3)
        return Status::InvalidArgument("range() takes 1 to 3 integers");
      const int64_t start = a.size() == 1 ? 0 : a[0];
      const int64_t stop = a.size() == 1 ? a[0] : a[1];
      const int64_t step = a.size() == 3 ? a[2] : 1;
      if (step == 0) return Status::InvalidArgument("range() step must not be zero");
      const double count = std::ceil((static_cast<double>(stop) - static_cast<double>(start)) /
                                     static_cast<double>(step));
      if (count > static_cast<double>(kMaxRange)) {
        return Status::InvalidArgument("range() of over " + std::to_string(kMaxRange) + " numbers");
      }
      List items;
      for (int64_t i = start; step > 0 ? i < stop : i > stop;
           i = __builtin_add_overflow(i, step, &i) ? stop : i)
        items.push_back(Value::integer(i));
      return make_list(std::move(items));
    }
    case Function::Kind::kNamespace: {
      namespaces_.push_back(std::make_unique<Namespace>());
      Namespace* ns = namespaces_.back().get();
      if (args.positional.size() > 1)
        return Status::InvalidArgument("namespace() takes at most 1 positional argument");
      auto put = [ns](const std::string& k, const Value& v) {
        for (auto& [name, old] : ns->entries) {
          if (name == k) {
            old = v;
            return;
          }
        }
        ns->entries.emplace_back(k, v);
      };
      if (!args.positional.empty()) {
        const Value& from = args.positional[0];
        if (from.is(Value::Type::kDict)) {
          for (const auto& [k, v] : from.entries()) put(k, v);
        } else if (from.is(Value::Type::kList)) {
          for (const Value& pair : from.items()) {
            if (!pair.is(Value::Type::kList) || pair.items().size() != 2 ||
                !pair.items()[0].is(Value::Type::kString)) {
              return Status::InvalidArgument("namespace() takes [key, value] pairs");
            }
            put(pair.items()[0].str(), pair.items()[1]);
          }
        } else {
          return Status::InvalidArgument(std::string("namespace() of a ") + type_name(from));
        }
      }
      for (const auto& [k, v] : args.keywords) put(k, v);
      if (Status s = made((ns->entries.size() + 1) * sizeof(Value)); !s.ok()) return s;
      return Value::namespace_of(ns);
    }
  }
  return Value{};
}

Result<Value> Renderer::call_macro(const Function& f, Args args) {
  const Node& m = *f.macro;
  if (call_depth_ >= kMaxCallDepth) {
    return Status::InvalidArgument("the chat template's macro '" + m.text + "' calls macros over " +
                                   std::to_string(kMaxCallDepth) + " deep");
  }
  Env* scope = new_env(f.env);
  std::vector<const Param*> pending;
  for (size_t k = 0; k < m.params.size(); ++k) {
    const Param& p = m.params[k];
    Value v;
    bool given = false;
    if (k < args.positional.size()) {
      v = args.positional[k];
      given = true;
    } else {
      for (auto it = args.keywords.begin(); it != args.keywords.end(); ++it) {
        if (it->first == p.name) {
          v = it->second;
          args.keywords.erase(it);
          given = true;
          break;
        }
      }
    }
    if (!given && p.default_value) pending.push_back(&p);
    scope->set(p.name, v);
  }
  if (m.uses_kwargs) {
    scope->set("kwargs", Value::dict(args.keywords));
  } else if (!args.keywords.empty()) {
    return Status::InvalidArgument("the chat template's macro '" + m.text +
                                   "' takes no keyword argument '" + args.keywords[0].first + "'");
  }
  if (m.uses_varargs) {
    List rest;
    for (size_t k = m.params.size(); k < args.positional.size(); ++k)
      rest.push_back(args.positional[k]);
    scope->set("varargs", Value::list(std::move(rest)));
  } else if (args.positional.size() > m.params.size()) {
    return Status::InvalidArgument("the chat template's macro '" + m.text + "' takes at most " +
                                   std::to_string(m.params.size()) + " arguments");
  }
  ++call_depth_;
  for (const Param* p : pending) {
    Result<Value> v = eval(*p->default_value, scope);
    if (!v.ok()) {
      --call_depth_;
      return v;
    }
    scope->set(p->name, *v);
  }
  std::string out;
  Flow flow = Flow::kNormal;
  Status s = render(m.body, scope, &out, &flow);
  --call_depth_;
  if (!s.ok()) return s;
  return Value::string(std::move(out));
}

// Python's str.split(sep=None, maxsplit=-1), as the reference implements it.
List split_string(const std::string& s, const Value* sep, int64_t maxsplit) {
  List out;
  if (sep == nullptr || sep->is_nullish()) {
    const std::string text = js_trim(s, true, false);
    size_t i = 0;
    while (i < text.size()) {
      size_t b = i;
      auto space_at = [&text](size_t k, size_t* len) {
        return is_js_space(decode_utf8(text, k, len));
      };
      size_t len = 0;
      while (b < text.size() && space_at(b, &len)) b += len;
      if (b >= text.size()) break;
      size_t e = b;
      while (e < text.size() && !space_at(e, &len)) e += len;
      if (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit) {
        out.push_back(Value::string(text.substr(b)));
        break;
      }
      out.push_back(Value::string(text.substr(b, e - b)));
      i = e;
    }
    return out;
  }
  const std::string& d = sep->str();
  size_t from = 0;
  while (true) {
    const size_t at = s.find(d, from);
    if (at == std::string::npos ||
        (maxsplit >= 0 && static_cast<int64_t>(out.size()) >= maxsplit)) {
      out.push_back(Value::string(s.substr(from)));
      return out;
    }
    out.push_back(Value::string(s.substr(from, at - from)));
    from = at + d.size();
  }
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to,
                        int64_t count) {
  if (count == 0) return s;
  std::string out;
  int64_t left = count < 0 ? INT64_MAX : count;
  if (from.empty()) {  // between every code point, as Python and the reference do
    for (size_t i = 0; i < s.size();) {
      size_t len = 0;
      decode_utf8(s, i, &len);
      if (left > 0) {
        out += to;
        --left;
      }
      out.append(s, i, len);
      i += len;
    }
    if (left > 0) out += to;
    return out;
  }
  size_t at = 0;
  while (left > 0) {
    const size_t found = s.find(from, at);
    if (found == std::string::npos) break;
    out.append(s, at, found - at);
    out += to;
    at = found + from.size();
    --left;
  }
  out.append(s, at, std::string::npos);
  return out;
}

// Python's str.strip(chars): a string of characters, or whitespace when none.
Result<std::string> strip_string(const std::string& s, const Value* chars, bool left, bool right) {
  if (chars == nullptr || chars->is_nullish()) return js_trim(s, left, right);
  if (!chars->is(Value::Type::kString)) {
    return Status::InvalidArgument(std::string("strip() takes a string of characters, not a ") +
                                   type_name(*chars));
  }
  std::vector<uint32_t> set;
  for (size_t i = 0; i < chars->str().size();) {
    size_t len = 0;
    set.push_back(decode_utf8(chars->str(), i, &len));
    i += len;
  }
  return strip_if(s, left, right,
                  [&set](uint32_t c) { return std::find(set.begin(), set.end(), c) != set.end(); });
}

Result<Value> Renderer::call_method(const Value& self, const std::string& name, const Args& args) {
  if (self.is(Value::Type::kString)) {
    const std::string& s = self.str();
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      Result<std::string> r =
          strip_string(s, args.get(0, "chars"), name != "rstrip", name != "lstrip");
      if (!r.ok()) return r.status();
      return make_string(std::move(*r));
    }
    if (name == "upper") return make_string(to_upper(s));
    if (name == "lower") return make_string(to_lower(s));
    if (name == "title") return make_string(title_case(s));
    if (name == "capitalize") {
      std::string r = s;
      if (!r.empty()) r[0] = ascii_upper(r[0]);
      return make_string(std::move(r));
    }
    if (name == "startswith" || name == "endswith") {
      const Value* pattern = args.get(0, "prefix");
      if (pattern == nullptr)
        return Status::InvalidArgument(name + "() takes a string or a list of strings");
      auto matches = [&](const std::string& x) {
        return x.size() <= s.size() &&
               (name == "startswith" ? s.compare(0, x.size(), x) == 0
                                     : s.compare(s.size() - x.size(), x.size(), x) == 0);
      };
      if (pattern->is(Value::Type::kString)) return Value::boolean(matches(pattern->str()));
      if (pattern->is(Value::Type::kList)) {
        for (const Value& p : pattern->items()) {
          if (!p.is(Value::Type::kString))
            return Status::InvalidArgument(name + "() takes strings");
          if (matches(p.str())) return Value::boolean(true);
        }
        return Value::boolean(false);
      }
      return Status::InvalidArgument(name + "() takes a string or a list of strings, not a " +
                                     type_name(*pattern));
    }
    if (name == "split") {
      const Value* sep = args.get(0, "sep");
      if (sep != nullptr && !sep->is_nullish() && !sep->is(Value::Type::kString)) {
        return Status::InvalidArgument("split() takes a string separator");
      }
      if (sep != nullptr && sep->is(Value::Type::kString) && sep->str().empty()) {
        return Status::InvalidArgument("split() with an empty separator");
      }
      const Value* max = args.get(1, "maxsplit");
      if (max != nullptr && !max->is(Value::Type::kInt))
        return Status::InvalidArgument("split()'s maxsplit is an integer");
      List parts = split_string(s, sep, max ? max->i : -1);
      if (Status st = made(s.size() + parts.size() * sizeof(Value)); !st.ok()) return st;
      return Value::list(std::move(parts));
    }
    if (name == "replace") {
      const Value* from = args.get(0, "old");
      const Value* to = args.get(1, "new");
      if (from == nullptr || to == nullptr || !from->is(Value::Type::kString) ||
          !to->is(Value::Type::kString)) {
        return Status::InvalidArgument("replace() takes two strings");
      }
      const Value* count = args.get(2, "count");
      if (count != nullptr && !count->is(Value::Type::kInt) && !count->is_nullish()) {
        return Status::InvalidArgument("replace()'s count is an integer");
      }
      const int64_t n = count != nullptr && count->is(Value::Type::kInt) ? count->i : -1;
      // Bounded before it is made: every replacement may add to.size() bytes.
      const uint64_t most =
          s.size() +
          (from->str().empty() ? s.size() + 1 : s.size() / from->str().size()) * to->str().size();
      if (Status st = made(most); !st.ok()) return st;
      return Value::string(replace_all(s, from->str(), to->str(), n));
    }
  }
  if (self.is(Value::Type::kDict)) {
    const Dict& d = self.entries();
    if (name == "get") {
      if (args.positional.empty() || !args.positional[0].is(Value::Type::kString)) {
        return Status::InvalidArgument("get() takes a string key");
      }
      if (const Value* v = find(d, args.positional[0].str())) return *v;
      return args.positional.size() > 1 ? args.positional[1] : Value::none();
    }
    List out;
    for (const auto& [k, v] : d) {
      if (name == "items") out.push_back(Value::list({Value::string(k), v}));
      if (name == "keys") out.push_back(Value::string(k));
      if (name == "values") out.push_back(v);
    }
    if (name == "dictsort") {
      for (const auto& [k, v] : d) out.push_back(Value::list({Value::string(k), v}));
      std::stable_sort(out.begin(), out.end(), [](const Value& a, const Value& b) {
        return to_lower(a.items()[0].str()) < to_lower(b.items()[0].str());
      });
    }
    return make_list(std::move(out));
  }
  return Status::InvalidArgument("the chat template calls ." + name + "() on a " + type_name(self));
}

Result<bool> Renderer::apply_test(const std::string& name, const Value& v) {
  using T = Value::Type;
  if (name == "defined") return !v.is(T::kUndefined);
  if (name == "undefined") return v.is(T::kUndefined);
  if (name == "none") return v.is(T::kNone);
  if (name == "string") return v.is(T::kString);
  if (name == "number") return v.is_number();
  if (name == "integer") return v.is(T::kInt);
  if (name == "boolean") return v.is(T::kBool);
  if (name == "mapping") return v.is(T::kDict);
  if (name == "sequence") return v.is(T::kList) || v.is(T::kDict) || v.is(T::kString);
  if (name == "iterable") return v.is(T::kList) || v.is(T::kString);
  if (name == "callable") return v.is(T::kFunction);
  if (name == "true") return v.is(T::kBool) && v.b;
  if (name == "false") return v.is(T::kBool) && !v.b;
  if (name == "odd" || name == "even") {
    if (!v.is(T::kInt))
      return Status::InvalidArgument("the chat template tests a " + std::string(type_name(v)) +
                                     " for '" + name + "'");
    return (v.i % 2 != 0) == (name == "odd");
  }
  if (name == "lower") return v.is(T::kString) && to_lower(v.str()) == v.str();
  if (name == "upper") return v.is(T::kString) && to_upper(v.str()) == v.str();
  return Status::InvalidArgument("unsupported test '" + name + "'");
}

// Sort order of the reference's sort and dictsort: numbers with numbers, strings with strings.
Result<int> compare_values(const Value& a, const Value& b, bool case_sensitive) {
  if (a.is_nullish() && b.is_nullish() && a.type == b.type) return 0;
  const auto numeric = [](const Value& v) { return v.is_number() || v.is(Value::Type::kBool); };
  if (numeric(a) && numeric(b)) {
    return a.as_double() < b.as_double() ? -1 : a.as_double() > b.as_double() ? 1 : 0;
  }
  if (a.is(Value::Type::kString) && b.is(Value::Type::kString)) {
    const std::string x = case_sensitive ? a.str() : to_lower(a.str());
    const std::string y = case_sensitive ? b.str() : to_lower(b.str());
    return x < y ? -1 : x > y ? 1 : 0;
  }
  return Status::InvalidArgument(std::string("the chat template sorts a ") + type_name(a) +
                                 " with a " + type_name(b));
}

Result<Value> Renderer::apply_filter(const Expr& e, Value v, Env* env) {
  using T = Value::Type;
  const std::string& name = e.name;
  Result<Args> args_or = eval_args(e, 1, env);
  if (!args_or.ok()) return args_or.status();
  const Args& args = *args_or;
  auto wrong = [&]() {
    return Status::InvalidArgument("the chat template applies the filter '" + name + "' to a " +
                                   type_name(v));
  };
  if (name == "safe") return v;
  if (name == "default" || name == "d") {
    const Value* fallback = args.get(0, "default_value");
    const Value* boolean = args.get(1, "boolean");
    const bool on_falsy = boolean != nullptr && truthy(*boolean);
    if (v.is(T::kUndefined) || (on_falsy && !truthy(v))) {
      return fallback != nullptr ? *fallback : Value::string("");
    }
    return v;
  }
  if (name == "tojson") {
    JsonOptions o;
    if (const Value* indent = args.get(99, "indent"); indent != nullptr && !indent->is_nullish()) {
      if (!indent->is(T::kInt) || indent->i < 0 || indent->i > 64) {
        return Status::InvalidArgument("tojson's indent is an integer from 0 to 64");
      }
      o.indent = static_cast<int>(indent->i);
    }
    if (const Value* a = args.get(99, "ensure_ascii")) o.ensure_ascii = truthy(*a);
    if (const Value* a = args.get(99, "sort_keys")) o.sort_keys = truthy(*a);
    if (const Value* sep = args.get(99, "separators"); sep != nullptr && !sep->is_nullish()) {
      if (!sep->is(T::kList) || sep->items().size() != 2 || !sep->items()[0].is(T::kString) ||
          !sep->items()[1].is(T::kString)) {
        return Status::InvalidArgument("tojson's separators are two strings");
      }
      o.has_separators = true;
      o.item_separator = sep->items()[0].str();
      o.key_separator = sep->items()[1].str();
    }
    std::string out;
    o.max_bytes = bytes_left_;
    if (Status s = to_json(v, o, 0, &out); !s.ok()) return s;
    return make_string(std::move(out));
  }
  if (name == "length" || name == "count") {
    if (v.is(T::kList)) return Value::integer(static_cast<int64_t>(v.items().size()));
    if (v.is(T::kString)) return Value::integer(static_cast<int64_t>(count_code_points(v.str())));
    if (v.is(T::kDict)) return Value::integer(static_cast<int64_t>(v.entries().size()));
    if (v.is(T::kUndefined)) return Value::integer(0);
    return wrong();
  }
  if (name == "string") {
    if (v.is(T::kString)) return v;
    Result<std::string> text =
        v.is(T::kFloat) ? Result<std::string>(js_number(v.f)) : text_of(v, bytes_left_);
    if (!text.ok()) return text.status();
    return make_string(std::move(*text));
  }
  if (v.is(T::kList)) {
    const List& items = v.items();
    if (name == "list") return v;
    if (name == "first") return items.empty() ? Value{} : items.front();
    if (name == "last") return items.empty() ? Value{} : items.back();
    if (name == "reverse") return make_list(List(items.rbegin(), items.rend()));
    if (name == "join") {
      const Value* sep = args.get(0, "d");
      if (sep != nullptr && !sep->is(T::kString))
        return Status::InvalidArgument("join's separator is a string");
      std::string out;
      for (size_t k = 0; k < items.size(); ++k) {
        if (k > 0 && sep != nullptr) out += sep->str();
        if (items[k].is(T::kFloat)) {
          out += js_number(items[k].f);
          continue;
        }
        Result<std::string> text = text_of(items[k], bytes_left_);
        if (out.size() > bytes_left_) return made(out.size());
        if (!text.ok()) return text.status();
        out += *text;
      }
      return make_string(std::move(out));
    }
    if (name == "unique") {
      List out;
      for (const Value& x : items) {
        bool seen = false;
        for (const Value& y : out) seen = seen || strict_equal(x, y);
        if (!seen) out.push_back(x);
      }
      return make_list(std::move(out));
    }
    if (name == "sort") {
      const Value* reverse = args.get(0, "reverse");
      const Value* case_sensitive = args.get(1, "case_sensitive");
      const Value* attr = args.get(2, "attribute");
      List sorted = items;
      Status failed = Status::Ok();
      auto key = [&](const Value& x) -> Value {
        if (attr == nullptr || attr->is_nullish()) return x;
        Result<Value> a =
            attribute(x, attr->is(T::kInt) ? Value::string(std::to_string(attr->i)) : *attr);
        return a.ok() ? *a : Value{};
      };
      std::stable_sort(sorted.begin(), sorted.end(), [&](const Value& a, const Value& b) {
        Result<int> c =
            compare_values(key(a), key(b), case_sensitive != nullptr && truthy(*case_sensitive));
        if (!c.ok()) {
          failed = c.status();
          return false;
        }
        return reverse != nullptr && truthy(*reverse) ? *c > 0 : *c < 0;
      });
      if (!failed.ok()) return failed;
      return make_list(std::move(sorted));
    }
    if (name == "select" || name == "reject" || name == "selectattr" || name == "rejectattr") {
      const bool keep = name == "select" || name == "selectattr";
      const bool by_attribute = name.size() > 6 && name.compare(name.size() - 4, 4, "attr") == 0;
      if (by_attribute && (args.positional.empty() || !args.positional[0].is(T::kString))) {
        return Status::InvalidArgument(name + " takes an attribute's name");
      }
      const size_t test_at = by_attribute ? 1 : 0;  // the test's name, then its argument
      if (args.positional.size() > test_at && !args.positional[test_at].is(T::kString)) {
        return Status::InvalidArgument(name + " takes a test's name");
      }
      List out;
      for (const Value& x : items) {
        const Value* subject = &x;
        if (by_attribute) {
          if (!x.is(T::kDict) && !x.is(T::kNamespace)) {
            return Status::InvalidArgument(name + " applies to a list of dicts, not of " +
                                           type_name(x) + "s");
          }
          subject = find(x.is(T::kDict) ? x.entries() : x.ns->entries, args.positional[0].str());
        }
        bool passes = false;
        if (subject == nullptr) {
          passes = false;  // as the reference: a missing attribute passes no test
        } else if (args.positional.size() <= test_at) {
          passes = truthy(*subject);
        } else if (const std::string& test = args.positional[test_at].str();
                   test == "equalto" || test == "eq" || test == "==") {
          passes = args.positional.size() > test_at + 1 &&
                   loose_equal(*subject, args.positional[test_at + 1]);
        } else {
          Result<bool> t = apply_test(test, *subject);
          if (!t.ok()) return t.status();
          passes = *t;
        }
        if (passes == keep) out.push_back(x);
      }
      return make_list(std::move(out));
    }
    if (name == "map") {
      const Value* attr = find(args.keywords, "attribute");
      if (attr == nullptr || !attr->is(T::kString)) {
        return Status::InvalidArgument(
            "map() takes attribute='name' (other forms are not supported)");
      }
      const Value* fallback = find(args.keywords, "default");
      List out;
      for (const Value& x : items) {
        Value cur = x;
        size_t from = 0;
        const std::string& path = attr->str();
        while (true) {
          const size_t dot = path.find('.', from);
          const std::string part =
              path.substr(from, dot == std::string::npos ? std::string::npos : dot - from);
          if (cur.is(T::kDict) || cur.is(T::kNamespace)) {
            const Value* found = find(cur.is(T::kDict) ? cur.entries() : cur.ns->entries, part);
            cur = found ? *found : Value{};
          } else if (cur.is(T::kList)) {
            int64_t index = -1;
            std::from_chars(part.data(), part.data() + part.size(), index);
            cur = index >= 0 && index < static_cast<int64_t>(cur.items().size())
                      ? cur.items()[static_cast<size_t>(index)]
                      : Value{};
          } else {
            cur = Value{};
          }
          if (dot == std::string::npos) break;
          from = dot + 1;
        }
        out.push_back(cur.is(T::kUndefined) && fallback ? *fallback : cur);
      }
      return make_list(std::move(out));
    }
    return wrong();
  }
  if (v.is(T::kString)) {
    const std::string& s = v.str();
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize" ||
        name == "replace") {
      return call_method(v, name, args);
    }
    if (name == "trim") {
      Result<std::string> r = strip_string(s, args.get(0, "chars"), true, true);
      if (!r.ok()) return r.status();
      return make_string(std::move(*r));
    }
    if (name == "list" || name == "reverse") {
      if (Status st = this->chars(s); !st.ok()) return st;
      List chars;
      for (std::string_view c : code_points(s)) chars.push_back(Value::string(std::string(c)));
      if (name == "list") return make_list(std::move(chars));
      std::string out;
      for (auto it = chars.rbegin(); it != chars.rend(); ++it) out += it->str();
      return make_string(std::move(out));
    }
    if (name == "first" || name == "last") {
      if (Status st = this->chars(s); !st.ok()) return st;
      const std::vector<std::string_view> chars = code_points(s);
      if (chars.empty()) return Value{};
      return Value::string(std::string(name == "first" ? chars.front() : chars.back()));
    }
    if (name == "join") {
      const Value* sep = args.get(0, "d");
      if (sep != nullptr && !sep->is(T::kString))
        return Status::InvalidArgument("join's separator is a string");
      if (sep == nullptr) return v;
      if (Status st = this->chars(s); !st.ok()) return st;
      if (Status st = made(count_code_points(s) * sep->str().size()); !st.ok()) return st;
      std::string out;
      const std::vector<std::string_view> chars = code_points(s);
      for (size_t k = 0; k < chars.size(); ++k) {
        if (k > 0) out += sep->str();
        out += chars[k];
      }
      return make_string(std::move(out));
    }
    if (name == "indent") {
      const Value* width = args.get(0, "width");
      const Value* first = args.get(1, "first");
      const Value* blank = args.get(2, "blank");
      std::string pad = "    ";
      if (width != nullptr && width->is(T::kString))
        pad = width->str();
      else if (width != nullptr && width->is(T::kInt))
        pad = std::string(static_cast<size_t>(std::clamp<int64_t>(width->i, 0, 1024)), ' ');
      else if (width != nullptr)
        return Status::InvalidArgument("indent's width is an integer or a string");
      std::string out;
      size_t from = 0;
      for (int line = 0;; ++line) {
        const size_t nl = s.find('\n', from);
        const std::string_view text = std::string_view(s).substr(
            from, nl == std::string::npos ? std::string::npos : nl - from);
        if ((line > 0 || (first && truthy(*first))) && (!text.empty() || (blank && truthy(*blank))))
          out += pad;
        out += text;
        if (nl == std::string::npos) break;
        out += '\n';
        from = nl + 1;
        if (Status st = made(pad.size()); !st.ok()) return st;
      }
      return make_string(std::move(out));
    }
    if (name == "int" || name == "float") {
      const Value* fallback = args.get(0, "default");
      const std::string t = js_trim(s);
      if (name == "int") {
        int64_t x = 0;
        const char* b = t.c_str();
        if (*b == '+') ++b;
        const auto r = std::from_chars(b, t.c_str() + t.size(), x);
        if (r.ec != std::errc() || r.ptr == b) return fallback ? *fallback : Value::integer(0);
        return Value::integer(x);
      }
      char* end = nullptr;
      const double x = std::strtod(t.c_str(), &end);
      if (end == t.c_str()) return fallback ? *fallback : Value::number(0);
      return Value::number(x);
    }
    return wrong();
  }
  if (v.is_number() || v.is(T::kBool)) {
    if (name == "abs" && v.is_number()) {
      if (v.is(T::kFloat)) return Value::number(std::fabs(v.f));
      if (v.i == INT64_MIN) return Status::InvalidArgument("the chat template's integer overflows");
      return Value::integer(v.i < 0 ? -v.i : v.i);
    }
    if (name == "int") {
      if (v.is(T::kFloat)) {
        if (!(std::fabs(v.f) < 9.2e18)) return Status::InvalidArgument("int of a float too large");
        return Value::integer(static_cast<int64_t>(std::trunc(v.f)));
      }
      return Value::integer(v.is(T::kInt) ? v.i : v.b);
    }
    if (name == "float") return Value::number(v.as_double());
    return wrong();
  }
  if (v.is(T::kDict)) {
    if (name == "items" || name == "dictsort") return call_method(v, name, args);
    return wrong();
  }
  return wrong();
}

uint64_t input_bytes(const std::vector<ChatMessage>& messages, const RenderOptions& o) {
  uint64_t n = o.bos_token.size() + o.eos_token.size();
  for (const ChatMessage& m : messages) n += m.role.size() + m.content.size();
  return n;
}

Value global_function(Function::Kind kind) {
  auto f = std::make_shared<Function>();
  f->kind = kind;
  return Value::function(std::move(f));
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  Lexer lexer(source, preprocess(source));
  Result<std::vector<Token>> tokens = lexer.run();
  if (!tokens.ok()) return tokens.status();
  Parser parser(source, std::move(*tokens));
  Result<Body> body = parser.program();
  if (!body.ok()) return body.status();
  auto program = std::make_shared<Program>();
  program->source = std::string(source);
  program->body = std::move(*body);
  ChatTemplate t;
  t.program_ = std::move(program);
  return t;
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         const RenderOptions& options) const {
  if (!program_) return Status::InvalidArgument("no chat template");
  const uint64_t steps = kBaseSteps + kStepsPerMessage * messages.size();
  const uint64_t bytes = kBaseBytes + kBytesPerInputByte * input_bytes(messages, options);
  Renderer r(options, steps, bytes);
  r.set_step_budget(steps);
  r.set_byte_budget(bytes);
  Env* globals = r.new_env(nullptr);
  globals->set("true", Value::boolean(true));
  globals->set("false", Value::boolean(false));
  globals->set("none", Value::none());
  globals->set("True", Value::boolean(true));
  globals->set("False", Value::boolean(false));
  globals->set("None", Value::none());
  globals->set("namespace", global_function(Function::Kind::kNamespace));
  globals->set("range", global_function(Function::Kind::kRange));
  globals->set("raise_exception", global_function(Function::Kind::kRaise));
  globals->set("strftime_now", global_function(Function::Kind::kStrftime));
  List list;
  for (const ChatMessage& m : messages) {
    list.push_back(
        Value::dict({{"role", Value::string(m.role)}, {"content", Value::string(m.content)}}));
  }
  globals->set("messages", Value::list(std::move(list)));
  globals->set("bos_token", Value::string(options.bos_token));
  globals->set("eos_token", Value::string(options.eos_token));
  globals->set("add_generation_prompt", Value::boolean(options.add_generation_prompt));
  std::string out;
  Flow flow = Flow::kNormal;
  if (Status s = r.render(program_->body, r.new_env(globals), &out, &flow); !s.ok()) return s;
  return out;
}

namespace {

nlohmann::json read_tokenizer_config(const std::string& path, Status* status) {
  Result<std::string> text = util::read_file(path, util::kTokenizerConfigFile);
  if (!text.ok()) {
    *status = text.status();
    return nullptr;
  }
  nlohmann::json cfg = nlohmann::json::parse(*text, nullptr, false);
  if (!cfg.is_object()) *status = Status::InvalidArgument(path + ": not a JSON object");
  return cfg;
}

std::string token_text(const nlohmann::json& cfg, const char* key) {
  if (!cfg.is_object() || !cfg.contains(key)) return "";
  const nlohmann::json& v = cfg[key];
  if (v.is_string()) return v.get<std::string>();
  if (v.is_object() && v.contains("content") && v["content"].is_string()) {
    return v["content"].get<std::string>();
  }
  return "";
}

// The template of a tokenizer_config.json: a string, or the "default" of a list of named ones.
Result<std::string> config_template(const nlohmann::json& cfg, const std::string& path) {
  const nlohmann::json& c = cfg["chat_template"];
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    for (const nlohmann::json& named : c) {
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template") &&
          named["template"].is_string()) {
        return named["template"].get<std::string>();
      }
    }
  }
  return Status::InvalidArgument(path +
                                 ": chat_template is neither a string nor a list holding a "
                                 "\"default\" template");
}

// Parses t->source's text and renders a one-message conversation with it: a template that
// fails on that would fail every request.
Status finish(ModelChatTemplate* t, const std::string& text) {
  Result<ChatTemplate> parsed = ChatTemplate::parse(text);
  if (!parsed.ok()) return parsed.status().WithContext(t->source);
  RenderOptions options;
  options.bos_token = t->bos;
  options.eos_token = t->eos;
  Result<std::string> trial = parsed->render({{"user", "hi"}}, options);
  if (!trial.ok()) return trial.status().WithContext(t->source + " (rendering one user message)");
  t->chat_template = std::move(*parsed);
  t->found = true;
  return Status::Ok();
}

}  // namespace

Result<ModelChatTemplate> load_model_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  ModelChatTemplate t;
  if (model_dir.empty()) return t;
  const fs::path jinja = fs::path(model_dir) / "chat_template.jinja";
  const fs::path config = fs::path(model_dir) / "tokenizer_config.json";
  std::error_code ec;
  nlohmann::json cfg;
  if (fs::exists(config, ec)) {
    Status s;
    cfg = read_tokenizer_config(config.string(), &s);
    if (!s.ok()) return s;
  }
  t.bos = token_text(cfg, "bos_token");
  t.eos = token_text(cfg, "eos_token");
  std::string text;
  if (fs::exists(jinja, ec)) {
    Result<std::string> read = util::read_file(jinja.string(), util::kTokenizerConfigFile);
    if (!read.ok()) return read.status();
    text = std::move(*read);
    t.source = jinja.string();
  } else if (cfg.is_object() && cfg.contains("chat_template")) {
    Result<std::string> c = config_template(cfg, config.string());
    if (!c.ok()) return c.status();
    text = std::move(*c);
    t.source = config.string() + " (chat_template)";
  } else {
    return t;
  }
  if (Status s = finish(&t, text); !s.ok()) return s;
  return t;
}

Result<ModelChatTemplate> load_chat_template_file(const std::string& path) {
  namespace fs = std::filesystem;
  ModelChatTemplate t;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) {
    return Status::NotFound(path + ": no such chat template file");
  }
  const bool is_config = fs::path(path).extension() == ".json";
  const fs::path beside =
      is_config ? fs::path(path) : fs::path(path).parent_path() / "tokenizer_config.json";
  nlohmann::json cfg;
  if (is_config || fs::exists(beside, ec)) {
    Status s;
    cfg = read_tokenizer_config(beside.string(), &s);
    if (!s.ok()) return s;
  }
  t.bos = token_text(cfg, "bos_token");
  t.eos = token_text(cfg, "eos_token");
  std::string text;
  if (is_config) {
    if (!cfg.contains("chat_template"))
      return Status::InvalidArgument(path + ": holds no chat_template");
    Result<std::string> c = config_template(cfg, path);
    if (!c.ok()) return c.status();
    text = std::move(*c);
    t.source = path + " (chat_template)";
  } else {
    Result<std::string> read = util::read_file(path, util::kTokenizerConfigFile);
    if (!read.ok()) return read.status();
    text = std::move(*read);
    t.source = path;
  }
  if (Status s = finish(&t, text); !s.ok()) return s;
  return t;
}

}  // namespace kvrt::server
