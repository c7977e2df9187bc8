// Server metrics (DESIGN.md, Scheduler): counters, gauges and histograms rendered in the
// Prometheus text exposition format for a /metrics endpoint, the standard set under SGLang's
// names with a "kvrt:" prefix (so dashboards built for SGLang need only the prefix changed), and
// the scheduler's log lines in SGLang's shape.
//
// Threading: the scheduler thread writes metrics while an HTTP thread renders them, so every
// metric is safe to update and read from any thread. A Registry hands out references that stay
// valid for the registry's lifetime.
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace kvrt::metrics {

// A monotonically increasing total (requests served, tokens generated).
class Counter {
 public:
  // Adds `amount`. A negative or NaN amount is ignored: a counter that goes down would make
  // Prometheus' rate() read it as a restart. Any thread.
  void add(double amount = 1.0);
  // The running total. Any thread.
  double value() const;

 private:
  std::atomic<double> value_{0.0};
};

// A value that goes up and down (requests running, KV usage).
class Gauge {
 public:
  // Replaces the value. Any thread.
  void set(double value);
  // The last value set, 0 before the first set(). Any thread.
  double value() const;

 private:
  std::atomic<double> value_{0.0};
};

// A distribution in fixed buckets with Prometheus semantics: bucket i counts observations
// <= upper_bounds[i], cumulatively, and an implicit +Inf bucket counts them all.
class Histogram {
 public:
  // A consistent copy of the state: every count, the sum and the total come from one instant.
  struct Snapshot {
    std::vector<double> upper_bounds;         // [n] finite, ascending
    std::vector<uint64_t> cumulative_counts;  // [n + 1] the last one is the +Inf bucket
    double sum = 0.0;
    uint64_t count = 0;
  };

  // The bounds are sorted and deduplicated; infinite and NaN bounds are dropped because +Inf is
  // always present. An empty list leaves only +Inf (sum and count still work; quantile is NaN).
  explicit Histogram(std::vector<double> upper_bounds);

  // Records one observation. NaN is ignored (it belongs to no bucket). Any thread.
  void observe(double value);

  // The q-quantile (0 <= q <= 1) estimated as Prometheus' histogram_quantile() does: find the
  // bucket holding rank q * count and interpolate linearly inside it, taking 0 as the lower
  // edge of the first bucket when its bound is positive. A rank in the +Inf bucket returns the
  // highest finite bound. Returns NaN with no observations or no finite bounds, -Inf for q < 0
  // and +Inf for q > 1 (Prometheus' convention). Any thread.
  double quantile(double q) const;

  // Copies the state. Any thread.
  Snapshot snapshot() const;

  const std::vector<double>& upper_bounds() const { return upper_bounds_; }

 private:
  const std::vector<double> upper_bounds_;
  mutable std::mutex mu_;                // one lock keeps buckets, sum and count consistent
  std::vector<uint64_t> bucket_counts_;  // [n + 1] non-cumulative; guarded by mu_
  double sum_ = 0.0;                     // guarded by mu_
  uint64_t count_ = 0;                   // guarded by mu_
};

// Named metrics with help text, rendered in registration order.
class Registry {
 public:
  Registry();
  ~Registry();
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Each returns the metric registered under `name`, creating it on first use; a second call
  // with the same name and kind returns the same metric (its help and bounds are kept).
  // Names must match Prometheus' [a-zA-Z_:][a-zA-Z0-9_:]* ("kvrt:num_running_reqs"). An invalid
  // name, or a name already registered as another kind, is a programming error: the process
  // aborts with a message naming the metric, because a silently broken /metrics page would go
  // unnoticed. References stay valid for the registry's lifetime. Any thread.
  Counter& counter(const std::string& name, const std::string& help);
  Gauge& gauge(const std::string& name, const std::string& help);
  Histogram& histogram(const std::string& name, const std::string& help,
                       std::vector<double> upper_bounds);

  // The text exposition format (version 0.0.4): per metric "# HELP", "# TYPE" and its samples;
  // a histogram writes cumulative name_bucket{le="..."} lines ending with le="+Inf", then
  // name_sum and name_count. Values use the shortest form that reads back exactly ("1", "0.25",
  // "+Inf"). Any thread; metrics may be updated while it runs.
  std::string render_prometheus() const;

 private:
  enum class Kind { kCounter, kGauge, kHistogram };
  struct Entry;
  // The entry for `name`, or nullptr when it is new; aborts on an invalid name or another kind.
  Entry* find(const std::string& name, Kind kind) const;
  Entry& add(std::unique_ptr<Entry> entry);

  mutable std::mutex mu_;
  std::deque<std::unique_ptr<Entry>> entries_;  // registration order; guarded by mu_
  std::map<std::string, Entry*> by_name_;       // guarded by mu_
};

// The metrics of a rendered exposition (render_prometheus) whose names start with `from`,
// renamed to start with `to`, each sample labelled name="value" as well (label_value escaped;
// no label when label_name is empty); other lines are dropped. kvrt serve exports its "kvrt:"
// metrics under SGLang's "sglang:" names with SGLang's model_name label this way.
std::string renamed_exposition(const std::string& exposition, const std::string& from,
                               const std::string& to, const std::string& label_name,
                               const std::string& label_value);

// Bucket bounds of SGLang's latency histograms, in seconds.
std::vector<double> time_to_first_token_bounds();
std::vector<double> inter_token_latency_bounds();
std::vector<double> time_per_output_token_bounds();
std::vector<double> e2e_request_latency_bounds();
// 1, 2, 4, ... 65536 tokens: request lengths span five orders of magnitude.
std::vector<double> token_count_bounds();

// The standard server metrics, registered on `registry` under "kvrt:" names. The references
// point into the registry, which must outlive this struct. Constructing two on one registry
// returns the same metrics. Thread-safety is the metrics' own: any thread.
struct ServerMetrics {
  explicit ServerMetrics(Registry& registry);

  Counter& prompt_tokens_total;         // kvrt:prompt_tokens_total
  Counter& generation_tokens_total;     // kvrt:generation_tokens_total
  Counter& cached_tokens_total;         // kvrt:cached_tokens_total: prompt tokens found cached
  Counter& num_requests_total;          // kvrt:num_requests_total: requests finished
  Counter& num_aborted_requests_total;  // kvrt:num_aborted_requests_total
  Counter& num_retractions_total;       // kvrt:num_retractions_total: decode ran out of pages
  Gauge& num_running_reqs;              // kvrt:num_running_reqs
  Gauge& num_queue_reqs;                // kvrt:num_queue_reqs
  Gauge& token_usage;                   // kvrt:token_usage: KV tokens in use / max_total
  Gauge& num_used_tokens;               // kvrt:num_used_tokens: KV tokens held by requests
  Gauge& max_total_num_tokens;          // kvrt:max_total_num_tokens: the pool's tokens
  Gauge& gen_throughput;                // kvrt:gen_throughput: tokens/s, last interval
  Gauge& cache_hit_rate;                // kvrt:cache_hit_rate: cached / prompt tokens, so far
  Histogram& time_to_first_token_seconds;
  Histogram& inter_token_latency_seconds;
  // Per finished request of 2 tokens or more: (last token - first token) / (tokens - 1), as
  // SGLang observes it (Grafana's SGLang dashboard plots its quantiles).
  Histogram& time_per_output_token_seconds;
  Histogram& e2e_request_latency_seconds;
  Histogram& prompt_tokens;      // kvrt:prompt_tokens: per request
  Histogram& generation_tokens;  // kvrt:generation_tokens: per request
};

// A KV store's host tier (its tier_info), registered only for a store that has one.
struct TierMetrics {
  explicit TierMetrics(Registry& registry);
  // The store's totals and occupancy now; the counters move to the totals.
  void publish(uint64_t capacity, uint64_t used, uint64_t saved, uint64_t loaded,
               uint64_t dropped, uint64_t loaded_tokens);

  Gauge& capacity_pages;         // kvrt:host_tier_capacity_pages
  Gauge& used_pages;             // kvrt:host_tier_used_pages
  Counter& saved_pages_total;    // kvrt:host_tier_saved_pages_total: device -> host copies
  Counter& loaded_pages_total;   // kvrt:host_tier_loaded_pages_total: host -> device copies
  Counter& dropped_pages_total;  // kvrt:host_tier_dropped_pages_total: evicted from the host
  Counter& loaded_tokens_total;  // kvrt:host_tier_loaded_tokens_total: cached tokens it gave
};

// One decode step's log line (SGLang's "Decode batch" shape).
struct DecodeLog {
  int running_requests = 0;
  uint64_t tokens = 0;          // KV tokens in use
  double token_usage = 0.0;     // tokens / max_total_num_tokens
  double gen_throughput = 0.0;  // generated tokens per second over the last interval
  int queued_requests = 0;
};

// One prefill step's log line (SGLang's "Prefill batch" shape).
struct PrefillLog {
  int new_sequences = 0;
  uint64_t new_tokens = 0;     // prompt tokens computed in this step
  uint64_t cached_tokens = 0;  // prompt tokens found in the prefix cache
  double token_usage = 0.0;
  int running_requests = 0;
  int queued_requests = 0;
};

// "Decode batch, #running-req: R, #token: T, token usage: U, gen throughput (token/s): G,
// #queue-req: Q" with U and G to two decimals. Pure; any thread.
std::string decode_log_line(const DecodeLog& log);

// "Prefill batch, #new-seq: N, #new-token: X, #cached-token: C, token usage: U, #running-req: R,
// #queue-req: Q" with U to two decimals. Pure; any thread.
std::string prefill_log_line(const PrefillLog& log);

}  // namespace kvrt::metrics
