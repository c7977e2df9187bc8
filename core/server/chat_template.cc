#include "core/server/chat_template.h"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/util/file.h"

namespace kvrt::server {

namespace {

// ---- values --------------------------------------------------------------------------------

struct Value {
  enum class Type { kUndefined, kNone, kBool, kInt, kString, kList, kMap };
  explicit Value(Type t = Type::kUndefined) : type(t) {}
  Type type;
  bool b = false;
  int64_t i = 0;
  std::string s;
  std::shared_ptr<std::vector<Value>> list;
  std::shared_ptr<std::map<std::string, Value>> map;

  static Value none() { return Value{Type::kNone}; }
  static Value boolean(bool v) {
    Value x{Type::kBool};
    x.b = v;
    return x;
  }
  static Value integer(int64_t v) {
    Value x{Type::kInt};
    x.i = v;
    return x;
  }
  static Value string(std::string v) {
    Value x{Type::kString};
    x.s = std::move(v);
    return x;
  }
  bool truthy() const {
    switch (type) {
      case Type::kBool: return b;
      case Type::kInt: return i != 0;
      case Type::kString: return !s.empty();
      case Type::kList: return !list->empty();
      case Type::kMap: return !map->empty();
      default: return false;
    }
  }
  std::string text() const {
    switch (type) {
      case Type::kBool: return b ? "True" : "False";
      case Type::kInt: return std::to_string(i);
      case Type::kString: return s;
      case Type::kNone: return "None";
      default: return "";
    }
  }
};

bool equal(const Value& a, const Value& b) {
  if (a.type != b.type) {
    const bool na = a.type == Value::Type::kNone || a.type == Value::Type::kUndefined;
    const bool nb = b.type == Value::Type::kNone || b.type == Value::Type::kUndefined;
    if (na && nb) return true;
    if (a.type == Value::Type::kBool && b.type == Value::Type::kInt) return a.b == (b.i != 0);
    if (a.type == Value::Type::kInt && b.type == Value::Type::kBool) return (a.i != 0) == b.b;
    return false;
  }
  switch (a.type) {
    case Value::Type::kBool: return a.b == b.b;
    case Value::Type::kInt: return a.i == b.i;
    case Value::Type::kString: return a.s == b.s;
    default: return a.type == Value::Type::kNone || a.type == Value::Type::kUndefined;
  }
}

// ---- expressions ---------------------------------------------------------------------------

struct Context;
struct Expr {
  virtual ~Expr() = default;
  virtual Result<Value> eval(Context& ctx) const = 0;
};
using ExprPtr = std::unique_ptr<Expr>;

struct Context {
  std::vector<std::map<std::string, Value>> scopes;
  // Bounds on one rendering, so no template (loops nested over the messages) can run away:
  // statements and outputs evaluated (100K plus 50 per message: a real template takes a few
  // per message), and bytes written.
  uint64_t steps_left = 0;
  static constexpr size_t kMaxOutput = 64u << 20;
  Value lookup(const std::string& name) const {
    for (auto it = scopes.rbegin(); it != scopes.rend(); ++it) {
      auto found = it->find(name);
      if (found != it->end()) return found->second;
    }
    return Value{};
  }
};

struct Literal : Expr {
  Value v;
  explicit Literal(Value x) : v(std::move(x)) {}
  Result<Value> eval(Context&) const override { return v; }
};
struct Name : Expr {
  std::string name;
  explicit Name(std::string n) : name(std::move(n)) {}
  Result<Value> eval(Context& ctx) const override { return ctx.lookup(name); }
};
struct Member : Expr {  // a.b, a['b'], a[i]
  ExprPtr object, key;
  Result<Value> eval(Context& ctx) const override {
    Result<Value> o = object->eval(ctx);
    if (!o.ok()) return o;
    Result<Value> k = key->eval(ctx);
    if (!k.ok()) return k;
    if (o->type == Value::Type::kMap && k->type == Value::Type::kString) {
      auto it = o->map->find(k->s);
      return it == o->map->end() ? Value{} : it->second;
    }
    if (o->type == Value::Type::kList && k->type == Value::Type::kInt) {
      const int64_t n = static_cast<int64_t>(o->list->size());
      const int64_t at = k->i < 0 ? n + k->i : k->i;
      if (at < 0 || at >= n) return Value{};
      return (*o->list)[static_cast<size_t>(at)];
    }
    return Value{};
  }
};
struct Not : Expr {
  ExprPtr operand;
  Result<Value> eval(Context& ctx) const override {
    Result<Value> v = operand->eval(ctx);
    if (!v.ok()) return v;
    return Value::boolean(!v->truthy());
  }
};
struct Binary : Expr {
  std::string op;
  ExprPtr left, right;
  Result<Value> eval(Context& ctx) const override {
    Result<Value> l = left->eval(ctx);
    if (!l.ok()) return l;
    if (op == "and" && !l->truthy()) return *l;
    if (op == "or" && l->truthy()) return *l;
    Result<Value> r = right->eval(ctx);
    if (!r.ok()) return r;
    if (op == "and" || op == "or") return *r;
    if (op == "~") return Value::string(l->text() + r->text());
    if (op == "+") {
      if (l->type == Value::Type::kInt && r->type == Value::Type::kInt) {
        return Value::integer(l->i + r->i);
      }
      if (l->type == Value::Type::kString && r->type == Value::Type::kString) {
        return Value::string(l->s + r->s);
      }
      return Status::InvalidArgument("the chat template adds a " + kind(*l) + " to a " +
                                     kind(*r));
    }
    if (op == "-" && l->type == Value::Type::kInt && r->type == Value::Type::kInt) {
      return Value::integer(l->i - r->i);
    }
    if (op == "==") return Value::boolean(equal(*l, *r));
    if (op == "!=") return Value::boolean(!equal(*l, *r));
    if (op == "in" || op == "not in") {
      bool found = false;
      if (r->type == Value::Type::kString && l->type == Value::Type::kString) {
        found = r->s.find(l->s) != std::string::npos;
      } else if (r->type == Value::Type::kList) {
        for (const Value& v : *r->list) found |= equal(v, *l);
      } else if (r->type == Value::Type::kMap && l->type == Value::Type::kString) {
        found = r->map->count(l->s) > 0;
      }
      return Value::boolean(op == "in" ? found : !found);
    }
    if (l->type == Value::Type::kInt && r->type == Value::Type::kInt) {
      if (op == "<") return Value::boolean(l->i < r->i);
      if (op == ">") return Value::boolean(l->i > r->i);
      if (op == "<=") return Value::boolean(l->i <= r->i);
      if (op == ">=") return Value::boolean(l->i >= r->i);
    }
    return Status::InvalidArgument("the chat template compares a " + kind(*l) + " with a " +
                                   kind(*r) + " by " + op);
  }
  static std::string kind(const Value& v) {
    static const char* const kNames[] = {"undefined", "none", "boolean", "integer",
                                         "string",    "list", "mapping"};
    return kNames[static_cast<int>(v.type)];
  }
};
struct Conditional : Expr {  // a if cond else b
  ExprPtr then, cond, otherwise;
  Result<Value> eval(Context& ctx) const override {
    Result<Value> c = cond->eval(ctx);
    if (!c.ok()) return c;
    if (c->truthy()) return then->eval(ctx);
    return otherwise ? otherwise->eval(ctx) : Result<Value>(Value{});
  }
};
struct Test : Expr {  // x is [not] defined / none / string
  ExprPtr operand;
  std::string test;
  bool negated = false;
  Result<Value> eval(Context& ctx) const override {
    Result<Value> v = operand->eval(ctx);
    if (!v.ok()) return v;
    bool r = false;
    if (test == "defined") r = v->type != Value::Type::kUndefined;
    if (test == "none") r = v->type == Value::Type::kNone;
    if (test == "string") r = v->type == Value::Type::kString;
    return Value::boolean(r != negated);
  }
};
// A filter (x | trim) or a string method (x.strip()): the same operations.
struct Apply : Expr {
  ExprPtr operand;
  std::string name;
  std::vector<ExprPtr> args;
  Result<Value> eval(Context& ctx) const override {
    Result<Value> v = operand->eval(ctx);
    if (!v.ok()) return v;
    std::vector<Value> a;
    for (const ExprPtr& e : args) {
      Result<Value> x = e->eval(ctx);
      if (!x.ok()) return x;
      a.push_back(*x);
    }
    if (name == "length") {
      if (v->type == Value::Type::kList) return Value::integer(static_cast<int64_t>(v->list->size()));
      return Value::integer(static_cast<int64_t>(v->text().size()));
    }
    std::string s = v->text();
    auto is_space = [](char c) { return std::isspace(static_cast<unsigned char>(c)) != 0; };
    if (name == "trim" || name == "strip" || name == "lstrip") {
      size_t b = 0;
      while (b < s.size() && is_space(s[b])) ++b;
      s.erase(0, b);
    }
    if (name == "trim" || name == "strip" || name == "rstrip") {
      while (!s.empty() && is_space(s.back())) s.pop_back();
    }
    if (name == "upper") for (char& c : s) c = static_cast<char>(std::toupper(c));
    if (name == "lower") for (char& c : s) c = static_cast<char>(std::tolower(c));
    if (name == "startswith" || name == "endswith") {
      const std::string x = a.empty() ? "" : a[0].text();
      const bool r = x.size() <= s.size() &&
                     (name == "startswith" ? s.compare(0, x.size(), x) == 0
                                           : s.compare(s.size() - x.size(), x.size(), x) == 0);
      return Value::boolean(r);
    }
    return Value::string(std::move(s));
  }
};
struct Raise : Expr {
  ExprPtr message;
  Result<Value> eval(Context& ctx) const override {
    Result<Value> m = message->eval(ctx);
    if (!m.ok()) return m;
    return Status::InvalidArgument("the model's chat template refuses this conversation: " +
                                   m->text());
  }
};

// ---- the expression parser -----------------------------------------------------------------

struct Token {
  enum class Kind { kName, kString, kInt, kOp, kEnd };
  Kind kind = Kind::kEnd;
  std::string text;
};

Status syntax(size_t at, const std::string& what) {
  return Status::InvalidArgument("chat template, byte " + std::to_string(at) + ": " + what);
}

Result<std::vector<Token>> lex(std::string_view src, size_t base) {
  std::vector<Token> out;
  size_t i = 0;
  while (i < src.size()) {
    const char c = src[i];
    if (std::isspace(static_cast<unsigned char>(c))) {
      ++i;
    } else if (std::isalpha(static_cast<unsigned char>(c)) || c == '_') {
      size_t j = i;
      while (j < src.size() && (std::isalnum(static_cast<unsigned char>(src[j])) || src[j] == '_')) ++j;
      out.push_back({Token::Kind::kName, std::string(src.substr(i, j - i))});
      i = j;
    } else if (std::isdigit(static_cast<unsigned char>(c))) {
      size_t j = i;
      while (j < src.size() && std::isdigit(static_cast<unsigned char>(src[j]))) ++j;
      if (j - i > 18) return syntax(base + i, "an integer too large");
      out.push_back({Token::Kind::kInt, std::string(src.substr(i, j - i))});
      i = j;
    } else if (c == '\'' || c == '"') {
      std::string s;
      size_t j = i + 1;
      for (; j < src.size() && src[j] != c; ++j) {
        if (src[j] == '\\' && j + 1 < src.size()) {
          const char e = src[++j];
          s += e == 'n' ? '\n' : e == 't' ? '\t' : e == 'r' ? '\r' : e;
        } else {
          s += src[j];
        }
      }
      if (j >= src.size()) return syntax(base + i, "a string without its closing quote");
      out.push_back({Token::Kind::kString, std::move(s)});
      i = j + 1;
    } else {
      static const char* const kOps[] = {"==", "!=", "<=", ">=", "(", ")", "[", "]", ".", ",",
                                         "|",  "+",  "~",  "-",  "<", ">", "=", ":"};
      bool matched = false;
      for (const char* op : kOps) {
        const std::string_view o(op);
        if (src.substr(i, o.size()) == o) {
          out.push_back({Token::Kind::kOp, std::string(o)});
          i += o.size();
          matched = true;
          break;
        }
      }
      if (!matched) return syntax(base + i, std::string("unsupported character '") + c + "'");
    }
  }
  out.push_back({Token::Kind::kEnd, ""});
  return out;
}

// Nesting is bounded, so no template can exhaust the stack: one level while a Nesting lives.
constexpr int kMaxNesting = 64;
class Nesting {
 public:
  explicit Nesting(int& depth) : depth_(depth) { ++depth_; }
  ~Nesting() { --depth_; }
  Nesting(const Nesting&) = delete;
  Nesting& operator=(const Nesting&) = delete;
  bool too_deep() const { return depth_ > kMaxNesting; }

