#include "core/bench/bench.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>
#include <functional>
#include <thread>
#include <time.h>
#include <unordered_map>


namespace kvrt::bench {
namespace {

using Clock = sched::Clock;

double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

// The sample at quantile q of sorted `v` (nearest rank).
double quantile(const std::vector<double>& v, double q) {
  const size_t i = static_cast<size_t>(q * static_cast<double>(v.size() - 1) + 0.5);
  return v[std::min(i, v.size() - 1)];
}

Percentiles percentiles(std::vector<double> v, std::vector<double>* quantiles = nullptr) {
  Percentiles p;
  if (v.empty()) return p;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  p.mean = sum / static_cast<double>(v.size());
  p.p50 = quantile(v, 0.50);
  p.p90 = quantile(v, 0.90);
  p.p99 = quantile(v, 0.99);
  if (quantiles != nullptr) {
    quantiles->clear();
    for (int i = 0; i <= kQuantileSteps; ++i) {
      quantiles->push_back(quantile(v, static_cast<double>(i) / kQuantileSteps));
    }
  }
  return p;
}

}  // namespace

void TimelineRecorder::add(double t_s, double running, double queued, double token_usage) {
  if (n_ > 0 && t_s > end_s_) close();
  if (n_ == 0) {
    // The interval holding t_s, on a grid from 0, so runs line up on one time axis.
    end_s_ = interval_s_ > 0 ? (std::floor(t_s / interval_s_) + 1) * interval_s_ : t_s;
  }
  sum_.running += running;
  sum_.queued += queued;
  sum_.token_usage += token_usage;
  ++n_;
}

void TimelineRecorder::close() {
  const double n = static_cast<double>(n_);
  points_.push_back({end_s_, sum_.running / n, sum_.queued / n, sum_.token_usage / n});
  sum_ = {};
  n_ = 0;
}

std::vector<TimelinePoint> TimelineRecorder::finish() {
  if (n_ > 0) close();
  return points_;
}

void fill_client_figures(const ClientSamples& samples, BenchReport* report) {
  report->ttft_s = percentiles(samples.ttft, &report->ttft_quantiles_s);
  report->itl_s = percentiles(samples.itl, &report->itl_quantiles_s);
  report->e2e_s = percentiles(samples.e2e);
  report->decode_rate_per_request = report->itl_s.mean > 0 ? 1.0 / report->itl_s.mean : 0;
  report->client_effective_throughput = percentiles(samples.effective).mean;
}

Status nothing_measured(const BenchReport& report) {
  if (!report.all_aborted()) return Status::Ok();
  const auto most = std::max_element(
      report.abort_reasons.begin(), report.abort_reasons.end(),
      [](const auto& a, const auto& b) { return a.second < b.second; });
  return Status::InvalidArgument("every request of the workload was aborted (" +
                                 std::to_string(report.aborted) +
                                 "): nothing was measured; most often: " + most->first);
}

void count_abort(const std::string& why, BenchReport* report) {
  ++report->aborted;
  ++report->abort_reasons[why.empty() ? "no reason given" : why];
}

void follow_conversation(WorkloadPlan& plan, const WorkloadSpec& workload, int64_t conversation,
                         int turn, bool completed, std::vector<int32_t> so_far,
                         std::deque<PlannedRequest>* ready, BenchReport* report) {
  PlannedRequest next;
  if (completed && plan.next_turn(conversation, turn, &next)) {
    so_far.insert(so_far.end(), next.prompt.begin(), next.prompt.end());
    next.prompt = std::move(so_far);
    ready->push_back(std::move(next));
  } else {
    // Later turns that will never be sent were counted as requests of the workload.
    report->requests -= static_cast<uint64_t>(workload.turns - 1 - turn);
  }
}

namespace {

// CPU time of the whole process (every thread) so far.
double process_cpu_seconds() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
}

struct InFlight {
  Clock::time_point sent, last;
  bool has_token = false;
  std::vector<int32_t> tokens;  // the prompt, then every token so far (a next turn's start)
};

}  // namespace

