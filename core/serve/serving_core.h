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
//
// The step loop (StepLoop, below; vLLM's engine core and its busy loop share a file too) is the
// core's one stepping thread, fed by other threads (the HTTP server's network threads).
// Requests are checked on the caller's thread (ServingCore::check_request reads only
// the options) and queued with aborts and commands in a locked inbox; outputs leave through
// each request's sink, called on the step thread (a sink posts them to its connection). The
// loop never waits on a socket: it sleeps only when the core is idle and the inbox empty.
//
// Readers never wait on the step thread either: after each step that ended a request, every
// kSnapshotInterval while busy and whenever it goes idle, the loop publishes a LoopSnapshot
// (the Prometheus text, the server's self-description, the queue) that /metrics,
// /get_server_info and /health read as it is. A request's end is in the snapshot before its
// sink hears it.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <future>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <utility>
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
  // The model's EOS ids (generation_config.json's, else the tokenizer's): every request stops
  // at them too unless it sets ignore_eos -- the one place the EOS policy is applied. Empty (a
  // benchmark's or an evaluation's fixed lengths): none.
  std::vector<int32_t> eos_token_ids;
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

// The step loop.
struct LoopSnapshot {
  std::string prometheus;   // GET /metrics
  std::string description;  // StepLoop::describe's text (GET /get_server_info)
  size_t running = 0, waiting = 0;
  uint64_t tokens_in_use = 0;  // KV tokens held by requests
  bool engine_broken = false;
};

struct StepLoopOptions {
  // The bounded waiting queue: submitted and unfinished requests beyond max_queued_requests +
  // max_running_requests are refused.
  size_t max_queued_requests = 0;
  size_t max_running_requests = 0;
  // The longest a snapshot goes unrefreshed while the loop is busy.
  std::chrono::milliseconds snapshot_interval{100};
};

class StepLoop {
 public:
  StepLoop(ServingCore& core, const StepLoopOptions& options);
  ~StepLoop();  // stop()
  StepLoop(const StepLoop&) = delete;
  StepLoop& operator=(const StepLoop&) = delete;

  // What the snapshot's description holds (GET /get_server_info's JSON); set before start().
  void describe(std::function<std::string(const ServingCore&)> fn) { describe_ = std::move(fn); }
  // Called once, on the step thread, when the engine breaks for good (its TP group failed):
  // every unfinished request has then ended as an engine failure. Set before start().
  void on_engine_broken(std::function<void(const std::string& why)> fn) {
    on_engine_broken_ = std::move(fn);
  }
  void start();
  // Aborts every unfinished request with `reason` (each sink hears it), then joins the thread.
  void stop(const std::string& reason = "the server is shutting down");

  // A fresh request id (unique for this loop's lifetime).
  uint64_t next_id() { return next_id_.fetch_add(1); }
  // From any thread: every request of a batch is queued, or none is. The refusals:
  //   InvalidArgument  a request can never be served: ServingCore::check_request's refusal
  //                    (naming the field), or a batch larger than the queue can ever hold
  //                    (field "batch"); a 400.
  //   NoMemory         the queue is full now: retry later (a 503).
  //   Internal         the loop is stopping (a 503).
  // The sinks of a refused batch are never called; `refused`, when given, is set to the index
  // of the request check_request refused.
  Status submit(std::vector<std::pair<GenerateRequest, RequestSink>> batch,
                size_t* refused = nullptr);
  Status submit(GenerateRequest request, RequestSink sink);
  // From any thread: aborts the request if it is still unfinished.
  void abort(uint64_t id, const std::string& reason);
  // The latest snapshot; never waits on the step thread.
  std::shared_ptr<const LoopSnapshot> snapshot() const;
  // Runs `fn` on the step thread between steps and returns its result, for a command that
  // changes the core (POST /flush_cache). After stop() it runs on the caller's thread.
  template <class F>
  auto call(F fn) -> decltype(fn(std::declval<ServingCore&>())) {
    using R = decltype(fn(core_));
    auto task = std::make_shared<std::packaged_task<R()>>([this, fn] { return fn(core_); });
    std::future<R> result = task->get_future();
    if (!post([task] { (*task)(); }, /*new_work=*/false)) (*task)();
    return result.get();
  }
  size_t unfinished() const { return unfinished_.load(); }
  size_t capacity() const { return max_unfinished_; }

 private:
  // Queues a command for the step thread; false once stopped (or, for new work, stopping).
  bool post(std::function<void()> command, bool new_work);
  void run();
  void publish();
  // The outputs held back during commands and steps, after a snapshot when one ended.
  void flush_outbox();

  ServingCore& core_;
  const StepLoopOptions options_;
  const size_t max_unfinished_;
  std::atomic<uint64_t> next_id_{1};
  std::atomic<size_t> unfinished_{0};
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> inbox_;
  bool stopping_ = false;
  bool stopped_ = false;
  std::thread thread_;
  mutable std::mutex snapshot_mutex_;
  std::shared_ptr<const LoopSnapshot> snapshot_;
  std::function<std::string(const ServingCore&)> describe_;
  std::function<void(const std::string&)> on_engine_broken_;
  // Step thread only.
  std::vector<std::pair<std::shared_ptr<const RequestSink>, RequestOutput>> outbox_;
  bool outbox_has_end_ = false;
  bool engine_broken_ = false;
  std::chrono::steady_clock::time_point published_{};
};

}  // namespace kvrt::serve