 private:
  int& depth_;
};

class ExprParser {
 public:
  ExprParser(std::vector<Token> tokens, size_t at) : t_(std::move(tokens)), at_(at) {}

  Result<ExprPtr> expression() {
    const Nesting nesting(depth_);
    if (nesting.too_deep()) return error("expressions nested too deeply");
    Result<ExprPtr> e = or_expr();
    if (!e.ok() || !is_name("if")) return e;
    ++p_;
    auto c = std::make_unique<Conditional>();
    c->then = std::move(*e);
    Result<ExprPtr> cond = or_expr();
    if (!cond.ok()) return cond;
    c->cond = std::move(*cond);
    if (is_name("else")) {
      ++p_;
      Result<ExprPtr> other = expression();
      if (!other.ok()) return other;
      c->otherwise = std::move(*other);
    }
    return ExprPtr(std::move(c));
  }
  bool done() const { return t_[p_].kind == Token::Kind::kEnd; }
  const Token& peek() const { return t_[p_]; }
  Status error(const std::string& what) const { return syntax(at_, what); }
  bool is_name(const char* n) const {
    return t_[p_].kind == Token::Kind::kName && t_[p_].text == n;
  }
  bool is_op(const char* o) const { return t_[p_].kind == Token::Kind::kOp && t_[p_].text == o; }
  Token next() { return t_[p_].kind == Token::Kind::kEnd ? t_[p_] : t_[p_++]; }

