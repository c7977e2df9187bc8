// The scheduler workload the real-model scheduler tests share: n greedy requests, request i
// being the prompt plus the first k(i) reference ids, whose answer is the remaining ones. On a
// pool too small for all of them they share cached prefixes, wait, get retracted and recomputed.
// stories260k's reference by default; tiny-deepseek-v3's tests pass their own.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <map>
#include <string>
#include <vector>

#include "core/serve/serving_core.h"
#include "tests/e2e/stories260k_reference.h"

namespace kvrt::stories260k {

// At least two ids are left to generate.
inline int known_prefix(int i, const std::vector<int32_t>& expected) {
  return (i * 5) % std::min<int>(13, static_cast<int>(expected.size()) - 1);
}

// Submits the n requests and steps the core until idle; each request's output, by id.
inline std::map<uint64_t, std::vector<int32_t>> run_continuations(
    serve::ServingCore& core, int n, int* steps, const std::vector<int32_t>& prompt = kPrompt,
    const std::vector<int32_t>& expected = kExpected) {
  std::map<uint64_t, std::vector<int32_t>> outputs;
  for (int i = 0; i < n; ++i) {
    const int k = known_prefix(i, expected);
    serve::GenerateRequest spec;
    spec.id = static_cast<uint64_t>(i);
    spec.input_ids = prompt;
    spec.input_ids.insert(spec.input_ids.end(), expected.begin(), expected.begin() + k);
    spec.max_new_tokens = static_cast<int32_t>(expected.size()) - k;
    std::vector<int32_t>& out = outputs[spec.id];
    const Status submitted = core.submit(std::move(spec), [&out](const serve::RequestOutput& o) {
      out.insert(out.end(), o.new_ids.begin(), o.new_ids.end());
      if (o.finished) {
        EXPECT_EQ(o.finish_reason, serve::FinishReason::kLength) << o.message;
      }
    });
    EXPECT_TRUE(submitted.ok()) << submitted.message();
  }
  *steps = 0;
  while (!core.idle() && *steps < 5000) {
    Result<sched::StepStats> s = core.step();
    EXPECT_TRUE(s.ok()) << s.status().message();
    if (!s.ok()) break;
    ++*steps;
  }
  EXPECT_TRUE(core.idle());
  return outputs;
}

// Every request's output is the rest of the reference ids.
inline void expect_continuations(const std::map<uint64_t, std::vector<int32_t>>& outputs, int n,
                                 const std::vector<int32_t>& expected = kExpected) {
  ASSERT_EQ(outputs.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int k = known_prefix(i, expected);
    EXPECT_EQ(outputs.at(i), std::vector<int32_t>(expected.begin() + k, expected.end()))
        << "request " << i << " (prompt + " << k << " reference ids)";
  }
}

// Logs how the run shared the pool (`what` names the store and TP) and expects that it did:
// requests reused cached prefixes and some were retracted.
inline void expect_pool_shared(const serve::ServingCore& core, const std::string& what,
                               uint64_t pages, int steps) {
  const sched::SchedulerCounters& c = core.counters();
  std::printf("%s: %llu pages, %d steps, %llu retractions, %llu cached tokens (%llu from the "
              "tier)\n",
              what.c_str(), static_cast<unsigned long long>(pages), steps,
              static_cast<unsigned long long>(c.retractions),
              static_cast<unsigned long long>(c.cached_tokens),
              static_cast<unsigned long long>(c.tier_loaded_tokens));
  EXPECT_GT(c.cached_tokens, 0u);
  EXPECT_GT(c.retractions, 0u);
}

}  // namespace kvrt::stories260k
