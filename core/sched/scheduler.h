// Continuous batching (SGLang's semantics): a waiting queue and a running batch over one pool of
// KV pages shared with a radix prefix cache. Each step either prefills (newly admitted requests,
// chunked) or decodes every running request by one token (num_continuous_decode_steps rounds).
//
// A step is plain data in and out, and the scheduler calls nobody (vLLM v1's schedule ->
// execute -> update): schedule() returns the batch to run, whoever owns the model runs it, and
// update() applies the sampled tokens and returns what advanced and what ended; end_step()
// closes the step with its statistics.
//
// Admission: a request is admitted when free + evictable pages, minus what running requests
// reserve for their future tokens (remaining max_new tokens * new_token_ratio, clipped), cover
// its uncached prompt plus min(max_new_tokens, clip). new_token_ratio decays every decode step
// and resets when a request is retracted. When decode runs out of pages the scheduler evicts
// unreferenced cached prefixes (LRU), then retracts the running requests with the least
// progress (their pages are freed, they go back to the queue and are recomputed later). A
// request that can never fit is refused at submit (check_request). Every request submitted ends
// exactly once.
//
// Page ownership: every page is in exactly one place -- the free list, the prefix cache, or one
// request's private tail. check_invariants() verifies it (after every step in debug builds).
//
// Not thread-safe: one thread calls submit / abort / step.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/config/scheduler_defaults.h"
#include "core/metrics/metrics.h"
#include "core/sched/kv_tier.h"
#include "core/sched/prefix_cache.h"
#include "core/util/status.h"

namespace kvrt::sched {

using Clock = std::chrono::steady_clock;

struct RequestSpec {
  uint64_t id = 0;
  std::vector<int32_t> prompt;
  int32_t max_new_tokens = 128;
  std::vector<int32_t> stop_ids;  // generation ends after one of these (empty: only length)
  // At most this many prompt tokens come from the prefix cache (-1: as many as match): a
  // request that wants its prompt's log-probabilities from position p computes p - 1 on.
  int32_t max_cached_tokens = -1;
};

struct Request {
  RequestSpec spec;
  std::vector<int32_t> tokens;  // prompt, then every generated token
  int32_t prompt_len = 0;
  int32_t kv_len = 0;          // tokens whose K/V are in `pages`
  std::vector<int32_t> pages;  // page table: positions [0, pages.size() * page_size)
  int32_t tree_pages = 0;      // leading pages owned by the prefix cache, locked via `locked`
  PrefixCache::Node* locked = nullptr;
  int64_t cached_tokens = 0;  // served from the cache (device or tier), all admissions
  int32_t retractions = 0;
  uint64_t arrival_order = 0;
  Clock::time_point arrival, first_token, last_token;

