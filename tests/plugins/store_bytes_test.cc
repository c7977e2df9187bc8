// page_bytes and info are exact: bytes per token against hand computation for GQA, KV heads
// fewer than TP ranks (replicated) and an MLA-like latent (K dim 576, V sharing K's storage).
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/capacity/capacity.h"
#include "core/plugin/registry.h"

namespace kvrt::plugin {
namespace {

class StoreBytes : public ::testing::Test {
 protected:
  void SetUp() override {
    setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
    registry_ = std::make_unique<Registry>();
    registry_->set_config_source([this](const std::string& name) -> const toml::table* {
      return name == "kv_fp8_e4m3" ? &fp8_table_ : nullptr;
    });
  }
  void TearDown() override { unsetenv("KVRT_PLUGIN_PATH"); }

  // Bytes per token of `store` for a model with `total_kv_heads` at `tp` ranks.
  uint64_t bytes_per_token(const std::string& store, uint32_t layers, uint32_t total_kv_heads,
                           uint32_t tp, uint32_t k_dim, uint32_t v_dim, uint32_t page_size = 16) {
    const LoadedPlugin* p = *registry_->load_kv_store(store);
    kvrt_kv_geometry g{};
    g.struct_size = sizeof(g);
    g.num_layers = layers;
    g.total_kv_heads = total_kv_heads;
    g.num_kv_heads = *capacity::kv_heads_per_rank(total_kv_heads, tp);
    g.k_head_dim = k_dim;
    g.v_head_dim = v_dim;
    g.page_size = page_size;
    g.input_dtype = KVRT_DTYPE_BF16;
    g.tp_size = tp;
    g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
    uint64_t page = 0;
    const kvrt_config* cfg = as_config(registry_->plugin_config(store));
    EXPECT_EQ(p->kv.page_bytes(p->host_api(), &g, cfg, &page), KVRT_OK) << take_last_error();
    // info() of a real store of two pages agrees with page_bytes().
    kvrt_kv_store* s = nullptr;
    EXPECT_EQ(p->kv.create(p->host_api(), &g, 2, cfg, &s), KVRT_OK) << take_last_error();
    kvrt_kv_info info{};
    info.struct_size = sizeof(info);
    EXPECT_EQ(p->kv.info(s, &info), KVRT_OK);
    EXPECT_EQ(info.bytes_per_page, page);
    EXPECT_EQ(info.bytes_per_token * page_size, page);
    p->kv.destroy(s);
    EXPECT_EQ(page % page_size, 0u);
    return page / page_size;
  }

  std::unique_ptr<Registry> registry_;
  toml::table fp8_table_;
};

TEST_F(StoreBytes, GqaLlama3_8B) {
  // 32 layers x 8 KV heads x (128 + 128) dims: bf16 2 bytes; fp8 1 byte plus a float scale per
  // token, head and K/V.
  EXPECT_EQ(bytes_per_token("kv_bf16_paged", 32, 8, 1, 128, 128), 32u * 8 * 256 * 2);  // 131072
  EXPECT_EQ(bytes_per_token("kv_fp8_e4m3", 32, 8, 1, 128, 128), 32u * 8 * 256 + 32 * 8 * 2 * 4);
  EXPECT_EQ(bytes_per_token("kv_host_tiered", 32, 8, 1, 128, 128), 131072u);
  EXPECT_EQ(bytes_per_token("kv_f32_paged", 32, 8, 1, 128, 128), 32u * 8 * 256 * 4);  // 262144
  // TP 2 halves each rank's heads.
  EXPECT_EQ(bytes_per_token("kv_bf16_paged", 32, 8, 2, 128, 128), 65536u);
}

TEST_F(StoreBytes, PerTensorFp8HasNoPerTokenScales) {
  fp8_table_.insert_or_assign("scale_mode", "per_tensor");
  EXPECT_EQ(bytes_per_token("kv_fp8_e4m3", 32, 8, 1, 128, 128), 32u * 8 * 256);
}

TEST_F(StoreBytes, FewerKvHeadsThanRanksAreReplicated) {
  // stories260k: 5 layers, 4 KV heads of dim 8; at TP 8 every rank keeps one whole head.
  EXPECT_EQ(bytes_per_token("kv_bf16_paged", 5, 4, 8, 8, 8), 5u * 1 * 16 * 2);
  EXPECT_EQ(bytes_per_token("kv_bf16_paged", 5, 4, 4, 8, 8), 5u * 1 * 16 * 2);
  EXPECT_EQ(bytes_per_token("kv_bf16_paged", 5, 4, 2, 8, 8), 5u * 2 * 16 * 2);
  EXPECT_FALSE(capacity::kv_heads_per_rank(6, 4).ok());
}

TEST_F(StoreBytes, MlaLatentSharesKStorage) {
  // Kimi-K2 / DeepSeek-V3: 61 layers of one 512 + 64 latent, replicated on every rank.
  EXPECT_EQ(bytes_per_token("kv_bf16_paged", 61, 1, 1, 576, 0, 64), 70272u);
  EXPECT_EQ(bytes_per_token("kv_bf16_paged", 61, 1, 8, 576, 0, 64), 70272u);
  EXPECT_EQ(bytes_per_token("kv_fp8_e4m3", 61, 1, 1, 576, 0, 64), 35136u + 61 * 4);
  fp8_table_.insert_or_assign("scale_mode", "per_tensor");
  EXPECT_EQ(bytes_per_token("kv_fp8_e4m3", 61, 1, 1, 576, 0, 64), 35136u);
}

}  // namespace
}  // namespace kvrt::plugin
