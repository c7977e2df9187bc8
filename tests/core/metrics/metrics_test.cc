#include "core/metrics/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <thread>
#include <vector>

namespace kvrt::metrics {
namespace {

TEST(Metrics, RendersPrometheusTextWithCumulativeBuckets) {
  Registry r;
  r.counter("kvrt:num_requests_total", "Number of requests processed.").add(3);
  r.gauge("kvrt:token_usage", "KV usage.").set(0.25);
  // Bounds out of order on purpose: rendering sorts them; 0.25 lands in le="0.25" (inclusive).
  Histogram& h = r.histogram("kvrt:ttft_seconds", "TTFT.", {0.5, 0.25, 1});
  for (double v : {0.125, 0.25, 0.75, 2.0}) h.observe(v);

  EXPECT_EQ(r.render_prometheus(),
            "# HELP kvrt:num_requests_total Number of requests processed.\n"
            "# TYPE kvrt:num_requests_total counter\n"
            "kvrt:num_requests_total 3\n"
            "# HELP kvrt:token_usage KV usage.\n"
            "# TYPE kvrt:token_usage gauge\n"
            "kvrt:token_usage 0.25\n"
            "# HELP kvrt:ttft_seconds TTFT.\n"
            "# TYPE kvrt:ttft_seconds histogram\n"
            "kvrt:ttft_seconds_bucket{le=\"0.25\"} 2\n"
            "kvrt:ttft_seconds_bucket{le=\"0.5\"} 2\n"
            "kvrt:ttft_seconds_bucket{le=\"1\"} 3\n"
            "kvrt:ttft_seconds_bucket{le=\"+Inf\"} 4\n"
            "kvrt:ttft_seconds_sum 3.125\n"
            "kvrt:ttft_seconds_count 4\n");
}

TEST(Metrics, RenamedExpositionTakesAnotherPrefixAndALabel) {
  Registry r;
  r.counter("kvrt:num_requests_total", "Requests.").add(3);
  r.gauge("other_gauge", "Not kvrt's.").set(1);
  r.histogram("kvrt:ttft_seconds", "TTFT.", {0.5}).observe(0.25);
  EXPECT_EQ(renamed_exposition(r.render_prometheus(), "kvrt:", "sglang:", "model_name",
                               "org/m \"x\"\\"),
            "# HELP sglang:num_requests_total Requests.\n"
            "# TYPE sglang:num_requests_total counter\n"
            "sglang:num_requests_total{model_name=\"org/m \\\"x\\\"\\\\\"} 3\n"
            "# HELP sglang:ttft_seconds TTFT.\n"
            "# TYPE sglang:ttft_seconds histogram\n"
            "sglang:ttft_seconds_bucket{model_name=\"org/m \\\"x\\\"\\\\\",le=\"0.5\"} 1\n"
            "sglang:ttft_seconds_bucket{model_name=\"org/m \\\"x\\\"\\\\\",le=\"+Inf\"} 1\n"
            "sglang:ttft_seconds_sum{model_name=\"org/m \\\"x\\\"\\\\\"} 0.25\n"
            "sglang:ttft_seconds_count{model_name=\"org/m \\\"x\\\"\\\\\"} 1\n");
  // Without a label the samples keep theirs alone.
  EXPECT_EQ(renamed_exposition("kvrt:a{le=\"1\"} 2\nkvrt:b 3\n", "kvrt:", "x_", "", ""),
            "x_a{le=\"1\"} 2\nx_b 3\n");
}

TEST(Metrics, HelpTextIsEscaped) {
  Registry r;
  r.gauge("g", "line one\nback\\slash");
  EXPECT_NE(r.render_prometheus().find("# HELP g line one\\nback\\\\slash\n"), std::string::npos);
}

TEST(Metrics, SameNameReturnsTheSameMetric) {
  Registry r;
  Counter& a = r.counter("kvrt:x_total", "first help");
  Counter& b = r.counter("kvrt:x_total", "second help");
  EXPECT_EQ(&a, &b);
  a.add(2);
  b.add(1);
  EXPECT_EQ(a.value(), 3.0);
  const std::string text = r.render_prometheus();
  EXPECT_NE(text.find("# HELP kvrt:x_total first help\n"), std::string::npos);
  EXPECT_EQ(text.find("second help"), std::string::npos);
}

TEST(MetricsDeathTest, NameClashAcrossKindsAborts) {
  Registry r;
  r.counter("kvrt:x", "a counter");
  EXPECT_DEATH(r.gauge("kvrt:x", "a gauge"), "metric 'kvrt:x' is already registered");
  EXPECT_DEATH(r.counter("kvrt x", "space"), "invalid metric name 'kvrt x'");
}

TEST(Metrics, CounterNeverGoesDown) {
  Counter c;
  c.add();
  c.add(2.5);
  c.add(-1);
  c.add(NAN);
  EXPECT_EQ(c.value(), 3.5);
}

TEST(Metrics, HistogramSnapshotIsCumulative) {
  Histogram h({1, 2, 4});
  for (double v : {0.5, 1.0, 1.5, 3.0, 100.0}) h.observe(v);
  h.observe(NAN);  // belongs to no bucket
  Histogram::Snapshot s = h.snapshot();
  EXPECT_EQ(s.upper_bounds, (std::vector<double>{1, 2, 4}));
  EXPECT_EQ(s.cumulative_counts, (std::vector<uint64_t>{2, 3, 4, 5}));
  EXPECT_EQ(s.count, 5u);
  EXPECT_EQ(s.sum, 106.0);
}

TEST(Metrics, HistogramQuantileInterpolatesLikePrometheus) {
  Histogram h({1, 2, 4});
  EXPECT_TRUE(std::isnan(h.quantile(0.5)));  // no observations
  // Buckets: (0,1] 1, (1,2] 2, (2,4] 1.
  for (double v : {0.5, 1.5, 1.5, 3.0}) h.observe(v);
  EXPECT_DOUBLE_EQ(h.quantile(0.25), 1.0);  // rank 1 at the top of the first bucket
  EXPECT_DOUBLE_EQ(h.quantile(0.5), 1.5);   // rank 2: halfway through (1,2]
  EXPECT_DOUBLE_EQ(h.quantile(0.75), 2.0);
  EXPECT_DOUBLE_EQ(h.quantile(1.0), 4.0);
  EXPECT_DOUBLE_EQ(h.quantile(0.125), 0.5);  // first bucket's lower edge is 0
  // A rank in +Inf reports the highest finite bound, as histogram_quantile does.
  h.observe(1000);
  EXPECT_DOUBLE_EQ(h.quantile(1.0), 4.0);
  EXPECT_EQ(h.quantile(-0.1), -INFINITY);
  EXPECT_EQ(h.quantile(1.1), INFINITY);
}

TEST(Metrics, ConcurrentUpdatesAreNotLost) {
  Registry r;
  Counter& c = r.counter("c_total", "c");
  Histogram& h = r.histogram("h", "h", {1});
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&] {
      for (int i = 0; i < 10000; ++i) {
        c.add(1);
        h.observe(0.5);
      }
    });
  }
  // Rendering while the writers run must be safe (ThreadSanitizer checks this).
  EXPECT_NE(r.render_prometheus().find("# TYPE h histogram"), std::string::npos);
  for (std::thread& t : threads) t.join();
  EXPECT_EQ(c.value(), 40000.0);
  EXPECT_EQ(h.snapshot().count, 40000u);
  EXPECT_NE(r.render_prometheus().find("h_bucket{le=\"1\"} 40000\n"), std::string::npos);
}

