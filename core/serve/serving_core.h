// The serving core: the scheduler, the engine (through batch_runner.h and engine_tier.h), the
// output processor (output_processor.h), the Prometheus metrics and the bottleneck diagnosis as
// one object. Whatever feeds it requests -- `kvrt generate`, `kvrt bench`'s workload driver, the
// HTTP server's step loop -- submits, aborts and calls step() from one thread; each request's
// outputs (request.h) reach its sink on that thread: at the end of each step that advanced it,
// or at once for an abort between steps.
//
// A step reads top to bottom: Scheduler::schedule() -> BatchRunner::run (the engine executes the
// batch and samples) -> Scheduler::update() -> OutputProcessor (text, stop strings, outputs),
// repeated for a decode step's rounds, then Scheduler::end_step(). Nothing below calls back up.
#pragma once

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "core/exec/engine.h"
#include "core/sampling/sampler.h"
#include "core/metrics/diagnosis.h"
#include "core/metrics/metrics.h"
#include "core/sched/scheduler.h"
#include "core/serve/batch_runner.h"
#include "core/serve/engine_tier.h"
#include "core/serve/output_processor.h"
#include "core/serve/request.h"
#include "core/text/detokenizer.h"
#include "core/text/tokenizer.h"

namespace kvrt::serve {

struct ServingOptions {
  sched::SchedulerOptions scheduler;
  // Decodes each request's output and matches its stop strings; null: ids only (no text, and
  // stop strings are refused). Outlives the core.
  const text::Tokenizer* tokenizer = nullptr;
  std::string store;  // the KV store's name, for the diagnosis
  // The ceiling each other loadable store would give on the same budget (the diagnosis's
  // "what would X give").
  std::vector<metrics::StoreCeiling> other_stores;
  // Decode steps per diagnosis line in the log; 0: 5 * scheduler.log_interval. No lines when
  // the scheduler logs none (log_interval 0).
  int diagnosis_interval = 0;
  // A streamed request hears its first token at once, then an output every this many tokens
  // (and at its end): SGLang's --stream-interval. 1: every step; more trades smoothness for
  // less work per token in whatever carries the outputs (one event and one write each, over
  // HTTP).
  int stream_interval = 1;
};

// The most top log-probabilities a request may ask for (OpenAI's top_logprobs bound).
inline constexpr int32_t kMaxTopLogprobs = 20;

class ServingCore {
 public:
  // Over the engine (its store's tier when it has one); `engine` outlives the core.
  ServingCore(const ServingOptions& options, exec::Engine* engine);
  // Over any runner and tier (a test's or a benchmark's instant runner), which samples.
  ServingCore(const ServingOptions& options, BatchRunner* runner, sched::KvTier* tier);
  ServingCore(const ServingCore&) = delete;
  ServingCore& operator=(const ServingCore&) = delete;

  // Whether the request can ever be served, every check in one place: the scheduler's
  // (sched::check_request: the prompt, the vocabulary, the context and the pool) and the
  // sampling parameters, stop ids and stop strings. A refusal names GenerateRequest's field
  // (Status::field(): "input_ids", "max_new_tokens", "temperature", "top_p", "top_k", "min_p",
  // "stop_token_ids", "stop"). Reads the options alone: safe from any thread.
  Status check_request(const GenerateRequest& request) const;
  // Queues a request whose outputs go to `sink`; a refusal (check_request) is returned and the
  // sink never hears of it. The id must not be one in flight.
  Status submit(GenerateRequest request, RequestSink sink);
  // submit() for a request check_request already accepted (the step loop checks on the caller's
  // thread): the check is not run again.
  Status submit_checked(GenerateRequest request, RequestSink sink);
  // Ends a waiting or running request with `reason` (kAborted or kEngineFailure) and `message`,
  // freeing its pages; its sink hears the end at once. False for an unknown id.
  bool abort(uint64_t id, const std::string& message, FinishReason reason = FinishReason::kAborted);
  // abort() for every request in flight.
  void abort_all(const std::string& message, FinishReason reason = FinishReason::kAborted);
  // One scheduler step (admission, a prefill or decode batch, finishes), its metrics and
  // diagnosis, then the outputs of every request it advanced. When the engine fails the step,
  // the requests of the failed batch end as kEngineFailure (every request, once the engine is
  // broken for good), the others stay as they were, and the failure is returned.
  Result<sched::StepStats> step();
  bool idle() const { return scheduler_.idle(); }
  // Requests submitted and not yet ended.
  size_t unfinished() const { return outputs_.size(); }
  // Whether the engine can never step again (its TP group failed): every request is lost.
  bool engine_broken() const { return engine_ != nullptr && engine_->broken(); }
  // The engine it steps; null over another runner.
  const exec::Engine* engine() const { return engine_; }

  const ServingOptions& options() const { return options_; }
  const sched::Scheduler& scheduler() const { return scheduler_; }
  const sched::SchedulerCounters& counters() const { return scheduler_.counters(); }
  uint64_t max_total_num_tokens() const;
  // The generation throughput of the last log interval, tokens/s (SGLang's last_gen_throughput).
  double last_gen_throughput() const { return server_metrics_.gen_throughput.value(); }
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
  void configure();
  // One batch of the step: run, applied, its tokens handed to the output processor. A failure
  // is returned, the batch handed back (failed_ holds its requests).
  Status run_batch(const sched::ScheduledBatch& batch);
  void end(const sched::Ended& ended);
  void observe(const sched::StepStats& stats);  // the step's metrics and diagnosis

  ServingOptions options_;
  bool in_step_ = false;            // outputs wait for the step's end
  exec::Engine* engine_ = nullptr;  // null over another runner
  std::unique_ptr<EngineRunner> engine_runner_;
  std::unique_ptr<EngineTier> engine_tier_;
  BatchRunner* runner_;
  sched::Scheduler scheduler_;
  OutputProcessor outputs_;
  std::vector<sampling::Sampler*> samplers_;  // the batch's, per sequence
  std::vector<int32_t> next_;
  std::vector<uint64_t> failed_;  // the failed batch's requests
  metrics::Registry registry_;
  metrics::ServerMetrics server_metrics_;
  std::unique_ptr<metrics::TierMetrics> tier_metrics_;  // with the engine's host tier only
  metrics::DiagnosisWindow whole_, interval_;
  int diagnosis_every_ = 1;
  uint64_t decode_since_diagnosis_ = 0;
};

}  // namespace kvrt::serve
