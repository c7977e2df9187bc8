// kv_host_tiered's policies, LRU and accounting, driven through the C ABI as the core drives it.
#include <gtest/gtest.h>

#include <cstdlib>
#include <numeric>
#include <string>
#include <vector>

#include "core/plugin/registry.h"
#include "core/sched/page_hash.h"

namespace kvrt::plugin {
namespace {

class HostTiered : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
    registry_.set_config_source([this](const std::string& name) -> const toml::table* {
      return name == "kv_host_tiered" ? &table_ : nullptr;
    });
    geometry_.struct_size = sizeof(geometry_);
    geometry_.num_layers = 2;
    geometry_.num_kv_heads = geometry_.total_kv_heads = 2;
    geometry_.k_head_dim = geometry_.v_head_dim = 16;
    geometry_.page_size = 4;
    geometry_.input_dtype = KVRT_DTYPE_F32;
    geometry_.tp_size = 1;
    geometry_.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  }
  void TearDown() override {
    if (store_ != nullptr) plugin_->kv.destroy(store_);
    unsetenv("KVRT_PLUGIN_PATH");
  }

  void create(uint64_t pages) {
    Result<const LoadedPlugin*> p = registry_.load_kv_store("kv_host_tiered");
    ASSERT_TRUE(p.ok()) << p.status().message();
    plugin_ = *p;
    ASSERT_EQ(
        plugin_->kv.create(plugin_->host_api(), &geometry_, pages, as_config(&table_), &store_),
        KVRT_OK)
        << take_last_error();
  }

  // Reports device pages [first, first + n) under `reason`, waits, returns the tier's hits.
  void save(const std::vector<uint64_t>& hashes, kvrt_tier_reason reason) {
    std::vector<int64_t> pages(hashes.size());
    std::iota(pages.begin(), pages.end(), 0);
    uint64_t ticket = 0;
    ASSERT_EQ(plugin_->kv.tier_save(store_, static_cast<uint32_t>(hashes.size()), hashes.data(),
                                    pages.data(), reason, &ticket),
              KVRT_OK);
    ASSERT_EQ(plugin_->kv.tier_wait(store_, ticket), KVRT_OK);
  }
  uint32_t lookup(const std::vector<uint64_t>& hashes) {
    uint32_t hits = 0;
    EXPECT_EQ(
        plugin_->kv.tier_lookup(store_, static_cast<uint32_t>(hashes.size()), hashes.data(), &hits),
        KVRT_OK);
    return hits;
  }
  kvrt_tier_info tier_info() {
    kvrt_tier_info info{};
    info.struct_size = sizeof(info);
    EXPECT_EQ(plugin_->kv.tier_info(store_, &info), KVRT_OK);
    return info;
  }
  static std::vector<uint64_t> prompt_hashes(int32_t first_token, size_t pages) {
    std::vector<int32_t> tokens(pages * 4);
    std::iota(tokens.begin(), tokens.end(), first_token);
    return sched::page_hashes(sched::root_hash("test-model"), tokens, 4);
  }

  Registry registry_;
  toml::table table_;
  kvrt_kv_geometry geometry_{};
  const LoadedPlugin* plugin_ = nullptr;
  kvrt_kv_store* store_ = nullptr;
};

TEST_F(HostTiered, AddsHostPagesButNoDeviceTokens) {
  table_.insert_or_assign("host_pool_ratio", 3.0);
  create(8);
  kvrt_kv_info info{};
  info.struct_size = sizeof(info);
  ASSERT_EQ(plugin_->kv.info(store_, &info), KVRT_OK);
  EXPECT_EQ(info.num_pages, 8u);
  EXPECT_EQ(info.bytes_per_token, 2u * 2 * (16 + 16) * 2);  // the inner bf16 store's
  EXPECT_EQ(info.host_tier_pages, 24u);
  EXPECT_EQ(tier_info().capacity_pages, 24u);
  // The host pool is host memory, the pages device memory: both accounted.
  EXPECT_EQ(registry_.memory().host_used(), 24 * info.bytes_per_page);
  EXPECT_GE(registry_.memory().device_used(), 8 * info.bytes_per_page);
}

TEST_F(HostTiered, WriteThroughCopiesOnInsert) {
  create(8);
  std::vector<uint64_t> h = prompt_hashes(100, 3);
  save(h, KVRT_TIER_INSERTED);
  EXPECT_EQ(lookup(h), 3u);
  std::vector<uint64_t> other = prompt_hashes(500, 2);
  save(other, KVRT_TIER_EVICTING);  // write-through does not copy at eviction
  EXPECT_EQ(lookup(other), 0u);
  EXPECT_EQ(tier_info().saved_pages, 3u);
}