TEST(Metrics, ServerMetricsUseKvrtNames) {
  Registry r;
  ServerMetrics m(r);
  m.generation_tokens_total.add(128);
  m.num_running_reqs.set(7);
  m.prompt_tokens.observe(3000);
  const std::string text = r.render_prometheus();
  for (const char* name :
       {"kvrt:prompt_tokens_total", "kvrt:generation_tokens_total", "kvrt:cached_tokens_total",
        "kvrt:num_requests_total", "kvrt:num_aborted_requests_total", "kvrt:num_retractions_total",
        "kvrt:num_running_reqs", "kvrt:num_queue_reqs", "kvrt:token_usage", "kvrt:gen_throughput",
        "kvrt:time_to_first_token_seconds", "kvrt:inter_token_latency_seconds",
        "kvrt:e2e_request_latency_seconds", "kvrt:prompt_tokens", "kvrt:generation_tokens"}) {
    EXPECT_NE(text.find(std::string("# TYPE ") + name + " "), std::string::npos) << name;
  }
  EXPECT_NE(text.find("kvrt:generation_tokens_total 128\n"), std::string::npos);
  EXPECT_NE(text.find("kvrt:num_running_reqs 7\n"), std::string::npos);
  // 3000 tokens: first counted in le="4096", and the token buckets reach 64K.
  EXPECT_NE(text.find("kvrt:prompt_tokens_bucket{le=\"2048\"} 0\n"), std::string::npos);
  EXPECT_NE(text.find("kvrt:prompt_tokens_bucket{le=\"4096\"} 1\n"), std::string::npos);
  EXPECT_NE(text.find("kvrt:prompt_tokens_bucket{le=\"65536\"} 1\n"), std::string::npos);
  // A second set on the same registry shares the metrics rather than clashing.
  ServerMetrics again(r);
  EXPECT_EQ(&again.num_running_reqs, &m.num_running_reqs);
}

TEST(Metrics, DecodeLogLineHasSglangShape) {
  EXPECT_EQ(decode_log_line({35, 150159, 0.94, 1234.567, 115}),
            "Decode batch, #running-req: 35, #token: 150159, token usage: 0.94, "
            "gen throughput (token/s): 1234.57, #queue-req: 115");
}

TEST(Metrics, PrefillLogLineHasSglangShape) {
  EXPECT_EQ(prefill_log_line({2, 812, 4096, 0.3, 33, 113}),
            "Prefill batch, #new-seq: 2, #new-token: 812, #cached-token: 4096, "
            "token usage: 0.30, #running-req: 33, #queue-req: 113");
}

}  // namespace
}  // namespace kvrt::metrics
