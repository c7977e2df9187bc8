#include "core/metrics/diagnosis.h"

#include <fmt/format.h>

#include <algorithm>

namespace kvrt::metrics {
namespace {

constexpr const char* kHostTierNote =
    "a host tier keeps prefixes for reuse; it does not raise the number of requests that can "
    "decode at once";

double ratio(double numerator, double denominator) {
  return denominator > 0.0 ? numerator / denominator : 0.0;
}

std::string format_ceiling(double ceiling) {
  return ceiling > 0.0 ? fmt::format("{:.1f}", ceiling) : std::string("unknown");
}

std::string kv_bound_line(const Diagnosis& d, uint64_t max_total_num_tokens,
                          const std::string& current_store,
                          const std::vector<StoreCeiling>& other_stores) {
  bool current_has_host_tier = false;
  bool listed_has_host_tier = false;
  for (const StoreCeiling& s : other_stores) {
    if (s.store == current_store) {
      current_has_host_tier = current_has_host_tier || s.host_tier;
    } else {
      listed_has_host_tier = listed_has_host_tier || s.host_tier;
    }
  }

  std::string line = fmt::format("Diagnosis: KV-bound. running {:.1f} (", d.mean_running);
  if (d.ceiling > 0.0) {
    line += fmt::format("ceiling {} / {:.0f} = {:.1f}", max_total_num_tokens, d.mean_live_length,
                        d.ceiling);
  } else {
    line += "ceiling unknown";
  }
  // With no other host-tier store listed, the note goes next to the current store's ceiling.
  if (current_has_host_tier && !listed_has_host_tier) line += fmt::format("; {}", kHostTierNote);
  line += fmt::format(
      "), queue {:.1f}, token usage {:.2f}, admission blocked by KV in {:.0f}% of steps.",
      d.mean_queue, d.mean_token_usage, d.kv_blocked_share * 100.0);

  std::string others;
  bool noted = false;
  for (const StoreCeiling& s : other_stores) {
    if (s.store == current_store) continue;
    if (!others.empty()) others += "; ";
    const double ceiling = ratio(static_cast<double>(s.max_total_num_tokens), d.mean_live_length);
    others += fmt::format("{} -> ceiling {}", s.store, format_ceiling(ceiling));
    if (s.host_tier && !noted) {
      others += fmt::format(" ({})", kHostTierNote);
      noted = true;
    }
  }
  if (!others.empty()) line += fmt::format(" Same budget: {}.", others);
  return line;
}

}  // namespace

std::string_view kind_name(Diagnosis::Kind kind) {
  switch (kind) {
    case Diagnosis::Kind::kIdle:
      return "idle";
    case Diagnosis::Kind::kKvBound:
      return "KV-bound";
    case Diagnosis::Kind::kClientBound:
      return "client-bound";
    case Diagnosis::Kind::kComputeBound:
      return "compute-bound";
  }
  return "unknown";
}

void DiagnosisWindow::add(const StepSample& sample) {
  ++steps_;
  running_sum_ += static_cast<uint64_t>(std::max(sample.running, 0));
  queued_sum_ += static_cast<uint64_t>(std::max(sample.queued, 0));
  tokens_in_use_sum_ += sample.tokens_in_use;
  live_tokens_sum_ += sample.live_tokens;
  if (sample.admission_blocked_by_kv) ++blocked_steps_;
  admissions_ += static_cast<uint64_t>(std::max(sample.new_admissions, 0));
  step_seconds_sum_ += sample.step_seconds;
  decode_tokens_sum_ += static_cast<uint64_t>(std::max(sample.decode_tokens, 0));
  prefill_tokens_sum_ += static_cast<uint64_t>(std::max(sample.prefill_tokens, 0));
}

void DiagnosisWindow::reset() { *this = DiagnosisWindow(); }

Diagnosis DiagnosisWindow::diagnose(uint64_t max_total_num_tokens, const std::string& current_store,
                                    const std::vector<StoreCeiling>& other_stores) const {
  Diagnosis d;
  d.steps = steps_;
  if (steps_ == 0 || (running_sum_ == 0 && queued_sum_ == 0)) {
    d.kind = Diagnosis::Kind::kIdle;
    d.line = steps_ == 0 ? "Diagnosis: idle. no scheduler steps in this interval."
                         : "Diagnosis: idle. no request ran or waited in this interval.";
    return d;
  }

  const double steps = static_cast<double>(steps_);
  d.mean_running = static_cast<double>(running_sum_) / steps;
  d.mean_queue = static_cast<double>(queued_sum_) / steps;
  d.mean_token_usage = ratio(static_cast<double>(tokens_in_use_sum_) / steps,
                             static_cast<double>(max_total_num_tokens));
  d.kv_blocked_share = static_cast<double>(blocked_steps_) / steps;
  // Weighted by request-steps: the mean length of the requests that held KV, which is what
  // divides the pool.
  d.mean_live_length =
      ratio(static_cast<double>(live_tokens_sum_), static_cast<double>(running_sum_));
  d.ceiling = ratio(static_cast<double>(max_total_num_tokens), d.mean_live_length);
  d.mean_step_seconds = step_seconds_sum_ / steps;
  const double decode_per_step = static_cast<double>(decode_tokens_sum_) / steps;
  const double prefill_per_step = static_cast<double>(prefill_tokens_sum_) / steps;
  d.mean_tokens_per_step = decode_per_step + prefill_per_step;
  d.admissions = admissions_;

  const bool kv_full = d.mean_token_usage >= kKvBoundTokenUsage;
  const bool kv_blocks = d.kv_blocked_share >= kKvBoundBlockedShare;
  // An unknown ceiling (no live length reported) cannot show the server full.
  const bool below_ceiling = d.ceiling <= 0.0 || d.mean_running < d.ceiling;
  if (d.mean_queue > 0.0 && (kv_full || kv_blocks)) {
    d.kind = Diagnosis::Kind::kKvBound;
    d.line = kv_bound_line(d, max_total_num_tokens, current_store, other_stores);
  } else if (d.mean_queue < kClientBoundMaxQueue && below_ceiling) {
    d.kind = Diagnosis::Kind::kClientBound;
    d.line = fmt::format(
        "Diagnosis: client-bound. running {:.1f}, queue {:.1f}, token usage {:.2f}: the server "
        "has room for more requests (ceiling {}); send more concurrent requests.",
        d.mean_running, d.mean_queue, d.mean_token_usage, format_ceiling(d.ceiling));
  } else {
    d.kind = Diagnosis::Kind::kComputeBound;
    const std::string why =
        d.mean_queue >= kClientBoundMaxQueue
            ? "requests wait but KV is not what stops them: if running sits at "
              "max_running_requests raise it, otherwise the step time dominates"
            : "running is at the ceiling with nothing waiting; the step time dominates";
    d.line = fmt::format(
        "Diagnosis: compute-bound. running {:.1f} (ceiling {}), queue {:.1f}, token usage {:.2f}, "
        "admission blocked by KV in {:.0f}% of steps. Mean step {:.1f} ms for {:.1f} tokens "
        "({:.1f} decode + {:.1f} prefill), {} admitted; {}.",
        d.mean_running, format_ceiling(d.ceiling), d.mean_queue, d.mean_token_usage,
        d.kv_blocked_share * 100.0, d.mean_step_seconds * 1000.0, d.mean_tokens_per_step,
        decode_per_step, prefill_per_step, d.admissions, why);
  }
  return d;
}

}  // namespace kvrt::metrics