Result<BenchReport> run_bench(runtime::Runtime& rt, const config::Config& cfg,
                              const WorkloadSpec& workload,
                              const std::vector<metrics::StoreCeiling>& other_stores,
                              const BenchOptions& options) {
  serve::ServingOptions so = runtime::serving_options(cfg, rt, other_stores);
  so.diagnosis_interval = options.diagnosis_interval;
  if (!options.log) so.scheduler.log_interval = 0;
  serve::ServingCore core(so, rt.engine.get());
  return drive(core, static_cast<int32_t>(rt.model.vocab_size), workload, options);
}

Result<BenchReport> run_workload(const sched::SchedulerOptions& sched_options,
                                 serve::BatchRunner* runner, sched::KvTier* tier,
                                 int32_t vocab_size, const std::string& store,
                                 const WorkloadSpec& workload,
                                 const std::vector<metrics::StoreCeiling>& other_stores,
                                 const BenchOptions& options) {
  serve::ServingOptions so;
  so.scheduler = sched_options;
  so.store = store;
  so.other_stores = other_stores;
  so.diagnosis_interval = options.diagnosis_interval;
  if (!options.log) so.scheduler.log_interval = 0;
  serve::ServingCore core(so, runner, tier);
  return drive(core, vocab_size, workload, options);
}

