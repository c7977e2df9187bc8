// The core's plugin wrappers (core/plugin/kv_store.h, attention.h): failures name the plugin and
// the callback, optional parts are optional, and what a store reports is checked against what
// it was asked for.
#include <gtest/gtest.h>

#include <cstdlib>
#include <string>

#include "core/plugin/attention.h"
#include "core/plugin/kv_store.h"
#include "core/plugin/registry.h"

namespace kvrt::plugin {
namespace {

kvrt_kv_geometry geometry() {
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = 2;
  g.num_kv_heads = g.total_kv_heads = 2;
  g.k_head_dim = g.v_head_dim = 16;
  g.page_size = 4;
  g.input_dtype = KVRT_DTYPE_F32;
  g.tp_size = 1;
  return g;
}

class Wrappers : public ::testing::Test {
 protected:
  void SetUp() override { setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1); }
  const LoadedPlugin& load(const char* name) {
    Result<const LoadedPlugin*> p = registry_.load(name);
    EXPECT_TRUE(p.ok()) << p.status().message();
    return **p;
  }
  Registry registry_;
};

TEST_F(Wrappers, FailuresNameThePluginAndTheCallback) {
  Result<std::unique_ptr<KvStore>> store =
      KvStore::create(load("kv_bf16_paged"), geometry(), 8, nullptr);
  ASSERT_TRUE(store.ok()) << store.status().message();
  Result<kvrt_kv_layout> bad = (*store)->layout(7);
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.status().message().find("plugin kv_bf16_paged: layout failed"), std::string::npos)
      << bad.status().message();
  kvrt_kv_geometry zero = geometry();
  zero.k_head_dim = zero.v_head_dim = 0;
  Result<std::unique_ptr<KvStore>> refused =
      KvStore::create(load("kv_bf16_paged"), zero, 8, nullptr);
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("plugin kv_bf16_paged: page_bytes failed"),
            std::string::npos)
      << refused.status().message();
}

TEST_F(Wrappers, TheTierIsOptionalAndTheLayoutComplete) {
  Result<std::unique_ptr<KvStore>> plain =
      KvStore::create(load("kv_bf16_paged"), geometry(), 8, nullptr);
  Result<std::unique_ptr<KvStore>> tiered =
      KvStore::create(load("kv_host_tiered"), geometry(), 8, nullptr);
  ASSERT_TRUE(plain.ok() && tiered.ok());
  EXPECT_EQ((*plain)->tier(), nullptr);
  ASSERT_NE((*tiered)->tier(), nullptr);
  Result<kvrt_tier_info> info = (*tiered)->tier()->info();
  ASSERT_TRUE(info.ok()) << info.status().message();
  EXPECT_EQ(info->capacity_pages, 16u);  // host_pool_ratio 2 of 8 device pages
  Result<kvrt_kv_layout> l = (*plain)->layout(1);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->v_width, 16u);
  EXPECT_EQ(l->v_offset, 0u);
  // A 1.0 store's layout (no v_width) is completed from the geometry: all of V, or of K when
  // V shares it.
  kvrt_kv_layout old{};
  complete_layout(geometry(), &old);
  EXPECT_EQ(old.v_width, 16u);
  kvrt_kv_geometry mla = geometry();
  mla.num_kv_heads = 1;
  mla.k_head_dim = 576;
  mla.v_head_dim = 0;
  kvrt_kv_layout latent{};
  complete_layout(mla, &latent);
  EXPECT_EQ(latent.v_width, 576u);  // a 1.0 host could not say 512
  mla.v_width = 512;
  latent = {};
  complete_layout(mla, &latent);
  EXPECT_EQ(latent.v_width, 512u);
}

// A layout whose strides reach past the store's own memory (kv_wrong_stride's page stride is a
// token too long) is refused when the store is created, before any attention reads it.
TEST_F(Wrappers, ALayoutReachingPastItsMemoryIsRefused) {
  Result<const LoadedPlugin*> wrong =
      registry_.load(std::string(KVRT_BROKEN_DIR) + "/kv_wrong_stride.so");
  ASSERT_TRUE(wrong.ok()) << wrong.status().message();
  Result<std::unique_ptr<KvStore>> store = KvStore::create(**wrong, geometry(), 8, nullptr);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("plugin kv_wrong_stride: layout("), std::string::npos)
      << store.status().message();
  EXPECT_NE(store.status().message().find("outside the memory the store allocated"),
            std::string::npos)
      << store.status().message();
  // The shipped stores' layouts stay inside what they allocated, scales included.
  for (const char* name : {"kv_bf16_paged", "kv_fp8_e4m3", "kv_host_tiered"}) {
    Result<std::unique_ptr<KvStore>> ok = KvStore::create(load(name), geometry(), 8, nullptr);
    EXPECT_TRUE(ok.ok()) << name << ": " << ok.status().message();
  }
}

TEST_F(Wrappers, AttentionSaysWhetherItReadsALayout) {
  Result<std::unique_ptr<KvStore>> store =
      KvStore::create(load("kv_fp8_e4m3"), geometry(), 8, nullptr);
  ASSERT_TRUE(store.ok()) << store.status().message();
  kvrt_attention_params p{};
  p.struct_size = sizeof(p);
  p.num_q_heads = 4;
  p.num_kv_heads = 2;
  p.qk_head_dim = p.v_head_dim = 16;
  p.softmax_scale = 0.25f;
  Result<std::unique_ptr<Attention>> attention = Attention::create(load("attn_cpu"), p, nullptr);
  ASSERT_TRUE(attention.ok()) << attention.status().message();
  EXPECT_TRUE((*attention)->supports(*(*store)->layout(0)).ok());
  kvrt_kv_layout wider = *(*store)->layout(0);
  wider.k_head_dim = 32;
  Status no = (*attention)->supports(wider);
  ASSERT_FALSE(no.ok());
  EXPECT_NE(no.message().find("plugin attn_cpu: supports failed"), std::string::npos)
      << no.message();
  // V starting inside its row is refused at create, naming the field.
  p.v_offset = 8;
  Result<std::unique_ptr<Attention>> offset = Attention::create(load("attn_cpu"), p, nullptr);
  ASSERT_FALSE(offset.ok());
  EXPECT_NE(offset.status().message().find("v_offset 8"), std::string::npos)
      << offset.status().message();
}

}  // namespace
}  // namespace kvrt::plugin
