// compare_stores() on the shipped stores: a Kimi-K2 geometry through kv_geometry(), bytes per
// token against hand computation, and max_total_num_tokens and @N worked out by hand.
#include "core/capacity/stores.h"

#include <gtest/gtest.h>

#include <cstdlib>
#include <map>

#include "core/capacity/model_shape.h"

namespace kvrt::capacity {
namespace {

class Stores : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
    registry_ = std::make_unique<plugin::Registry>();
    registry_->set_config_source([this](const std::string& name) -> const toml::table* {
      auto it = tables_.find(name);
      return it == tables_.end() ? nullptr : &it->second;
    });
  }
  void TearDown() override { unsetenv("KVRT_PLUGIN_PATH"); }

  std::map<std::string, StoreCapacity> compare(const kvrt_kv_geometry& g, const Budget& b) {
    std::map<std::string, StoreCapacity> out;
    for (StoreCapacity& c : compare_stores(*registry_, g, b)) out[c.store] = c;
    return out;
  }

  std::unique_ptr<plugin::Registry> registry_;
  std::map<std::string, toml::table> tables_;
};

TEST_F(Stores, KimiK2SideBySide) {
  Result<ModelShape> kimi = read_model_shape("kimi-k2-shape");
  ASSERT_TRUE(kimi.ok()) << kimi.status().message();
  Result<kvrt_kv_geometry> g = kv_geometry(kimi->kv, 8, 16);
  ASSERT_TRUE(g.ok()) << g.status().message();
  // 80 GiB per GPU, 40 GiB of weights per rank, fraction 0.875: reserve 10 GiB, KV 30 GiB.
  const Budget budget{80ull << 30, 40ull << 30, 0.875, ""};
  const uint64_t kv_budget = 30ull << 30;
  std::map<std::string, StoreCapacity> by_store = compare(*g, budget);
  for (const char* name : {"kv_bf16_paged", "kv_fp8_e4m3", "kv_host_tiered"}) {
    ASSERT_TRUE(by_store.count(name)) << name << " was not loaded from " << KVRT_PLUGIN_DIR;
    ASSERT_TRUE(by_store[name].error.ok()) << by_store[name].error.message();
  }

  // bf16: 61 layers x (512 + 64) x 2 bytes, the same on every rank.
  const Plan& bf16 = by_store["kv_bf16_paged"].plan;
  EXPECT_EQ(bf16.bytes_per_token(), 70272u);
  EXPECT_EQ(bf16.page_bytes, 70272u * 16);
  EXPECT_EQ(bf16.kv_budget, kv_budget);
  EXPECT_EQ(bf16.num_pages, 28649u);  // floor(32212254720 / 1124352)
  EXPECT_EQ(bf16.max_total_num_tokens, 458384u);
  EXPECT_EQ(bf16.concurrent_decodes(1024), 447u);
  EXPECT_EQ(bf16.concurrent_decodes(4096), 111u);
  EXPECT_EQ(bf16.concurrent_decodes(16384), 27u);
  EXPECT_FALSE(by_store["kv_bf16_paged"].host_tier);

  // fp8 e4m3: one byte per element plus one float scale per token and layer (the latent is one
  // head, and V has no scales of its own): 35136 + 61 * 4.
  const Plan& fp8 = by_store["kv_fp8_e4m3"].plan;
  EXPECT_EQ(fp8.bytes_per_token(), 35136u + 244);
  EXPECT_EQ(fp8.num_pages, kv_budget / (35380u * 16));
  EXPECT_EQ(fp8.num_pages, 56904u);
  EXPECT_EQ(fp8.max_total_num_tokens, 910464u);
  EXPECT_EQ(fp8.concurrent_decodes(4096), 222u);  // about twice bf16's 111

  // The host tier wraps bf16: the same device pool, plus twice its pages in host memory that
  // add no concurrent decodes.
  const StoreCapacity& tiered = by_store["kv_host_tiered"];
  EXPECT_EQ(tiered.plan.max_total_num_tokens, bf16.max_total_num_tokens);
  EXPECT_EQ(tiered.plan.concurrent_decodes(4096), 111u);
  EXPECT_TRUE(tiered.host_tier);
  EXPECT_EQ(tiered.host_tier_tokens, 2u * 28649 * 16);
}

TEST_F(Stores, StoreTablesAreHonoured) {
  tables_["kv_fp8_e4m3"].insert_or_assign("scale_mode", "per_tensor");
  tables_["kv_host_tiered"].insert_or_assign("host_pool_gib", 1.0);
  Result<kvrt_kv_geometry> g = kv_geometry({61, 0, 0, 0, 512, 64}, 1, 16);
  ASSERT_TRUE(g.ok());
  std::map<std::string, StoreCapacity> by_store =
      compare(*g, {80ull << 30, 40ull << 30, 0.875, ""});
  EXPECT_EQ(by_store["kv_fp8_e4m3"].plan.bytes_per_token(), 35136u);  // no per-token scales
  EXPECT_EQ(by_store["kv_host_tiered"].host_tier_tokens, (1ull << 30) / (70272 * 16) * 16);
}

TEST_F(Stores, ABudgetThatDoesNotFitIsListedWithItsShortfall) {
  Result<kvrt_kv_geometry> g = kv_geometry({61, 0, 0, 0, 512, 64}, 8, 16);
  ASSERT_TRUE(g.ok());
  // 140 GiB GPUs cannot hold 1 TiB of weights on 8 ranks at fraction 0.875.
  std::map<std::string, StoreCapacity> by_store =
      compare(*g, {140ull << 30, (1ull << 40) / 8, 0.875, ""});
  const StoreCapacity& bf16 = by_store["kv_bf16_paged"];
  ASSERT_FALSE(bf16.error.ok());
  EXPECT_TRUE(bf16.error.IsNoMemory());
  EXPECT_EQ(bf16.page_bytes, 70272u * 16);
  // (128 GiB + 17.5 GiB + one page) - 140 GiB
  const uint64_t shortfall = (128ull << 30) + (35ull << 29) + 70272 * 16 - (140ull << 30);
  EXPECT_NE(bf16.error.message().find("short by " + std::to_string(shortfall) + " bytes"),
            std::string::npos)
      << bf16.error.message();
}

}  // namespace
}  // namespace kvrt::capacity
