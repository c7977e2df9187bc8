#include "core/bench/workload.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/bench/bench.h"
#include "core/sched/page_hash.h"

namespace kvrt::bench {
namespace {

std::string write_temp(const std::string& name, const std::string& text) {
  const std::filesystem::path p = std::filesystem::temp_directory_path() / name;
  std::ofstream(p) << text;
  return p.string();
}

TEST(Workload, ParsesEveryKey) {
  Result<WorkloadSpec> w = parse_workload_toml(R"(
[workload]
num_requests = 12
concurrency = 4
request_rate = 2.5
seed = 9
shared_prefix_groups = 3
shared_prefix_len = 20
turns = 3
[workload.input]
dist = "uniform"
min = 5
max = 9
[workload.output]
dist = "lognormal"
mean = 100
sigma = 0.5
max = 300
)",
                                               "w.toml");
  ASSERT_TRUE(w.ok()) << w.status().message();
  EXPECT_EQ(w->num_requests, 12u);
  EXPECT_EQ(w->concurrency, 4);
  EXPECT_DOUBLE_EQ(w->request_rate, 2.5);
  EXPECT_EQ(w->shared_prefix_groups, 3);
  EXPECT_EQ(w->turns, 3);
  EXPECT_EQ(w->input.kind, LengthDist::Kind::kUniform);
  EXPECT_EQ(w->output.kind, LengthDist::Kind::kLognormal);
  EXPECT_EQ(w->output.max, 300);
}

TEST(Workload, ErrorsNameTheFileLineAndKey) {
  Result<WorkloadSpec> typo = parse_workload_toml("[workload]\nnum_request = 3\n", "w.toml");
  ASSERT_FALSE(typo.ok());
  EXPECT_NE(typo.status().message().find("w.toml:2"), std::string::npos) << typo.status().message();
  EXPECT_NE(typo.status().message().find("num_requests"), std::string::npos);  // did you mean

  Result<WorkloadSpec> range = parse_workload_toml("[workload]\nconcurrency = -1\n", "w.toml");
  ASSERT_FALSE(range.ok());
  EXPECT_NE(range.status().message().find("w.toml:2:15: workload.concurrency: expected an integer"),
            std::string::npos)
      << range.status().message();

  Result<WorkloadSpec> dist =
      parse_workload_toml("[workload]\n[workload.output]\ndist = \"zipf\"\n", "w.toml");
  ASSERT_FALSE(dist.ok());
  EXPECT_NE(dist.status().message().find("workload.output.dist"), std::string::npos)
      << dist.status().message();

  Result<WorkloadSpec> order = parse_workload_toml(
      "[workload]\n[workload.input]\ndist = \"uniform\"\nmin = 9\nmax = 3\n", "w.toml");
  ASSERT_FALSE(order.ok());
  EXPECT_NE(order.status().message().find("min (9) is above max (3)"), std::string::npos);
}

TEST(Workload, LengthDistributionsHaveTheirMeans) {
  std::mt19937_64 rng(1);
  LengthDist fixed;
  fixed.value = 17;
  EXPECT_EQ(fixed.sample(rng), 17);
  LengthDist logn;
  logn.kind = LengthDist::Kind::kLognormal;
  logn.mean = 200;
  logn.sigma = 0.5;
  logn.min = 1;
  logn.max = 100000;  // effectively uncapped
  double sum = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    const int64_t x = logn.sample(rng);
    ASSERT_GE(x, 1);
    sum += static_cast<double>(x);
  }
  EXPECT_NEAR(sum / n, 200, 2);
  EXPECT_NEAR(logn.expected(), 200, 0.5);
  logn.max = 150;  // a cap lowers the mean, and expected() knows by how much
  sum = 0;
  for (int i = 0; i < n; ++i) sum += static_cast<double>(logn.sample(rng));
  EXPECT_NEAR(sum / n, logn.expected(), 1.5);
  EXPECT_LT(logn.expected(), 150);
}

TEST(Workload, PlansSharedPrefixesAndConversations) {
  WorkloadSpec spec;
  spec.num_requests = 8;
  spec.turns = 2;
  spec.shared_prefix_groups = 2;
  spec.shared_prefix_len = 10;
  spec.input.value = 5;
  spec.output.value = 7;
  WorkloadPlan plan(spec, 512);
  ASSERT_EQ(plan.initial().size(), 4u);  // 4 conversations of 2 turns
  EXPECT_EQ(plan.total_requests(), 8u);
  const auto& a = plan.initial()[0].prompt;
  const auto& c = plan.initial()[2].prompt;
  ASSERT_EQ(a.size(), 15u);
  EXPECT_TRUE(std::equal(a.begin(), a.begin() + 10, c.begin()));  // the same group
  EXPECT_FALSE(std::equal(a.begin(), a.begin() + 10, plan.initial()[1].prompt.begin()));
  for (int32_t t : a) EXPECT_TRUE(t >= 3 && t < 512);
  PlannedRequest next;
  EXPECT_TRUE(plan.next_turn(0, 0, &next));
  EXPECT_EQ(next.turn, 1);
  EXPECT_EQ(next.prompt.size(), 5u);  // the driver prepends the conversation so far
  EXPECT_FALSE(plan.next_turn(0, 1, &next));
}

