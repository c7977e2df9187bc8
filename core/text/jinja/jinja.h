// The Jinja engine behind chat_template.h, shared by its parts: the values a template computes
// (value.cc), the tokens (lexer.cc), the syntax tree (parser.cc) and the renderer (renderer.cc;
// filters, tests and methods in filters.cc). Nothing here is used outside core/text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/text/chat_template.h"
#include "core/text/utf8.h"
#include "core/util/status.h"

namespace kvrt::text::jinja {

// ---- limits --------------------------------------------------------------------------------

// Expressions and statements inside one another, as parsed.
inline constexpr int kMaxParseNesting = 64;
// Operators, filters and members applied in a chain.
inline constexpr int kMaxExprHeight = 256;
// Expressions and statements evaluated inside one another.
inline constexpr int kMaxEvalDepth = 1000;
// Macro calls inside one another.
inline constexpr int kMaxCallDepth = 64;
// Lists / dicts / namespaces inside one another (tojson).
inline constexpr int kMaxValueNesting = 64;
// Elements of one range().
inline constexpr int64_t kMaxRange = 100'000;
// Statements and expressions evaluated, plus kStepsPerMessage per message.
inline constexpr uint64_t kBaseSteps = 200'000;
inline constexpr uint64_t kStepsPerMessage = 10'000;
// Bytes of strings and lists made, plus kBytesPerInputByte per byte of the messages.
inline constexpr uint64_t kBaseBytes = 32ull << 20;
inline constexpr uint64_t kBytesPerInputByte = 64;

// ---- text as the reference treats it (value.cc) -------------------------------------------

// JavaScript's \s (what the reference's lexer and String.trim strip).
inline bool is_js_space(uint32_t c) {
  if (c <= 32) return c == 32 || (c >= 9 && c <= 13);
  return c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000 || c == 0xFEFF;
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

std::string js_trim(std::string_view s, bool left = true, bool right = true);
char ascii_upper(char c);
char ascii_lower(char c);
bool is_word_char(char c);
bool is_digit(char c);
std::string to_upper(std::string s);
std::string to_lower(std::string s);
// JavaScript's s.replace(/\b\w/g, toUpperCase): the first word character after a non-word one.
std::string title_case(std::string s);
// A number as JavaScript's String(number) writes it (shortest round trip).
std::string js_number(double v);

// ---- values (value.cc) ---------------------------------------------------------------------

struct Namespace;
struct Function;
struct Value;
using List = std::vector<Value>;
using Dict = std::vector<std::pair<std::string, Value>>;  // in insertion order, as JS's Map

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

const Value* find(const Dict& d, std::string_view key);
const char* type_name(const Value& v);
bool truthy(const Value& v);
// JavaScript's `a == b` on the values the reference compares.
bool loose_equal(const Value& a, const Value& b);
// JavaScript's `a === b` (list membership).
bool strict_equal(const Value& a, const Value& b);

struct JsonOptions {
  int indent = 0;  // 0: on one line
  bool ensure_ascii = false;
  bool sort_keys = false;
  bool has_separators = false;
  std::string item_separator, key_separator;
  bool undefined_as_null = true;    // false: "undefined", as the reference prints a list
  uint64_t max_bytes = UINT64_MAX;  // an error once the text grows past this
};

void json_string(std::string_view s, bool ensure_ascii, std::string* out);
Status to_json(const Value& v, const JsonOptions& o, int depth, std::string* out);
// A value as the reference's toString() writes it: {{ x }}, ~, and + with a string.
Result<std::string> text_of(const Value& v, uint64_t max_bytes = UINT64_MAX);
// A primitive as JavaScript's value.toString() (the reference's + and ~ operands).
Result<std::string> primitive_text(const Value& v, const char* op);

// ---- tokens (lexer.cc) ---------------------------------------------------------------------

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

// "chat template, line L (byte B)": where an error is.
std::string where(std::string_view source, size_t at);

// The tokens of a template's source, after the reference's preprocessing (trim_blocks,
// lstrip_blocks, the trailing newline and {% generation %} tags); an error names the offset.
Result<std::vector<Token>> lex(std::string_view source);

// ---- the syntax tree (parser.cc) -----------------------------------------------------------

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

template <size_t N>
bool one_of(const char* const (&names)[N], std::string_view name) {
  return std::find(std::begin(names), std::end(names), name) != std::end(names);
}

// The template's statements from its tokens; a syntax error or a construct kvrt cannot render
// is an error naming it with its line and byte offset in `source`.
Result<Body> parse(std::string_view source, std::vector<Token> tokens);

// ---- rendering (renderer.cc, filters.cc) ---------------------------------------------------

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

}  // namespace kvrt::text::jinja

namespace kvrt::text {

struct ChatTemplate::Program {
  std::string source;
  jinja::Body body;
};

}  // namespace kvrt::text
