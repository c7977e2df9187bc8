#include "core/metrics/metrics.h"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <iterator>
#include <limits>
#include <string_view>
#include <utility>

namespace kvrt::metrics {
namespace {

// Prometheus writes floats in Go's shortest round-trip form; fmt's "{}" is the same idea, with
// the special values spelled the way Prometheus parses them.
std::string format_value(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  return fmt::format("{}", v);
}

// HELP text escapes backslash and newline, a label value the double quote as well (exposition
// format 0.0.4).
std::string escape_text(const std::string& text, bool label_value) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == '\\') {
      out += "\\\\";
    } else if (c == '\n') {
      out += "\\n";
    } else if (c == '"' && label_value) {
      out += "\\\"";
    } else {
      out += c;
    }
  }
  return out;
}

bool valid_metric_name(const std::string& name) {
  if (name.empty()) return false;
  for (size_t i = 0; i < name.size(); ++i) {
    const char c = name[i];
    const bool letter = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_' || c == ':';
    const bool digit = c >= '0' && c <= '9';
    if (!letter && !(digit && i > 0)) return false;
  }
  return true;
}

[[noreturn]] void die(const std::string& message) {
  std::fprintf(stderr, "kvrt metrics: %s\n", message.c_str());
  std::abort();
}

std::vector<double> clean_bounds(std::vector<double> bounds) {
  std::erase_if(bounds, [](double b) { return !std::isfinite(b); });
  std::sort(bounds.begin(), bounds.end());
  bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
  return bounds;
}

}  // namespace

void Counter::add(double amount) {
  if (!(amount >= 0.0)) return;  // negative or NaN
  value_.fetch_add(amount, std::memory_order_relaxed);
}

double Counter::value() const { return value_.load(std::memory_order_relaxed); }

void Gauge::set(double value) { value_.store(value, std::memory_order_relaxed); }

double Gauge::value() const { return value_.load(std::memory_order_relaxed); }

Histogram::Histogram(std::vector<double> upper_bounds)
    : upper_bounds_(clean_bounds(std::move(upper_bounds))),
      bucket_counts_(upper_bounds_.size() + 1, 0) {}

void Histogram::observe(double value) {
  if (std::isnan(value)) return;
  // First bound >= value: bucket i holds (bounds[i-1], bounds[i]]; past the end is +Inf.
  const size_t bucket = static_cast<size_t>(std::distance(
      upper_bounds_.begin(), std::lower_bound(upper_bounds_.begin(), upper_bounds_.end(), value)));
  std::lock_guard<std::mutex> lock(mu_);
  ++bucket_counts_[bucket];
  sum_ += value;
  ++count_;
}

Histogram::Snapshot Histogram::snapshot() const {
  Snapshot s;
  s.upper_bounds = upper_bounds_;
  s.cumulative_counts.resize(upper_bounds_.size() + 1);
  std::lock_guard<std::mutex> lock(mu_);
  uint64_t running = 0;
  for (size_t i = 0; i < bucket_counts_.size(); ++i) {
    running += bucket_counts_[i];
    s.cumulative_counts[i] = running;
  }
  s.sum = sum_;
  s.count = count_;
  return s;
}

double Histogram::quantile(double q) const {
  if (std::isnan(q)) return std::numeric_limits<double>::quiet_NaN();
  if (q < 0.0) return -std::numeric_limits<double>::infinity();
  if (q > 1.0) return std::numeric_limits<double>::infinity();
  const Snapshot s = snapshot();
  if (s.count == 0 || s.upper_bounds.empty()) return std::numeric_limits<double>::quiet_NaN();

  const double rank = q * static_cast<double>(s.count);
  // The first finite bucket whose cumulative count reaches the rank; none means +Inf.
  size_t b = 0;
  while (b < s.upper_bounds.size() && static_cast<double>(s.cumulative_counts[b]) < rank) ++b;
  if (b == s.upper_bounds.size()) return s.upper_bounds.back();
  if (b == 0 && s.upper_bounds[0] <= 0.0) return s.upper_bounds[0];

  double start = 0.0;
  const double end = s.upper_bounds[b];
  double in_bucket = static_cast<double>(s.cumulative_counts[b]);
  double rank_in_bucket = rank;
  if (b > 0) {
    start = s.upper_bounds[b - 1];
    in_bucket -= static_cast<double>(s.cumulative_counts[b - 1]);
    rank_in_bucket -= static_cast<double>(s.cumulative_counts[b - 1]);
  }
  if (in_bucket == 0.0) return start;  // only when rank is 0 and the first bucket is empty
  return start + (end - start) * (rank_in_bucket / in_bucket);
}

