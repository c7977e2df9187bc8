// The serving core: the scheduler, the engine (through engine_step.h's executor and tier), the
// output text (detokenizer.h), the Prometheus metrics and the bottleneck diagnosis as one object.
// Whatever feeds it requests -- `kvrt generate`, `kvrt bench`'s workload driver, the HTTP
// server's step loop -- submits, aborts and calls step() from one thread; each request's
// outputs (request.h) reach its sink on that thread: at the end of each step that advanced it,
// or at once for an abort between steps.
#pragma once

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
  // Over any executor and tier (a test's or a benchmark's instant executor); it samples.
  ServingCore(const ServingOptions& options, sched::StepExecutor* executor, sched::KvTier* tier);
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
  size_t unfinished() const { return live_.size(); }
  // Whether the engine can never step again (its TP group failed): every request is lost.
  bool engine_broken() const { return engine_ != nullptr && engine_->broken(); }
  // The engine it steps; null over another executor.
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
  // A request in flight: where its outputs go and what it has been told.
  struct Live {
    Live(RequestSink s, const GenerateRequest& request, text::OutputText t)
        : sink(std::make_shared<const RequestSink>(std::move(s))),
          sampler(request.sampling, request.input_ids, request.stop_token_ids),
          text(std::move(t)) {}
    // Shared, so a sink that submits or aborts (and rehashes live_) is not moved under itself.
    std::shared_ptr<const RequestSink> sink;
    exec::Sampler sampler;
    text::OutputText text;
    std::vector<int32_t> output;  // every id sampled
    std::vector<exec::SampledLogprobs> logprobs;  // not yet in an output (sampling.logprobs)
    size_t sent_ids = 0;          // of output, in an earlier output
    bool stream = true;           // GenerateRequest::stream
    bool no_output = false;       // max_new_tokens 0: the prefill's token is dropped
    int32_t prompt_tokens = 0;
    int64_t cached_tokens = 0;
    // How an abort ends it (set by abort() before the scheduler's finish).
    FinishReason abort_reason = FinishReason::kAborted;
    std::string abort_message;
    bool advanced = false;  // in step_outputs_ already
    std::optional<RequestOutput> end;  // its last output, once it ended
  };

  void wire();
  exec::Sampler& sampler_of(const sched::Request& r);
  bool on_token(const sched::Request& r, int32_t token);
  void on_finish(const sched::Request& r, sched::FinishKind kind);
  void observe(const sched::StepStats& stats);  // the step's metrics and diagnosis
  // The output of what `live` did since its last one, if it is due (stream_interval, stream);
  // erases it when it ended.
  void deliver(uint64_t id);

  ServingOptions options_;
  std::unordered_map<uint64_t, Live> live_;
  bool in_step_ = false;             // outputs wait for the step's end
  std::vector<uint64_t> step_outputs_;  // the requests advanced in this step, in order
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
};

}  // namespace kvrt::serve
