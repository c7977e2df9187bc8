// The loader refuses each kind of broken plugin with one line naming the file and the reason,
// and loads the shipped stores by name and by path.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/capacity/stores.h"
#include "core/plugin/kv_store.h"
#include "core/plugin/registry.h"

namespace kvrt::plugin {
namespace {

std::string broken(const std::string& file) { return std::string(KVRT_BROKEN_DIR) + "/" + file; }

std::string load_error(const std::string& path) {
  Registry registry;
  Result<const LoadedPlugin*> plugin = registry.load(path);
  EXPECT_FALSE(plugin.ok()) << path << " loaded";
  return plugin.ok() ? "" : plugin.status().message();
}

void expect_error(const std::string& file, const std::string& reason) {
  std::string message = load_error(broken(file));
  EXPECT_NE(message.find(broken(file)), std::string::npos) << message;
  EXPECT_NE(message.find(reason), std::string::npos) << message;
  EXPECT_EQ(message.find('\n'), std::string::npos) << "not one line: " << message;
}

TEST(Loader, MissingFileIsNamed) { expect_error("does_not_exist.so", "file not found"); }

TEST(Loader, NotASharedLibrary) {
  expect_error("not_a_library.so", "not a loadable shared library");
}

TEST(Loader, MissingEntrySymbol) {
  expect_error("broken_no_entry.so", "entry symbol 'kvrt_plugin_query' not found");
}

TEST(Loader, AbiMajorMismatch) {
  expect_error("broken_abi_major.so", "ABI major mismatch: plugin built for 99, host is 1");
}

TEST(Loader, TableTooSmall) {
  expect_error("broken_table_too_small.so", "KV store table too small: struct_size 40");
}

TEST(Loader, RequiredCallbackMissing) {
  expect_error("broken_missing_callback.so", "required callback 'write' is missing");
}

TEST(Loader, TierCallbacksAllOrNone) {
  expect_error("broken_unpaired_tier.so",
               "tier callbacks must all be present or all absent: 'tier_lookup' is missing");
}

TEST(Loader, PluginDeclinesDevice) {
  expect_error("broken_declines_device.so",
               "declines device cpu:0: needs a CUDA device with compute capability 9.0");
}

TEST(Loader, PluginInitErrorCarriesItsMessage) {
  expect_error("broken_init_error.so",
               "plugin init failed (CONFIG): license file /etc/kv_vendor.lic not found");
}

TEST(Loader, NameNotFoundListsTheSearchPath) {
  setenv("KVRT_PLUGIN_PATH", KVRT_BROKEN_DIR, 1);
  Registry registry;
  Result<const LoadedPlugin*> plugin = registry.load("kv_nonexistent");
  unsetenv("KVRT_PLUGIN_PATH");
  ASSERT_FALSE(plugin.ok());
  EXPECT_NE(plugin.status().message().find("plugin 'kv_nonexistent' not found; searched: " +
                                           std::string(KVRT_BROKEN_DIR)),
            std::string::npos)
      << plugin.status().message();
}

TEST(Loader, LoadsShippedStoresByNameFromThePluginPath) {
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  Registry registry;
  for (const char* name : {"kv_bf16_paged", "kv_fp8_e4m3", "kv_host_tiered"}) {
    Result<const LoadedPlugin*> plugin = registry.load_kv_store(name);
    ASSERT_TRUE(plugin.ok()) << plugin.status().message();
    EXPECT_EQ((*plugin)->name, name);
    EXPECT_EQ((*plugin)->kind(), KVRT_PLUGIN_KV_STORE);
    // Loading again, by name or by path, gives the same plugin.
    EXPECT_EQ(*registry.load(name), *plugin);
    EXPECT_EQ(*registry.load((*plugin)->path.string()), *plugin);
  }
  unsetenv("KVRT_PLUGIN_PATH");
  const LoadedPlugin* tiered = *registry.load("kv_host_tiered");
  EXPECT_EQ(tiered->capabilities(), "layout,gather,tier");
  EXPECT_EQ((*registry.load("kv_bf16_paged"))->capabilities(), "layout,gather");
  EXPECT_EQ(tiered->input_dtype_names(), "f32,bf16");
}

// One layer of one KV head of `dim`, pages of 16.
kvrt_kv_geometry one_layer(uint32_t dim) {
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = g.num_kv_heads = g.total_kv_heads = g.tp_size = 1;
  g.k_head_dim = g.v_head_dim = dim;
  g.page_size = 16;
  g.input_dtype = KVRT_DTYPE_F32;
  return g;
}

// A store built against ABI 1.0 (minor 0, a table ending at tier_wait) loads into a 1.1 host;
// the 1.1 slot it lacks reads as NULL, and the tier it has is reported with an unknown size
// rather than a size the core would have to guess.
TEST(Loader, AnAbi10PluginStillLoads) {
  Registry registry;
  Result<const LoadedPlugin*> old = registry.load(broken("broken_abi_1_0.so"));
  ASSERT_TRUE(old.ok()) << old.status().message();
  EXPECT_EQ((*old)->desc.abi_minor, 0u);
  EXPECT_NE((*old)->kv.tier_wait, nullptr);
  EXPECT_EQ((*old)->kv.tier_pages, nullptr);
  const kvrt_kv_geometry g = one_layer(8);
  Result<uint64_t> pages = tier_pages(**old, g, nullptr, 100);
  ASSERT_FALSE(pages.ok());
  EXPECT_TRUE(pages.status().IsNotFound()) << pages.status().message();
  // An MLA-like V (the latent's first 32 of 40 values) cannot be said to a 1.0 store.
  kvrt_kv_geometry mla = one_layer(40);
  mla.v_head_dim = 0;
  mla.v_width = 32;
  Result<std::unique_ptr<KvStore>> refused = KvStore::create(**old, mla, 4, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(
      refused.status().message().find("built against ABI 1.0, which cannot hold V of width 32"),
      std::string::npos)
      << refused.status().message();
  capacity::Budget budget;
  budget.device_memory = 1 << 20;
  capacity::StoreCapacity c = capacity::store_capacity(**old, nullptr, g, budget);
  ASSERT_TRUE(c.error.ok()) << c.error.message();
  EXPECT_TRUE(c.host_tier);
  EXPECT_FALSE(c.host_tier_sized);
  EXPECT_NE(capacity::format_report(c, budget).find("host tier tokens       unknown"),
            std::string::npos)
      << capacity::format_report(c, budget);
}

// The 1.1 store sizes its own tier (tier_pages), and the capacity report takes its word.
TEST(Loader, ATierSizesItselfThroughTierPages) {
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  Registry registry;
  Result<const LoadedPlugin*> tiered = registry.load("kv_host_tiered");
  unsetenv("KVRT_PLUGIN_PATH");
  ASSERT_TRUE(tiered.ok()) << tiered.status().message();
  ASSERT_NE((*tiered)->kv.tier_pages, nullptr);
  const kvrt_kv_geometry g = one_layer(64);
  Result<uint64_t> pages = tier_pages(**tiered, g, nullptr, 100);
  ASSERT_TRUE(pages.ok()) << pages.status().message();
  EXPECT_EQ(*pages, 200u);  // host_pool_ratio's default of 2 times the device pages
}

TEST(Loader, DiscoverReportsBrokenPluginsWithoutStopping) {
  setenv("KVRT_PLUGIN_PATH", KVRT_BROKEN_DIR, 1);
  Registry registry;
  std::vector<LoadFailure> failures = registry.discover();
  unsetenv("KVRT_PLUGIN_PATH");
  EXPECT_GE(failures.size(), 8u);   // every broken_* plus not_a_library
  bool found_wrong_stride = false;  // a plugin that loads fine (its bug is in its data)
  for (const LoadedPlugin* p : registry.loaded())
    found_wrong_stride |= p->name == "kv_wrong_stride";
  EXPECT_TRUE(found_wrong_stride);
}

}  // namespace
}  // namespace kvrt::plugin
