#include "core/config/config.h"

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <map>
#include <sstream>
#include <system_error>
#include <tuple>
#include <type_traits>
#include <utility>
#include <variant>

#include "core/util/file.h"

namespace kvrt::config {

// Lets the loader set the private effective table without making it writable for everyone.
struct ConfigAccess {
  static void set_table(Config& config, toml::table table) {
    config.table_ = std::make_shared<const toml::table>(std::move(table));
  }
};

const toml::table& Config::table() const {
  static const toml::table kEmpty;
  return table_ ? *table_ : kEmpty;
}

const toml::table* Config::plugin_table(std::string_view section, std::string_view plugin) const {
  const toml::table* s = table()[section].as_table();
  return s ? (*s)[plugin].as_table() : nullptr;
}

namespace {

// Overrides are parsed with this prefix plus their own text as the toml++ source path, so every
// node an override brings in says where it came from, even after it is merged into the file's
// table, and errors can name the override instead of a line.
constexpr std::string_view kOverridePrefix = "--set ";
constexpr int64_t kIntMax = std::numeric_limits<int>::max();
constexpr int64_t kInt64Max = std::numeric_limits<int64_t>::max();

std::string_view Trim(std::string_view s) {
  const char* kSpace = " \t\r\n";
  size_t b = s.find_first_not_of(kSpace);
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(kSpace) - b + 1);
}

std::string Lower(std::string_view s) {
  std::string out(s);
  for (char& ch : out) ch = static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
  return out;
}

// A TOML basic string: what messages show and what to_toml writes, so it reads back exactly.
std::string Quote(std::string_view s) {
  std::string out = "\"";
  for (char ch : s) {
    switch (ch) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      default:
        if (static_cast<unsigned char>(ch) < 0x20 || ch == 0x7f) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04X", static_cast<unsigned>(ch));
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  return out + "\"";
}

// Shortest text that reads back as the same double; toml++'s own printer uses 17 digits, which
// turns 0.7 into 0.69999999999999996.
std::string FormatNumber(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char buf[64];
  auto [end, ec] = std::to_chars(buf, buf + sizeof buf, v);
  return ec == std::errc() ? std::string(buf, end) : std::to_string(v);
}

// As FormatNumber, but always a TOML float (2 -> 2.0), so the key keeps its type on reload.
std::string FormatFloat(double v) {
  std::string s = FormatNumber(v);
  if (s.find_first_of(".ein") == std::string::npos) s += ".0";
  return s;
}

// The "found ..." part of a message. Type errors name the type (`string "two"`); range errors
// only show the value (`48`), since its type was right.
std::string Describe(const toml::node& n, bool with_type) {
  auto typed = [&](std::string_view type, std::string value) {
    return with_type ? std::string(type) + " " + value : value;
  };
  switch (n.type()) {
    case toml::node_type::string:
      return typed("string", Quote(n.as_string()->get()));
    case toml::node_type::integer:
      return typed("integer", std::to_string(n.as_integer()->get()));
    case toml::node_type::floating_point:
      return typed("float", FormatFloat(n.as_floating_point()->get()));
    case toml::node_type::boolean:
      return typed("boolean", n.as_boolean()->get() ? "true" : "false");
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return "an array";
    case toml::node_type::date:
      return "a date";
    case toml::node_type::time:
      return "a time";
    case toml::node_type::date_time:
      return "a date-time";
    default:
      return "nothing";
  }
}

std::string Expected(std::string_view what, const toml::node& found, bool with_type) {
  return "expected " + std::string(what) + ", found " + Describe(found, with_type);
}

std::string Join(const std::vector<std::string>& items, std::string_view sep) {
  std::string out;
  for (const std::string& item : items) out += (out.empty() ? "" : std::string(sep)) + item;
  return out;
}

// ---------------------------------------------------------------------------------------------
// Error positions and order.

bool HasPath(const toml::source_region& r) { return r.path && !r.path->empty(); }
bool IsOverride(const toml::source_region& r) {
  return HasPath(r) &&
         std::string_view(*r.path).substr(0, kOverridePrefix.size()) == kOverridePrefix;
}

// The first region found at or below `node`: a table that only exists because of a dotted
// header has a position, but one created by merging may not while the values inside it do.
const toml::source_region* FindRegion(const toml::node& node) {
  if (node.source().begin.line > 0) return &node.source();
  if (const toml::table* t = node.as_table()) {
    for (auto&& [k, v] : *t) {
      if (const toml::source_region* r = FindRegion(v)) return r;
    }
  }
  if (const toml::array* a = node.as_array()) {
    for (const toml::node& v : *a) {
      if (const toml::source_region* r = FindRegion(v)) return r;
    }
  }
  return nullptr;
}

// Collects problems and reports the first in file order (then overrides in the order given),
// so the user fixes the file top to bottom and the message does not depend on map order.
class Reporter {
 public:
  using Ranks = std::map<std::string, size_t, std::less<>>;
  Reporter(std::string_view fallback, const Ranks* ranks) : fallback_(fallback), ranks_(ranks) {}

  // `key` (may be null) is used when it starts before the value: an unknown key is reported
  // at its name (column 1), a bad value at the value.
  void Add(const toml::key* key, const toml::node& node, const std::string& text) {
    Problem p;
    p.seq = problems_.size();
    const toml::source_region* r = FindRegion(node);
    if (r != nullptr && IsOverride(*r)) {
      p.bucket = 1;
      p.a = Rank(*r->path);
      p.message = *r->path + ": " + text;
    } else {
      toml::source_position pos{};
      if (r != nullptr) pos = r->begin;
      if (key != nullptr && key->source().begin.line > 0 &&
          (pos.line == 0 || key->source().begin < pos)) {
        pos = key->source().begin;
      }
      std::string name = r != nullptr && HasPath(*r) ? *r->path : fallback_;
      if (pos.line > 0) {
        p.bucket = 0;
        p.a = pos.line;
        p.b = pos.column;
        name += ":" + std::to_string(pos.line) + ":" + std::to_string(pos.column);
      }
      p.message = name + ": " + text;
    }
    problems_.push_back(std::move(p));
  }

  bool empty() const { return problems_.empty(); }

  Status First() const {
    if (problems_.empty()) return Status::Ok();
    auto it = std::min_element(problems_.begin(), problems_.end(), [](auto& x, auto& y) {
      return std::tie(x.bucket, x.a, x.b, x.seq) < std::tie(y.bucket, y.a, y.b, y.seq);
    });
    return Status::ConfigError(it->message);
  }

 private:
  struct Problem {
    int bucket = 2;  // 0: a file position, 1: an override, 2: neither
    uint64_t a = 0;
    uint64_t b = 0;
    size_t seq = 0;
    std::string message;
  };
  size_t Rank(const std::string& path) const {
    if (ranks_ == nullptr) return 0;
    auto it = ranks_->find(path);
    return it == ranks_->end() ? 0 : it->second;
  }

  std::string fallback_;
  const Ranks* ranks_;
  std::vector<Problem> problems_;
};

// ---------------------------------------------------------------------------------------------
// The schema: one row per known key. `read` checks a node and stores it; `get` gives the value
// back for defaults and to_toml, so the Config's member initializers are the only defaults.

using Value = std::variant<int64_t, double, std::string, std::vector<std::string>, bool>;

struct Field {
  std::string_view section;
  std::string_view key;
  // "" when accepted and stored, else "expected X, found Y".
  std::function<std::string(const toml::node&, Config&)> read;
  std::function<Value(const Config&)> get;
};

// `slot` is a generic lambda `[](auto& c) -> auto& { return c.x.y; }`, usable on a const
// Config (get) and a mutable one (read).
template <class Slot>
using SlotType = std::remove_reference_t<decltype(std::declval<Slot>()(std::declval<Config&>()))>;

// An integer in [lo, hi] that also passes `extra`; `what` replaces the generated description.
template <class Slot>
Field IntField(std::string_view section, std::string_view key, Slot slot, int64_t lo, int64_t hi,
               std::string what = "", bool (*extra)(int64_t) = nullptr) {
  return {section, key,
          [=](const toml::node& n, Config& c) -> std::string {
            if (!n.is_integer()) return Expected("an integer", n, true);
            int64_t v = n.as_integer()->get();
            if (v >= lo && v <= hi && (extra == nullptr || extra(v))) {
              slot(c) = static_cast<SlotType<Slot>>(v);
              return "";
            }
            if (!what.empty()) return Expected(what, n, false);
            // hi at the storage type's limit is a representation bound, not a tuning one: only
            // mention it to someone who went past it.
            if (hi >= kIntMax) {
              return Expected(v < lo ? "an integer >= " + std::to_string(lo)
                                     : "an integer <= " + std::to_string(hi),
                              n, false);
            }
            return Expected(
                "an integer between " + std::to_string(lo) + " and " + std::to_string(hi), n,
                false);
          },
          [=](const Config& c) -> Value { return static_cast<int64_t>(slot(c)); }};
}

// A number in (lo, hi) or (lo, hi]; integers are accepted, as a user writing `1` means 1.0.
template <class Slot>
Field FloatField(std::string_view section, std::string_view key, Slot slot, double lo, double hi,
                 bool hi_inclusive) {
  std::string what =
      "a number in (" + FormatNumber(lo) + ", " + FormatNumber(hi) + (hi_inclusive ? "]" : ")");
  return {section, key,
          [=](const toml::node& n, Config& c) -> std::string {
            if (!n.is_number()) return Expected("a number", n, true);
            double v = n.is_integer() ? static_cast<double>(n.as_integer()->get())
                                      : n.as_floating_point()->get();
            // Written so that NaN fails.
            if (!(v > lo && (hi_inclusive ? v <= hi : v < hi))) return Expected(what, n, false);
            slot(c) = v;
            return "";
          },
          [=](const Config& c) -> Value { return slot(c); }};
}

template <class Slot>
Field StringField(std::string_view section, std::string_view key, Slot slot,
                  std::vector<std::string> choices, bool allow_empty) {
  std::vector<std::string> quoted;
  for (const std::string& choice : choices) quoted.push_back(Quote(choice));
  std::string what = "one of " + Join(quoted, ", ");
  return {section, key,
          [=](const toml::node& n, Config& c) -> std::string {
            if (!n.is_string()) return Expected("a string", n, true);
            const std::string& v = n.as_string()->get();
            if (!choices.empty() && std::find(choices.begin(), choices.end(), v) == choices.end()) {
              return Expected(what, n, false);
            }
            if (v.empty() && !allow_empty) return Expected("a non-empty string", n, false);
            slot(c) = v;
            return "";
          },
          [=](const Config& c) -> Value { return slot(c); }};
}

template <class Slot>
Field StringArrayField(std::string_view section, std::string_view key, Slot slot) {
  return {section, key,
          [=](const toml::node& n, Config& c) -> std::string {
            const toml::array* a = n.as_array();
            if (a == nullptr) return Expected("an array of strings", n, true);
            std::vector<std::string> values;
            for (size_t i = 0; i < a->size(); ++i) {
              const toml::node& item = *a->get(i);
              if (!item.is_string()) {
                return Expected("an array of strings", item, true) + " at index " +
                       std::to_string(i);
              }
              values.push_back(item.as_string()->get());
            }
            slot(c) = std::move(values);
            return "";
          },
          [=](const Config& c) -> Value { return slot(c); }};
}

template <class Slot>
Field BoolField(std::string_view section, std::string_view key, Slot slot) {
  return {section, key,
          [=](const toml::node& n, Config& c) -> std::string {
            if (!n.is_boolean()) return Expected("true or false", n, true);
            slot(c) = n.as_boolean()->get();
            return "";
          },
          [=](const Config& c) -> Value { return slot(c); }};
}

// device.memory: a size string or a count of bytes; keeps the spelling for to_toml and the
// value for the capacity arithmetic.
Field MemoryField() {
  return {"device", "memory",
          [](const toml::node& n, Config& c) -> std::string {
            constexpr std::string_view kWhat =
                "a size > 0 such as \"2GiB\", \"512MiB\", \"1.5GB\" or a number of bytes";
            std::optional<uint64_t> bytes;
            std::string text;
            if (const auto* s = n.as_string()) {
              text = s->get();
              bytes = parse_size(text);
            } else if (const auto* i = n.as_integer()) {
              text = std::to_string(i->get());
              if (i->get() > 0) bytes = static_cast<uint64_t>(i->get());
            } else {
              return Expected(kWhat, n, true);
            }
            if (!bytes || *bytes == 0) return Expected(kWhat, n, false);
            c.device.memory = text;
            c.device.memory_bytes = *bytes;
            return "";
          },
          [](const Config& c) -> Value { return c.device.memory; }};
}

bool IsPowerOfTwo(int64_t v) { return v > 0 && (v & (v - 1)) == 0; }

const std::vector<Field>& Schema() {
  // One row per key; the formatter's wrapping of lambda arguments hides the table.
  // clang-format off
  static const std::vector<Field> kFields = {
      StringField("model", "preset", [](auto& c) -> auto& { return c.model.preset; }, {}, false),
      StringField("model", "path", [](auto& c) -> auto& { return c.model.path; }, {}, true),
      StringField("model", "dtype", [](auto& c) -> auto& { return c.model.dtype; },
                  {"bf16", "f32", "auto"}, false),
      StringField("model", "matmul_precision",
                  [](auto& c) -> auto& { return c.model.matmul_precision; },
                  {"auto", "highest", "medium"}, false),
      StringField("model", "quantization",
                  [](auto& c) -> auto& { return c.model.quantization; },
                  {"none", "int4", "fp8"}, false),
      StringField("device", "kind", [](auto& c) -> auto& { return c.device.kind; },
                  {"cpu", "cuda"}, false),
      IntField("device", "ordinal", [](auto& c) -> auto& { return c.device.ordinal; }, 0, kIntMax),
      MemoryField(),
      IntField("tp", "size", [](auto& c) -> auto& { return c.tp.size; }, 1, 8),
      StringField("tp", "backend", [](auto& c) -> auto& { return c.tp.backend; },
                  {"auto", "threads", "mpi"}, false),
      FloatField("tp", "timeout_s", [](auto& c) -> auto& { return c.tp.timeout_s; }, 0, 86400,
                 false),
      IntField("tp", "dcp_size", [](auto& c) -> auto& { return c.tp.dcp_size; }, 1, 8),
      StringField("kv", "store", [](auto& c) -> auto& { return c.kv.store; }, {}, false),
      StringField("attention", "backend", [](auto& c) -> auto& { return c.attention.backend; },
                  {}, false),
      FloatField("scheduler", "mem_fraction_static",
                 [](auto& c) -> auto& { return c.scheduler.mem_fraction_static; }, 0, 1, false),
      IntField("scheduler", "page_size", [](auto& c) -> auto& { return c.scheduler.page_size; },
               1, 1024, "a power of two between 1 and 1024", IsPowerOfTwo),
      IntField("scheduler", "chunked_prefill_size",
               [](auto& c) -> auto& { return c.scheduler.chunked_prefill_size; }, -1, kInt64Max,
               "an integer >= 1, or -1 to disable chunking", [](int64_t v) { return v != 0; }),
      IntField("scheduler", "max_running_requests",
               [](auto& c) -> auto& { return c.scheduler.max_running_requests; }, 1, kIntMax),
      IntField("scheduler", "max_prefill_tokens",
               [](auto& c) -> auto& { return c.scheduler.max_prefill_tokens; }, 1, kInt64Max),
      IntField("scheduler", "num_continuous_decode_steps",
               [](auto& c) -> auto& { return c.scheduler.num_continuous_decode_steps; }, 1,
               kIntMax),
      FloatField("scheduler", "new_token_ratio",
                 [](auto& c) -> auto& { return c.scheduler.new_token_ratio; }, 0, 1, true),
      FloatField("scheduler", "new_token_ratio_decay",
                 [](auto& c) -> auto& { return c.scheduler.new_token_ratio_decay; }, 0, 1, true),
      FloatField("scheduler", "min_new_token_ratio",
                 [](auto& c) -> auto& { return c.scheduler.min_new_token_ratio; }, 0, 1, true),
      IntField("scheduler", "max_new_tokens_clip",
               [](auto& c) -> auto& { return c.scheduler.max_new_tokens_clip; }, 1, kInt64Max),
      StringField("scheduler", "schedule_policy",
                  [](auto& c) -> auto& { return c.scheduler.schedule_policy; }, {"fcfs", "lpm"},
                  false),
      IntField("scheduler", "log_interval",
               [](auto& c) -> auto& { return c.scheduler.log_interval; }, 1, kIntMax),
      IntField("scheduler", "tier_min_load_pages",
               [](auto& c) -> auto& { return c.scheduler.tier_min_load_pages; }, 1, kInt64Max),
      StringField("server", "host", [](auto& c) -> auto& { return c.server.host; }, {}, false),
      IntField("server", "port", [](auto& c) -> auto& { return c.server.port; }, 0, 65535,
               "a port between 1 and 65535, or 0 for any free port"),
      IntField("server", "network_threads",
               [](auto& c) -> auto& { return c.server.network_threads; }, 1, 64),
      IntField("server", "max_queued_requests",
               [](auto& c) -> auto& { return c.server.max_queued_requests; }, 1, kIntMax),
      IntField("server", "max_connections",
               [](auto& c) -> auto& { return c.server.max_connections; }, 1, kIntMax),
      IntField("server", "max_body_bytes",
               [](auto& c) -> auto& { return c.server.max_body_bytes; }, 1, int64_t{1} << 30),
      FloatField("server", "request_timeout_s",
                 [](auto& c) -> auto& { return c.server.request_timeout_s; }, 0, 86400, true),
      IntField("server", "stream_interval",
               [](auto& c) -> auto& { return c.server.stream_interval; }, 1, kIntMax),
      FloatField("server", "header_timeout_s",
                 [](auto& c) -> auto& { return c.server.header_timeout_s; }, 0, 86400, true),
      FloatField("server", "body_timeout_s",
                 [](auto& c) -> auto& { return c.server.body_timeout_s; }, 0, 86400, true),
      FloatField("server", "idle_timeout_s",
                 [](auto& c) -> auto& { return c.server.idle_timeout_s; }, 0, 86400, true),
      FloatField("server", "shutdown_grace_s",
                 [](auto& c) -> auto& { return c.server.shutdown_grace_s; }, 0, 3600, true),
      StringField("server", "api_key", [](auto& c) -> auto& { return c.server.api_key; }, {},
                  true),
      StringField("server", "record_trace",
                  [](auto& c) -> auto& { return c.server.record_trace; }, {}, true),
      StringField("server", "chat_template",
                  [](auto& c) -> auto& { return c.server.chat_template; }, {}, true),
      BoolField("server", "incremental_streaming_output",
                [](auto& c) -> auto& { return c.server.incremental_streaming_output; }),
      StringField("server", "metric_names",
                  [](auto& c) -> auto& { return c.server.metric_names; },
                  {"kvrt", "sglang", "both"}, false),
      StringArrayField("plugins", "path", [](auto& c) -> auto& { return c.plugin_paths; }),
      BoolField("plugins", "verify", [](auto& c) -> auto& { return c.verify_plugins; }),
  };
  // clang-format on
  return kFields;
}

// Sections whose sub-tables ([kv.<plugin>]) hold a plugin's options, checked by the plugin
// loader against what the plugin declares.
bool HoldsPluginTables(std::string_view section) {
  return section == "kv" || section == "attention";
}

std::vector<std::string> SectionNames() {
  std::vector<std::string> names;
  for (const Field& f : Schema()) {
    if (names.empty() || names.back() != f.section) names.emplace_back(f.section);
  }
  return names;
}

std::vector<std::string> KeysOf(std::string_view section) {
  std::vector<std::string> keys;
  for (const Field& f : Schema()) {
    if (f.section == section) keys.emplace_back(f.key);
  }
  return keys;
}

const Field* FindField(std::string_view section, std::string_view key) {
  for (const Field& f : Schema()) {
    if (f.section == section && f.key == key) return &f;
  }
  return nullptr;
}

std::string KnownList(const std::vector<std::string>& known) {
  return known.empty() ? " (no keys are accepted here)" : " (known: " + Join(known, ", ") + ")";
}

// `section` is "" at the top level.
std::string UnknownKey(std::string_view section, std::string_view key) {
  std::string prefix = section.empty() ? "" : std::string(section) + ".";
  std::vector<std::string> known = section.empty() ? SectionNames() : KeysOf(section);
  std::string hint = suggest(key, known);
  if (!hint.empty()) {
    hint = prefix + hint;
  } else {
    // A key under the wrong header, or above every header: name where it belongs.
    std::vector<std::string> all_keys;
    for (const Field& f : Schema()) all_keys.emplace_back(f.key);
    std::string near = suggest(key, all_keys);
    for (const Field& f : Schema()) {
      if (!near.empty() && f.key == near && f.section != section) {
        hint = std::string(f.section) + "." + near;
        break;
      }
    }
  }
  std::string message = "unknown key '" + prefix + std::string(key) + "'";
  if (!hint.empty()) return message + " (did you mean '" + hint + "'?)";
  if (HoldsPluginTables(section)) known.push_back("[" + prefix + "<plugin>]");
  return message + KnownList(known);
}

void Validate(const toml::table& merged, Config& c, Reporter& reporter) {
  const std::vector<std::string> sections = SectionNames();
  for (auto&& [k, node] : merged) {
    std::string_view section = k.str();
    if (std::find(sections.begin(), sections.end(), section) == sections.end()) {
      reporter.Add(&k, node, UnknownKey("", section));
      continue;
    }
    const toml::table* table = node.as_table();
    if (table == nullptr) {
      reporter.Add(&k, node, std::string(section) + ": " + Expected("a table", node, true));
      continue;
    }
    for (auto&& [k2, value] : *table) {
      if (const Field* f = FindField(section, k2.str())) {
        std::string problem = f->read(value, c);
        if (!problem.empty()) {
          reporter.Add(nullptr, value,
                       std::string(section) + "." + std::string(k2.str()) + ": " + problem);
        }
      } else if (!(HoldsPluginTables(section) && value.is_table())) {
        reporter.Add(&k2, value, UnknownKey(section, k2.str()));
      }
    }
  }
  // The reservation ratio decays from new_token_ratio down to min_new_token_ratio; the other
  // way round it would grow. Only checked on otherwise valid values, else it reports defaults.
  if (reporter.empty() && c.scheduler.min_new_token_ratio > c.scheduler.new_token_ratio) {
    const toml::table& s = *merged["scheduler"].as_table();  // present: a default was changed
    if (const toml::node* n = s["min_new_token_ratio"].node()) {
      reporter.Add(nullptr, *n,
                   "scheduler.min_new_token_ratio: expected a number <= "
                   "scheduler.new_token_ratio (" +
                       FormatNumber(c.scheduler.new_token_ratio) + "), found " +
                       Describe(*n, false));
    } else {
      const toml::node& r = *s["new_token_ratio"].node();
      reporter.Add(nullptr, r,
                   "scheduler.new_token_ratio: expected a number >= "
                   "scheduler.min_new_token_ratio (" +
                       FormatNumber(c.scheduler.min_new_token_ratio) + "), found " +
                       Describe(r, false));
    }
  }
}

// tp.dcp_size splits each group of ranks that hold the same KV, so it divides tp.size (the
// model decides which groups hold the same KV: checked when it is loaded).
void CheckDcp(const Config& c, const toml::table& merged, Reporter& reporter) {
  if (!reporter.empty() || c.tp.size % c.tp.dcp_size == 0) return;
  const toml::table& tp = *merged["tp"].as_table();  // present: a default was changed
  const toml::node& n = *tp["dcp_size"].node();
  reporter.Add(nullptr, n,
               "tp.dcp_size: expected a divisor of tp.size (" + std::to_string(c.tp.size) +
                   "), found " + Describe(n, false));
}

// Writes the value of every key the file and overrides left out, and turns integers given for
// float keys into floats, so table() agrees with the typed fields.
void FillDefaults(toml::table& merged, const Config& c) {
  for (const Field& f : Schema()) {
    toml::table* section = merged[f.section].as_table();
    if (section == nullptr) {
      section = merged.insert_or_assign(f.section, toml::table{}).first->second.as_table();
    }
    const toml::node* existing = section->get(f.key);
    Value v = f.get(c);
    if (existing != nullptr && !(existing->is_integer() && std::holds_alternative<double>(v))) {
      continue;
    }
    std::visit(
        [&](const auto& x) {
          if constexpr (std::is_same_v<std::decay_t<decltype(x)>, std::vector<std::string>>) {
            toml::array array;
            for (const std::string& s : x) array.push_back(s);
            section->insert_or_assign(f.key, std::move(array));
          } else {
            section->insert_or_assign(f.key, x);
          }
        },
        v);
  }
}

// Deep merge: tables merge key by key, anything else is replaced by the override.
void Merge(toml::table& into, toml::table& from) {
  for (auto&& [k, v] : from) {
    toml::table* existing = into[k.str()].as_table();
    if (existing != nullptr && v.is_table()) {
      Merge(*existing, *v.as_table());
    } else {
      into.insert_or_assign(k, std::move(v));
    }
  }
}

Status ApplyOverride(toml::table& into, const std::string& text) {
  const std::string where = std::string(kOverridePrefix) + text;
  size_t eq = text.find('=');
  std::string_view key = eq == std::string::npos ? "" : Trim(std::string_view(text).substr(0, eq));
  if (key.empty() || key.find_first_of("\r\n") != std::string_view::npos) {
    return Status::ConfigError(where + ": expected section.key=value");
  }
  std::string_view value = Trim(std::string_view(text).substr(eq + 1));
  // Letting toml++ read "key = value" handles dotted and quoted keys and every value type. A
  // value on several lines could define more keys than the one named, so it stays a string.
  if (value.find_first_of("\r\n") == std::string_view::npos) {
    try {
      toml::table parsed = toml::parse(std::string(key) + " = " + std::string(value), where);
      Merge(into, parsed);
      return Status::Ok();
    } catch (const toml::parse_error&) {
      // Not a TOML value: a bare string, below.
    }
  }
  try {
    toml::table parsed = toml::parse(std::string(key) + " = " + Quote(value), where);
    Merge(into, parsed);
    return Status::Ok();
  } catch (const toml::parse_error& e) {
    // Quoted, any value reads, short of bytes that are not UTF-8; else the key is at fault.
    try {
      (void)toml::parse(std::string(key) + " = 0", where);
    } catch (const toml::parse_error&) {
      return Status::ConfigError(where + ": bad key '" + std::string(key) +
                                 "': " + std::string(e.description()));
    }
    return Status::ConfigError(where + ": " + std::string(e.description()));
  }
}

}  // namespace

Result<Config> load_string(std::string_view toml_text, std::string_view source_name,
                           const std::vector<std::string>& overrides) {
  toml::table merged;
  try {
    merged = toml::parse(toml_text, source_name);
  } catch (const toml::parse_error& e) {
    const toml::source_region& r = e.source();
    return Status::ConfigError(std::string(source_name) + ":" + std::to_string(r.begin.line) + ":" +
                               std::to_string(r.begin.column) + ": " +
                               std::string(e.description()));
  }
  Reporter::Ranks ranks;
  for (size_t i = 0; i < overrides.size(); ++i) {
    if (Status s = ApplyOverride(merged, overrides[i]); !s.ok()) return s;
    ranks.emplace(std::string(kOverridePrefix) + overrides[i], i);
  }
  Config config;
  config.source = std::string(source_name);
  Reporter reporter(source_name, &ranks);
  Validate(merged, config, reporter);
  CheckDcp(config, merged, reporter);
  if (Status s = reporter.First(); !s.ok()) return s;
  FillDefaults(merged, config);
  ConfigAccess::set_table(config, std::move(merged));
  return config;
}

Result<Config> load_file(const std::string& path, const std::vector<std::string>& overrides) {
  Result<std::string> text = util::read_file(path, kConfigFile);
  if (!text.ok()) return Status::ConfigError(text.status().message());
  return load_string(*text, path, overrides);
}

Result<Config> load(const std::string& path, const std::vector<std::string>& overrides) {
  return path.empty() ? load_string("", "<defaults>", overrides) : load_file(path, overrides);
}

Result<Config> defaults() { return load_string("", "<defaults>", {}); }

std::string to_toml(const Config& config) {
  std::string source = config.source;
  std::replace_if(
      source.begin(), source.end(), [](char ch) { return ch == '\n' || ch == '\r'; }, ' ');
  std::string out = "# kvrt effective configuration (source: " + source + ")\n";
  auto plugin_tables = [&](std::string_view section) {
    const toml::table* s = config.table()[section].as_table();
    if (!HoldsPluginTables(section) || s == nullptr) return;
    // Streamed by toml++ from a root holding only the sub-tables, so nested tables get their
    // full [kv.<plugin>.<x>] headers.
    toml::table plugins;
    for (auto&& [name, value] : *s) {
      if (!value.is_table()) continue;
      toml::table copy = *value.as_table();
      // Written inline (kv = { p = {...} }), it would print under a second [kv] header.
      copy.is_inline(false);
      plugins.insert(name, std::move(copy));
    }
    if (plugins.empty()) return;
    toml::table root;
    root.insert(section, std::move(plugins));
    std::ostringstream text;
    text << root;
    out += "\n" + text.str() + "\n";
  };
  std::string_view section;
  for (const Field& f : Schema()) {
    if (f.section != section) {
      if (!section.empty()) plugin_tables(section);
      section = f.section;
      out += "\n[" + std::string(section) + "]\n";
    }
    out += std::string(f.key) + " = ";
    std::visit(
        [&](const auto& x) {
          using X = std::decay_t<decltype(x)>;
          if constexpr (std::is_same_v<X, int64_t>) {
            out += std::to_string(x);
          } else if constexpr (std::is_same_v<X, double>) {
            out += FormatFloat(x);
          } else if constexpr (std::is_same_v<X, std::string>) {
            out += Quote(x);
          } else if constexpr (std::is_same_v<X, bool>) {
            out += x ? "true" : "false";
          } else {
            std::vector<std::string> quoted;
            for (const std::string& s : x) quoted.push_back(Quote(s));
            out += "[" + Join(quoted, ", ") + "]";
          }
        },
        f.get(config));
    out += "\n";
  }
  plugin_tables(section);
  return out;
}

std::optional<uint64_t> parse_size(std::string_view text) {
  text = Trim(text);
  size_t end = 0;
  bool fraction = false;
  while (end < text.size() &&
         (std::isdigit(static_cast<unsigned char>(text[end])) || (text[end] == '.' && !fraction))) {
    fraction |= text[end] == '.';
    ++end;
  }
  std::string_view number = text.substr(0, end);
  if (number.find_first_of("0123456789") == std::string_view::npos) return std::nullopt;
  static const std::map<std::string, uint64_t, std::less<>> kUnits = {
      {"", 1},
      {"b", 1},
      {"k", uint64_t{1} << 10},
      {"kib", uint64_t{1} << 10},
      {"kb", 1000},
      {"m", uint64_t{1} << 20},
      {"mib", uint64_t{1} << 20},
      {"mb", 1000 * 1000},
      {"g", uint64_t{1} << 30},
      {"gib", uint64_t{1} << 30},
      {"gb", 1000 * 1000 * 1000},
      {"t", uint64_t{1} << 40},
      {"tib", uint64_t{1} << 40},
      {"tb", uint64_t{1000} * 1000 * 1000 * 1000},
  };
  auto unit = kUnits.find(Lower(Trim(text.substr(end))));
  if (unit == kUnits.end()) return std::nullopt;
  const uint64_t scale = unit->second;
  if (!fraction) {
    // Whole numbers stay in integers: a byte count above 2^53 would not survive a double.
    uint64_t n = 0;
    auto [p, ec] = std::from_chars(number.data(), number.data() + number.size(), n);
    if (ec != std::errc() || n > std::numeric_limits<uint64_t>::max() / scale) return std::nullopt;
    return n * scale;
  }
  double n = 0;
  auto [p, ec] = std::from_chars(number.data(), number.data() + number.size(), n);
  if (ec != std::errc() || p != number.data() + number.size()) return std::nullopt;
  const double bytes = std::floor(n * static_cast<double>(scale));
  if (!(bytes < 18446744073709551616.0)) return std::nullopt;  // 2^64
  return static_cast<uint64_t>(bytes);
}

std::string position_of(const toml::node& node, std::string_view fallback) {
  Reporter reporter(fallback, nullptr);
  reporter.Add(nullptr, node, "");
  std::string where = reporter.First().message();
  return where.substr(0, where.size() - 2);  // the empty text's ": "
}

Status validate_keys(const toml::table& table, const std::vector<KeySpec>& keys,
                     std::string_view source, std::string_view table_path) {
  using Type = KeySpec::Type;
  Reporter reporter(source, nullptr);
  std::string prefix = table_path.empty() ? "" : std::string(table_path) + ".";
  std::vector<std::string> names;
  for (const KeySpec& spec : keys) names.push_back(spec.name);
  for (auto&& [k, value] : table) {
    std::string dotted = prefix + std::string(k.str());
    const std::string_view name = k.str();  // a structured binding cannot be captured (clang 14)
    auto spec =
        std::find_if(keys.begin(), keys.end(), [&](const KeySpec& s) { return s.name == name; });
    if (spec == keys.end()) {
      std::string hint = suggest(k.str(), names);
      reporter.Add(
          &k, value,
          "unknown key '" + dotted + "'" +
              (hint.empty() ? KnownList(names) : " (did you mean '" + prefix + hint + "'?)"));
      continue;
    }
    std::string problem;
    switch (spec->type) {
      case Type::kString:
        if (!value.is_string()) problem = Expected("a string", value, true);
        break;
      case Type::kInt:
        if (!value.is_integer()) problem = Expected("an integer", value, true);
        break;
      case Type::kFloat:
        if (!value.is_number()) problem = Expected("a number", value, true);
        break;
      case Type::kBool:
        if (!value.is_boolean()) problem = Expected("a boolean", value, true);
        break;
      case Type::kTable:
        if (!value.is_table()) problem = Expected("a table", value, true);
        break;
      case Type::kStringArray:
        if (const toml::array* a = value.as_array()) {
          for (size_t i = 0; i < a->size() && problem.empty(); ++i) {
            if (!a->get(i)->is_string()) {
              problem = Expected("an array of strings", *a->get(i), true) + " at index " +
                        std::to_string(i);
            }
          }
        } else {
          problem = Expected("an array of strings", value, true);
        }
        break;
    }
    if (!problem.empty()) reporter.Add(nullptr, value, dotted + ": " + problem);
  }
  return reporter.First();
}

// Optimal string alignment distance: Levenshtein plus adjacent transpositions, the most common
// typing slip ("pgae_size").
std::string suggest(std::string_view unknown, const std::vector<std::string>& known) {
  const std::string a = Lower(unknown);
  const size_t limit = a.size() <= 3 ? 1 : 2;
  std::string best;
  size_t best_distance = limit + 1;
  for (const std::string& candidate : known) {
    const std::string b = Lower(candidate);
    std::vector<std::vector<size_t>> d(a.size() + 1, std::vector<size_t>(b.size() + 1));
    for (size_t i = 0; i <= a.size(); ++i) d[i][0] = i;
    for (size_t j = 0; j <= b.size(); ++j) d[0][j] = j;
    for (size_t i = 1; i <= a.size(); ++i) {
      for (size_t j = 1; j <= b.size(); ++j) {
        size_t cost = a[i - 1] == b[j - 1] ? 0 : 1;
        d[i][j] = std::min({d[i - 1][j] + 1, d[i][j - 1] + 1, d[i - 1][j - 1] + cost});
        if (i > 1 && j > 1 && a[i - 1] == b[j - 2] && a[i - 2] == b[j - 1]) {
          d[i][j] = std::min(d[i][j], d[i - 2][j - 2] + 1);
        }
      }
    }
    if (d[a.size()][b.size()] < best_distance) {
      best_distance = d[a.size()][b.size()];
      best = candidate;
    }
  }
  return best;
}

}  // namespace kvrt::config