struct Registry::Entry {
  std::string name;
  std::string help;
  Kind kind;
  std::unique_ptr<Counter> counter;
  std::unique_ptr<Gauge> gauge;
  std::unique_ptr<Histogram> histogram;
};

Registry::Registry() = default;
Registry::~Registry() = default;

Registry::Entry* Registry::find(const std::string& name, Kind kind) const {
  if (!valid_metric_name(name)) {
    die("invalid metric name '" + name + "' (expected [a-zA-Z_:][a-zA-Z0-9_:]*)");
  }
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return nullptr;
  if (it->second->kind != kind) die("metric '" + name + "' is already registered as another kind");
  return it->second;
}

Registry::Entry& Registry::add(std::unique_ptr<Entry> entry) {
  Entry& added = *entry;
  by_name_.emplace(added.name, &added);
  entries_.push_back(std::move(entry));
  return added;
}

Counter& Registry::counter(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(name, Kind::kCounter)) return *e->counter;
  auto e = std::make_unique<Entry>(Entry{name, help, Kind::kCounter, nullptr, nullptr, nullptr});
  e->counter = std::make_unique<Counter>();
  return *add(std::move(e)).counter;
}

Gauge& Registry::gauge(const std::string& name, const std::string& help) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(name, Kind::kGauge)) return *e->gauge;
  auto e = std::make_unique<Entry>(Entry{name, help, Kind::kGauge, nullptr, nullptr, nullptr});
  e->gauge = std::make_unique<Gauge>();
  return *add(std::move(e)).gauge;
}

Histogram& Registry::histogram(const std::string& name, const std::string& help,
                               std::vector<double> upper_bounds) {
  std::lock_guard<std::mutex> lock(mu_);
  if (Entry* e = find(name, Kind::kHistogram)) return *e->histogram;
  auto e = std::make_unique<Entry>(Entry{name, help, Kind::kHistogram, nullptr, nullptr, nullptr});
  e->histogram = std::make_unique<Histogram>(std::move(upper_bounds));
  return *add(std::move(e)).histogram;
}

std::string Registry::render_prometheus() const {
  std::lock_guard<std::mutex> lock(mu_);
  std::string out;
  for (const auto& e : entries_) {
    out += fmt::format("# HELP {} {}\n", e->name, escape_text(e->help, /*label_value=*/false));
    switch (e->kind) {
      case Kind::kCounter:
        out += fmt::format("# TYPE {} counter\n{} {}\n", e->name, e->name,
                           format_value(e->counter->value()));
        break;
      case Kind::kGauge:
        out += fmt::format("# TYPE {} gauge\n{} {}\n", e->name, e->name,
                           format_value(e->gauge->value()));
        break;
      case Kind::kHistogram: {
        const Histogram::Snapshot s = e->histogram->snapshot();
        out += fmt::format("# TYPE {} histogram\n", e->name);
        for (size_t i = 0; i < s.upper_bounds.size(); ++i) {
          out += fmt::format("{}_bucket{{le=\"{}\"}} {}\n", e->name,
                             format_value(s.upper_bounds[i]), s.cumulative_counts[i]);
        }
        out += fmt::format("{}_bucket{{le=\"+Inf\"}} {}\n", e->name, s.count);
        out +=
            fmt::format("{}_sum {}\n{}_count {}\n", e->name, format_value(s.sum), e->name, s.count);
        break;
      }
    }
  }
  return out;
}