TEST(Workload, ReadsAJsonlTrace) {
  const std::string path = write_temp(
      "kvrt_trace_test.jsonl",
      "{\"timestamp\": 1.5, \"input_len\": 30, \"output_len\": 8, \"group\": 1, \"prefix_len\": "
      "16}\n\n{\"timestamp\": 0.5, \"input_len\": 20, \"output_len\": 4}\n"
      "{\"timestamp\": 2.0, \"input_len\": 30, \"output_len\": 8, \"group\": 1, \"prefix_len\": "
      "16}\n");
  Result<WorkloadSpec> w = load_trace_jsonl(path);
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_EQ(w->trace.size(), 3u);
  EXPECT_DOUBLE_EQ(w->trace[0].arrival_s, 0.5);  // sorted by time
  WorkloadPlan plan(*w, 512);
  ASSERT_EQ(plan.initial().size(), 3u);
  EXPECT_EQ(plan.initial()[0].prompt.size(), 20u);
  EXPECT_EQ(plan.initial()[1].prompt.size(), 30u);
  EXPECT_EQ(plan.initial()[1].max_new_tokens, 8);
  EXPECT_TRUE(std::equal(plan.initial()[1].prompt.begin(), plan.initial()[1].prompt.begin() + 16,
                         plan.initial()[2].prompt.begin()));

  const std::string bad = write_temp("kvrt_trace_bad.jsonl",
                                     "{\"input_len\": 3, \"output_len\": 2}\n{\"input_len\": 3}\n");
  Result<WorkloadSpec> e = load_trace_jsonl(bad);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("kvrt_trace_bad.jsonl:2: missing \"output_len\""),
            std::string::npos)
      << e.status().message();
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

// [workload.sampling]: every generated request (later turns too) samples so, each with a seed
// of its own that is the same in every run; a value out of range names the key; none: greedy.
TEST(Workload, ASamplingTableSamplesEveryRequestWithItsOwnSeed) {
  Result<WorkloadSpec> w = parse_workload_toml(
      "[workload]\nnum_requests = 4\nturns = 2\n"
      "[workload.sampling]\ntemperature = 0.7\ntop_p = 0.95\ntop_k = 40\nmin_p = 0.01\n",
      "w.toml");
  ASSERT_TRUE(w.ok()) << w.status().message();
  WorkloadPlan plan(*w, 512), again(*w, 512);
  ASSERT_EQ(plan.initial().size(), 2u);
  std::set<uint64_t> seeds;
  for (size_t i = 0; i < plan.initial().size(); ++i) {
    const PlannedRequest& r = plan.initial()[i];
    ASSERT_TRUE(r.sampling.has_value());
    EXPECT_EQ(r.sampling->temperature, 0.7f);
    EXPECT_EQ(r.sampling->top_p, 0.95f);
    EXPECT_EQ(r.sampling->top_k, 40);
    EXPECT_EQ(r.sampling->min_p, 0.01f);
    EXPECT_EQ(r.sampling->seed, again.initial()[i].sampling->seed);
    seeds.insert(r.sampling->seed);
    PlannedRequest next;
    ASSERT_TRUE(plan.next_turn(r.conversation, 0, &next));
    ASSERT_TRUE(next.sampling.has_value());
    EXPECT_EQ(next.sampling->top_k, 40);
    seeds.insert(next.sampling->seed);
  }
  EXPECT_EQ(seeds.size(), 4u);
  Result<WorkloadSpec> greedy = parse_workload_toml("[workload]\nnum_requests = 2\n", "g.toml");
  ASSERT_TRUE(greedy.ok());
  EXPECT_FALSE(WorkloadPlan(*greedy, 512).initial()[0].sampling.has_value());
  for (const char* bad : {"top_p = 0", "top_p = 1.5", "temperature = -1", "top_k = -2",
                          "min_p = 2", "seed = 3"}) {
    Result<WorkloadSpec> e = parse_workload_toml(
        std::string("[workload]\n[workload.sampling]\n") + bad + "\n", "b.toml");
    ASSERT_FALSE(e.ok()) << bad;
    const std::string key = std::string(bad).substr(0, std::string(bad).find(' '));
    EXPECT_NE(e.status().message().find("workload.sampling." + key), std::string::npos)
        << e.status().message();
  }
}

