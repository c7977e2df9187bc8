#include "core/bench/workload.h"

#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <iterator>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <sstream>

#include "core/config/config.h"
#include "core/util/file.h"

namespace kvrt::bench {
namespace {

constexpr util::FileKind kWorkloadFile{"workload file", 4 * util::kMiB};
constexpr util::FileKind kTraceFile{"trace", 256 * util::kMiB};

std::string where(const toml::node& node, const std::string& source) {
  const toml::source_region& r = node.source();
  if (r.begin.line == 0) return source;
  return source + ":" + std::to_string(r.begin.line) + ":" + std::to_string(r.begin.column);
}

// Reads an integer key in [lo, hi] (kept at its default when absent).
Status read_int(const toml::table& t, const char* key, const std::string& path,
                const std::string& source, int64_t lo, int64_t hi, int64_t* out) {
  const toml::node* n = t.get(key);
  if (n == nullptr) return Status::Ok();
  std::optional<int64_t> v = n->value<int64_t>();
  if (!v || *v < lo || *v > hi) {
    return Status::ConfigError(where(*n, source) + ": " + path + "." + key +
                               ": expected an integer in [" + std::to_string(lo) + ", " +
                               std::to_string(hi) + "]");
  }
  *out = *v;
  return Status::Ok();
}

Status read_float(const toml::table& t, const char* key, const std::string& path,
                  const std::string& source, double lo, double hi, double* out) {
  const toml::node* n = t.get(key);
  if (n == nullptr) return Status::Ok();
  std::optional<double> v = n->value<double>();
  if (!v || !(*v >= lo && *v <= hi)) {
    std::ostringstream range;
    range << "[" << lo << ", " << hi << "]";
    return Status::ConfigError(where(*n, source) + ": " + path + "." + key +
                               ": expected a number in " + range.str());
  }
  *out = *v;
  return Status::Ok();
}

// [workload.sampling]: every generated request's sampling (its seed is set per request).
Status read_sampling(const toml::table& parent, const std::string& source,
                     std::optional<sampling::SamplingParams>* out) {
  const toml::node* node = parent.get("sampling");
  if (node == nullptr) return Status::Ok();
  const toml::table* t = node->as_table();
  if (t == nullptr) {
    return Status::ConfigError(where(*node, source) + ": workload.sampling: expected a table");
  }
  using T = config::KeySpec::Type;
  if (Status s = config::validate_keys(
          *t,
          {{"temperature", T::kFloat, "0 = greedy"},
           {"top_p", T::kFloat, "nucleus mass in (0, 1]"},
           {"top_k", T::kInt, "0 = every token"},
           {"min_p", T::kFloat, "probability floor relative to the likeliest, [0, 1]"}},
          source, "workload.sampling");
      !s.ok()) {
    return s;
  }
  double temperature = 1.0, top_p = 1.0, min_p = 0.0;
  int64_t top_k = 0;
  const std::string path = "workload.sampling";
  if (Status s = read_float(*t, "temperature", path, source, 0, 1e6, &temperature); !s.ok()) {
    return s;
  }
  if (Status s = read_float(*t, "top_p", path, source, 0, 1, &top_p); !s.ok()) return s;
  if (top_p <= 0) {
    return Status::ConfigError(where(*t->get("top_p"), source) +
                               ": workload.sampling.top_p: expected a number in (0, 1]");
  }
  if (Status s = read_int(*t, "top_k", path, source, 0, INT32_MAX, &top_k); !s.ok()) return s;
  if (Status s = read_float(*t, "min_p", path, source, 0, 1, &min_p); !s.ok()) return s;
  sampling::SamplingParams p;
  p.temperature = static_cast<float>(temperature);
  p.top_p = static_cast<float>(top_p);
  p.top_k = static_cast<int32_t>(top_k);
  p.min_p = static_cast<float>(min_p);
  *out = p;
  return Status::Ok();
}

Status read_dist(const toml::table& parent, const char* key, const std::string& source,
                 LengthDist* out) {
  const toml::node* node = parent.get(key);
  if (node == nullptr) return Status::Ok();
  const std::string path = std::string("workload.") + key;
  const toml::table* t = node->as_table();
  if (t == nullptr) {
    return Status::ConfigError(where(*node, source) + ": " + path + ": expected a table");
  }
  using T = config::KeySpec::Type;
  if (Status s = config::validate_keys(*t,
                                       {{"dist", T::kString, "fixed | uniform | lognormal"},
                                        {"value", T::kInt, "fixed length"},
                                        {"min", T::kInt, "smallest length"},
                                        {"max", T::kInt, "largest length"},
                                        {"mean", T::kFloat, "lognormal mean"},
                                        {"sigma", T::kFloat, "lognormal spread"}},
                                       source, path);
      !s.ok()) {
    return s;
  }
  const std::string dist = t->get("dist") ? t->get("dist")->value_or(std::string("?")) : "fixed";
  if (dist == "fixed") {
    out->kind = LengthDist::Kind::kFixed;
  } else if (dist == "uniform") {
    out->kind = LengthDist::Kind::kUniform;
  } else if (dist == "lognormal") {
    out->kind = LengthDist::Kind::kLognormal;
  } else {
    return Status::ConfigError(where(*t->get("dist"), source) + ": " + path +
                               ".dist: expected \"fixed\", \"uniform\" or \"lognormal\", found \"" +
                               dist + "\"");
  }
  const int64_t kMax = kMaxLength;
  if (Status s = read_int(*t, "value", path, source, 1, kMax, &out->value); !s.ok()) return s;
  if (Status s = read_int(*t, "min", path, source, 1, kMax, &out->min); !s.ok()) return s;
  if (Status s = read_int(*t, "max", path, source, 1, kMax, &out->max); !s.ok()) return s;
  if (Status s = read_float(*t, "mean", path, source, 1, kMax, &out->mean); !s.ok()) return s;
  if (Status s = read_float(*t, "sigma", path, source, 0, 4, &out->sigma); !s.ok()) return s;
  if (out->kind != LengthDist::Kind::kFixed && out->min > out->max) {
    return Status::ConfigError(where(*t, source) + ": " + path + ": min (" +
                               std::to_string(out->min) + ") is above max (" +
                               std::to_string(out->max) + ")");
  }
  return Status::Ok();
}

// A trace line's sampling keys (`at` is "file:line: "), checked with the ranges the serving
// core accepts so a replay is refused here, naming the line, rather than request by request.
Status read_trace_sampling(const nlohmann::json& j, const std::string& at,
                           std::optional<sampling::SamplingParams>* out) {
  static const char* const kKeys[] = {"temperature",
                                      "top_p",
                                      "top_k",
                                      "min_p",
                                      "seed",
                                      "frequency_penalty",
                                      "presence_penalty",
                                      "repetition_penalty"};
  if (std::none_of(std::begin(kKeys), std::end(kKeys),
                   [&j](const char* k) { return j.contains(k); })) {
    return Status::Ok();
  }
  sampling::SamplingParams p;
  struct Real {
    const char* key;
    float* field;
    double lo, hi;
    bool open_lo;  // lo itself excluded
  };
  const Real reals[] = {{"temperature", &p.temperature, 0, 1e6, false},
                        {"top_p", &p.top_p, 0, 1, true},
                        {"min_p", &p.min_p, 0, 1, false},
                        {"frequency_penalty", &p.frequency_penalty, -2, 2, false},
                        {"presence_penalty", &p.presence_penalty, -2, 2, false},
                        {"repetition_penalty", &p.repetition_penalty, 0, 1e6, true}};
  for (const Real& r : reals) {
    if (!j.contains(r.key)) continue;
    const nlohmann::json& v = j[r.key];
    const bool ok = v.is_number() && v.get<double>() <= r.hi &&
                    (r.open_lo ? v.get<double>() > r.lo : v.get<double>() >= r.lo);
    if (!ok) {
      std::ostringstream range;
      range << (r.open_lo ? "(" : "[") << r.lo << ", " << r.hi << "]";
      return Status::ConfigError(at + "\"" + r.key + "\": expected a number in " + range.str() +
                                 ", found " + v.dump());
    }
    *r.field = v.get<float>();
  }
  if (j.contains("top_k")) {
    const nlohmann::json& v = j["top_k"];
    if (!v.is_number_integer() || v.get<int64_t>() < -1 || v.get<int64_t>() > INT32_MAX) {
      return Status::ConfigError(at + "\"top_k\": expected -1, 0 (every token) or more, found " +
                                 v.dump());
    }
    p.top_k = v.get<int64_t>() < 0 ? 0 : static_cast<int32_t>(v.get<int64_t>());
  }
  if (j.contains("seed")) {
    const nlohmann::json& v = j["seed"];
    if (!v.is_number_integer()) {
      return Status::ConfigError(at + "\"seed\": expected an integer, found " + v.dump());
    }
    p.seed = v.is_number_unsigned() ? v.get<uint64_t>() : static_cast<uint64_t>(v.get<int64_t>());
  }
  *out = p;
  return Status::Ok();
}

}  // namespace

int64_t LengthDist::sample(std::mt19937_64& rng) const {
  switch (kind) {
    case Kind::kFixed:
      return value;
    case Kind::kUniform:
      return std::uniform_int_distribution<int64_t>(min, max)(rng);
    case Kind::kLognormal: {
      // mean = exp(mu + sigma^2 / 2)
      const double mu = std::log(mean) - sigma * sigma / 2;
      const double x = std::lognormal_distribution<double>(mu, sigma)(rng);
      // Clamped before rounding: a far tail (or inf) must not reach the integer conversion.
      const double clamped =
          std::clamp(x, static_cast<double>(min), static_cast<double>(max));
      return static_cast<int64_t>(std::llround(clamped));
    }
  }
  return value;
}

double LengthDist::expected() const {
  switch (kind) {
    case Kind::kFixed:
      return static_cast<double>(value);
    case Kind::kUniform:
      return (static_cast<double>(min) + static_cast<double>(max)) / 2;
    case Kind::kLognormal: {
      // E[clamp(X, min, max)] by the midpoint rule over the normal's +-8 sigma.
      const double mu = std::log(mean) - sigma * sigma / 2;
      if (sigma == 0) return std::clamp(mean, double(min), double(max));
      const int kSteps = 4000;
      double sum = 0, weight = 0;
      for (int i = 0; i < kSteps; ++i) {
        const double z = -8.0 + 16.0 * (i + 0.5) / kSteps;
        const double w = std::exp(-z * z / 2);
        sum += w * std::clamp(std::exp(mu + sigma * z), double(min), double(max));
        weight += w;
      }
      return sum / weight;
    }
  }
  return 0;
}

std::string LengthDist::describe() const {
  std::ostringstream s;
  switch (kind) {
    case Kind::kFixed:
      s << value;
      break;
    case Kind::kUniform:
      s << "uniform " << min << ".." << max;
      break;
    case Kind::kLognormal:
      s << "lognormal mean " << mean << " sigma " << sigma << " in " << min << ".." << max;
      break;
  }
  return s.str();
}

Result<WorkloadSpec> parse_workload_toml(const std::string& text, const std::string& source) {
  toml::table root;
  try {
    root = toml::parse(text, source);
  } catch (const toml::parse_error& e) {
    const auto& b = e.source().begin;
    return Status::ConfigError(source + ":" + std::to_string(b.line) + ":" +
                               std::to_string(b.column) + ": " + std::string(e.description()));
  }
  using T = config::KeySpec::Type;
  if (Status s = config::validate_keys(root, {{"workload", T::kTable, "the workload"}}, source, "");
      !s.ok()) {
    return s;
  }
  WorkloadSpec spec;
  spec.source = source;
  const toml::table* w = root["workload"].as_table();
  if (w == nullptr) return Status::ConfigError(source + ": no [workload] table");
  if (Status s = config::validate_keys(
          *w,
          {{"num_requests", T::kInt, "requests (conversations * turns)"},
           {"concurrency", T::kInt, "requests in flight at most; 0 = no limit"},
           {"request_rate", T::kFloat, "requests per second (Poisson); 0 = all at once"},
           {"seed", T::kInt, "token and length generator seed"},
           {"input", T::kTable, "prompt length distribution"},
           {"output", T::kTable, "output length distribution"},
           {"shared_prefix_groups", T::kInt, "number of shared system prompts"},
           {"shared_prefix_len", T::kInt, "tokens in each shared prefix"},
           {"turns", T::kInt, "turns per conversation"},
           {"sampling", T::kTable, "how every request samples (default: greedy)"}},
          source, "workload");
      !s.ok()) {
    return s;
  }
  int64_t n = static_cast<int64_t>(spec.num_requests), conc = 0, seed = 1, groups = 0, turns = 1;
  if (Status s = read_int(*w, "num_requests", "workload", source, 1, 10'000'000, &n); !s.ok())
    return s;
  if (Status s = read_int(*w, "concurrency", "workload", source, 0, 1'000'000, &conc); !s.ok())
    return s;
  if (Status s = read_float(*w, "request_rate", "workload", source, 0, 1e9, &spec.request_rate);
      !s.ok())
    return s;
  if (Status s = read_int(*w, "seed", "workload", source, 0, INT64_MAX, &seed); !s.ok()) return s;
  if (Status s = read_int(*w, "shared_prefix_groups", "workload", source, 0, 1'000'000, &groups);
      !s.ok())
    return s;
  if (Status s = read_int(*w, "shared_prefix_len", "workload", source, 0, 1 << 20,
                          &spec.shared_prefix_len);
      !s.ok())
    return s;
  if (Status s = read_int(*w, "turns", "workload", source, 1, 1000, &turns); !s.ok()) return s;
  spec.num_requests = static_cast<uint64_t>(n);
  spec.concurrency = static_cast<int>(conc);
  spec.seed = static_cast<uint64_t>(seed);
  spec.shared_prefix_groups = static_cast<int>(groups);
  spec.turns = static_cast<int>(turns);
  if (Status s = read_dist(*w, "input", source, &spec.input); !s.ok()) return s;
  if (Status s = read_dist(*w, "output", source, &spec.output); !s.ok()) return s;
  if (Status s = read_sampling(*w, source, &spec.sampling); !s.ok()) return s;
  // Every prompt is generated before the run: the workload must fit in memory.
  const uint64_t per_request =
      static_cast<uint64_t>(spec.input.largest()) + static_cast<uint64_t>(spec.shared_prefix_len);
  if (spec.num_requests * per_request > kMaxPlannedTokens) {
    return Status::ConfigError(
        source + ": workload.num_requests: " + std::to_string(spec.num_requests) +
        " requests of up to " + std::to_string(per_request) + " prompt tokens are over the " +
        std::to_string(kMaxPlannedTokens) + " prompt tokens a bench generates");
  }
  // Poisson arrivals at this rate take about num_requests / rate seconds to arrive: a rate so
  // low that they would outlast a day is a mistake (1e-9 for 1e9), not a plan.
  if (spec.request_rate > 0 &&
      static_cast<double>(spec.num_requests) / spec.request_rate > kMaxBenchSeconds) {
    return Status::ConfigError(where(*w->get("request_rate"), source) +
                               ": workload.request_rate: " + std::to_string(spec.num_requests) +
                               " requests at " + std::to_string(spec.request_rate) +
                               " per second would take over 24 h to arrive (a bench lasts at "
                               "most " + std::to_string(static_cast<int>(kMaxBenchSeconds)) +
                               " s)");
  }
  return spec;
}

Result<WorkloadSpec> load_workload_toml(const std::string& path) {
  Result<std::string> text = util::read_file(path, kWorkloadFile);
  if (!text.ok()) return text.status();
  return parse_workload_toml(*text, path);
}

Result<WorkloadSpec> load_trace_jsonl(const std::string& path) {
  Result<std::string> text = util::read_file(path, kTraceFile);
  if (!text.ok()) return text.status();
  return parse_trace_jsonl(*text, path);
}

Result<WorkloadSpec> parse_trace_jsonl(const std::string& text, const std::string& path) {
  std::istringstream in(text);
  WorkloadSpec spec;
  spec.source = path;
  std::string line;
  int line_no = 0;
  while (std::getline(in, line)) {
    ++line_no;
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    const std::string at = path + ":" + std::to_string(line_no) + ": ";
    nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_discarded() || !j.is_object()) return Status::ConfigError(at + "not a JSON object");
    TraceEntry e;
    auto get_int = [&](const char* key, bool required, int64_t lo, int64_t hi,
                       int64_t* out) -> Status {
      if (!j.contains(key)) {
        return required ? Status::ConfigError(at + "missing \"" + key + "\"") : Status::Ok();
      }
      const nlohmann::json& v = j[key];
      if (!v.is_number_integer() || (v.is_number_unsigned() && v.get<uint64_t>() > uint64_t(hi)) ||
          v.get<int64_t>() < lo || v.get<int64_t>() > hi) {
        return Status::ConfigError(at + "\"" + key + "\": expected an integer in [" +
                                   std::to_string(lo) + ", " + std::to_string(hi) + "], found " +
                                   v.dump());
      }
      *out = j[key].get<int64_t>();
      return Status::Ok();
    };
    if (Status s = get_int("input_len", true, 1, kMaxLength, &e.input_len); !s.ok()) return s;
    if (Status s = get_int("output_len", true, 1, kMaxLength, &e.output_len); !s.ok()) return s;
    int64_t group = -1;
    if (Status s = get_int("group", false, 0, 1'000'000, &group); !s.ok()) return s;
    e.group = static_cast<int>(group);
    if (Status s = get_int("prefix_len", false, 0, kMaxLength, &e.prefix_len); !s.ok()) return s;
    if (Status s = read_trace_sampling(j, at, &e.sampling); !s.ok()) return s;
    if (j.contains("timestamp")) {
      const nlohmann::json& t = j["timestamp"];
      if (!t.is_number() || !(t.get<double>() >= 0 && t.get<double>() <= kMaxBenchSeconds)) {
        return Status::ConfigError(at + "\"timestamp\": expected seconds in [0, " +
                                   std::to_string(static_cast<int>(kMaxBenchSeconds)) +
                                   "] (a bench lasts at most 24 h), found " + t.dump());
      }
      e.arrival_s = j["timestamp"].get<double>();
    }
    spec.trace.push_back(e);
  }
  if (spec.trace.empty()) return Status::ConfigError(path + ": the trace has no requests");
  uint64_t planned = 0;
  for (const TraceEntry& e : spec.trace) {
    planned += static_cast<uint64_t>(std::max(e.input_len, e.prefix_len));
  }
  if (planned > kMaxPlannedTokens) {
    return Status::ConfigError(path + ": the trace's prompts hold " + std::to_string(planned) +
                               " tokens, over the " + std::to_string(kMaxPlannedTokens) +
                               " a bench generates");
  }
  // In arrival order, lines of one time as written. (Through an index: GCC 12 takes swapping
  // entries that hold an optional for reading uninitialized memory, -Wmaybe-uninitialized.)
  std::vector<size_t> order(spec.trace.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(), [&spec](size_t a, size_t b) {
    return spec.trace[a].arrival_s < spec.trace[b].arrival_s;
  });
  std::vector<TraceEntry> sorted;
  sorted.reserve(order.size());
  for (size_t i : order) sorted.push_back(std::move(spec.trace[i]));
  spec.trace = std::move(sorted);
  spec.num_requests = spec.trace.size();
  return spec;
}

