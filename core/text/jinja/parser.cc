// Tokens into the syntax tree (jinja.h's Expr and Node), refusing at parse time every
// statement, filter, test, method and global kvrt does not render.
#include <algorithm>
#include <charconv>

#include "core/text/jinja/jinja.h"

namespace kvrt::text::jinja {

namespace {

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

}  // namespace

Result<Body> parse(std::string_view source, std::vector<Token> tokens) {
  Parser parser(source, std::move(tokens));
  return parser.program();
}

}  // namespace kvrt::text::jinja