std::vector<double> time_to_first_token_bounds() {
  return {0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400};
}

std::vector<double> inter_token_latency_bounds() {
  return {0.002, 0.004, 0.006, 0.008, 0.010, 0.015, 0.020, 0.025, 0.030, 0.035, 0.040, 0.060,
          0.080, 0.100, 0.200, 0.400, 0.600, 0.800, 1.000, 2.000, 4.000, 6.000, 8.000};
}

std::vector<double> time_per_output_token_bounds() {
  return {0.002, 0.005, 0.010, 0.020, 0.030, 0.040, 0.050, 0.060, 0.070, 0.080,
          0.090, 0.100, 0.150, 0.200, 0.300, 0.400, 0.600, 0.800, 1.000, 2.000};
}

std::vector<double> e2e_request_latency_bounds() {
  return {0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 800};
}

std::vector<double> token_count_bounds() {
  std::vector<double> bounds;
  for (double b = 1; b <= 65536; b *= 2) bounds.push_back(b);
  return bounds;
}

ServerMetrics::ServerMetrics(Registry& r)
    : prompt_tokens_total(
          r.counter("kvrt:prompt_tokens_total", "Number of prefill tokens processed.")),
      generation_tokens_total(
          r.counter("kvrt:generation_tokens_total", "Number of generation tokens processed.")),
      cached_tokens_total(r.counter("kvrt:cached_tokens_total",
                                    "Number of prompt tokens found in the prefix cache.")),
      num_requests_total(r.counter("kvrt:num_requests_total", "Number of requests processed.")),
      num_aborted_requests_total(
          r.counter("kvrt:num_aborted_requests_total", "Number of requests aborted.")),
      num_retractions_total(r.counter(
          "kvrt:num_retractions_total",
          "Number of requests retracted (pages freed and re-queued) because decode ran out of "
          "KV pages.")),
      num_running_reqs(r.gauge("kvrt:num_running_reqs", "The number of running requests.")),
      num_queue_reqs(
          r.gauge("kvrt:num_queue_reqs", "The number of requests in the waiting queue.")),
      token_usage(
          r.gauge("kvrt:token_usage", "The token usage: KV tokens in use / max_total_num_tokens.")),
      num_used_tokens(r.gauge("kvrt:num_used_tokens",
                              "KV tokens held by requests (not counting evictable cache).")),
      max_total_num_tokens(
          r.gauge("kvrt:max_total_num_tokens", "The KV pool's capacity in tokens.")),
      gen_throughput(r.gauge("kvrt:gen_throughput", "The generation throughput (token/s).")),
      cache_hit_rate(r.gauge("kvrt:cache_hit_rate",
                             "The prefix cache hit rate: prompt tokens found cached / prompt "
                             "tokens, since the start.")),
      time_to_first_token_seconds(r.histogram("kvrt:time_to_first_token_seconds",
                                              "Histogram of time to first token in seconds.",
                                              time_to_first_token_bounds())),
      inter_token_latency_seconds(r.histogram("kvrt:inter_token_latency_seconds",
                                              "Histogram of inter-token latency in seconds.",
                                              inter_token_latency_bounds())),
      time_per_output_token_seconds(r.histogram("kvrt:time_per_output_token_seconds",
                                                "Histogram of time per output token in seconds.",
                                                time_per_output_token_bounds())),
      e2e_request_latency_seconds(r.histogram("kvrt:e2e_request_latency_seconds",
                                              "Histogram of end-to-end request latency in seconds.",
                                              e2e_request_latency_bounds())),
      prompt_tokens(r.histogram("kvrt:prompt_tokens", "Histogram of prompt tokens per request.",
                                token_count_bounds())),
      generation_tokens(r.histogram("kvrt:generation_tokens",
                                    "Histogram of generation tokens per request.",
                                    token_count_bounds())) {}