 private:
  Result<ExprPtr> or_expr() { return binary_chain({"or"}, &ExprParser::and_expr); }
  Result<ExprPtr> and_expr() { return binary_chain({"and"}, &ExprParser::not_expr); }
  Result<ExprPtr> not_expr() {
    if (is_name("not")) {
      ++p_;
      if (++nots_ > kMaxNesting) return error("too many 'not's");
      auto n = std::make_unique<Not>();
      Result<ExprPtr> e = not_expr();
      if (!e.ok()) return e;
      n->operand = std::move(*e);
      return ExprPtr(std::move(n));
    }
    return comparison();
  }
  Result<ExprPtr> comparison() {
    Result<ExprPtr> left = additive();
    if (!left.ok()) return left;
    ExprPtr l = std::move(*left);
    while (true) {
      std::string op;
      if (is_op("==") || is_op("!=") || is_op("<") || is_op(">") || is_op("<=") || is_op(">=")) {
        op = next().text;
      } else if (is_name("in")) {
        op = next().text;
      } else if (is_name("not") && t_[p_ + 1].kind == Token::Kind::kName &&
                 t_[p_ + 1].text == "in") {
        p_ += 2;
        op = "not in";
      } else if (is_name("is")) {
        ++p_;
        auto t = std::make_unique<Test>();
        if (is_name("not")) {
          ++p_;
          t->negated = true;
        }
        const Token name = next();
        if (name.kind != Token::Kind::kName ||
            (name.text != "defined" && name.text != "none" && name.text != "string")) {
          return error("unsupported test 'is " + name.text + "'");
        }
        t->test = name.text;
        t->operand = std::move(l);
        l = std::move(t);
        continue;
      } else {
        return l;
      }
      Result<ExprPtr> right = additive();
      if (!right.ok()) return right;
      auto b = std::make_unique<Binary>();
      b->op = op;
      b->left = std::move(l);
      b->right = std::move(*right);
      l = std::move(b);
    }
  }
  Result<ExprPtr> additive() { return binary_chain({"+", "~", "-"}, &ExprParser::postfix); }

