// The [scheduler] table's defaults (SGLang's), in one place for both the configuration
// (config::Config::Scheduler) and the scheduler's own options (sched::SchedulerOptions), which
// code and tests also build directly. Constants only, so the scheduler need not see the TOML
// parser.
#pragma once

#include <cstdint>

namespace kvrt::config::scheduler_defaults {

inline constexpr int kPageSize = 16;
inline constexpr int64_t kChunkedPrefillSize = 2048;
inline constexpr int kMaxRunningRequests = 256;
inline constexpr int64_t kMaxPrefillTokens = 16384;
inline constexpr int kNumContinuousDecodeSteps = 1;
inline constexpr double kNewTokenRatio = 0.7;
inline constexpr double kNewTokenRatioDecay = 0.001;
inline constexpr double kMinNewTokenRatio = 0.1;
inline constexpr int64_t kMaxNewTokensClip = 4096;
inline constexpr int kLogInterval = 40;
inline constexpr int64_t kTierMinLoadPages = 1;

}  // namespace kvrt::config::scheduler_defaults
