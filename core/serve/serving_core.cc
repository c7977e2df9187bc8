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
  scheduler_.on_token([this](const sched::Request& r, int32_t token) {
    if (on_token_) on_token_(r, token);
  });
  scheduler_.on_finish(
      [this](const sched::Request& r, sched::FinishKind kind, const std::string& reason) {
        samplers_.erase(r.spec.id);
        if (on_finish_) on_finish_(r, kind, reason);
      });
  diagnosis_every_ = options_.diagnosis_interval > 0
                         ? options_.diagnosis_interval
                         : std::max(1, 5 * options_.scheduler.log_interval);
}

exec::Sampler& ServingCore::sampler_of(const sched::Request& r) {
  auto it = samplers_.find(r.spec.id);
  // A request submitted before its sampler existed cannot happen (submit makes it); greedy
  // is the safe reading should it ever.
  if (it == samplers_.end()) it = samplers_.emplace(r.spec.id, exec::Sampler({})).first;
  return it->second;
}

namespace {

// What the scheduler does not check: the sampling parameters and the stop ids.
Status check_sampling(const GenerateRequest& r, int32_t vocab_size) {
  const exec::SamplingParams& p = r.sampling;
  if (!(std::isfinite(p.temperature) && p.temperature >= 0)) {
    return Status::InvalidArgument(
        "temperature: expected a finite number >= 0 (0 = greedy), found " +
        std::to_string(p.temperature));
  }
  if (!(p.top_p > 0 && p.top_p <= 1)) {
    return Status::InvalidArgument("top_p: expected a number in (0, 1], found " +
                                   std::to_string(p.top_p));
  }
  if (!(p.min_p >= 0 && p.min_p <= 1)) {
    return Status::InvalidArgument("min_p: expected a number in [0, 1], found " +
                                   std::to_string(p.min_p));
  }
  if (p.top_k < 0) {
    return Status::InvalidArgument("top_k: expected 0 (all tokens) or more, found " +
                                   std::to_string(p.top_k));
  }
  for (int32_t id : r.stop_token_ids) {
    if (vocab_size > 0 && (id < 0 || id >= vocab_size)) {
      return Status::InvalidArgument("stop_token_ids: " + std::to_string(id) +
                                     " is outside the vocabulary of " + std::to_string(vocab_size));
    }
  }
  return Status::Ok();
}

}  // namespace

void ServingCore::submit(GenerateRequest request) {
  const Status sampling = check_sampling(request, options_.scheduler.vocab_size);
  if (sampling.ok()) samplers_.insert_or_assign(request.id, exec::Sampler(request.sampling));
  sched::RequestSpec spec;
  spec.id = request.id;
  spec.prompt = std::move(request.input_ids);
  spec.max_new_tokens = request.max_new_tokens;
  spec.stop_ids = std::move(request.stop_token_ids);
  if (!sampling.ok()) {
    // Ended at once like the scheduler's own refusals: aborted, with the field named.
    const std::string reason = "request " + std::to_string(spec.id) + ": " + sampling.message();
    scheduler_.reject(std::move(spec), reason);
    return;
  }
  scheduler_.submit(std::move(spec));
}

bool ServingCore::abort(uint64_t id, const std::string& reason) {
  return scheduler_.abort(id, reason);
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
  Result<sched::StepStats> st = scheduler_.step();
  if (!st.ok() || !st->ran) return st;
  const sched::StepStats& s = *st;
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
  return st;
}

}  // namespace kvrt::serve
