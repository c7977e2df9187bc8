// Bottleneck diagnosis (DESIGN.md, Diagnosis): over each reporting interval the scheduler adds
// one sample per step, and at the end of the interval the window says what limits throughput,
// with the evidence, in one log line an operator can act on.
//
// Rules, applied in order to the interval's means:
//   idle          no steps, or no request ran or waited in any step.
//   KV-bound      requests wait (mean queue > 0) and KV is what stops them: token usage
//                 >= kKvBoundTokenUsage, or admission was blocked by KV in at least
//                 kKvBoundBlockedShare of the steps. The line gives the ceiling
//                 (max_total_num_tokens / mean live length), the measured running count, and
//                 the ceiling every other store would give on the same budget; a host tier is
//                 said not to raise it, because a decoding request's KV must be on the device.
//   client-bound  almost nothing waits (mean queue < kClientBoundMaxQueue) and fewer requests
//                 run than the ceiling allows: the server has room, the client sends too little.
//   compute-bound otherwise: requests wait but KV does not stop them (max_running_requests, or
//                 the step time dominates), or running sits at the ceiling with nothing waiting.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kvrt::metrics {

// Token usage at or above which waiting requests are taken to wait for KV.
inline constexpr double kKvBoundTokenUsage = 0.9;
// Share of steps with the queue head blocked by KV at or above which the interval is KV-bound.
inline constexpr double kKvBoundBlockedShare = 0.5;
// Mean queue below which nothing is taken to wait (a request queued for a step or two is
// admission latency, not a bottleneck).
inline constexpr double kClientBoundMaxQueue = 0.5;

// What the scheduler saw in one step.
struct StepSample {
  int running = 0;                       // requests decoding or prefilling
  int queued = 0;                        // requests waiting for admission
  uint64_t tokens_in_use = 0;            // KV tokens held by running requests + the prefix cache
  uint64_t live_tokens = 0;              // sum of the running requests' current lengths
  bool admission_blocked_by_kv = false;  // queue non-empty and its head did not fit in KV
  int new_admissions = 0;
  double step_seconds = 0.0;
  int decode_tokens = 0;
  int prefill_tokens = 0;
};

// Another KV store's pool size on the same device budget (from the capacity report).
struct StoreCeiling {
  std::string store;  // plugin name, e.g. "kv_fp8_e4m3"
  uint64_t max_total_num_tokens = 0;
  bool host_tier = false;  // keeps evicted prefixes in host memory
};

struct Diagnosis {
  enum class Kind { kIdle, kKvBound, kClientBound, kComputeBound };
  Kind kind = Kind::kIdle;
  uint64_t steps = 0;
  double mean_running = 0.0;
  double mean_queue = 0.0;
  double mean_token_usage = 0.0;  // mean tokens_in_use / max_total_num_tokens
  double kv_blocked_share = 0.0;  // share of steps with admission blocked by KV, 0..1
  double mean_live_length = 0.0;  // mean length of a running request, over request-steps
  double ceiling = 0.0;           // max_total_num_tokens / mean_live_length; 0 when unknown
  double mean_step_seconds = 0.0;
  double mean_tokens_per_step = 0.0;  // decode + prefill tokens
  uint64_t admissions = 0;
  std::string line;  // "Diagnosis: <kind>. <evidence>"
};

// "idle", "KV-bound", "client-bound", "compute-bound".
std::string_view kind_name(Diagnosis::Kind kind);

// Step statistics of one reporting interval. Not thread-safe: the scheduler thread owns it.
class DiagnosisWindow {
 public:
  // Accumulates one step. Never fails.
  void add(const StepSample& sample);

  // Forgets every step, starting a new interval.
  void reset();

  // Steps added since the last reset().
  uint64_t steps() const { return steps_; }

  // Classifies the interval by the rules at the top of this file against a pool of
  // `max_total_num_tokens` (0 leaves usage and ceilings unknown, reported as 0). `other_stores`
  // lists the stores to compare with; an entry named `current_store` is not listed as another
  // store, but its host_tier flag still brings the host-tier note. Does not reset the window.
  Diagnosis diagnose(uint64_t max_total_num_tokens, const std::string& current_store,
                     const std::vector<StoreCeiling>& other_stores) const;

 private:
  uint64_t steps_ = 0;
  uint64_t running_sum_ = 0;  // request-steps
  uint64_t queued_sum_ = 0;
  uint64_t tokens_in_use_sum_ = 0;
  uint64_t live_tokens_sum_ = 0;
  uint64_t blocked_steps_ = 0;
  uint64_t admissions_ = 0;
  double step_seconds_sum_ = 0.0;
  uint64_t decode_tokens_sum_ = 0;
  uint64_t prefill_tokens_sum_ = 0;
};

}  // namespace kvrt::metrics
