#include "core/serve/serving_core.h"

#include <pthread.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

namespace kvrt::serve {

// The engine's runner: the scheduled batch as the engine's, then one Engine::step_and_sample.
Status EngineRunner::run(const sched::ScheduledBatch& batch,
                         std::span<sampling::Sampler* const> samplers, std::vector<int32_t>* next) {
  const size_t n = batch.sequences.size();
  exec_batch_.sequences.resize(n);
  sampling_.resize(n);
  for (size_t i = 0; i < n; ++i) {
    const sched::ScheduledSequence& s = batch.sequences[i];
    exec::SequenceStep& e = exec_batch_.sequences[i];
    e.tokens.assign(s.tokens.begin(), s.tokens.end());
    e.start = s.start;
    e.pages.assign(s.pages.begin(), s.pages.end());
    // A prefill chunk whose rows predict prompt tokens the request wants log-probabilities of
    // (row j predicts position start + j + 1) gets every row's logits.
    const sampling::Sampler& sampler = *samplers[i];
    const int32_t wanted = sampler.next_prompt_position();
    const int32_t last_predicted = s.start + static_cast<int32_t>(s.tokens.size());
    e.all_logits = sampler.params().prompt_logprobs_from >= 0 && wanted < s.request->prompt_len &&
                   last_predicted >= wanted;
    sampling_[i] =
        exec::SequenceSampling{samplers[i], s.request->tokens, s.request->prompt_len, s.samples};
  }
  Result<std::vector<int32_t>> tokens = engine_->step_and_sample(exec_batch_, sampling_);
  if (!tokens.ok()) return tokens.status();
  *next = std::move(*tokens);
  return Status::Ok();
}

ServingCore::ServingCore(const ServingOptions& options, exec::Engine* engine)
    : options_(options),
      engine_(engine),
      engine_runner_(std::make_unique<EngineRunner>(engine)),
      engine_tier_(EngineTier::create(engine)),
      runner_(engine_runner_.get()),
      scheduler_(options.scheduler, engine_tier_.get()),
      outputs_(options.tokenizer, options.stream_interval),
      server_metrics_(registry_) {
  if (engine_tier_ != nullptr) tier_metrics_ = std::make_unique<metrics::TierMetrics>(registry_);
  configure();
}

ServingCore::ServingCore(const ServingOptions& options, BatchRunner* runner, sched::KvTier* tier)
    : options_(options),
      runner_(runner),
      scheduler_(options.scheduler, tier),
      outputs_(options.tokenizer, options.stream_interval),
      server_metrics_(registry_) {
  configure();
}

void ServingCore::configure() {
  scheduler_.set_metrics(&server_metrics_);
  diagnosis_every_ = options_.diagnosis_interval > 0
                         ? options_.diagnosis_interval
                         : std::max(1, 5 * options_.scheduler.log_interval);
}

Status ServingCore::check_request(const GenerateRequest& r) const {
  if (r.max_new_tokens < 0) {
    return Status::BadField("max_new_tokens",
                            "expected 0 or more, found " + std::to_string(r.max_new_tokens));
  }
  sched::RequestSpec spec;
  spec.prompt = r.input_ids;
  // A request for no tokens runs as one for 1 whose token is dropped (submit): it must fit so.
  spec.max_new_tokens = std::max(r.max_new_tokens, 1);
  if (Status s = sched::check_request(options_.scheduler, spec); !s.ok()) return s;
  const sampling::SamplingParams& p = r.sampling;
  if (!(std::isfinite(p.temperature) && p.temperature >= 0)) {
    return Status::BadField("temperature", "expected a finite number >= 0 (0 = greedy), found " +
                                               std::to_string(p.temperature));
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    return Status::BadField("top_p",
                            "expected a number in (0, 1], found " + std::to_string(p.top_p));
  }
  if (!(p.min_p >= 0 && p.min_p <= 1)) {
    return Status::BadField("min_p",
                            "expected a number in [0, 1], found " + std::to_string(p.min_p));
  }
  if (p.top_k < 0) {
    return Status::BadField("top_k",
                            "expected 0 (all tokens) or more, found " + std::to_string(p.top_k));
  }
  for (auto [name, value] : {std::pair{"frequency_penalty", p.frequency_penalty},
                             std::pair{"presence_penalty", p.presence_penalty}}) {
    if (!(value >= -2.0f && value <= 2.0f)) {
      return Status::BadField(name, "expected a number in [-2, 2], found " + std::to_string(value));
    }
  }
  if (!(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0)) {
    return Status::BadField("repetition_penalty", "expected a finite number > 0 (1 = off), found " +
                                                      std::to_string(p.repetition_penalty));
  }
  if (p.min_tokens < 0 || p.min_tokens > r.max_new_tokens) {
    return Status::BadField("min_tokens", "expected 0 to max_new_tokens (" +
                                              std::to_string(r.max_new_tokens) + "), found " +
                                              std::to_string(p.min_tokens));
  }
  if (p.logprobs < -1 || p.logprobs > kMaxTopLogprobs) {
    return Status::BadField("logprobs", "expected at most " + std::to_string(kMaxTopLogprobs) +
                                            " top log-probabilities, found " +
                                            std::to_string(p.logprobs));
  }
  if (p.prompt_logprobs_from < -1 ||
      p.prompt_logprobs_from >= static_cast<int32_t>(r.input_ids.size())) {
    return Status::BadField("prompt_logprobs_from",
                            "expected -1 (none) or a prompt position below " +
                                std::to_string(r.input_ids.size()) + ", found " +
                                std::to_string(p.prompt_logprobs_from));
  }
  const int32_t vocab = options_.scheduler.vocab_size;
  for (const auto& [id, bias] : p.logit_bias) {
    if (vocab > 0 && (id < 0 || id >= vocab)) {
      return Status::BadField("logit_bias", std::to_string(id) + " is outside the vocabulary of " +
                                                std::to_string(vocab));
    }
    if (!(bias >= -100.0f && bias <= 100.0f)) {
      return Status::BadField("logit_bias", "expected biases in [-100, 100], found " +
                                                std::to_string(bias) + " for " +
                                                std::to_string(id));
    }
  }
  for (int32_t id : r.stop_token_ids) {
    if (vocab > 0 && (id < 0 || id >= vocab)) {
      return Status::BadField("stop_token_ids", std::to_string(id) +
                                                    " is outside the vocabulary of " +
                                                    std::to_string(vocab));
    }
  }
  for (const std::string& stop : r.stop) {
    if (stop.empty()) return Status::BadField("stop", "a stop string is empty");
  }
  if (!r.stop.empty() && options_.tokenizer == nullptr) {
    return Status::BadField("stop", "stop strings need a tokenizer, and this server has none");
  }
  return Status::Ok();
}

Status ServingCore::submit(GenerateRequest request, RequestSink sink) {
  if (Status s = check_request(request); !s.ok()) return s;
  return submit_checked(std::move(request), std::move(sink));
}

Status ServingCore::submit_checked(GenerateRequest request, RequestSink sink) {
  if (outputs_.contains(request.id)) {
    return Status::Internal("request id " + std::to_string(request.id) + " is already in flight");
  }
  outputs_.add(request, std::move(sink));
  sched::RequestSpec spec;
  spec.id = request.id;
  spec.prompt = std::move(request.input_ids);
  // No tokens asked for (SGLang's max_new_tokens 0, as bench_serving's random dataset sends):
  // the prompt is still prefilled -- its log-probabilities computed when asked for, its pages
  // cached, as in SGLang -- and the one token that prefill samples is dropped.
  spec.max_new_tokens = std::max(request.max_new_tokens, 1);
  spec.stop_ids = std::move(request.stop_token_ids);
  if (!request.ignore_eos) {
    spec.stop_ids.insert(spec.stop_ids.end(), options_.eos_token_ids.begin(),
                         options_.eos_token_ids.end());
  }
  // Positions whose prompt log-probabilities it wants are computed, not taken from the cache.
  if (request.sampling.prompt_logprobs_from >= 0) {
    spec.max_cached_tokens = std::max(request.sampling.prompt_logprobs_from - 1, 0);
  }
  scheduler_.submit(std::move(spec));
  return Status::Ok();
}

bool ServingCore::abort(uint64_t id, const std::string& message, FinishReason reason) {
  if (!outputs_.contains(id)) return false;
  std::optional<sched::Ended> ended = scheduler_.abort(id, message);
  if (!ended) return false;
  outputs_.end(*ended, reason, message);
  if (!in_step_) outputs_.deliver();
  return true;
}

void ServingCore::abort_all(const std::string& message, FinishReason reason) {
  for (uint64_t id : outputs_.ids()) abort(id, message, reason);
}

uint64_t ServingCore::max_total_num_tokens() const {
  return options_.scheduler.num_pages * options_.scheduler.page_size;
}

std::optional<kvrt_tier_info> ServingCore::tier_info() const {
  if (engine_tier_ == nullptr) return std::nullopt;
  Result<kvrt_tier_info> info = engine_tier_->info();
  if (!info.ok()) {
    spdlog::warn("KV tier: {}", info.status().message());
    return std::nullopt;
  }
  return *info;
}

std::string ServingCore::prometheus() const {
  scheduler_.publish_gauges();
  const sched::SchedulerCounters& c = counters();
  server_metrics_.cache_hit_rate.set(c.prompt_tokens == 0
                                         ? 0.0
                                         : static_cast<double>(c.cached_tokens) /
                                               static_cast<double>(c.prompt_tokens));
  if (tier_metrics_ != nullptr) {
    if (std::optional<kvrt_tier_info> t = tier_info()) {
      tier_metrics_->publish(t->capacity_pages, t->used_pages, t->saved_pages, t->loaded_pages,
                             t->evicted_pages, c.tier_loaded_tokens);
    }
  }
  return registry_.render_prometheus();
}

metrics::Diagnosis ServingCore::diagnosis() const {
  return whole_.diagnose(max_total_num_tokens(), options_.store, options_.other_stores);
}

Result<sched::StepStats> ServingCore::step() {
  in_step_ = true;
  Status failure = Status::Ok();
  for (;;) {
    const sched::ScheduledBatch& batch = scheduler_.schedule();
    for (const sched::Ended& ended : batch.ended) outputs_.end(ended);
    if (batch.empty()) break;
    failure = run_batch(batch);
    if (!failure.ok()) break;
  }
  Result<sched::StepStats> stats = failure.ok() ? scheduler_.end_step() : failure;
  in_step_ = false;
  if (stats.ok() && stats->ran) observe(*stats);
  // Delivered in the order the step advanced them; a sink may submit or abort meanwhile.
  outputs_.deliver();
  if (!failure.ok()) {
    // The engine failed: the requests of the failed batch end with the reason (a retry would
    // fail the same way); the rest go on -- unless the engine broke for good (its TP group
    // failed), when nothing unfinished can finish and every request ends.
    const std::string why = "the engine failed: " + failure.message();
    spdlog::error("step failed for {} requests: {}", failed_.size(), failure.message());
    const std::vector<uint64_t> failed = std::move(failed_);
    failed_.clear();
    for (uint64_t id : failed) abort(id, why, FinishReason::kEngineFailure);
    if (failed.empty() || engine_broken()) abort_all(why, FinishReason::kEngineFailure);
  }
  return stats;
}

Status ServingCore::run_batch(const sched::ScheduledBatch& batch) {
  samplers_.clear();
  for (const sched::ScheduledSequence& s : batch.sequences) {
    samplers_.push_back(&outputs_.sampler(s.request->spec.id));
  }
  next_.assign(batch.sequences.size(), 0);
  if (Status s = runner_->run(batch, samplers_, &next_); !s.ok()) {
    failed_ = scheduler_.fail();
    return s;
  }
  const sched::StepUpdate update = scheduler_.update(next_);
  for (const sched::Advanced& token : update.advanced) {
    // A completed stop string ends the request with this token (unless its length or a stop
    // id ended it already).
    if (outputs_.advance(token)) {
      if (std::optional<sched::Ended> ended = scheduler_.stop(token.id)) outputs_.end(*ended);
    }
  }
  for (const sched::Ended& ended : update.ended) outputs_.end(ended);
  return Status::Ok();
}

void ServingCore::observe(const sched::StepStats& s) {
  metrics::StepSample sample;
  sample.running = s.running;
  sample.queued = s.queued;
  sample.tokens_in_use = s.pages_in_use * options_.scheduler.page_size;
  sample.live_tokens = s.live_tokens;
  sample.admission_blocked_by_kv = s.admission_blocked_by_kv;
  sample.new_admissions = s.new_requests;
  sample.step_seconds = s.seconds;
  sample.decode_tokens = s.prefill ? 0 : static_cast<int>(s.new_tokens);
  sample.prefill_tokens = s.prefill ? static_cast<int>(s.new_tokens) : 0;
  whole_.add(sample);
  interval_.add(sample);
  if (!s.prefill && ++decode_since_diagnosis_ >= static_cast<uint64_t>(diagnosis_every_)) {
    if (options_.scheduler.log_interval > 0) {
      spdlog::info(
          interval_.diagnose(max_total_num_tokens(), options_.store, options_.other_stores).line);
    }
    interval_.reset();
    decode_since_diagnosis_ = 0;
  }
}

// The step loop: the one thread that steps the core.
StepLoop::StepLoop(ServingCore& core, const StepLoopOptions& options)
    : core_(core),
      options_(options),
      max_unfinished_(options.max_queued_requests + options.max_running_requests),
      snapshot_(std::make_shared<const LoopSnapshot>()) {}

StepLoop::~StepLoop() { stop(); }

void StepLoop::start() {
  publish();
  thread_ = std::thread([this] {
    pthread_setname_np(pthread_self(), "kvrt-step");
    run();
  });
}

void StepLoop::stop(const std::string& reason) {
  {
    std::lock_guard lock(mutex_);
    if (stopped_) return;
    stopping_ = true;
    inbox_.emplace_back([this, reason] { core_.abort_all(reason); });
  }
  wake_.notify_all();
  if (thread_.joinable()) {
    thread_.join();
  } else {
    // Never started: the abort runs here, so every sink still hears its end.
    std::deque<std::function<void()>> commands;
    {
      std::lock_guard lock(mutex_);
      commands.swap(inbox_);
    }
    for (auto& command : commands) command();
    flush_outbox();
  }
  // Commands posted after the thread's last look run here, so no caller waits forever.
  std::deque<std::function<void()>> leftover;
  {
    std::lock_guard lock(mutex_);
    stopped_ = true;
    leftover.swap(inbox_);
  }
  for (auto& command : leftover) command();
  flush_outbox();
}

bool StepLoop::post(std::function<void()> command, bool new_work) {
  {
    std::lock_guard lock(mutex_);
    // While stopping, commands and aborts still run on the step thread; new requests do not.
    if (stopped_ || (new_work && stopping_)) return false;
    inbox_.push_back(std::move(command));
  }
  wake_.notify_one();
  return true;
}

Status StepLoop::submit(GenerateRequest request, RequestSink sink) {
  std::vector<std::pair<GenerateRequest, RequestSink>> one;
  one.emplace_back(std::move(request), std::move(sink));
  return submit(std::move(one));
}

Status StepLoop::submit(std::vector<std::pair<GenerateRequest, RequestSink>> batch,
                        size_t* refused) {
  if (batch.size() > max_unfinished_) {
    return Status::BadField(
        "batch", std::to_string(batch.size()) +
                     " prompts can never be held at once: max_queued_requests (" +
                     std::to_string(options_.max_queued_requests) + ") + max_running_requests (" +
                     std::to_string(options_.max_running_requests) + ") = " +
                     std::to_string(max_unfinished_));
  }
  // Checked here, on the caller's thread, so the step thread never spends time on a refusal.
  for (size_t i = 0; i < batch.size(); ++i) {
    if (Status s = core_.check_request(batch[i].first); !s.ok()) {
      if (refused != nullptr) *refused = i;
      return s;
    }
  }
  // Counted here, all at once, so a burst from many connections cannot overrun the bound
  // between steps and a batch is never half admitted.
  if (unfinished_.fetch_add(batch.size()) + batch.size() > max_unfinished_) {
    unfinished_.fetch_sub(batch.size());
    return Status::NoMemory("the waiting queue is full (max_queued_requests " +
                            std::to_string(options_.max_queued_requests) + " + max_running_requests " +
                            std::to_string(options_.max_running_requests) + "); retry later");
  }
  auto shared = std::make_shared<std::vector<std::pair<GenerateRequest, RequestSink>>>(
      std::move(batch));
  const size_t n = shared->size();
  const bool queued = post(
      [this, shared] {
        for (auto& [request, sink] : *shared) {
          auto target = std::make_shared<const RequestSink>(std::move(sink));
          // Held back until the step (or command) is over and, for an end, the snapshot shows it.
          RequestSink hold = [this, target](RequestOutput out) {
            outbox_has_end_ = outbox_has_end_ || out.finished;
            outbox_.emplace_back(target, std::move(out));
          };
          const uint64_t id = request.id;
          if (Status s = core_.submit_checked(std::move(request), std::move(hold)); !s.ok()) {
            // check_request passed on the caller's thread: only a duplicate id gets here.
            spdlog::error("request {}: {}", id, s.message());
            RequestOutput end;
            end.id = id;
            end.finished = true;
            end.finish_reason = FinishReason::kAborted;
            end.message = s.message();
            outbox_has_end_ = true;
            outbox_.emplace_back(target, std::move(end));
          }
        }
      },
      /*new_work=*/true);
  if (!queued) {
    unfinished_.fetch_sub(n);
    return Status::Internal("the server is shutting down");
  }
  return Status::Ok();
}

void StepLoop::abort(uint64_t id, const std::string& reason) {
  post([this, id, reason] { core_.abort(id, reason); }, /*new_work=*/false);
}

std::shared_ptr<const LoopSnapshot> StepLoop::snapshot() const {
  std::lock_guard lock(snapshot_mutex_);
  return snapshot_;
}

void StepLoop::publish() {
  auto s = std::make_shared<LoopSnapshot>();
  s->prometheus = core_.prometheus();
  if (describe_) s->description = describe_(core_);
  s->running = core_.scheduler().num_running();
  s->waiting = core_.scheduler().num_waiting();
  s->tokens_in_use = core_.scheduler().tokens_in_use();
  s->engine_broken = core_.engine_broken();
  published_ = std::chrono::steady_clock::now();
  std::lock_guard lock(snapshot_mutex_);
  snapshot_ = std::move(s);
}

void StepLoop::flush_outbox() {
  if (outbox_.empty()) return;
  if (outbox_has_end_) publish();
  std::vector<std::pair<std::shared_ptr<const RequestSink>, RequestOutput>> outputs;
  outputs.swap(outbox_);
  outbox_has_end_ = false;
  for (auto& [sink, out] : outputs) {
    if (out.finished) unfinished_.fetch_sub(1);
    if (*sink) (*sink)(std::move(out));
  }
}

void StepLoop::run() {
  for (;;) {
    std::deque<std::function<void()>> commands;
    {
      std::unique_lock lock(mutex_);
      if (inbox_.empty() && !stopping_ && core_.idle()) {
        lock.unlock();
        publish();  // the state the loop sleeps in
        lock.lock();
      }
      // Sleep only with nothing to step and nothing to do.
      wake_.wait(lock, [&] { return !inbox_.empty() || stopping_ || !core_.idle(); });
      commands.swap(inbox_);
      if (stopping_ && commands.empty() && core_.unfinished() == 0) return;
    }
    for (auto& command : commands) command();
    flush_outbox();
    if (core_.idle()) continue;
    Result<sched::StepStats> step = core_.step();
    const bool newly_broken = !step.ok() && !engine_broken_ && core_.engine_broken();
    engine_broken_ = engine_broken_ || newly_broken;
    if (std::chrono::steady_clock::now() - published_ >= options_.snapshot_interval) publish();
    flush_outbox();
    if (newly_broken && on_engine_broken_) on_engine_broken_(step.status().message());
  }
}

}  // namespace kvrt::serve
