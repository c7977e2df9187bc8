#include "core/sched/scheduler.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>

#include "core/metrics/metrics.h"

namespace kvrt::sched {
namespace {

uint64_t ceil_div(uint64_t a, uint64_t b) { return (a + b - 1) / b; }

}  // namespace

Request::Request(RequestSpec s)
    : spec(std::move(s)),
      tokens(spec.prompt),
      prompt_len(static_cast<int32_t>(spec.prompt.size())) {}

Scheduler::Scheduler(const SchedulerOptions& options, KvTier* tier)
    : options_(options),
      tier_(tier),
      cache_(options.page_size, options.root_hash, tier),
      new_token_ratio_(options.new_token_ratio),
      log_since_(Clock::now()) {
  free_pages_.reserve(options.num_pages);
  // Popped from the back: page 0 is handed out first.
  for (uint64_t p = options.num_pages; p > 0; --p)
    free_pages_.push_back(static_cast<int32_t>(p - 1));
}

Scheduler::~Scheduler() = default;

Scheduler::RequestPtr Scheduler::arrive(RequestSpec spec) {
  auto r = std::make_unique<Request>(std::move(spec));
  r->arrival = Clock::now();
  r->arrival_order = arrivals_++;
  ++counters_.submitted;
  return r;
}

Status check_request(const SchedulerOptions& options, const RequestSpec& spec) {
  if (spec.prompt.empty()) return Status::BadField("input_ids", "the prompt is empty");
  if (spec.max_new_tokens < 1) {
    return Status::BadField("max_new_tokens",
                            "expected at least 1, found " + std::to_string(spec.max_new_tokens));
  }
  for (size_t i = 0; i < spec.prompt.size(); ++i) {
    const int32_t t = spec.prompt[i];
    if (options.vocab_size > 0 && (t < 0 || t >= options.vocab_size)) {
      return Status::BadField("input_ids", "token " + std::to_string(t) + " at position " +
                                               std::to_string(i) +
                                               " is outside the vocabulary of " +
                                               std::to_string(options.vocab_size));
    }
  }
  const uint64_t total = spec.prompt.size() + static_cast<uint64_t>(spec.max_new_tokens);
  const std::string need = std::to_string(spec.prompt.size()) + " prompt tokens + " +
                           std::to_string(spec.max_new_tokens) + " max_new_tokens = " +
                           std::to_string(total) + " tokens";
  if (options.max_context > 0 && static_cast<int64_t>(total) > options.max_context) {
    return Status::BadField("max_new_tokens", need + " exceed the model's context of " +
                                                  std::to_string(options.max_context) + " tokens");
  }
  const uint64_t pages = ceil_div(total, options.page_size);
  if (pages > options.num_pages) {
    return Status::BadField(
        "max_new_tokens",
        need + " of KV (" + std::to_string(pages) + " pages) exceed max_total_num_tokens, the " +
            std::to_string(options.num_pages * options.page_size) + " tokens (" +
            std::to_string(options.num_pages) + " pages) of the whole KV pool: it can never run");
  }
  return Status::Ok();
}

void Scheduler::submit(RequestSpec spec) {
  RequestPtr r = arrive(std::move(spec));
  counters_.prompt_tokens += r->tokens.size();
  if (metrics_ != nullptr) metrics_->prompt_tokens_total.add(static_cast<double>(r->tokens.size()));
  waiting_.push_back(std::move(r));
}

std::optional<Ended> Scheduler::abort(uint64_t id, const std::string& reason) {
  auto matches = [id](const RequestPtr& r) { return r->spec.id == id; };
  if (auto it = std::find_if(waiting_.begin(), waiting_.end(), matches); it != waiting_.end()) {
    RequestPtr r = std::move(*it);
    waiting_.erase(it);
    return finish(std::move(r), FinishKind::kAborted, reason);
  }
  if (auto it = std::find_if(running_.begin(), running_.end(), matches); it != running_.end()) {
    RequestPtr r = std::move(*it);
    running_.erase(it);
    return finish(std::move(r), FinishKind::kAborted, reason);
  }
  if (chunked_ && matches(chunked_)) return finish(std::move(chunked_), FinishKind::kAborted, reason);
  return std::nullopt;
}

std::optional<Ended> Scheduler::stop(uint64_t id) {
  auto it = std::find_if(running_.begin(), running_.end(),
                         [id](const RequestPtr& r) { return r->spec.id == id; });
  if (it == running_.end()) return std::nullopt;
  RequestPtr r = std::move(*it);
  running_.erase(it);
  ++step_stats_.finished;
  return finish(std::move(r), FinishKind::kStop, "stop");
}

uint64_t Scheduler::evict(uint64_t n) {
  scratch_pages_.clear();
  const uint64_t freed = cache_.evict(n, &scratch_pages_);
  counters_.evicted_pages += freed;
  free_pages_.insert(free_pages_.end(), scratch_pages_.begin(), scratch_pages_.end());
  // A tier copying evicted pages out must finish before they are written again.
  if (tier_ != nullptr && freed > 0) {
    if (Status s = tier_->wait(); !s.ok())
      spdlog::warn("KV tier: waiting for copies: {}", s.message());
  }
  return freed;
}

Result<uint64_t> Scheduler::flush_cache() {
  if (!idle()) {
    return Status::InvalidArgument("the cache is not flushed while requests run: " +
                                   std::to_string(num_running()) + " running, " +
                                   std::to_string(num_waiting()) + " waiting");
  }
  return evict(cache_.evictable_pages());
}

bool Scheduler::take_pages(uint64_t n, std::vector<int32_t>* into) {
  if (free_pages_.size() < n) {
    evict(n - free_pages_.size());
    if (free_pages_.size() < n) return false;
  }
  for (uint64_t i = 0; i < n; ++i) {
    into->push_back(free_pages_.back());
    free_pages_.pop_back();
  }
  return true;
}

bool Scheduler::grow_pages(Request& r, int64_t tokens) {
  const uint64_t want = ceil_div(static_cast<uint64_t>(tokens), options_.page_size);
  return want <= r.pages.size() || take_pages(want - r.pages.size(), &r.pages);
}

uint64_t Scheduler::reserved_tokens() const {
  double reserved = 0;
  auto add = [&](const Request& r) {
    const int64_t slots = static_cast<int64_t>(r.pages.size()) * options_.page_size;
    const int64_t prompt_left = std::max<int64_t>(0, static_cast<int64_t>(r.tokens.size()) - slots);
    const int64_t new_left =
        std::min<int64_t>(r.spec.max_new_tokens - r.output_len(), options_.max_new_tokens_clip);
    reserved += static_cast<double>(prompt_left) +
                static_cast<double>(std::max<int64_t>(0, new_left)) * new_token_ratio_;
  };
  for (const RequestPtr& r : running_) add(*r);
  if (chunked_) add(*chunked_);
  return static_cast<uint64_t>(std::ceil(reserved));
}

void Scheduler::cache_computed_pages(Request& r) {
  const int32_t full = r.kv_len / static_cast<int32_t>(options_.page_size);
  if (full <= r.tree_pages) return;
  scratch_pages_.clear();
  PrefixCache::Node* node = cache_.insert(
      std::span<const int32_t>(r.tokens.data(), static_cast<size_t>(full) * options_.page_size),
      std::span<int32_t>(r.pages.data(), static_cast<size_t>(full)), &scratch_pages_, r.locked);
  free_pages_.insert(free_pages_.end(), scratch_pages_.begin(), scratch_pages_.end());
  cache_.lock(node);
  if (r.locked != nullptr) cache_.unlock(r.locked);
  r.locked = node;
  r.tree_pages = node->depth;
}

void Scheduler::release(Request& r, bool keep_in_cache) {
  if (keep_in_cache) cache_computed_pages(r);
  if (r.locked != nullptr) cache_.unlock(r.locked);
  r.locked = nullptr;
  free_pages_.insert(free_pages_.end(), r.pages.begin() + r.tree_pages, r.pages.end());
  r.pages.clear();
  r.tree_pages = 0;
  r.kv_len = 0;
}

Ended Scheduler::finish(RequestPtr r, FinishKind kind, const std::string& reason) {
  release(*r, /*keep_in_cache=*/true);
  if (kind == FinishKind::kAborted) {
    ++counters_.aborted;
    if (options_.log_interval > 0) spdlog::warn("Abort request {}: {}", r->spec.id, reason);
  } else {
    ++counters_.finished;
  }
  if (metrics_ != nullptr) {
    if (kind == FinishKind::kAborted) {
      metrics_->num_aborted_requests_total.add();
    } else {
      metrics_->num_requests_total.add();
      metrics_->e2e_request_latency_seconds.observe(
          std::chrono::duration<double>(Clock::now() - r->arrival).count());
      metrics_->prompt_tokens.observe(r->prompt_len);
      metrics_->generation_tokens.observe(r->output_len());
      if (r->output_len() >= 2) {
        metrics_->time_per_output_token_seconds.observe(
            std::chrono::duration<double>(r->last_token - r->first_token).count() /
            static_cast<double>(r->output_len() - 1));
      }
    }
  }
  return Ended{r->spec.id, kind, reason, r->cached_tokens};
}

void Scheduler::retract(RequestPtr r) {
  ++counters_.retractions;
  ++r->retractions;
  if (metrics_ != nullptr) metrics_->num_retractions_total.add();
  if (options_.log_interval > 0) {
    spdlog::warn(
        "Retract request {}: {} of {} tokens generated, {} tokens of KV freed; #running-req: {}, "
        "#queue-req: {}",
        r->spec.id, r->output_len(), r->spec.max_new_tokens, r->kv_len, running_.size(),
        waiting_.size() + 1);
  }
  // Its computed pages stay in the prefix cache as evictable pages: reclaimed if needed, reused
  // when the request comes back before they are.
  release(*r, /*keep_in_cache=*/true);
  requeue(std::move(r));
}

void Scheduler::requeue(RequestPtr r) {
  // Back in arrival order, so it is readmitted before requests that came after it.
  auto pos = std::find_if(waiting_.begin(), waiting_.end(),
                          [&](const RequestPtr& w) { return w->arrival_order > r->arrival_order; });
  waiting_.insert(pos, std::move(r));
}

void Scheduler::attach_prefix(Request& r) {
  // At most len - 1 tokens come from the cache: the last one is computed for its logits (and
  // those the request wants logits of, max_cached_tokens).
  size_t reusable = r.tokens.size() - 1;
  if (r.spec.max_cached_tokens >= 0) {
    reusable = std::min(reusable, static_cast<size_t>(r.spec.max_cached_tokens));
  }
  const std::span<const int32_t> key(r.tokens.data(), reusable);
  PrefixCache::Match m = cache_.match(key, /*report_hits=*/tier_ != nullptr);
  cache_.lock(m.last);
  r.locked = m.last;
  r.pages = std::move(m.pages);
  r.tree_pages = static_cast<int32_t>(r.pages.size());
  r.kv_len = r.tree_pages * static_cast<int32_t>(options_.page_size);
}

bool Scheduler::schedule_prefill(StepStats* stats) {
  batch_.sequences.clear();
  batch_requests_.clear();
  batch_.prefill = true;
  const uint32_t ps = options_.page_size;
  int64_t budget = options_.max_prefill_tokens;
  if (options_.chunked_prefill_size > 0) budget = std::min(budget, options_.chunked_prefill_size);

  auto add_sequence = [&](Request& r, int64_t n) {
    ScheduledSequence s;
    s.request = &r;
    s.tokens = std::span<const int32_t>(r.tokens).subspan(r.kv_len, n);
    s.start = r.kv_len;
    s.pages = std::span<const int32_t>(r.pages).first(ceil_div(r.kv_len + n, ps));
    s.samples = r.kv_len + n == static_cast<int64_t>(r.tokens.size());
    batch_.sequences.push_back(s);
    batch_requests_.push_back(&r);
  };

  if (chunked_) {
    Request& r = *chunked_;
    const int64_t n = std::min<int64_t>(budget, static_cast<int64_t>(r.tokens.size()) - r.kv_len);
    if (!grow_pages(r, r.kv_len + n)) {
      retract(std::move(chunked_));
      ++stats->retracted;
    } else {
      add_sequence(r, n);
      budget -= n;
    }
  }

  const int active = static_cast<int>(running_.size()) + (chunked_ ? 1 : 0);
  if (active >= options_.max_running_requests || waiting_.empty() || budget <= 0) {
    return !batch_.sequences.empty();
  }

  if (options_.longest_prefix_first && waiting_.size() <= 128) {
    // Longest cached prefix first (SGLang's lpm); ties keep arrival order.
    std::vector<std::pair<size_t, size_t>> order;  // (-matched pages, index)
    for (size_t i = 0; i < waiting_.size(); ++i) {
      const Request& r = *waiting_[i];
      PrefixCache::Match m =
          cache_.match(std::span<const int32_t>(r.tokens.data(), r.tokens.size() - 1));
      order.push_back({m.pages.size(), i});
    }
    std::stable_sort(order.begin(), order.end(),
                     [](const auto& a, const auto& b) { return a.first > b.first; });
    std::deque<RequestPtr> sorted;
    for (const auto& [matched, i] : order) sorted.push_back(std::move(waiting_[i]));
    waiting_.swap(sorted);
  }

  const int64_t reserved_pages = static_cast<int64_t>(ceil_div(reserved_tokens(), ps));
  int64_t room =
      static_cast<int64_t>(free_pages_.size() + cache_.evictable_pages()) - reserved_pages;
  int admitted = static_cast<int>(running_.size()) + (chunked_ ? 1 : 0);
  while (!waiting_.empty() && budget > 0 && admitted < options_.max_running_requests) {
    Request& r = *waiting_.front();
    const uint64_t evictable_before = cache_.evictable_pages();
    attach_prefix(r);
    room -= static_cast<int64_t>(evictable_before - cache_.evictable_pages());
    const int64_t new_clip =
        std::min<int64_t>(r.spec.max_new_tokens - r.output_len(), options_.max_new_tokens_clip);
    const int64_t need =
        static_cast<int64_t>(ceil_div(r.tokens.size() + std::max<int64_t>(0, new_clip), ps)) -
        r.tree_pages;
    const int64_t extend = static_cast<int64_t>(r.tokens.size()) - r.kv_len;
    const bool would_chunk = extend > budget;
    if (need > room || (would_chunk && chunked_)) {
      if (need > room) stats->admission_blocked_by_kv = true;
      room += static_cast<int64_t>(evictable_before - cache_.evictable_pages());
      release(r, /*keep_in_cache=*/false);
      break;
    }
    RequestPtr owned = std::move(waiting_.front());
    waiting_.pop_front();

    // Pages the device no longer holds may still be in the tier.
    if (tier_ != nullptr) {
      const std::span<const int32_t> key(r.tokens.data(), r.tokens.size() - 1);
      std::vector<uint64_t> hashes = cache_.hashes_after(r.locked, key, UINT64_MAX);
      const uint64_t hits = hashes.empty() ? 0 : tier_->lookup(hashes);
      if (hits >= options_.tier_min_load_pages && hits > 0) {
        hashes.resize(hits);
        std::vector<int32_t> fresh;
        if (take_pages(hits, &fresh)) {
          std::vector<uint8_t> loaded;
          uint64_t k = 0;
          if (Status s = tier_->load(hashes, fresh, &loaded); s.ok()) {
            while (k < hits && loaded[k]) ++k;
          } else {
            spdlog::warn("KV tier: loading {} pages for request {}: {}; they are recomputed", hits,
                         r.spec.id, s.message());
          }
          free_pages_.insert(free_pages_.end(), fresh.begin() + k, fresh.end());
          r.pages.insert(r.pages.end(), fresh.begin(), fresh.begin() + k);
          r.kv_len += static_cast<int32_t>(k * ps);
          counters_.tier_loaded_tokens += k * ps;
          cache_computed_pages(r);
        }
      }
    }
    const int64_t cached = r.kv_len;
    r.cached_tokens += cached;
    stats->cached_tokens += cached;
    counters_.cached_tokens += cached;
    if (metrics_ != nullptr) metrics_->cached_tokens_total.add(static_cast<double>(cached));

    const int64_t left = static_cast<int64_t>(r.tokens.size()) - r.kv_len;
    const int64_t n = std::min(left, budget);
    if (!grow_pages(r, r.kv_len + n)) {
      // Should not happen after the room check; put it back rather than lose it.
      release(r, /*keep_in_cache=*/false);
      waiting_.push_front(std::move(owned));
      stats->admission_blocked_by_kv = true;
      break;
    }
    room -= need;
    budget -= n;
    ++admitted;
    ++stats->new_requests;
    add_sequence(r, n);
    if (n < left) {
      chunked_ = std::move(owned);
    } else {
      prefilling_.push_back(std::move(owned));
    }
  }
  return !batch_.sequences.empty();
}

void Scheduler::emit(Request& r, int32_t token, Clock::time_point now) {
  r.tokens.push_back(token);
  ++counters_.generated_tokens;
  ++log_tokens_;
  if (metrics_ != nullptr) {
    metrics_->generation_tokens_total.add();
    if (r.output_len() == 1) {
      metrics_->time_to_first_token_seconds.observe(
          std::chrono::duration<double>(now - r.arrival).count());
    } else {
      metrics_->inter_token_latency_seconds.observe(
          std::chrono::duration<double>(now - r.last_token).count());
    }
  }
  if (r.output_len() == 1) r.first_token = now;
  r.last_token = now;
}

std::optional<FinishKind> Scheduler::finish_kind(const Request& r) const {
  if (r.output_len() == 0) return std::nullopt;
  const std::vector<int32_t>& stop = r.spec.stop_ids;
  if (std::find(stop.begin(), stop.end(), r.tokens.back()) != stop.end()) return FinishKind::kStop;
  if (r.output_len() >= r.spec.max_new_tokens ||
      (options_.max_context > 0 && static_cast<int64_t>(r.tokens.size()) >= options_.max_context)) {
    return FinishKind::kLength;
  }
  return std::nullopt;
}

const ScheduledBatch& Scheduler::schedule() {
  batch_.ended.clear();
  if (phase_ == Phase::kIdle) {
    step_start_ = Clock::now();
    step_stats_ = StepStats{};
    rounds_ = 0;
    if (schedule_prefill(&step_stats_)) {
      phase_ = Phase::kPrefill;
      step_stats_.ran = true;
      step_stats_.prefill = true;
      step_stats_.batch_size = static_cast<int>(batch_.sequences.size());
      step_stats_.new_tokens = batch_.num_tokens();
      return batch_;
    }
    phase_ = running_.empty() ? Phase::kOver : Phase::kDecode;
  } else if (phase_ == Phase::kPrefill) {
    phase_ = Phase::kOver;  // a prefill step is one batch
  }
  batch_.sequences.clear();
  batch_requests_.clear();
  if (phase_ == Phase::kDecode) schedule_decode();
  if (batch_.sequences.empty()) phase_ = Phase::kOver;
  return batch_;
}

void Scheduler::schedule_decode() {
  batch_.prefill = false;
  if (rounds_ >= options_.num_continuous_decode_steps || running_.empty()) return;
  ++rounds_;
  step_stats_.ran = true;
  const uint32_t ps = options_.page_size;
  // Each request writes position kv_len; one whose pages are full needs one more.
  auto needs_page = [&](const Request& r) {
    return static_cast<uint64_t>(r.kv_len) >= r.pages.size() * ps;
  };
  uint64_t need = 0;
  retracted_now_ = 0;
  for (const RequestPtr& r : running_) need += needs_page(*r) ? 1 : 0;
  while (free_pages_.size() < need) {
    if (cache_.evictable_pages() > 0) {
      evict(need - free_pages_.size());
      continue;
    }
    if (chunked_) {
      // A prompt still being prefilled has made the least progress of all: no output yet.
      retract(std::move(chunked_));
      ++step_stats_.retracted;
      ++retracted_now_;
      continue;
    }
    if (running_.size() <= 1) break;
    // The least progress: fewest generated tokens, then the longest prompt (SGLang's order).
    auto victim = std::min_element(running_.begin(), running_.end(),
                                   [](const RequestPtr& a, const RequestPtr& b) {
                                     if (a->output_len() != b->output_len())
                                       return a->output_len() < b->output_len();
                                     return a->prompt_len > b->prompt_len;
                                   });
    if (needs_page(**victim)) --need;
    RequestPtr r = std::move(*victim);
    running_.erase(victim);
    retract(std::move(r));
    ++step_stats_.retracted;
    ++retracted_now_;
  }
  if (retracted_now_ > 0) {
    // SGLang's reset: the share of their max_new_tokens the remaining requests have decoded,
    // plus a margin of kRetractDecodeSteps tokens each -- how much of the reservation they
    // actually turn out to use.
    double decoded = 0, max_new = 0;
    for (const RequestPtr& r : running_) {
      decoded += r->output_len();
      max_new += r->spec.max_new_tokens;
    }
    constexpr double kRetractDecodeSteps = 20;
    new_token_ratio_ = max_new > 0
                           ? std::min(1.0, (decoded + kRetractDecodeSteps *
                                                          static_cast<double>(running_.size())) /
                                               max_new)
                           : options_.new_token_ratio;
  }
  if (free_pages_.size() < need) {
    // One request alone cannot grow: only possible if the pool shrank under it.
    RequestPtr r = std::move(running_.front());
    running_.clear();
    batch_.ended.push_back(finish(std::move(r), FinishKind::kAborted,
                                  "the KV pool has no page left for the only running request"));
    return;
  }
  for (RequestPtr& rp : running_) {
    Request& r = *rp;
    if (needs_page(r)) {
      r.pages.push_back(free_pages_.back());
      free_pages_.pop_back();
    }
    ScheduledSequence s;
    s.request = &r;
    s.tokens = std::span<const int32_t>(r.tokens).subspan(r.kv_len, 1);
    s.start = r.kv_len;
    s.pages = std::span<const int32_t>(r.pages).first(ceil_div(r.kv_len + 1, ps));
    s.samples = true;
    batch_.sequences.push_back(s);
    batch_requests_.push_back(&r);
  }
}

StepUpdate Scheduler::update(std::span<const int32_t> next) {
  StepUpdate out;
  if (batch_.prefill) {
    update_prefill(next, &out);
  } else {
    update_decode(next, &out);
  }
  batch_.sequences.clear();
  return out;
}

void Scheduler::update_prefill(std::span<const int32_t> next, StepUpdate* out) {
  const Clock::time_point now = Clock::now();
  for (size_t i = 0; i < batch_.sequences.size(); ++i) {
    const ScheduledSequence& s = batch_.sequences[i];
    Request& r = *batch_requests_[i];
    r.kv_len += static_cast<int32_t>(s.tokens.size());
    cache_computed_pages(r);
    if (s.samples) {
      emit(r, next[i], now);
      out->advanced.push_back(Advanced{r.spec.id, next[i], r.cached_tokens});
    }
  }
  if (chunked_ && chunked_->kv_len == static_cast<int32_t>(chunked_->tokens.size()) - 1) {
    prefilling_.push_back(std::move(chunked_));
  }
  for (RequestPtr& r : prefilling_) {
    if (std::optional<FinishKind> kind = finish_kind(*r)) {
      ++step_stats_.finished;
      out->ended.push_back(
          finish(std::move(r), *kind, *kind == FinishKind::kStop ? "stop" : "length"));
    } else {
      running_.push_back(std::move(r));
    }
  }
  prefilling_.clear();
}

void Scheduler::update_decode(std::span<const int32_t> next, StepUpdate* out) {
  step_stats_.batch_size = static_cast<int>(batch_.sequences.size());
  step_stats_.new_tokens += static_cast<int64_t>(batch_.sequences.size());
  const Clock::time_point now = Clock::now();
  // The batch is running_ in order.
  size_t kept = 0;
  for (size_t i = 0; i < running_.size(); ++i) {
    RequestPtr& rp = running_[i];
    Request& r = *rp;
    ++r.kv_len;
    emit(r, next[i], now);
    out->advanced.push_back(Advanced{r.spec.id, next[i], r.cached_tokens});
    if (std::optional<FinishKind> kind = finish_kind(r)) {
      ++step_stats_.finished;
      out->ended.push_back(
          finish(std::move(rp), *kind, *kind == FinishKind::kStop ? "stop" : "length"));
    } else {
      running_[kept++] = std::move(rp);
    }
  }
  running_.resize(kept);
  ++decode_steps_;
  if (retracted_now_ == 0) {
    new_token_ratio_ =
        std::max(options_.min_new_token_ratio, new_token_ratio_ - options_.new_token_ratio_decay);
  }
}

std::vector<uint64_t> Scheduler::fail() {
  std::vector<uint64_t> ids;
  for (const ScheduledSequence& s : batch_.sequences) ids.push_back(s.request->spec.id);
  if (batch_.prefill) {
    // Nothing advanced: the admitted requests go back to the queue with their pages released.
    for (RequestPtr& r : prefilling_) {
      release(*r, /*keep_in_cache=*/false);
      requeue(std::move(r));
    }
    prefilling_.clear();
  }
  batch_.sequences.clear();
  phase_ = Phase::kIdle;
  return ids;
}

Result<StepStats> Scheduler::end_step() {
  phase_ = Phase::kIdle;
  StepStats stats = step_stats_;
  fill_stats(&stats);
  stats.seconds = std::chrono::duration<double>(Clock::now() - step_start_).count();
  if (!stats.ran) return stats;
  publish_gauges();
  log_step(stats);
  if (options_.check_invariants) {
    if (Status s = check_invariants(); !s.ok()) return s.WithContext("scheduler invariant");
  }
  return stats;
}

uint64_t Scheduler::tokens_in_use() const {
  StepStats now;
  fill_stats(&now);
  return now.pages_in_use * options_.page_size;
}

void Scheduler::publish_gauges() const {
  if (metrics_ == nullptr) return;
  StepStats now;
  fill_stats(&now);
  metrics_->num_running_reqs.set(now.running);
  metrics_->num_queue_reqs.set(now.queued);
  metrics_->token_usage.set(now.token_usage);
  metrics_->num_used_tokens.set(static_cast<double>(now.pages_in_use * options_.page_size));
  metrics_->max_total_num_tokens.set(static_cast<double>(options_.num_pages * options_.page_size));
}

void Scheduler::fill_stats(StepStats* stats) const {
  stats->running = static_cast<int>(num_running());
  stats->queued = static_cast<int>(waiting_.size());
  stats->free_pages = free_pages_.size();
  stats->cached_pages = cache_.cached_pages();
  stats->pages_in_use = options_.num_pages - free_pages_.size() - cache_.evictable_pages();
  stats->token_usage = options_.num_pages == 0 ? 0.0
                                               : static_cast<double>(stats->pages_in_use) /
                                                     static_cast<double>(options_.num_pages);
  uint64_t live = 0;
  for (const RequestPtr& r : running_) live += r->tokens.size();
  if (chunked_) live += chunked_->kv_len;
  stats->live_tokens = live;
}

void Scheduler::log_step(const StepStats& stats) {
  if (options_.log_interval <= 0) return;
  if (stats.prefill) {
    spdlog::info(
        metrics::prefill_log_line({stats.new_requests, static_cast<uint64_t>(stats.new_tokens),
                                   static_cast<uint64_t>(stats.cached_tokens), stats.token_usage,
                                   stats.running, stats.queued}));
    return;
  }
  if (decode_steps_ % static_cast<uint64_t>(options_.log_interval) != 0) return;
  const Clock::time_point now = Clock::now();
  const double seconds = std::chrono::duration<double>(now - log_since_).count();
  const double throughput = seconds > 0 ? static_cast<double>(log_tokens_) / seconds : 0.0;
  if (metrics_ != nullptr) metrics_->gen_throughput.set(throughput);
  spdlog::info(metrics::decode_log_line({stats.running, stats.pages_in_use * options_.page_size,
                                         stats.token_usage, throughput, stats.queued}));
  log_since_ = now;
  log_tokens_ = 0;
}

Status Scheduler::check_invariants() const {
  const uint64_t total = options_.num_pages;
  std::vector<uint8_t> owners(total, 0);
  auto own = [&](int32_t page, const char* by) -> Status {
    if (page < 0 || static_cast<uint64_t>(page) >= total) {
      return Status::Internal(std::string(by) + " holds page " + std::to_string(page) +
                              " outside the pool of " + std::to_string(total));
    }
    if (owners[page]++ != 0) {
      return Status::Internal("page " + std::to_string(page) + " is owned twice (again by " + by +
                              ")");
    }
    return Status::Ok();
  };
  for (int32_t p : free_pages_) {
    if (Status s = own(p, "the free list"); !s.ok()) return s;
  }
  std::vector<int32_t> cached;
  cache_.collect_pages(&cached);
  for (int32_t p : cached) {
    if (Status s = own(p, "the prefix cache"); !s.ok()) return s;
  }
  std::unordered_map<const PrefixCache::Node*, int32_t> locks;
  uint64_t used = 0;
  auto check_request = [&](const Request& r, bool running) -> Status {
    const std::string who = "request " + std::to_string(r.spec.id);
    for (size_t i = r.tree_pages; i < r.pages.size(); ++i) {
      if (Status s = own(r.pages[i], who.c_str()); !s.ok()) return s;
    }
    used += r.pages.size() - r.tree_pages;
    // Its cached pages are exactly the locked path.
    int32_t depth = 0;
    for (const PrefixCache::Node* n = r.locked; n != nullptr && n->parent != nullptr;
         n = n->parent) {
      ++locks[n];
      if (n->depth - 1 >= static_cast<int32_t>(r.pages.size()) ||
          r.pages[n->depth - 1] != n->page) {
        return Status::Internal(who + ": page table disagrees with its cached prefix at page " +
                                std::to_string(n->depth - 1));
      }
      ++depth;
    }
    if (depth != r.tree_pages) {
      return Status::Internal(who + ": " + std::to_string(r.tree_pages) +
                              " cached pages recorded, the locked path has " +
                              std::to_string(depth));
    }
    if (static_cast<uint64_t>(r.kv_len) > r.pages.size() * options_.page_size) {
      return Status::Internal(who + ": " + std::to_string(r.kv_len) +
                              " tokens of KV in too few pages");
    }
    if (running && r.kv_len != static_cast<int32_t>(r.tokens.size()) - 1) {
      return Status::Internal(who + ": running with " + std::to_string(r.kv_len) +
                              " tokens of KV for " + std::to_string(r.tokens.size()) + " tokens");
    }
    return Status::Ok();
  };
  for (const RequestPtr& r : running_) {
    if (Status s = check_request(*r, true); !s.ok()) return s;
  }
  if (chunked_) {
    if (Status s = check_request(*chunked_, false); !s.ok()) return s;
  }
  for (const RequestPtr& r : waiting_) {
    if (!r->pages.empty() || r->locked != nullptr) {
      return Status::Internal("waiting request " + std::to_string(r->spec.id) + " holds pages");
    }
  }
  if (used + free_pages_.size() + cached.size() != total) {
    return Status::Internal("used " + std::to_string(used) + " + free " +
                            std::to_string(free_pages_.size()) + " + cached " +
                            std::to_string(cached.size()) + " != total " + std::to_string(total) +
                            " pages (a page leaked)");
  }
  // Lock counts: every node's count is the number of requests whose path runs through it.
  uint64_t unlocked = 0;
  std::vector<const PrefixCache::Node*> stack;
  for (const auto& [h, child] : const_cast<PrefixCache&>(cache_).root()->children)
    stack.push_back(child.get());
  while (!stack.empty()) {
    const PrefixCache::Node* n = stack.back();
    stack.pop_back();
    auto it = locks.find(n);
    const int32_t expected = it == locks.end() ? 0 : it->second;
    if (n->lock_ref != expected) {
      return Status::Internal("cached page " + std::to_string(n->page) + " has lock count " +
                              std::to_string(n->lock_ref) + ", requests hold " +
                              std::to_string(expected));
    }
    if (n->lock_ref == 0) ++unlocked;
    for (const auto& [h, child] : n->children) stack.push_back(child.get());
  }
  if (unlocked != cache_.evictable_pages()) {
    return Status::Internal("the cache counts " + std::to_string(cache_.evictable_pages()) +
                            " evictable pages, " + std::to_string(unlocked) + " are unlocked");
  }
  const uint64_t in_use = total - free_pages_.size() - cache_.evictable_pages();
  if (in_use > total || in_use != used + (cached.size() - unlocked)) {
    return Status::Internal("token usage above 1 or miscounted: " + std::to_string(in_use) +
                            " pages in use of " + std::to_string(total));
  }
  return Status::Ok();
}

}  // namespace kvrt::sched