  Result<ExprPtr> binary_chain(std::vector<std::string> ops, Result<ExprPtr> (ExprParser::*sub)()) {
    Result<ExprPtr> left = (this->*sub)();
    if (!left.ok()) return left;
    ExprPtr l = std::move(*left);
    while (true) {
      bool any = false;
      for (const std::string& op : ops) any |= t_[p_].text == op && t_[p_].kind != Token::Kind::kString;
      if (!any) return l;
      auto b = std::make_unique<Binary>();
      b->op = next().text;
      Result<ExprPtr> right = (this->*sub)();
      if (!right.ok()) return right;
      b->left = std::move(l);
      b->right = std::move(*right);
      l = std::move(b);
    }
  }

  Result<std::vector<ExprPtr>> call_args() {
    std::vector<ExprPtr> args;
    ++p_;  // (
    while (!is_op(")")) {
      Result<ExprPtr> a = expression();
      if (!a.ok()) return a.status();
      args.push_back(std::move(*a));
      if (is_op(",")) {
        ++p_;
      } else if (!is_op(")")) {
        return error("expected ',' or ')' in a call");
      }
    }
    ++p_;  // )
    return args;
  }

  // A filter or string method applied to `operand`, when `name` is one of `known`.
  template <size_t N>
  Result<std::unique_ptr<Apply>> apply(ExprPtr operand, const Token& name,
                                       const char* const (&known)[N], const std::string& what) {
    bool found = false;
    for (const char* k : known) found |= name.text == k;
    if (!found) return error("unsupported " + what);
    auto a = std::make_unique<Apply>();
    a->operand = std::move(operand);
    a->name = name.text;
    return a;
  }