  explicit Request(RequestSpec s);
  int32_t output_len() const { return static_cast<int32_t>(tokens.size()) - prompt_len; }
  std::span<const int32_t> output() const {
    return std::span<const int32_t>(tokens).subspan(prompt_len);
  }
};

// One sequence of a step's batch. Spans point into the scheduler's requests and stay valid until
// update() or fail().
struct ScheduledSequence {
  const Request* request = nullptr;
  std::span<const int32_t> tokens;  // new tokens; their K/V are written this step
  int32_t start = 0;                // tokens already in the KV cache
  std::span<const int32_t> pages;   // pages for positions [0, start + tokens.size())
  bool samples = false;             // the step's last token produces a next token
};

enum class FinishKind { kLength, kStop, kAborted };

// A request that ended: its pages are released and the scheduler has forgotten it.
struct Ended {
  uint64_t id = 0;
  FinishKind kind = FinishKind::kLength;
  std::string reason;         // "length", "stop", or why it was aborted
  int64_t cached_tokens = 0;  // prompt tokens served from the cache, all admissions
};

// What schedule() hands out: the sequences to run (empty: the step is over) and the requests it
// had to end while building them (an only running request with no page left to grow into).
struct ScheduledBatch {
  bool prefill = false;
  std::vector<ScheduledSequence> sequences;
  std::vector<Ended> ended;
  bool empty() const { return sequences.empty(); }
  int64_t num_tokens() const {
    int64_t n = 0;
    for (const ScheduledSequence& s : sequences) n += static_cast<int64_t>(s.tokens.size());
    return n;
  }
};

// A generated token, appended to its request.
struct Advanced {
  uint64_t id = 0;
  int32_t token = 0;
  int64_t cached_tokens = 0;
};

// What update() did: every sampled token in batch order, then the requests that ended with it
// (their length or a stop id).
struct StepUpdate {
  std::vector<Advanced> advanced;
  std::vector<Ended> ended;
};

struct SchedulerOptions {
  // Defaults as the [scheduler] table's (core/config/scheduler_defaults.h).
  uint32_t page_size = config::scheduler_defaults::kPageSize;
  uint64_t num_pages = 0;
  int32_t vocab_size = 0;   // prompts with ids outside are aborted
  int64_t max_context = 0;  // prompt + max_new_tokens limit (0: only the pool limits it)
  uint64_t root_hash = 0;   // page_hash.h root for this model
  int64_t chunked_prefill_size = config::scheduler_defaults::kChunkedPrefillSize;  // <= 0: none
  int max_running_requests = config::scheduler_defaults::kMaxRunningRequests;
  int64_t max_prefill_tokens = config::scheduler_defaults::kMaxPrefillTokens;
  int num_continuous_decode_steps = config::scheduler_defaults::kNumContinuousDecodeSteps;
  double new_token_ratio = config::scheduler_defaults::kNewTokenRatio;
  double new_token_ratio_decay = config::scheduler_defaults::kNewTokenRatioDecay;
  double min_new_token_ratio = config::scheduler_defaults::kMinNewTokenRatio;
  int64_t max_new_tokens_clip = config::scheduler_defaults::kMaxNewTokensClip;
  bool longest_prefix_first = false;  // "lpm" policy (fcfs past 128 waiting requests)
  // load from the tier when it holds at least this many pages
  uint64_t tier_min_load_pages = config::scheduler_defaults::kTierMinLoadPages;
  int log_interval = config::scheduler_defaults::kLogInterval;  // 0: no log lines at all
#ifdef NDEBUG
  bool check_invariants = false;  // after every step
#else
  bool check_invariants = true;  // after every step: on in debug builds
#endif
};

// What one step did, for metrics and diagnosis.
struct StepStats {
  bool ran = false;  // false: nothing to do
  bool prefill = false;
  int batch_size = 0;
  int64_t new_tokens = 0;     // tokens computed this step
  int64_t cached_tokens = 0;  // prompt tokens admitted from the cache this step
  int new_requests = 0;       // admitted this step
  int running = 0;            // after the step
  int queued = 0;
  uint64_t pages_in_use = 0;  // held by requests (private + locked cached pages)
  uint64_t cached_pages = 0;
  uint64_t free_pages = 0;
  double token_usage = 0;
  uint64_t live_tokens = 0;  // sum of running requests' lengths
  bool admission_blocked_by_kv = false;
  int retracted = 0;
  int finished = 0;
  double seconds = 0;
};

// Whether the scheduler can ever serve `spec`: a prompt, ids inside the vocabulary,
// max_new_tokens >= 1, the prompt plus max_new_tokens inside the model's context and the whole
// pool. A refusal names the field ("input_ids", "max_new_tokens") and the numbers.
Status check_request(const SchedulerOptions& options, const RequestSpec& spec);

struct SchedulerCounters {
  uint64_t submitted = 0, finished = 0, aborted = 0, retractions = 0;
  uint64_t prompt_tokens = 0, generated_tokens = 0, cached_tokens = 0, tier_loaded_tokens = 0;
  uint64_t evicted_pages = 0;
};

class Scheduler {
 public:
  // `tier` (optional) must outlive the scheduler.
  explicit Scheduler(const SchedulerOptions& options, KvTier* tier = nullptr);
  ~Scheduler();

  // Counters, gauges and histograms (TTFT, ITL, latency, tokens, retractions) for /metrics;
  // not owned, may be null.
  void set_metrics(metrics::ServerMetrics* m) { metrics_ = m; }
  // Sets the gauges (running, queued, token usage, used and total tokens) to the state now,
  // also between steps: /metrics reads them when the server is idle.
  void publish_gauges() const;