Result<BenchReport> drive(serve::ServingCore& core, int32_t vocab_size,
                          const WorkloadSpec& workload, const BenchOptions& options) {
  WorkloadPlan plan(workload, vocab_size);
  BenchReport report;
  report.store = core.options().store;
  const comm::Communicator* comm =
      core.engine() != nullptr ? &core.engine()->communicator() : nullptr;
  report.max_total_num_tokens = core.max_total_num_tokens();
  report.requests = plan.total_requests();

  std::deque<PlannedRequest> pending(plan.initial().begin(), plan.initial().end());
  std::deque<PlannedRequest> ready;  // later turns, sent as soon as the limit allows
  std::unordered_map<uint64_t, InFlight> in_flight;
  std::unordered_map<uint64_t, std::pair<int64_t, int>> turn_of;  // id -> (conversation, turn)
  ClientSamples samples;
  std::vector<double>& ttft = samples.ttft;
  std::vector<double>& itl = samples.itl;
  std::vector<double>& e2e = samples.e2e;
  std::vector<double>& effective = samples.effective;

  // What the workload's client hears of request `id`: each output's tokens (TTFT, ITL), then its
  // end, which may send the conversation's next turn.
  auto on_output = [&](uint64_t id, const serve::RequestOutput& out) {
    const Clock::time_point now = Clock::now();
    auto it = in_flight.find(id);
    if (it == in_flight.end()) return;
    InFlight& f = it->second;
    for (size_t k = 0; k < out.new_ids.size(); ++k) {
      if (!f.has_token) {
        ttft.push_back(seconds(now - f.sent));
      } else {
        itl.push_back(k == 0 ? seconds(now - f.last) : 0.0);  // ids of one step arrive together
      }
      f.last = now;
      f.has_token = true;
    }
    f.tokens.insert(f.tokens.end(), out.new_ids.begin(), out.new_ids.end());
    if (!out.finished) return;
    const bool done = serve::completed(out.finish_reason);
    if (!done) {
      count_abort(out.message, &report);
    } else {
      ++report.completed;
      const double latency = seconds(now - f.sent);
      e2e.push_back(latency);
      if (latency > 0) effective.push_back(static_cast<double>(out.output_tokens) / latency);
    }
    std::vector<int32_t> so_far = std::move(f.tokens);
    in_flight.erase(it);
    auto t = turn_of.find(id);
    if (t != turn_of.end()) {
      follow_conversation(plan, workload, t->second.first, t->second.second, done,
                          std::move(so_far), &ready, &report);
      turn_of.erase(t);
    }
    if (options.progress) options.progress(report.completed + report.aborted, report.requests);
  };
  TimelineRecorder timeline(options.timeline_interval_s);

  double running_sum = 0, usage_sum = 0, queue_sum = 0;
  double sat_running = 0, sat_live = 0;
  bool saturated = false;
  Clock::time_point first_send{}, last_end{};
  const Clock::time_point start = Clock::now();
  const double cpu_start = process_cpu_seconds();

  auto send = [&](PlannedRequest& p) {
    serve::GenerateRequest spec;
    spec.id = p.id;
    spec.input_ids = std::move(p.prompt);
    spec.max_new_tokens = p.max_new_tokens;
    if (p.sampling) spec.sampling = *p.sampling;  // a trace's; else greedy
    InFlight& f = in_flight[p.id];
    f = InFlight{Clock::now(), {}, false, spec.input_ids};
    if (first_send == Clock::time_point{}) first_send = Clock::now();
    const uint64_t id = p.id;
    if (Status s = core.submit(std::move(spec), [&on_output, id](const serve::RequestOutput& out) {
          on_output(id, out);
        });
        !s.ok()) {
      // Never served (too long for the pool or the context): counted as aborted, with why.
      in_flight.erase(id);
      count_abort(s.message(), &report);
      if (p.conversation >= 0) {
        follow_conversation(plan, workload, p.conversation, p.turn, false, {}, &ready, &report);
      }
      if (options.progress) options.progress(report.completed + report.aborted, report.requests);
      return;
    }
    if (p.conversation >= 0) turn_of[p.id] = {p.conversation, p.turn};
  };

  while (true) {
    const double now_s = seconds(Clock::now() - start);
    auto room = [&] {
      return workload.concurrency <= 0 || static_cast<int>(in_flight.size()) < workload.concurrency;
    };
    while (!ready.empty() && room()) {
      send(ready.front());
      ready.pop_front();
    }
    while (!pending.empty() && pending.front().arrival_s <= now_s && room()) {
      send(pending.front());
      pending.pop_front();
    }
    if (core.idle()) {
      if (pending.empty() && ready.empty()) break;
      if (!pending.empty() && ready.empty() && room()) {
        // Arrival times are bounded by the workload's parser; the nap is bounded here too.
        const double wait = pending.front().arrival_s - seconds(Clock::now() - start);
        std::this_thread::sleep_for(std::chrono::duration<double>(std::clamp(wait, 0.0, 0.5)));
      }
      continue;
    }
    const comm::CommStats comm_before = comm != nullptr ? comm->stats() : comm::CommStats{};
    const Clock::time_point step_start = Clock::now();
    Result<sched::StepStats> st = core.step();
    if (!st.ok()) return st.status();
    const sched::StepStats& s = *st;
    if (!s.ran) continue;
    ++report.steps;
    report.decode_steps += s.prefill ? 0 : 1;
    if (!s.prefill) {
      report.decode.step_s += seconds(Clock::now() - step_start);
      if (comm != nullptr) {
        const comm::CommStats& after = comm->stats();
        report.decode.comm_s += after.seconds - comm_before.seconds;
        report.decode.collectives +=
            static_cast<double>(after.collectives - comm_before.collectives);
        report.decode.bytes_sent += static_cast<double>(after.bytes_sent - comm_before.bytes_sent);
      }
    }
    report.max_running = std::max(report.max_running, s.running);
    running_sum += s.running;
    usage_sum += s.token_usage;
    queue_sum += s.queued;
    timeline.add(seconds(Clock::now() - start), s.running, s.queued, s.token_usage);
    if (s.admission_blocked_by_kv) saturated = true;
    if (saturated && s.queued > 0 && !s.prefill) {
      ++report.saturated_steps;
      sat_running += s.running;
      sat_live += static_cast<double>(s.live_tokens);
    }
    last_end = Clock::now();
  }

  const sched::SchedulerCounters& c = core.counters();
  report.duration_s = seconds(Clock::now() - start);
  report.process_cpu_s = process_cpu_seconds() - cpu_start;
  if (comm != nullptr) {
    report.decode.tp_backend = comm->backend();
    report.decode.tp = core.engine()->tp();
  }
  if (report.decode_steps > 0) {
    const double n = static_cast<double>(report.decode_steps);
    report.decode.step_s /= n;
    report.decode.comm_s /= n;
    report.decode.collectives /= n;
    report.decode.bytes_sent /= n;
  }
  report.prompt_tokens = c.prompt_tokens;
  report.generated_tokens = c.generated_tokens;
  report.cached_tokens = c.cached_tokens;
  report.tier_loaded_tokens = c.tier_loaded_tokens;
  report.retractions = c.retractions;
  const double active_s = first_send == Clock::time_point{} ? 0 : seconds(last_end - first_send);
  report.server_gen_throughput =
      active_s > 0 ? static_cast<double>(c.generated_tokens) / active_s : 0;
  report.total_output_throughput =
      report.duration_s > 0 ? static_cast<double>(c.generated_tokens) / report.duration_s : 0;
  fill_client_figures(samples, &report);
  report.timeline = timeline.finish();
  if (report.steps > 0) {
    const double n = static_cast<double>(report.steps);
    report.mean_running = running_sum / n;
    report.mean_token_usage = usage_sum / n;
    report.mean_queue = queue_sum / n;
  }
  if (report.saturated_steps > 0 && sat_running > 0) {
    report.saturated_running = sat_running / static_cast<double>(report.saturated_steps);
    report.saturated_live_length = sat_live / sat_running;
    report.saturated_ceiling =
        static_cast<double>(report.max_total_num_tokens) / report.saturated_live_length;
  }
  if (std::optional<kvrt_tier_info> tier = core.tier_info()) {
    report.host_tier = true;
    report.tier = *tier;
  }
  report.diagnosis = core.diagnosis();
  report.prometheus = core.prometheus();
  return report;
}

