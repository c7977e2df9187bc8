// The serving core: the scheduler, the engine (through engine_step.h's executor and tier), the
// Prometheus metrics and the bottleneck diagnosis as one object. Whatever feeds it requests --
// `kvrt generate`, `kvrt bench`'s workload driver, an HTTP server -- submits and aborts and calls
// step() from one thread (the step loop); tokens and finishes come back through callbacks, on
// that thread, during step().
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <vector>

#include "core/exec/engine.h"
#include "core/exec/sampler.h"
#include "core/metrics/diagnosis.h"
#include "core/metrics/metrics.h"
#include "core/sched/scheduler.h"
#include "core/serve/engine_step.h"

namespace kvrt::serve {

// One generation request as a client states it (SGLang's /generate: input_ids, sampling_params).
struct GenerateRequest {
  uint64_t id = 0;  // unique among the requests in flight
  std::vector<int32_t> input_ids;
  int32_t max_new_tokens = 128;
  exec::SamplingParams sampling;
  std::vector<int32_t> stop_token_ids;  // generation ends after one of these
};

struct ServingOptions {
  sched::SchedulerOptions scheduler;
  std::string store;  // the KV store's name, for the diagnosis
  // The ceiling each other loadable store would give on the same budget (the diagnosis's
  // "what would X give").
  std::vector<metrics::StoreCeiling> other_stores;
  // Decode steps per diagnosis line in the log; 0: 5 * scheduler.log_interval. No lines when
  // the scheduler logs none (log_interval 0).
  int diagnosis_interval = 0;
};

class ServingCore {
 public:
  using TokenCallback = sched::Scheduler::TokenCallback;
  using FinishCallback = sched::Scheduler::FinishCallback;

  // Over the engine (its store's tier when it has one); `engine` outlives the core.
  ServingCore(const ServingOptions& options, exec::Engine* engine);
  // Over any executor and tier (a test's or a benchmark's instant executor); it samples.
  ServingCore(const ServingOptions& options, sched::StepExecutor* executor, sched::KvTier* tier);
  ServingCore(const ServingCore&) = delete;
  ServingCore& operator=(const ServingCore&) = delete;

  // Each generated token, after it is appended; each request's end, exactly once.
  void on_token(TokenCallback cb) { on_token_ = std::move(cb); }
  void on_finish(FinishCallback cb) { on_finish_ = std::move(cb); }

  // Queues a request; one that can never be served ends at once through on_finish (aborted,
  // with the reason).
  void submit(GenerateRequest request);
  // Ends a waiting or running request as aborted, freeing its pages; false for an unknown id.
  bool abort(uint64_t id, const std::string& reason);
  // One scheduler step (admission, a prefill or decode batch, finishes), then its metrics and
  // diagnosis. An engine failure is returned and leaves every request as it was.
  Result<sched::StepStats> step();
  bool idle() const { return scheduler_.idle(); }
  // Whether the engine can never step again (its TP group failed): every request is lost.
  bool engine_broken() const { return engine_ != nullptr && engine_->broken(); }
  // The engine it steps; null over another executor.
  const exec::Engine* engine() const { return engine_; }

  const ServingOptions& options() const { return options_; }
  const sched::Scheduler& scheduler() const { return scheduler_; }
  const sched::SchedulerCounters& counters() const { return scheduler_.counters(); }
  uint64_t max_total_num_tokens() const;
  // The diagnosis over every step so far.
  metrics::Diagnosis diagnosis() const;
  // The engine's host tier, as its store reports it (tier_info); nullopt without one, or when
  // the store cannot say (logged).
  std::optional<kvrt_tier_info> tier_info() const;
  // The metrics as /metrics serves them, the gauges (and the host tier's pages) as they are now.
  std::string prometheus() const;
  // Empties the prefix cache (POST /flush_cache): the pages freed, or why not (requests run).
  Result<uint64_t> flush_cache() { return scheduler_.flush_cache(); }

 private:
  void wire();
  exec::Sampler& sampler_of(const sched::Request& r);

  ServingOptions options_;
  std::unordered_map<uint64_t, exec::Sampler> samplers_;
  exec::Engine* engine_ = nullptr;  // null over another executor
  std::unique_ptr<EngineExecutor> engine_executor_;
  std::unique_ptr<EngineTier> engine_tier_;
  sched::Scheduler scheduler_;
  metrics::Registry registry_;
  metrics::ServerMetrics server_metrics_;
  std::unique_ptr<metrics::TierMetrics> tier_metrics_;  // with the engine's host tier only
  metrics::DiagnosisWindow whole_, interval_;
  int diagnosis_every_ = 1;
  uint64_t decode_since_diagnosis_ = 0;
  TokenCallback on_token_;
  FinishCallback on_finish_;
};

}  // namespace kvrt::serve