  Result<ExprPtr> postfix() {
    Result<ExprPtr> base = primary();
    if (!base.ok()) return base;
    ExprPtr e = std::move(*base);
    static const char* const kMethods[] = {"strip", "lstrip", "rstrip", "upper", "lower",
                                           "startswith", "endswith"};
    static const char* const kFilters[] = {"trim", "length", "upper", "lower"};
    while (true) {
      if (is_op(".")) {
        ++p_;
        const Token name = next();
        if (name.kind != Token::Kind::kName) return error("expected a name after '.'");
        if (is_op("(")) {
          Result<std::unique_ptr<Apply>> a =
              apply(std::move(e), name, kMethods, "method '." + name.text + "()'");
          if (!a.ok()) return a.status();
          Result<std::vector<ExprPtr>> args = call_args();
          if (!args.ok()) return args.status();
          (*a)->args = std::move(*args);
          e = std::move(*a);
        } else {
          auto m = std::make_unique<Member>();
          m->object = std::move(e);
          m->key = std::make_unique<Literal>(Value::string(name.text));
          e = std::move(m);
        }
      } else if (is_op("[")) {
        ++p_;
        Result<ExprPtr> key = expression();
        if (!key.ok()) return key;
        if (is_op(":")) return error("slices (a[x:y]) are not supported");
        if (!is_op("]")) return error("expected ']'");
        ++p_;
        auto m = std::make_unique<Member>();
        m->object = std::move(e);
        m->key = std::move(*key);
        e = std::move(m);
      } else if (is_op("|")) {
        ++p_;
        const Token name = next();
        Result<std::unique_ptr<Apply>> a =
            apply(std::move(e), name, kFilters, "filter '| " + name.text + "'");
        if (!a.ok()) return a.status();
        e = std::move(*a);
      } else {
        return e;
      }
    }
  }

  Result<ExprPtr> primary() {
    const Token t = next();
    switch (t.kind) {
      case Token::Kind::kString: return ExprPtr(std::make_unique<Literal>(Value::string(t.text)));
      case Token::Kind::kInt:
        return ExprPtr(std::make_unique<Literal>(Value::integer(std::stoll(t.text))));
      case Token::Kind::kName:
        if (t.text == "true" || t.text == "True") return ExprPtr(std::make_unique<Literal>(Value::boolean(true)));
        if (t.text == "false" || t.text == "False") return ExprPtr(std::make_unique<Literal>(Value::boolean(false)));
        if (t.text == "none" || t.text == "None") return ExprPtr(std::make_unique<Literal>(Value::none()));
        if (is_op("(")) {
          if (t.text != "raise_exception") return error("unsupported function '" + t.text + "()'");
          Result<std::vector<ExprPtr>> args = call_args();
          if (!args.ok()) return args.status();
          if (args->size() != 1) return error("raise_exception takes one message");
          auto r = std::make_unique<Raise>();
          r->message = std::move((*args)[0]);
          return ExprPtr(std::move(r));
        }
        return ExprPtr(std::make_unique<Name>(t.text));
      case Token::Kind::kOp:
        if (t.text == "(") {
          Result<ExprPtr> e = expression();
          if (!e.ok()) return e;
          if (!is_op(")")) return error("expected ')'");
          ++p_;
          return e;
        }
        if (t.text == "[") return error("list literals are not supported");
        return error("unexpected '" + t.text + "'");
      case Token::Kind::kEnd: return error("an expression ends too early");
    }
    return error("unexpected token");
  }

