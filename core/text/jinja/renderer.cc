// Rendering the syntax tree: statements, expressions, operators, attributes, slices, calls
// and macros, each charged against the render's bounds.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <ctime>

#include "core/text/jinja/jinja.h"

namespace kvrt::text::jinja {

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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

namespace {

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

}  // namespace

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

}  // namespace kvrt::text::jinja