// A trace line's sampling (kvrt serve's record_trace writes it) reaches its planned request; a
// line without it is greedy, as traces were before; a value out of range names file:line, key.
TEST(Workload, ATraceCarriesEachRequestsSampling) {
  Result<WorkloadSpec> w = parse_trace_jsonl(
      "{\"timestamp\": 0, \"input_len\": 4, \"output_len\": 2}\n"
      "{\"timestamp\": 1, \"input_len\": 4, \"output_len\": 2, \"temperature\": 0.7, "
      "\"top_p\": 0.9, \"top_k\": -1, \"min_p\": 0.05, \"seed\": 18446744073709551615, "
      "\"frequency_penalty\": 0.5, \"repetition_penalty\": 1.1}\n"
      "{\"timestamp\": 2, \"input_len\": 4, \"output_len\": 2, \"seed\": 3}\n",
      "t.jsonl");
  ASSERT_TRUE(w.ok()) << w.status().message();
  ASSERT_EQ(w->trace.size(), 3u);
  EXPECT_FALSE(w->trace[0].sampling.has_value());
  ASSERT_TRUE(w->trace[1].sampling.has_value());
  const sampling::SamplingParams& p = *w->trace[1].sampling;
  EXPECT_EQ(p.temperature, 0.7f);
  EXPECT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 0);  // -1: every token
  EXPECT_EQ(p.min_p, 0.05f);
  EXPECT_EQ(p.seed, UINT64_MAX);
  EXPECT_EQ(p.frequency_penalty, 0.5f);
  EXPECT_EQ(p.presence_penalty, 0.0f);
  EXPECT_EQ(p.repetition_penalty, 1.1f);
  // A seed alone: greedy (temperature 0), seeded.
  ASSERT_TRUE(w->trace[2].sampling.has_value());
  EXPECT_EQ(w->trace[2].sampling->temperature, 0.0f);
  EXPECT_EQ(w->trace[2].sampling->seed, 3u);
  WorkloadPlan plan(*w, 512);
  ASSERT_EQ(plan.initial().size(), 3u);
  EXPECT_FALSE(plan.initial()[0].sampling.has_value());
  ASSERT_TRUE(plan.initial()[1].sampling.has_value());
  EXPECT_EQ(plan.initial()[1].sampling->seed, UINT64_MAX);

  for (const auto& [line, key] : std::vector<std::pair<std::string, std::string>>{
           {"\"top_p\": 0", "top_p"},
           {"\"temperature\": -1", "temperature"},
           {"\"top_k\": 1.5", "top_k"},
           {"\"seed\": \"x\"", "seed"},
           {"\"presence_penalty\": 3", "presence_penalty"}}) {
    Result<WorkloadSpec> bad =
        parse_trace_jsonl("{\"input_len\": 4, \"output_len\": 2, " + line + "}\n", "b.jsonl");
    ASSERT_FALSE(bad.ok()) << line;
    EXPECT_EQ(bad.status().message().rfind("b.jsonl:1: \"" + key + "\": expected", 0), 0u)
        << bad.status().message();
  }
}

// The driver over an executor that answers at once: a multi-turn workload's later turns resend
// the conversation, so they hit the prefix cache; every request completes.
class Instant : public serve::BatchRunner {
 public:
  Status run(const sched::ScheduledBatch& b, std::span<sampling::Sampler* const>,
             std::vector<int32_t>* next) override {
    for (size_t i = 0; i < b.sequences.size(); ++i) (*next)[i] = 7;
    return Status::Ok();
  }
};

TEST(Workload, ConversationsReuseTheirHistory) {
  WorkloadSpec spec;
  spec.num_requests = 30;
  spec.turns = 3;
  spec.concurrency = 5;
  spec.input.value = 40;
  spec.output.value = 24;
  sched::SchedulerOptions o;
  o.page_size = 8;
  o.num_pages = 400;
  o.vocab_size = 512;
  o.root_hash = sched::root_hash("t");
  o.log_interval = 0;
  o.check_invariants = true;
  Instant exec;
  BenchOptions bo;
  bo.log = false;
  Result<BenchReport> r = run_workload(o, &exec, nullptr, 512, "x", spec, {}, bo);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->requests, 30u);
  EXPECT_EQ(r->completed, 30u);
  EXPECT_EQ(r->generated_tokens, 30u * 24);
  // Turn 2 of each conversation finds turn 1's prompt and answer (64 tokens: 8 pages) cached,
  // turn 3 finds 128 tokens; 10 conversations.
  EXPECT_EQ(r->cached_tokens, 10u * (56 + 120));
  EXPECT_LE(r->max_running, 5);
  EXPECT_NE(r->prometheus.find("kvrt:num_requests_total 30"), std::string::npos);
}

}  // namespace
}  // namespace kvrt::bench