  std::vector<Token> t_;
  size_t p_ = 0;
  size_t at_;
  int depth_ = 0;
  int nots_ = 0;
};

Result<ExprPtr> parse_expression(std::string_view src, size_t at) {
  Result<std::vector<Token>> tokens = lex(src, at);
  if (!tokens.ok()) return tokens.status();
  ExprParser p(std::move(*tokens), at);
  Result<ExprPtr> e = p.expression();
  if (!e.ok()) return e;
  if (!p.done()) return p.error("unexpected '" + p.peek().text + "' after an expression");
  return e;
}

}  // namespace

// ---- statements ----------------------------------------------------------------------------

struct ChatTemplate::Node {
  enum class Kind { kText, kOutput, kIf, kFor, kSet };
  Kind kind = Kind::kText;
  std::string text;  // kText; kFor: the loop variable; kSet: the name
  ExprPtr expr;      // kOutput, kFor (the sequence), kSet
  std::vector<std::pair<ExprPtr, std::vector<std::unique_ptr<Node>>>> branches;  // kIf
  std::vector<std::unique_ptr<Node>> body, otherwise;  // kFor body; kIf's else
};

namespace {

using NodePtr = std::unique_ptr<ChatTemplate::Node>;
using Body = std::vector<NodePtr>;

// One piece of the source: text, or a tag with its inside.
struct Piece {
  enum class Kind { kText, kOutput, kStatement } kind;
  std::string content;
  size_t at;
};

Result<std::vector<Piece>> split(std::string_view src) {
  std::vector<Piece> out;
  size_t i = 0;
  bool trim_next = false;  // the last tag ended with "-": strip the whitespace that follows
  auto strip_front = [](std::string* t) {
    const size_t first = t->find_first_not_of(" \t\r\n");
    t->erase(0, first == std::string::npos ? t->size() : first);
  };
  // The next place of each opener, found again only once passed (linear in the source).
  static const char* const kOpeners[] = {"{{", "{%", "{#"};
  size_t next[3] = {0, 0, 0};
  bool stale[3] = {true, true, true};
  while (true) {
    size_t tag = std::string_view::npos;
    for (int k = 0; k < 3; ++k) {
      if (stale[k] || (next[k] != std::string_view::npos && next[k] < i)) {
        next[k] = src.find(kOpeners[k], i);
        stale[k] = false;
      }
      tag = std::min(tag, next[k]);
    }
    std::string text(src.substr(i, tag == std::string_view::npos ? std::string_view::npos : tag - i));
    if (trim_next) strip_front(&text);
    if (tag == std::string_view::npos) {
      if (!text.empty()) out.push_back({Piece::Kind::kText, text, i});
      return out;
    }
    const char type = src[tag + 1];
    const std::string close = type == '{' ? "}}" : type == '%' ? "%}" : "#}";
    const size_t end = src.find(close, tag + 2);
    if (end == std::string_view::npos) return syntax(tag, "a tag without its closing " + close);
    size_t inner_begin = tag + 2, inner_end = end;
    const bool trim_before = inner_begin < inner_end && src[inner_begin] == '-';
    if (trim_before) ++inner_begin;
    const bool trim_after = inner_end > inner_begin && src[inner_end - 1] == '-';
    if (trim_after) --inner_end;
    if (trim_before) {
      const size_t last = text.find_last_not_of(" \t\r\n");
      text.resize(last == std::string::npos ? 0 : last + 1);
    }
    if (!text.empty()) out.push_back({Piece::Kind::kText, text, i});
    if (type != '#') {
      out.push_back({type == '{' ? Piece::Kind::kOutput : Piece::Kind::kStatement,
                     std::string(src.substr(inner_begin, inner_end - inner_begin)), tag});
    }
    trim_next = trim_after;
    i = end + 2;
  }
}

std::string first_word(const std::string& s, std::string* rest) {
  size_t b = s.find_first_not_of(" \t\r\n");
  if (b == std::string::npos) {
    rest->clear();
    return "";
  }
  size_t e = b;
  while (e < s.size() && (std::isalnum(static_cast<unsigned char>(s[e])) || s[e] == '_')) ++e;
  *rest = s.substr(e);
  return s.substr(b, e - b);
}

class StatementParser {
 public:
  explicit StatementParser(std::vector<Piece> pieces) : pieces_(std::move(pieces)) {}