  // Queues a request check_request accepted (the serving core checks every request once, at
  // its door: the scheduler does not check again).
  void submit(RequestSpec spec);
  // Ends a waiting or running request as aborted; nullopt for an unknown id.
  std::optional<Ended> abort(uint64_t id, const std::string& reason);
  // Empties the prefix cache (SGLang's /flush_cache), returning how many pages it freed; refused
  // while any request waits or runs, since their pages are in it. A host tier keeps its copies.
  Result<uint64_t> flush_cache();
  // One step, in order:
  //   for (;;) { const ScheduledBatch& b = schedule(); (b.ended ended);
  //              if (b.empty()) break; run it; update(tokens) (or fail() and stop); }
  //   end_step();
  // schedule() admits waiting requests and returns a prefill batch, or else one decode round of
  // every running request (evicting cached prefixes, then retracting requests, when pages run
  // out); within a decode step it returns the next round until num_continuous_decode_steps
  // rounds ran, then an empty batch.
  const ScheduledBatch& schedule();
  // Applies the batch's sampled tokens (next[i] for sequences[i] where it samples): advances
  // each request's KV, caches its full pages, appends its token, and ends the requests that
  // reached their length or a stop id.
  StepUpdate update(std::span<const int32_t> next);
  // The batch could not run: its requests are as they were before it, and the step is over.
  // Returns their ids; whoever steps decides their fate.
  std::vector<uint64_t> fail();
  // Ends a running request as a stop after its last token (a stop string its caller found in
  // the text); nullopt for an unknown id.
  std::optional<Ended> stop(uint64_t id);
  // Closes the step: its statistics, the gauges, the log line and (when on) the invariants.
  Result<StepStats> end_step();

  bool idle() const { return waiting_.empty() && running_.empty() && !chunked_; }
  size_t num_waiting() const { return waiting_.size(); }
  size_t num_running() const { return running_.size() + (chunked_ ? 1 : 0); }
  // KV tokens held by requests now (the num_used_tokens gauge).
  uint64_t tokens_in_use() const;
  const SchedulerCounters& counters() const { return counters_; }
  const PrefixCache& cache() const { return cache_; }
  uint64_t free_pages() const { return free_pages_.size(); }
  double new_token_ratio() const { return new_token_ratio_; }
  const SchedulerOptions& options() const { return options_; }

  // Every page owned exactly once; used + free + cached = total; cache locks match the
  // requests' locked paths; token usage <= 1. Returns the first violation.
  Status check_invariants() const;

 private:
  using RequestPtr = std::unique_ptr<Request>;

  RequestPtr arrive(RequestSpec spec);  // a new request, counted and stamped
  // Admits requests and builds the prefill batch; false when there is none.
  bool schedule_prefill(StepStats* stats);
  void schedule_decode();  // the next decode round into batch_ (empty when none is due)
  void update_prefill(std::span<const int32_t> next, StepUpdate* out);
  void update_decode(std::span<const int32_t> next, StepUpdate* out);
  uint64_t evict(uint64_t n);  // up to n cached pages to the free list; returns how many
  bool take_pages(uint64_t n, std::vector<int32_t>* into);  // evicting as needed
  bool grow_pages(Request& r, int64_t tokens);              // r's pages cover [0, tokens)
  uint64_t reserved_tokens() const;
  // Longest usable cached prefix (device, then tier) for r; locks it into r's page table.
  void attach_prefix(Request& r);
  void cache_computed_pages(Request& r);         // inserts r's full computed pages into the cache
  void release(Request& r, bool keep_in_cache);  // gives back r's pages and lock
  void retract(RequestPtr r);
  void requeue(RequestPtr r);  // into the waiting queue, in arrival order
  Ended finish(RequestPtr r, FinishKind kind, const std::string& reason);
  void emit(Request& r, int32_t token, Clock::time_point now);  // appends a generated token
  // How r ends after its last token (a stop id, or max_new_tokens / the context reached).
  std::optional<FinishKind> finish_kind(const Request& r) const;
  void fill_stats(StepStats* stats) const;
  void log_step(const StepStats& stats);

  SchedulerOptions options_;
  KvTier* tier_;
  PrefixCache cache_;
  std::vector<int32_t> free_pages_;
  std::deque<RequestPtr> waiting_;
  std::vector<RequestPtr> running_;
  RequestPtr chunked_;                  // the request whose prompt is being prefilled in chunks
  std::vector<RequestPtr> prefilling_;  // admitted this step (the batch's other prefills)
  double new_token_ratio_;
  uint64_t arrivals_ = 0;
  uint64_t decode_steps_ = 0;
  uint64_t log_tokens_ = 0;
  Clock::time_point log_since_;
  SchedulerCounters counters_;
  metrics::ServerMetrics* metrics_ = nullptr;
  // The step under way: its batch, statistics, start and decode rounds.
  enum class Phase { kIdle, kPrefill, kDecode, kOver };
  Phase phase_ = Phase::kIdle;
  ScheduledBatch batch_;
  std::vector<Request*> batch_requests_;  // batch_.sequences[i]'s request, writable
  StepStats step_stats_;
  Clock::time_point step_start_;
  int rounds_ = 0;
  int retracted_now_ = 0;  // by this decode round
  std::vector<int32_t> scratch_pages_;
};

}  // namespace kvrt::sched
