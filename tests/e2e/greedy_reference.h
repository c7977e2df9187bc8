// What the tests of checkpoints against scripts/reference_forward.py's float64 forward pass
// share: a prompt's reference greedy ids with each step's top-1 margin, and the check of kvrt's
// ids against them up to the reference's first near-tie.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <string>
#include <tuple>
#include <vector>

#include "tests/e2e/model_run.h"

namespace kvrt::e2e {

struct GreedyReference {
  std::vector<int32_t> prompt;
  std::vector<int32_t> ids;     // the reference's greedy continuation
  std::vector<double> margins;  // per step: top-1 minus top-2 logit
};

// Under this margin kvrt's f32 (and bf16 KV) arithmetic may pick the runner-up; the ids from
// such a step on are not compared.
constexpr double kNearTie = 0.01;

// How many leading steps are compared: those before the first near-tie.
inline size_t compared_steps(const GreedyReference& r) {
  size_t n = 0;
  while (n < r.ids.size() && r.margins[n] >= kNearTie) ++n;
  return n;
}

// The smallest margin among the compared steps of all of `refs`.
inline double smallest_compared_margin(const std::vector<GreedyReference>& refs) {
  double least = 1e9;
  for (const GreedyReference& r : refs) {
    for (size_t i = 0; i < compared_steps(r); ++i) least = std::min(least, r.margins[i]);
  }
  return least;
}

// The KV stores, TP sizes and page sizes a checkpoint is checked at, and the tests' names.
using StoreTpPage = std::tuple<std::string, int, int>;
inline auto stores_tp_pages() {
  return ::testing::Combine(::testing::Values("kv_bf16_paged", "kv_f32_paged"),
                            ::testing::Values(1, 2), ::testing::Values(1, 16));
}
inline std::string store_tp_page_name(const ::testing::TestParamInfo<StoreTpPage>& info) {
  return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param)) + "_page" +
         std::to_string(std::get<2>(info.param));
}

// The checkpoint in `dir` (with `kv_heads` KV heads of `head_dim`) run at `at`: kvrt's greedy
// ids after each reference prompt equal the reference's compared steps. device.memory fits
// the f32 embedding of a 150k vocabulary and its bf16 LM head, whole at TP 1.
inline void expect_reference_ids(const std::string& dir, const StoreTpPage& at,
                                 const std::vector<GreedyReference>& refs, uint32_t kv_heads,
                                 uint32_t head_dim) {
  const auto& [store, tp, page_size] = at;
  ModelRun run(dir, store, tp, page_size, {"device.memory=\"96MiB\""});
  ASSERT_TRUE(run.runtime.ok()) << run.runtime.status().message();
  EXPECT_EQ(run.runtime->geometry.num_kv_heads, kv_heads / static_cast<uint32_t>(tp));
  EXPECT_EQ(run.runtime->geometry.k_head_dim, head_dim);
  for (const GreedyReference& r : refs) {
    SCOPED_TRACE("prompt of " + std::to_string(r.prompt.size()) + " ids");
    const size_t n = compared_steps(r);
    ASSERT_GT(n, 0u);
    Result<exec::GenerateResult> out = greedy(run, r.prompt, static_cast<int>(n));
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(out->ids, std::vector<int32_t>(r.ids.begin(), r.ids.begin() + n));
  }
}

}  // namespace kvrt::e2e