  // Parses nodes until one of `enders` (returned in *ended) or the end (when enders is empty).
  Status parse_body(Body* body, const std::vector<std::string>& enders, std::string* ended,
                    std::string* ended_rest) {
    const Nesting nesting(depth_);
    if (nesting.too_deep()) return syntax(0, "statements nested too deeply");
    while (p_ < pieces_.size()) {
      const Piece& piece = pieces_[p_++];
      if (piece.kind == Piece::Kind::kText) {
        auto n = std::make_unique<ChatTemplate::Node>();
        n->text = piece.content;
        body->push_back(std::move(n));
        continue;
      }
      if (piece.kind == Piece::Kind::kOutput) {
        Result<ExprPtr> e = parse_expression(piece.content, piece.at);
        if (!e.ok()) return e.status();
        auto n = std::make_unique<ChatTemplate::Node>();
        n->kind = ChatTemplate::Node::Kind::kOutput;
        n->expr = std::move(*e);
        body->push_back(std::move(n));
        continue;
      }
      std::string rest;
      const std::string word = first_word(piece.content, &rest);
      for (const std::string& e : enders) {
        if (word == e) {
          *ended = word;
          *ended_rest = rest;
          return Status::Ok();
        }
      }
      if (word == "if") {
        auto n = std::make_unique<ChatTemplate::Node>();
        n->kind = ChatTemplate::Node::Kind::kIf;
        std::string cond = rest;
        while (true) {
          Result<ExprPtr> c = parse_expression(cond, piece.at);
          if (!c.ok()) return c.status();
          Body branch;
          std::string end_word, end_rest;
          if (Status s = parse_body(&branch, {"elif", "else", "endif"}, &end_word, &end_rest); !s.ok()) {
            return s;
          }
          if (end_word.empty()) return syntax(piece.at, "an if without its endif");
          n->branches.emplace_back(std::move(*c), std::move(branch));
          if (end_word == "elif") {
            cond = end_rest;
            continue;
          }
          if (end_word == "else") {
            std::string w;
            if (Status s = parse_body(&n->otherwise, {"endif"}, &w, &end_rest); !s.ok()) return s;
            if (w.empty()) return syntax(piece.at, "an if without its endif");
          }
          break;
        }
        body->push_back(std::move(n));
      } else if (word == "for") {
        std::string after;
        const std::string var = first_word(rest, &after);
        std::string in_rest;
        if (var.empty() || first_word(after, &in_rest) != "in") {
          return syntax(piece.at, "expected 'for NAME in EXPR'");
        }
        Result<ExprPtr> seq = parse_expression(in_rest, piece.at);
        if (!seq.ok()) return seq.status();
        auto n = std::make_unique<ChatTemplate::Node>();
        n->kind = ChatTemplate::Node::Kind::kFor;
        n->text = var;
        n->expr = std::move(*seq);
        std::string w, r;
        if (Status s = parse_body(&n->body, {"endfor"}, &w, &r); !s.ok()) return s;
        if (w.empty()) return syntax(piece.at, "a for without its endfor");
        body->push_back(std::move(n));
      } else if (word == "set") {
        const size_t eq = rest.find('=');
        std::string name_rest;
        const std::string name = first_word(rest.substr(0, eq == std::string::npos ? 0 : eq), &name_rest);
        if (eq == std::string::npos || name.empty() ||
            name_rest.find_first_not_of(" \t") != std::string::npos) {
          return syntax(piece.at, "expected 'set NAME = EXPR' (namespaces and blocks are not supported)");
        }
        Result<ExprPtr> value = parse_expression(rest.substr(eq + 1), piece.at);
        if (!value.ok()) return value.status();
        auto n = std::make_unique<ChatTemplate::Node>();
        n->kind = ChatTemplate::Node::Kind::kSet;
        n->text = name;
        n->expr = std::move(*value);
        body->push_back(std::move(n));
      } else {
        return syntax(piece.at, "unsupported statement '{% " + word + " %}'");
      }
    }
    if (!enders.empty()) ended->clear();
    return Status::Ok();
  }