TEST_F(HostTiered, WriteThroughSelectiveCopiesAfterThresholdReports) {
  table_.insert_or_assign("policy", "write_through_selective");
  table_.insert_or_assign("write_through_threshold", 3);
  create(8);
  std::vector<uint64_t> h = prompt_hashes(100, 2);
  save(h, KVRT_TIER_INSERTED);
  save(h, KVRT_TIER_HIT);
  EXPECT_EQ(lookup(h), 0u);
  save(h, KVRT_TIER_HIT);
  EXPECT_EQ(lookup(h), 2u);
}

TEST_F(HostTiered, WriteBackCopiesOnEviction) {
  table_.insert_or_assign("policy", "write_back");
  create(8);
  std::vector<uint64_t> h = prompt_hashes(100, 2);
  save(h, KVRT_TIER_INSERTED);
  save(h, KVRT_TIER_HIT);
  EXPECT_EQ(lookup(h), 0u);
  save(h, KVRT_TIER_EVICTING);
  EXPECT_EQ(lookup(h), 2u);
}

TEST_F(HostTiered, LookupCountsLeadingPagesOnly) {
  create(8);
  std::vector<uint64_t> h = prompt_hashes(100, 4);
  save({h[0], h[1], h[3]}, KVRT_TIER_INSERTED);
  EXPECT_EQ(lookup(h), 2u);  // the chain breaks at the third page
}

TEST_F(HostTiered, EvictsLeastRecentlyUsed) {
  table_.insert_or_assign("host_pool_ratio", 0.5);  // 4 host pages for 8 device pages
  create(8);
  std::vector<uint64_t> h = prompt_hashes(100, 5);
  save({h[0], h[1], h[2], h[3]}, KVRT_TIER_INSERTED);
  EXPECT_EQ(lookup({h[0]}), 1u);     // h[0] is now the most recently used
  save({h[4]}, KVRT_TIER_INSERTED);  // evicts h[1], the least recently used
  EXPECT_EQ(lookup({h[1]}), 0u);
  EXPECT_EQ(lookup({h[0]}), 1u);
  EXPECT_EQ(lookup({h[4]}), 1u);
  EXPECT_EQ(tier_info().evicted_pages, 1u);
  EXPECT_EQ(tier_info().used_pages, 4u);
  // A load of the evicted page says so; the others load.
  std::vector<uint64_t> want = {h[0], h[1], h[4]};
  std::vector<int64_t> into = {5, 6, 7};
  std::vector<uint8_t> loaded(3, 9);
  uint64_t ticket = 0;
  ASSERT_EQ(plugin_->kv.tier_load(store_, 3, want.data(), into.data(), loaded.data(), &ticket),
            KVRT_OK);
  ASSERT_EQ(plugin_->kv.tier_wait(store_, ticket), KVRT_OK);
  EXPECT_EQ(loaded, (std::vector<uint8_t>{1, 0, 1}));
}

TEST_F(HostTiered, RejectsBadOptionsWithTheirNames) {
  table_.insert_or_assign("policy", "write_sideways");
  Result<const LoadedPlugin*> p = registry_.load_kv_store("kv_host_tiered");
  ASSERT_TRUE(p.ok());
  uint64_t bytes = 0;
  EXPECT_EQ((*p)->kv.page_bytes((*p)->host_api(), &geometry_, as_config(&table_), &bytes),
            KVRT_ERR_CONFIG);
  EXPECT_NE(take_last_error().find("policy: expected write_through"), std::string::npos);
  table_.insert_or_assign("policy", "write_back");
  table_.insert_or_assign("inner", "kv_missing");
  EXPECT_NE((*p)->kv.page_bytes((*p)->host_api(), &geometry_, as_config(&table_), &bytes), KVRT_OK);
  EXPECT_NE(take_last_error().find("plugin 'kv_missing' not found"), std::string::npos);
}

TEST_F(HostTiered, WaitingOnAnUnissuedTicketIsAnError) {
  create(4);
  EXPECT_EQ(plugin_->kv.tier_wait(store_, 12345), KVRT_ERR_INVALID_ARGUMENT);
  EXPECT_NE(take_last_error().find("ticket 12345 was never issued"), std::string::npos);
}

}  // namespace
}  // namespace kvrt::plugin
