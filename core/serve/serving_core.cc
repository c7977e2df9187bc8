#include "core/serve/serving_core.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>

namespace kvrt::serve {

ServingCore::ServingCore(const ServingOptions& options, exec::Engine* engine)
    : options_(options),
      engine_(engine),
      engine_executor_(std::make_unique<EngineExecutor>(
          engine, [this](const sched::Request& r) -> exec::Sampler& { return sampler_of(r); })),
      engine_tier_(EngineTier::create(engine)),
      scheduler_(options.scheduler, engine_executor_.get(), engine_tier_.get()),
      server_metrics_(registry_) {
  if (engine_tier_ != nullptr) tier_metrics_ = std::make_unique<metrics::TierMetrics>(registry_);
  wire();
}

ServingCore::ServingCore(const ServingOptions& options, sched::StepExecutor* executor,
                         sched::KvTier* tier)
    : options_(options), scheduler_(options.scheduler, executor, tier), server_metrics_(registry_) {
  wire();
}

void ServingCore::wire() {
  scheduler_.set_metrics(&server_metrics_);
  scheduler_.on_token([this](const sched::Request& r, int32_t token) { return on_token(r, token); });
  scheduler_.on_finish([this](const sched::Request& r, sched::FinishKind kind, const std::string&) {
    on_finish(r, kind);
  });
  diagnosis_every_ = options_.diagnosis_interval > 0
                         ? options_.diagnosis_interval
                         : std::max(1, 5 * options_.scheduler.log_interval);
}

exec::Sampler& ServingCore::sampler_of(const sched::Request& r) {
  // Every request the scheduler runs was submitted here, with its sampler.
  return live_.at(r.spec.id).sampler;
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
  const exec::SamplingParams& p = r.sampling;
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
  if (live_.count(request.id) != 0) {
    return Status::Internal("request id " + std::to_string(request.id) + " is already in flight");
  }
  Live live(std::move(sink), request,
            text::OutputText(options_.tokenizer, request.input_ids, std::move(request.stop)));
  live.prompt_tokens = static_cast<int32_t>(request.input_ids.size());
  live.stream = request.stream;
  live.no_output = request.max_new_tokens == 0;
  const uint64_t id = request.id;
  live_.emplace(id, std::move(live));
  sched::RequestSpec spec;
  spec.id = id;
  spec.prompt = std::move(request.input_ids);
  // No tokens asked for (SGLang's max_new_tokens 0, as bench_serving's random dataset sends):
  // the prompt is still prefilled -- its log-probabilities computed when asked for, its pages
  // cached, as in SGLang -- and the one token that prefill samples is dropped.
  spec.max_new_tokens = std::max(request.max_new_tokens, 1);
  spec.stop_ids = std::move(request.stop_token_ids);
  // Positions whose prompt log-probabilities it wants are computed, not taken from the cache.
  if (request.sampling.prompt_logprobs_from >= 0) {
    spec.max_cached_tokens = std::max(request.sampling.prompt_logprobs_from - 1, 0);
  }
  Status queued = scheduler_.submit(std::move(spec));
  if (!queued.ok()) live_.erase(id);  // check_request said it would be taken
  return queued;
}

bool ServingCore::on_token(const sched::Request& r, int32_t token) {
  Live& live = live_.at(r.spec.id);
  if (live.no_output) {
    if (live.sampler.has_logprobs()) live.sampler.take_logprobs();
    live.cached_tokens = r.cached_tokens;
    if (!live.advanced) {
      live.advanced = true;
      step_outputs_.push_back(r.spec.id);
    }
    return false;
  }
  live.output.push_back(token);
  // Each sampled token was the sampler's; an executor that samples elsewhere (a test's) has none.
  if (live.sampler.has_logprobs()) live.logprobs.push_back(live.sampler.take_logprobs());
  live.cached_tokens = r.cached_tokens;
  if (!live.advanced) {
    live.advanced = true;
    step_outputs_.push_back(r.spec.id);
  }
  // A completed stop string ends the request with this token, counted as finished.
  return options_.tokenizer != nullptr && live.text.update(live.output);
}

void ServingCore::on_finish(const sched::Request& r, sched::FinishKind kind) {
  const uint64_t id = r.spec.id;
  Live& live = live_.at(id);
  RequestOutput end;
  end.finished = true;
  if (kind == sched::FinishKind::kAborted) {
    end.finish_reason = live.abort_reason;
    end.message = live.abort_message;
  } else if (kind == sched::FinishKind::kLength || live.no_output) {
    // (Its dropped token may have been a stop id: it asked for no tokens and got as many.)
    end.finish_reason = FinishReason::kLength;
  } else if (r.stopped) {
    end.finish_reason = FinishReason::kStopString;
    end.matched_stop = live.text.matched();
  } else {
    end.finish_reason = FinishReason::kStopToken;
    end.matched_token = live.output.empty() ? -1 : live.output.back();
  }
  // The whole output decoded at once: exact, a character the last token left unfinished
  // included (a stop string's cut stays).
  live.text.finish(live.output);
  live.cached_tokens = r.cached_tokens;
  live.end = std::move(end);
  if (!in_step_) return deliver(id);
  if (!live.advanced) {
    live.advanced = true;
    step_outputs_.push_back(id);
  }
}

void ServingCore::deliver(uint64_t id) {
  auto it = live_.find(id);
  if (it == live_.end()) return;
  Live& live = it->second;
  live.advanced = false;
  if (!live.end) {
    // Not ended: due when it streams and this is its first token or an interval's worth.
    const size_t unsent = live.output.size() - live.sent_ids;
    const auto interval = static_cast<size_t>(std::max(1, options_.stream_interval));
    const bool due = live.stream && unsent > 0 && (live.sent_ids == 0 || unsent >= interval);
    if (!due) return;
  }
  RequestOutput out = live.end ? std::move(*live.end) : RequestOutput{};
  out.id = id;
  out.new_ids.assign(live.output.begin() + static_cast<ptrdiff_t>(live.sent_ids),
                     live.output.end());
  live.sent_ids = live.output.size();
  out.new_logprobs = std::move(live.logprobs);
  live.logprobs.clear();
  out.prompt_logprobs = live.sampler.take_prompt_logprobs();
  if (options_.tokenizer != nullptr) out.new_text = live.text.take();
  out.output_tokens = static_cast<int32_t>(live.output.size());
  out.prompt_tokens = live.prompt_tokens;
  out.cached_tokens = live.cached_tokens;
  const std::shared_ptr<const RequestSink> sink = live.sink;
  // Ended: forgotten before its sink hears it, so a sink may submit the next request at once.
  if (out.finished) live_.erase(it);
  if (*sink) (*sink)(std::move(out));
}

bool ServingCore::abort(uint64_t id, const std::string& message, FinishReason reason) {
  auto it = live_.find(id);
  if (it == live_.end()) return false;
  it->second.abort_reason = reason;
  it->second.abort_message = message;
  return scheduler_.abort(id, message);
}

void ServingCore::abort_all(const std::string& message, FinishReason reason) {
  std::vector<uint64_t> ids;
  ids.reserve(live_.size());
  for (const auto& entry : live_) ids.push_back(entry.first);
  for (uint64_t id : ids) abort(id, message, reason);
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
  Result<sched::StepStats> st = scheduler_.step();
  in_step_ = false;
  if (st.ok() && st->ran) observe(*st);
  // Delivered in the order the step advanced them; a sink may submit or abort meanwhile.
  std::vector<uint64_t> advanced;
  advanced.swap(step_outputs_);
  for (uint64_t id : advanced) deliver(id);
  if (!st.ok()) {
    // The engine failed: the requests of the failed batch end with the reason (a retry would
    // fail the same way); the rest go on -- unless the engine broke for good (its TP group
    // failed), when nothing unfinished can finish and every request ends.
    const std::string why = "the engine failed: " + st.status().message();
    spdlog::error("step failed for {} requests: {}", scheduler_.failed_batch().size(),
                  st.status().message());
    const std::vector<uint64_t> failed = scheduler_.failed_batch();
    for (uint64_t id : failed) abort(id, why, FinishReason::kEngineFailure);
    if (failed.empty() || engine_broken()) abort_all(why, FinishReason::kEngineFailure);
  }
  return st;
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

}  // namespace kvrt::serve