std::string format_report(const BenchReport& r) {
  std::string out;
  char line[256];
  auto add = [&](const char* fmt, auto... args) {
    std::snprintf(line, sizeof(line), fmt, args...);
    out += line;
    out += '\n';
  };
  using ull = unsigned long long;
  if (!r.endpoint.empty()) add("%-38s %s", "server", r.endpoint.c_str());
  add("%-38s %s", "KV store", r.store.c_str());
  add("%-38s %llu", "max_total_num_tokens", static_cast<ull>(r.max_total_num_tokens));
  add("%-38s %llu completed, %llu aborted of %llu", "requests", static_cast<ull>(r.completed),
      static_cast<ull>(r.aborted), static_cast<ull>(r.requests));
  add("%-38s %.2f", "duration (s)", r.duration_s);
  if (r.process_cpu_s > 0) {
    add("%-38s %.2f (%.3f per 1000 generated tokens)", "process CPU (s)", r.process_cpu_s,
        r.generated_tokens > 0
            ? r.process_cpu_s * 1000.0 / static_cast<double>(r.generated_tokens)
            : 0.0);
  }
  add("%-38s %llu prompt, %llu generated, %llu cached (%llu from the tier)", "tokens",
      static_cast<ull>(r.prompt_tokens), static_cast<ull>(r.generated_tokens),
      static_cast<ull>(r.cached_tokens), static_cast<ull>(r.tier_loaded_tokens));
  add("%-38s %.1f", "server gen throughput (tok/s)", r.server_gen_throughput);
  add("%-38s %.1f", "decode rate per running request (tok/s)", r.decode_rate_per_request);
  add("%-38s %.2f", "client effective throughput (tok/s/req)", r.client_effective_throughput);
  add("%-38s %.1f", "all clients' output (tok/s)", r.total_output_throughput);
  add("%-38s %.1f", "requests completed per second",
      r.duration_s > 0 ? static_cast<double>(r.completed) / r.duration_s : 0.0);
  if (r.steps > 0) {
    add("%-38s %.1f (%llu steps)", "scheduler steps per second",
        r.duration_s > 0 ? static_cast<double>(r.steps) / r.duration_s : 0.0,
        static_cast<ull>(r.steps));
  }
  if (r.endpoint.empty() && r.decode_steps > 0) {
    add("%-38s %.2f", "decode step, mean (ms)", r.decode.step_s * 1e3);
    if (r.decode.tp > 1) {
      add("%-38s %.2f ms (%.1f%% of the step), %.0f collectives, %.1f KiB sent by rank 0 "
          "(TP %d over %s)",
          "TP communication per decode step", r.decode.comm_s * 1e3,
          r.decode.step_s > 0 ? 100 * r.decode.comm_s / r.decode.step_s : 0.0,
          r.decode.collectives, r.decode.bytes_sent / 1024, r.decode.tp,
          r.decode.tp_backend.c_str());
    }
  }
  add("%-38s mean %.1f  p50 %.1f  p90 %.1f  p99 %.1f", "TTFT (ms)", r.ttft_s.mean * 1e3,
      r.ttft_s.p50 * 1e3, r.ttft_s.p90 * 1e3, r.ttft_s.p99 * 1e3);
  add("%-38s mean %.2f  p50 %.2f  p90 %.2f  p99 %.2f", "ITL (ms)", r.itl_s.mean * 1e3,
      r.itl_s.p50 * 1e3, r.itl_s.p90 * 1e3, r.itl_s.p99 * 1e3);
  add("%-38s mean %.2f  p50 %.2f  p99 %.2f", "end-to-end latency (s)", r.e2e_s.mean, r.e2e_s.p50,
      r.e2e_s.p99);
  add("%-38s max %d, mean %.1f", "running requests", r.max_running, r.mean_running);
  add("%-38s %.2f", "mean token usage", r.mean_token_usage);
  add("%-38s %.1f", "mean queue", r.mean_queue);
  add("%-38s %llu", "retractions", static_cast<ull>(r.retractions));
  if (r.saturated_steps > 0) {
    add("%-38s %llu steps: running %.1f, ceiling %.1f (%llu / %.0f mean live tokens)",
        "saturated phase", static_cast<ull>(r.saturated_steps), r.saturated_running,
        r.saturated_ceiling, static_cast<ull>(r.max_total_num_tokens), r.saturated_live_length);
  }
  if (r.host_tier) {
    add("%-38s %llu of %llu pages held; %llu saved, %llu loaded, %llu dropped",
        "host tier (rank 0)", static_cast<ull>(r.tier.used_pages),
        static_cast<ull>(r.tier.capacity_pages), static_cast<ull>(r.tier.saved_pages),
        static_cast<ull>(r.tier.loaded_pages), static_cast<ull>(r.tier.evicted_pages));
  }
  // The most frequent reasons first; a run where nothing completed says so instead of "idle".
  std::vector<std::pair<uint64_t, std::string>> reasons;
  for (const auto& [why, n] : r.abort_reasons) reasons.emplace_back(n, why);
  std::sort(reasons.begin(), reasons.end(), std::greater<>());
  for (size_t i = 0; i < reasons.size() && i < 3; ++i) {
    add("%-38s %llu x %s", i == 0 ? "aborted because" : "", static_cast<ull>(reasons[i].first),
        reasons[i].second.c_str());
  }
  if (r.all_aborted()) {
    out += "Diagnosis: every request was aborted (" + std::to_string(r.aborted) + " of " +
           std::to_string(r.requests) + "): nothing was measured. " +
           (reasons.empty() ? "" : "Most often: " + reasons.front().second) + "\n";
  } else {
    out += r.diagnosis.line + "\n";
  }
  return out;
}

}  // namespace kvrt::bench
