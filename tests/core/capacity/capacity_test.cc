#include "core/capacity/capacity.h"

#include <gtest/gtest.h>

namespace kvrt::capacity {
namespace {

TEST(Capacity, SglangBudgetRule) {
  // 24 GiB, 15 GiB of weights, fraction 0.88: reserve 0.12 * 24 GiB; the rest after weights is
  // the KV budget, floored to whole pages.
  Budget b{24ull << 30, 15ull << 30, 0.88};
  Result<Plan> p = plan(b, 2u << 20, 16);
  ASSERT_TRUE(p.ok()) << p.status().message();
  const double kv = (24.0 - 15.0 - 0.12 * 24.0) * (1ull << 30);
  EXPECT_NEAR(static_cast<double>(p->kv_budget), kv, 1.0);
  EXPECT_EQ(p->num_pages, p->kv_budget / (2u << 20));
  EXPECT_EQ(p->max_total_num_tokens, p->num_pages * 16);
  EXPECT_EQ(p->bytes_per_token(), 131072u);
  EXPECT_EQ(p->concurrent_decodes(4096), p->max_total_num_tokens / 4096);
}

TEST(Capacity, RefusesWithTheShortfallInBytes) {
  Budget b{2ull << 30, 15ull << 30, 0.88};
  Result<Plan> p = plan(b, 1u << 20, 16);
  ASSERT_FALSE(p.ok());
  EXPECT_TRUE(p.status().IsNoMemory());
  // (15 GiB weights + 0.12 * 2 GiB reserve + one 1 MiB page) - 2 GiB
  const uint64_t shortfall =
      (15ull << 30) + static_cast<uint64_t>(0.12 * (2ull << 30)) + (1u << 20) - (2ull << 30);
  EXPECT_NE(p.status().message().find("short by " + std::to_string(shortfall) + " bytes"),
            std::string::npos)
      << p.status().message();
}

TEST(Capacity, KvHeadsPerRank) {
  EXPECT_EQ(*kv_heads_per_rank(8, 2), 4u);
  EXPECT_EQ(*kv_heads_per_rank(4, 8), 1u);
  EXPECT_EQ(*kv_heads_per_rank(1, 8), 1u);
  Result<uint32_t> bad = kv_heads_per_rank(6, 4);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("6 KV heads cannot be split over 4 TP ranks"),
            std::string::npos);
}

TEST(Capacity, FormatsBytes) {
  EXPECT_EQ(format_bytes(980), "980 B");
  EXPECT_EQ(format_bytes(24ull << 30), "24.0 GiB");
}

}  // namespace
}  // namespace kvrt::capacity
