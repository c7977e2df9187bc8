// The values a template computes: their truth, equality, text and JSON, as the reference
// (JavaScript) has them.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/text/jinja/jinja.h"

namespace kvrt::text::jinja {

std::string js_trim(std::string_view s, bool left, bool right) {
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
Result<std::string> text_of(const Value& v, uint64_t max_bytes) {
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

}  // namespace kvrt::text::jinja
