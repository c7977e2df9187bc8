// The scheduler workload the stories260k scheduler tests share: n greedy requests, request i
// being the prompt plus the first k(i) reference ids, whose answer is the remaining ones. On a
// pool too small for all of them they share cached prefixes, wait, get retracted and recomputed.
#pragma once

#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "core/serve/serving_core.h"
#include "tests/e2e/stories260k_reference.h"

namespace kvrt::stories260k {

inline int known_prefix(int i) { return (i * 5) % 13; }

// Submits the n requests and steps the core until idle; each request's output, by id.
inline std::map<uint64_t, std::vector<int32_t>> run_continuations(serve::ServingCore& core,
                                                                  int n, int* steps) {
  std::map<uint64_t, std::vector<int32_t>> outputs;
  core.on_finish([&](const sched::Request& r, sched::FinishKind kind, const std::string& why) {
    EXPECT_EQ(kind, sched::FinishKind::kLength) << why;
    outputs[r.spec.id].assign(r.output().begin(), r.output().end());
  });
  for (int i = 0; i < n; ++i) {
    const int k = known_prefix(i);
    serve::GenerateRequest spec;
    spec.id = static_cast<uint64_t>(i);
    spec.input_ids = kPrompt;
    spec.input_ids.insert(spec.input_ids.end(), kExpected.begin(), kExpected.begin() + k);
    spec.max_new_tokens = static_cast<int32_t>(kExpected.size()) - k;
    core.submit(std::move(spec));
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
inline void expect_continuations(const std::map<uint64_t, std::vector<int32_t>>& outputs, int n) {
  ASSERT_EQ(outputs.size(), static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) {
    const int k = known_prefix(i);
    EXPECT_EQ(outputs.at(i), std::vector<int32_t>(kExpected.begin() + k, kExpected.end()))
        << "request " << i << " (prompt + " << k << " reference ids)";
  }
}

}  // namespace kvrt::stories260k