WorkloadPlan::WorkloadPlan(const WorkloadSpec& spec, int32_t vocab_size)
    : spec_(spec), vocab_size_(vocab_size), rng_(spec.seed) {
  // Shared prefixes first, from their own stream, so they do not depend on the request count.
  std::mt19937_64 prefix_rng(spec.seed ^ 0x5eed5eed5eedULL);
  auto prefix_tokens = [&](int64_t n) {
    std::vector<int32_t> v(n);
    for (int32_t& t : v) t = std::uniform_int_distribution<int32_t>(3, vocab_size_ - 1)(prefix_rng);
    return v;
  };
  std::vector<std::vector<int32_t>> prefixes;
  for (int g = 0; g < spec.shared_prefix_groups; ++g) {
    prefixes.push_back(prefix_tokens(spec.shared_prefix_len));
  }
  if (!spec.trace.empty()) {
    std::map<int, std::vector<int32_t>> trace_prefixes;
    for (const TraceEntry& e : spec.trace) {
      PlannedRequest r;
      r.id = next_id_++;
      r.arrival_s = e.arrival_s;
      if (e.group >= 0 && e.prefix_len > 0) {
        auto [it, fresh] = trace_prefixes.try_emplace(e.group);
        if (fresh) it->second = prefix_tokens(e.prefix_len);
        r.prompt.assign(it->second.begin(),
                        it->second.begin() + std::min<int64_t>(e.prefix_len, it->second.size()));
      }
      const int64_t own = std::max<int64_t>(1, e.input_len - static_cast<int64_t>(r.prompt.size()));
      std::vector<int32_t> mine = random_tokens(own);
      r.prompt.insert(r.prompt.end(), mine.begin(), mine.end());
      r.max_new_tokens = static_cast<int32_t>(e.output_len);
      r.sampling = e.sampling;
      initial_.push_back(std::move(r));
    }
    total_ = initial_.size();
    return;
  }
  const uint64_t conversations =
      std::max<uint64_t>(1, spec.num_requests / static_cast<uint64_t>(spec.turns));
  total_ = spec.turns > 1 ? conversations * spec.turns : spec.num_requests;
  double t = 0;
  for (uint64_t c = 0; c < (spec.turns > 1 ? conversations : spec.num_requests); ++c) {
    PlannedRequest r;
    r.id = next_id_++;
    if (spec.request_rate > 0) t += std::exponential_distribution<double>(spec.request_rate)(rng_);
    r.arrival_s = t;
    if (!prefixes.empty()) r.prompt = prefixes[c % prefixes.size()];
    std::vector<int32_t> mine = random_tokens(spec.input.sample(rng_));
    r.prompt.insert(r.prompt.end(), mine.begin(), mine.end());
    r.max_new_tokens = static_cast<int32_t>(spec.output.sample(rng_));
    r.sampling = sampling_of(r.id);
    if (spec.turns > 1) r.conversation = static_cast<int64_t>(c);
    initial_.push_back(std::move(r));
  }
}

bool WorkloadPlan::next_turn(int64_t conversation, int turn, PlannedRequest* out) {
  if (conversation < 0 || turn + 1 >= spec_.turns) return false;
  out->id = next_id_++;
  out->arrival_s = 0;
  out->conversation = conversation;
  out->turn = turn + 1;
  out->prompt = random_tokens(spec_.input.sample(rng_));
  out->max_new_tokens = static_cast<int32_t>(spec_.output.sample(rng_));
  out->sampling = sampling_of(out->id);
  return true;
}

std::optional<sampling::SamplingParams> WorkloadPlan::sampling_of(uint64_t id) const {
  if (!spec_.sampling) return std::nullopt;
  sampling::SamplingParams p = *spec_.sampling;
  // Seeds apart for every request, the same in every run of this workload.
  p.seed = spec_.seed ^ ((id + 1) * 0x9e3779b97f4a7c15ull);
  return p;
}

std::vector<int32_t> WorkloadPlan::random_tokens(int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (int32_t& t : v) t = std::uniform_int_distribution<int32_t>(3, vocab_size_ - 1)(rng_);
  return v;
}

}  // namespace kvrt::bench