std::string renamed_exposition(const std::string& exposition, const std::string& from,
                               const std::string& to, const std::string& label_name,
                               const std::string& label_value) {
  const std::string label =
      label_name.empty() ? ""
                         : label_name + "=\"" + escape_text(label_value, /*label_value=*/true) + '"';
  std::string out;
  out.reserve(exposition.size() + exposition.size() / 2);
  size_t begin = 0;
  while (begin < exposition.size()) {
    size_t end = exposition.find('\n', begin);
    if (end == std::string::npos) end = exposition.size();
    const std::string_view line(exposition.data() + begin, end - begin);
    begin = end + 1;
    for (const char* comment : {"# HELP ", "# TYPE "}) {
      const std::string_view c(comment);
      if (line.substr(0, c.size()) == c && line.substr(c.size(), from.size()) == from) {
        out.append(c).append(to).append(line.substr(c.size() + from.size())).append("\n");
      }
    }
    if (line.empty() || line[0] == '#' || line.substr(0, from.size()) != from) continue;
    // name{labels} value, or name value.
    const size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string_view::npos) continue;
    out.append(to).append(line.substr(from.size(), name_end - from.size()));
    if (label.empty()) {
      out.append(line.substr(name_end));
    } else if (line[name_end] == '{') {
      out.append("{").append(label);
      if (line.substr(name_end + 1, 1) != "}") out.append(",");
      out.append(line.substr(name_end + 1));
    } else {
      out.append("{").append(label).append("}").append(line.substr(name_end));
    }
    out.append("\n");
  }
  return out;
}

std::string decode_log_line(const DecodeLog& log) {
  return fmt::format(
      "Decode batch, #running-req: {}, #token: {}, token usage: {:.2f}, gen throughput "
      "(token/s): {:.2f}, #queue-req: {}",
      log.running_requests, log.tokens, log.token_usage, log.gen_throughput, log.queued_requests);
}

std::string prefill_log_line(const PrefillLog& log) {
  return fmt::format(
      "Prefill batch, #new-seq: {}, #new-token: {}, #cached-token: {}, token usage: {:.2f}, "
      "#running-req: {}, #queue-req: {}",
      log.new_sequences, log.new_tokens, log.cached_tokens, log.token_usage, log.running_requests,
      log.queued_requests);
}

TierMetrics::TierMetrics(Registry& r)
    : capacity_pages(r.gauge("kvrt:host_tier_capacity_pages", "Pages the host tier can hold.")),
      used_pages(r.gauge("kvrt:host_tier_used_pages", "Pages the host tier holds now.")),
      saved_pages_total(r.counter("kvrt:host_tier_saved_pages_total",
                                  "Pages copied from the device pool to the host tier.")),
      loaded_pages_total(r.counter("kvrt:host_tier_loaded_pages_total",
                                   "Pages copied from the host tier back to the device pool.")),
      dropped_pages_total(r.counter("kvrt:host_tier_dropped_pages_total",
                                    "Pages the host tier dropped to make room.")),
      loaded_tokens_total(r.counter("kvrt:host_tier_loaded_tokens_total",
                                    "Prompt tokens found cached in the host tier (loaded, not "
                                    "recomputed).")) {}

void TierMetrics::publish(uint64_t capacity, uint64_t used, uint64_t saved, uint64_t loaded,
                          uint64_t dropped, uint64_t loaded_tokens) {
  capacity_pages.set(static_cast<double>(capacity));
  used_pages.set(static_cast<double>(used));
  saved_pages_total.add(static_cast<double>(saved) - saved_pages_total.value());
  loaded_pages_total.add(static_cast<double>(loaded) - loaded_pages_total.value());
  dropped_pages_total.add(static_cast<double>(dropped) - dropped_pages_total.value());
  loaded_tokens_total.add(static_cast<double>(loaded_tokens) - loaded_tokens_total.value());
}

}  // namespace kvrt::metrics