 private:
  std::vector<Piece> pieces_;
  size_t p_ = 0;
  int depth_ = 0;
};

Status render_body(const Body& body, Context& ctx, std::string* out);

Status render_node(const ChatTemplate::Node& n, Context& ctx, std::string* out) {
  using Kind = ChatTemplate::Node::Kind;
  if (ctx.steps_left-- == 0 || out->size() > Context::kMaxOutput) {
    return Status::InvalidArgument(
        "the chat template takes too long to render (over 100K + 50 steps per message, or 64 MiB "
        "of text)");
  }
  switch (n.kind) {
    case Kind::kText:
      out->append(n.text);
      return Status::Ok();
    case Kind::kOutput: {
      Result<Value> v = n.expr->eval(ctx);
      if (!v.ok()) return v.status();
      out->append(v->text());
      return Status::Ok();
    }
    case Kind::kSet: {
      Result<Value> v = n.expr->eval(ctx);
      if (!v.ok()) return v.status();
      ctx.scopes.back()[n.text] = *v;
      return Status::Ok();
    }
    case Kind::kIf:
      for (const auto& [cond, branch] : n.branches) {
        Result<Value> c = cond->eval(ctx);
        if (!c.ok()) return c.status();
        if (c->truthy()) return render_body(branch, ctx, out);
      }
      return render_body(n.otherwise, ctx, out);
    case Kind::kFor: {
      Result<Value> seq = n.expr->eval(ctx);
      if (!seq.ok()) return seq.status();
      if (seq->type != Value::Type::kList) return Status::Ok();
      const auto items = seq->list;
      for (size_t i = 0; i < items->size(); ++i) {
        auto loop = std::make_shared<std::map<std::string, Value>>();
        (*loop)["index0"] = Value::integer(static_cast<int64_t>(i));
        (*loop)["index"] = Value::integer(static_cast<int64_t>(i + 1));
        (*loop)["first"] = Value::boolean(i == 0);
        (*loop)["last"] = Value::boolean(i + 1 == items->size());
        (*loop)["length"] = Value::integer(static_cast<int64_t>(items->size()));
        Value loop_value{Value::Type::kMap};
        loop_value.map = loop;
        ctx.scopes.push_back({{n.text, (*items)[i]}, {"loop", loop_value}});
        Status s = render_body(n.body, ctx, out);
        ctx.scopes.pop_back();
        if (!s.ok()) return s;
      }
      return Status::Ok();
    }
  }
  return Status::Ok();
}

Status render_body(const Body& body, Context& ctx, std::string* out) {
  for (const NodePtr& n : body) {
    if (Status s = render_node(*n, ctx, out); !s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace

Result<ChatTemplate> ChatTemplate::parse(std::string_view source) {
  Result<std::vector<Piece>> pieces = split(source);
  if (!pieces.ok()) return pieces.status();
  auto body = std::make_shared<Body>();
  StatementParser parser(std::move(*pieces));
  std::string ended, rest;
  if (Status s = parser.parse_body(body.get(), {}, &ended, &rest); !s.ok()) return s;
  ChatTemplate t;
  t.body_ = std::move(body);
  return t;
}

Result<std::string> ChatTemplate::render(const std::vector<ChatMessage>& messages,
                                         const std::string& bos, const std::string& eos) const {
  if (!body_) return Status::InvalidArgument("no chat template");
  Context ctx;
  Value list{Value::Type::kList};
  list.list = std::make_shared<std::vector<Value>>();
  for (const ChatMessage& m : messages) {
    Value v{Value::Type::kMap};
    v.map = std::make_shared<std::map<std::string, Value>>();
    (*v.map)["role"] = Value::string(m.role);
    (*v.map)["content"] = Value::string(m.content);
    list.list->push_back(std::move(v));
  }
  ctx.steps_left = 100'000 + 50 * static_cast<uint64_t>(messages.size());
  ctx.scopes.push_back({{"messages", list},
                        {"bos_token", Value::string(bos)},
                        {"eos_token", Value::string(eos)},
                        {"add_generation_prompt", Value::boolean(true)}});
  std::string out;
  if (Status s = render_body(*body_, ctx, &out); !s.ok()) return s;
  return out;
}

Result<ModelChatTemplate> load_model_chat_template(const std::string& model_dir) {
  namespace fs = std::filesystem;
  ModelChatTemplate t;
  if (model_dir.empty()) return t;
  const fs::path jinja = fs::path(model_dir) / "chat_template.jinja";
  const fs::path config = fs::path(model_dir) / "tokenizer_config.json";
  std::error_code ec;
  std::string source;
  nlohmann::json cfg;
  if (fs::exists(config, ec)) {
    Result<std::string> text = util::read_file(config.string(), util::kTokenizerConfigFile);
    if (!text.ok()) return text.status();
    cfg = nlohmann::json::parse(*text, nullptr, false);
    if (!cfg.is_object()) return Status::InvalidArgument(config.string() + ": not a JSON object");
  }
  auto token = [&cfg](const char* key) -> std::string {
    if (!cfg.is_object() || !cfg.contains(key)) return "";
    const nlohmann::json& v = cfg[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) {
      return v["content"].get<std::string>();
    }
    return "";
  };
  t.bos = token("bos_token");
  t.eos = token("eos_token");
  if (fs::exists(jinja, ec)) {
    Result<std::string> text = util::read_file(jinja.string(), util::kTokenizerConfigFile);
    if (!text.ok()) return text.status();
    source = *text;
    t.source = jinja.string();
  } else if (cfg.is_object() && cfg.contains("chat_template")) {
    const nlohmann::json& c = cfg["chat_template"];
    if (c.is_string()) {
      source = c.get<std::string>();
    } else if (c.is_array()) {
      for (const nlohmann::json& named : c) {
        if (named.is_object() && named.value("name", "") == "default" &&
            named.contains("template") && named["template"].is_string()) {
          source = named["template"].get<std::string>();
        }
      }
    }
    if (source.empty()) {
      return Status::InvalidArgument(config.string() +
                                     ": chat_template is neither a string nor a list holding a "
                                     "\"default\" template");
    }
    t.source = config.string() + " (chat_template)";
  } else {
    return t;
  }
  Result<ChatTemplate> parsed = ChatTemplate::parse(source);
  if (!parsed.ok()) return parsed.status().WithContext(t.source);
  // A trial conversation: a template that fails on it would fail every request.
  Result<std::string> trial = parsed->render({{"user", "hi"}}, t.bos, t.eos);
  if (!trial.ok()) return trial.status().WithContext(t.source);
  t.chat_template = std::move(*parsed);
  t.found = true;
  return t;
}

}  // namespace kvrt::server
