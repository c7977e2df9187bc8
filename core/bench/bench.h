// `kvrt bench`: a workload run in process through the real scheduler and engine, reported the
// way an operator needs it -- server-side generation throughput beside what clients see,
// latency percentiles, running / queue / token usage, retractions, cached tokens -- and the
// bottleneck diagnosis with the capacity ceiling of every other store on the same budget.
#pragma once

#include <deque>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "core/bench/workload.h"
#include "core/config/config.h"
#include "core/metrics/diagnosis.h"
#include "core/runtime/runtime.h"
#include "core/sched/scheduler.h"
#include "core/serve/serving_core.h"

namespace kvrt::bench {

struct Percentiles {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
};

// What the scheduler held over one interval of a run, as means over the interval's steps (or
// /metrics samples over HTTP): the time series behind the report's charts.
struct TimelinePoint {
  double t_s = 0;  // the interval's end, seconds after the run started
  double running = 0, queued = 0, token_usage = 0;
};

// Quantiles 0, 1/kQuantileSteps, ..., 1 of a distribution: its CDF, for charts and later
// comparison, in kQuantileSteps + 1 values (empty when nothing was measured).
inline constexpr int kQuantileSteps = 100;

struct BenchReport {
  // Over HTTP (kvrt bench --url): the server, the API and how often /metrics was sampled;
  // running, queue and usage are then means of those samples rather than of every step.
  std::string endpoint;
  std::string store;
  uint64_t max_total_num_tokens = 0;
  double duration_s = 0;
  // In process: the CPU seconds this process spent over the run, every thread (0 over HTTP,
  // where the server's own CPU is read from /proc by bench/http_overhead.sh).
  double process_cpu_s = 0;
  uint64_t requests = 0, completed = 0, aborted = 0;
  // Why requests were aborted: each distinct reason and how many times it was given.
  std::map<std::string, uint64_t> abort_reasons;
  // Every request of the run was aborted: the run measured nothing (kvrt bench exits 1).
  bool all_aborted() const { return completed == 0 && aborted > 0; }
  uint64_t prompt_tokens = 0, generated_tokens = 0, cached_tokens = 0, tier_loaded_tokens = 0;
  uint64_t retractions = 0, steps = 0, decode_steps = 0;
  // The decode steps' mean wall time, and what TP rank 0's communicator did in them: time inside
  // collectives (waiting for the other ranks included), their count and the bytes it sent.
  // In process only; tp_backend is "threads" or "mpi".
  struct DecodeComm {
    std::string tp_backend;
    int tp = 1;
    double step_s = 0, comm_s = 0, collectives = 0, bytes_sent = 0;
  } decode;
  // Server side: generated tokens per second of wall time while requests ran -- the figure
  // the scheduler's log prints. Client side: what one request experienced, its output tokens
  // over its whole latency including the wait for admission; and all clients together.
  double server_gen_throughput = 0;
  double decode_rate_per_request = 0;      // tokens/s of a running request (1 / mean ITL)
  double client_effective_throughput = 0;  // mean over requests: output / (end - send)
  double total_output_throughput = 0;      // generated tokens / duration
  Percentiles ttft_s, itl_s, e2e_s;
  std::vector<double> ttft_quantiles_s, itl_quantiles_s;
  std::vector<TimelinePoint> timeline;
  int max_running = 0;
  double mean_running = 0, mean_token_usage = 0, mean_queue = 0;
  // The saturated phase: steps with requests queued, from the first admission blocked by KV
  // on. Its ceiling is max_total_num_tokens / the mean live length of running requests.
  uint64_t saturated_steps = 0;
  double saturated_running = 0, saturated_live_length = 0, saturated_ceiling = 0;
  // The store's host tier at the end (rank 0's tier_info), when it has one.
  bool host_tier = false;
  kvrt_tier_info tier{};
  // kvrt bench --matrix --eval-text: the combination's KV store against exact f32 KV on that
  // corpus (kvrt eval's figures), when it was evaluated.
  struct Accuracy {
    bool measured = false;
    double kl_mean = 0, kl_p99 = 0, top1_agreement = 0, perplexity_ratio = 0;
  } accuracy;
  metrics::Diagnosis diagnosis;  // over the whole run
  std::string prometheus;        // the scheduler's metrics at the end, as /metrics serves them
};

struct BenchOptions {
  bool log = true;             // scheduler log lines and a diagnosis line per interval
  int diagnosis_interval = 0;  // decode steps per diagnosis line; 0: 5 * log_interval
  double timeline_interval_s = 0.1;  // one TimelinePoint per this many seconds of the run
  // Called on the driver's thread each time a request ends: (ended so far, requests in all).
  std::function<void(uint64_t, uint64_t)> progress;
};

// Runs `workload` through a fresh serving core over the runtime's engine (and its store's tier,
// when it has one). `other_stores` are the ceilings the diagnosis compares with.
Result<BenchReport> run_bench(runtime::Runtime& rt, const config::Config& cfg,
                              const WorkloadSpec& workload,
                              const std::vector<metrics::StoreCeiling>& other_stores,
                              const BenchOptions& options = {});

// The same loop over any runner and tier (the scheduler benchmark's instant runner).
Result<BenchReport> run_workload(const sched::SchedulerOptions& sched_options,
                                 serve::BatchRunner* runner, sched::KvTier* tier,
                                 int32_t vocab_size, const std::string& store,
                                 const WorkloadSpec& workload,
                                 const std::vector<metrics::StoreCeiling>& other_stores,
                                 const BenchOptions& options = {});

// The workload driver both use: sends the workload's requests to `core` as their arrival times,
// the concurrency limit and earlier turns allow, steps it until every request has ended, and
// measures what clients see. `core`'s callbacks are the driver's until it returns.
Result<BenchReport> drive(serve::ServingCore& core, int32_t vocab_size,
                          const WorkloadSpec& workload, const BenchOptions& options = {});

// What clients measured, in seconds (ttft, itl and e2e per token or request; effective: each
// request's output tokens over its latency), turned into the report's client-side figures.
struct ClientSamples {
  std::vector<double> ttft, itl, e2e, effective;
};
void fill_client_figures(const ClientSamples& samples, BenchReport* report);
// OK, or when every request of the run was aborted, InvalidArgument saying so with the most
// frequent reason: the run measured nothing.
Status nothing_measured(const BenchReport& report);
// How an aborted request counts: one more for its reason (the scheduler's "request N: " prefix
// dropped, so equal reasons group).
void count_abort(const std::string& why, BenchReport* report);

// Means of running, queue and token usage over fixed intervals of a run, one TimelinePoint
// per interval that saw a sample.
class TimelineRecorder {
 public:
  explicit TimelineRecorder(double interval_s) : interval_s_(interval_s) {}
  void add(double t_s, double running, double queued, double token_usage);
  // The points so far, the interval in progress included.
  std::vector<TimelinePoint> finish();

 private:
  void close();
  double interval_s_;
  double end_s_ = 0;  // the current interval's end
  TimelinePoint sum_;
  int n_ = 0;
  std::vector<TimelinePoint> points_;
};

// A conversation's turn `turn` ended: when it completed and the conversation has another turn,
// that turn goes on `ready`, its prompt being `so_far` (the conversation's prompt and answer)
// then the user's new input; otherwise the turns that will never be sent leave
// report->requests.
void follow_conversation(WorkloadPlan& plan, const WorkloadSpec& workload, int64_t conversation,
                         int turn, bool completed, std::vector<int32_t> so_far,
                         std::deque<PlannedRequest>* ready, BenchReport* report);

// A table of the report's figures, one per line.
std::string format_report(const BenchReport& report);

}  // namespace kvrt::bench
