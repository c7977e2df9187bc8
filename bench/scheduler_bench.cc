// Scheduler overhead per step: the real Scheduler (admission, prefix cache, page tables, batch
// building, finish checks, stats) driven by an executor that returns every token at once, with
// N requests decoding. Reports the median and p99 step time besides Google Benchmark's mean.
//
//   ./build/bin/scheduler_bench
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <vector>

#include "core/sched/page_hash.h"
#include "core/sched/scheduler.h"

namespace {

using kvrt::sched::ScheduledBatch;

// One step with an instant model: schedule -> tokens -> update, as the serving core steps.
kvrt::Result<kvrt::sched::StepStats> step(kvrt::sched::Scheduler& scheduler,
                                          std::vector<int32_t>& next) {
  for (;;) {
    const ScheduledBatch& batch = scheduler.schedule();
    if (batch.empty()) break;
    next.resize(batch.sequences.size());
    for (size_t i = 0; i < batch.sequences.size(); ++i) {
      next[i] = static_cast<int32_t>((batch.sequences[i].start * 31 + i) % 500 + 3);
    }
    scheduler.update(next);
  }
  return scheduler.end_step();
}

void BM_DecodeStep(benchmark::State& state) {
  const int running = static_cast<int>(state.range(0));
  const int32_t prompt_len = 128, max_new = 1 << 16;
  kvrt::sched::SchedulerOptions o;
  o.page_size = 16;
  o.num_pages = static_cast<uint64_t>(running) * ((prompt_len + max_new) / 16 + 1);
  o.vocab_size = 512;
  o.root_hash = kvrt::sched::root_hash("scheduler_bench");
  o.max_running_requests = running;
  o.max_prefill_tokens = 1 << 30;
  o.chunked_prefill_size = -1;
  o.log_interval = 0;
  o.check_invariants = false;
  kvrt::sched::Scheduler scheduler(o);
  std::vector<int32_t> next;
  for (int i = 0; i < running; ++i) {
    kvrt::sched::RequestSpec spec;
    spec.id = static_cast<uint64_t>(i);
    spec.prompt.resize(prompt_len);
    for (int32_t t = 0; t < prompt_len; ++t) spec.prompt[t] = (i * 7 + t * 13) % 500 + 3;
    spec.max_new_tokens = max_new;
    scheduler.submit(std::move(spec));
  }
  while (scheduler.num_waiting() > 0) (void)step(scheduler, next);  // admit and prefill everyone
  std::vector<double> micros;
  micros.reserve(1 << 16);
  for (auto _ : state) {
    const auto t0 = std::chrono::steady_clock::now();
    auto s = step(scheduler, next);
    const auto t1 = std::chrono::steady_clock::now();
    if (!s.ok() || s->batch_size != running) {
      state.SkipWithError("the step did not decode every request");
      break;
    }
    micros.push_back(std::chrono::duration<double, std::micro>(t1 - t0).count());
  }
  if (micros.empty()) return;
  std::sort(micros.begin(), micros.end());
  state.counters["p50_us"] = micros[micros.size() / 2];
  state.counters["p99_us"] = micros[std::min(micros.size() - 1, micros.size() * 99 / 100)];
  state.counters["running"] = running;
}
BENCHMARK(BM_DecodeStep)
    ->Arg(64)
    ->Arg(256)
    ->Arg(1024)
    ->Iterations(20000)
    ->Unit(benchmark::kMicrosecond);

}  // namespace

BENCHMARK_MAIN();
