// What a template applies to values by name: string and dict methods, tests (is ...) and
// filters (| ...).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdio>

#include "core/text/jinja/jinja.h"

namespace kvrt::text::jinja {

namespace {

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

}  // namespace

namespace {

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

}  // namespace

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace kvrt::text::jinja
