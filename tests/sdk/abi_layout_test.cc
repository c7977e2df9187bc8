// Pins the size and every field offset of each ABI struct (x86-64 / aarch64 LP64). A change
// here is an ABI break: append fields instead, or bump KVRT_ABI_MAJOR and update this file.
#include <gtest/gtest.h>

#include <cstddef>

#include "kvrt/abi.h"
#include "kvrt/attention.h"
#include "kvrt/kv_store.h"

#define PIN_SIZE(type, size) EXPECT_EQ(sizeof(type), size##u) << #type
#define PIN(type, field, offset) EXPECT_EQ(offsetof(type, field), offset##u) << #type "." #field

TEST(AbiLayout, Device) {
  PIN_SIZE(kvrt_device, 16);
  PIN(kvrt_device, struct_size, 0);
  PIN(kvrt_device, kind, 4);
  PIN(kvrt_device, ordinal, 8);
  PIN(kvrt_device, reserved, 12);
}

TEST(AbiLayout, HostApi) {
  PIN_SIZE(kvrt_host_api, 128);
  PIN(kvrt_host_api, struct_size, 0);
  PIN(kvrt_host_api, abi_major, 4);
  PIN(kvrt_host_api, abi_minor, 8);
  PIN(kvrt_host_api, reserved, 12);
  PIN(kvrt_host_api, ctx, 16);
  PIN(kvrt_host_api, log, 24);
  PIN(kvrt_host_api, set_error, 32);
  PIN(kvrt_host_api, config_string, 40);
  PIN(kvrt_host_api, config_int, 48);
  PIN(kvrt_host_api, config_float, 56);
  PIN(kvrt_host_api, config_bool, 64);
  PIN(kvrt_host_api, alloc, 72);
  PIN(kvrt_host_api, free, 80);
  PIN(kvrt_host_api, copy, 88);
  PIN(kvrt_host_api, open_kv_store, 96);
  PIN(kvrt_host_api, alloc_async, 104);  // ABI 1.1
  PIN(kvrt_host_api, free_async, 112);
  PIN(kvrt_host_api, copy_async, 120);
}

TEST(AbiLayout, OptionDesc) {
  PIN_SIZE(kvrt_option_desc, 32);
  PIN(kvrt_option_desc, struct_size, 0);
  PIN(kvrt_option_desc, type, 4);
  PIN(kvrt_option_desc, name, 8);
  PIN(kvrt_option_desc, default_value, 16);
  PIN(kvrt_option_desc, help, 24);
}

TEST(AbiLayout, PluginDesc) {
  PIN_SIZE(kvrt_plugin_desc, 72);
  PIN(kvrt_plugin_desc, struct_size, 0);
  PIN(kvrt_plugin_desc, abi_major, 4);
  PIN(kvrt_plugin_desc, abi_minor, 8);
  PIN(kvrt_plugin_desc, kind, 12);
  PIN(kvrt_plugin_desc, name, 16);
  PIN(kvrt_plugin_desc, version, 24);
  PIN(kvrt_plugin_desc, description, 32);
  PIN(kvrt_plugin_desc, table, 40);
  PIN(kvrt_plugin_desc, options, 48);
  PIN(kvrt_plugin_desc, num_options, 56);
  PIN(kvrt_plugin_desc, input_dtypes, 60);
  PIN(kvrt_plugin_desc, probe, 64);
}

TEST(AbiLayout, KvGeometry) {
  PIN_SIZE(kvrt_kv_geometry, 64);
  PIN(kvrt_kv_geometry, struct_size, 0);
  PIN(kvrt_kv_geometry, num_layers, 4);
  PIN(kvrt_kv_geometry, num_kv_heads, 8);
  PIN(kvrt_kv_geometry, total_kv_heads, 12);
  PIN(kvrt_kv_geometry, k_head_dim, 16);
  PIN(kvrt_kv_geometry, v_head_dim, 20);
  PIN(kvrt_kv_geometry, page_size, 24);
  PIN(kvrt_kv_geometry, input_dtype, 28);
  PIN(kvrt_kv_geometry, tp_rank, 32);
  PIN(kvrt_kv_geometry, tp_size, 36);
  PIN(kvrt_kv_geometry, device, 40);
  PIN(kvrt_kv_geometry, v_width, 56);  // ABI 1.1
  PIN(kvrt_kv_geometry, v_offset, 60);
}

TEST(AbiLayout, KvInfo) {
  PIN_SIZE(kvrt_kv_info, 48);
  PIN(kvrt_kv_info, struct_size, 0);
  PIN(kvrt_kv_info, k_dtype, 4);
  PIN(kvrt_kv_info, v_dtype, 8);
  PIN(kvrt_kv_info, scale_mode, 12);
  PIN(kvrt_kv_info, bytes_per_token, 16);
  PIN(kvrt_kv_info, bytes_per_page, 24);
  PIN(kvrt_kv_info, num_pages, 32);
  PIN(kvrt_kv_info, host_tier_pages, 40);
}

TEST(AbiLayout, KvLayout) {
  PIN_SIZE(kvrt_kv_layout, 152);
  PIN(kvrt_kv_layout, struct_size, 0);
  PIN(kvrt_kv_layout, k_dtype, 4);
  PIN(kvrt_kv_layout, v_dtype, 8);
  PIN(kvrt_kv_layout, scale_mode, 12);
  PIN(kvrt_kv_layout, num_kv_heads, 16);
  PIN(kvrt_kv_layout, k_head_dim, 20);
  PIN(kvrt_kv_layout, v_head_dim, 24);
  PIN(kvrt_kv_layout, page_size, 28);
  PIN(kvrt_kv_layout, num_pages, 32);
  PIN(kvrt_kv_layout, k_base, 40);
  PIN(kvrt_kv_layout, v_base, 48);
  PIN(kvrt_kv_layout, k_page_stride, 56);
  PIN(kvrt_kv_layout, k_token_stride, 64);
  PIN(kvrt_kv_layout, k_head_stride, 72);
  PIN(kvrt_kv_layout, v_page_stride, 80);
  PIN(kvrt_kv_layout, v_token_stride, 88);
  PIN(kvrt_kv_layout, v_head_stride, 96);
  PIN(kvrt_kv_layout, k_scale, 104);
  PIN(kvrt_kv_layout, v_scale, 112);
  PIN(kvrt_kv_layout, scale_page_stride, 120);
  PIN(kvrt_kv_layout, scale_token_stride, 128);
  PIN(kvrt_kv_layout, scale_head_stride, 136);
  PIN(kvrt_kv_layout, v_width, 144);  // ABI 1.1
  PIN(kvrt_kv_layout, v_offset, 148);
}

TEST(AbiLayout, KvWrite) {
  PIN_SIZE(kvrt_kv_write, 72);
  PIN(kvrt_kv_write, struct_size, 0);
  PIN(kvrt_kv_write, layer, 4);
  PIN(kvrt_kv_write, dtype, 8);
  PIN(kvrt_kv_write, num_tokens, 12);
  PIN(kvrt_kv_write, slots, 16);
  PIN(kvrt_kv_write, k, 24);
  PIN(kvrt_kv_write, v, 32);
  PIN(kvrt_kv_write, k_token_stride, 40);
  PIN(kvrt_kv_write, v_token_stride, 48);
  PIN(kvrt_kv_write, device_slots, 56);  // ABI 1.2
  PIN(kvrt_kv_write, stream, 64);
}

TEST(AbiLayout, TierInfo) {
  PIN_SIZE(kvrt_tier_info, 48);
  PIN(kvrt_tier_info, struct_size, 0);
  PIN(kvrt_tier_info, reserved, 4);
  PIN(kvrt_tier_info, capacity_pages, 8);
  PIN(kvrt_tier_info, used_pages, 16);
  PIN(kvrt_tier_info, saved_pages, 24);
  PIN(kvrt_tier_info, loaded_pages, 32);
  PIN(kvrt_tier_info, evicted_pages, 40);
}

TEST(AbiLayout, KvStoreApi) {
  PIN_SIZE(kvrt_kv_store_api, 112);
  PIN(kvrt_kv_store_api, struct_size, 0);
  PIN(kvrt_kv_store_api, reserved, 4);
  PIN(kvrt_kv_store_api, page_bytes, 8);
  PIN(kvrt_kv_store_api, create, 16);
  PIN(kvrt_kv_store_api, destroy, 24);
  PIN(kvrt_kv_store_api, info, 32);
  PIN(kvrt_kv_store_api, layout, 40);
  PIN(kvrt_kv_store_api, write, 48);
  PIN(kvrt_kv_store_api, gather, 56);
  PIN(kvrt_kv_store_api, tier_info, 64);
  PIN(kvrt_kv_store_api, tier_lookup, 72);
  PIN(kvrt_kv_store_api, tier_save, 80);
  PIN(kvrt_kv_store_api, tier_load, 88);
  PIN(kvrt_kv_store_api, tier_wait, 96);
  PIN(kvrt_kv_store_api, tier_pages, 104);  // ABI 1.1
}

// ABI 1.3: the store table's new part lives in its own struct, so the 1.2 table above is
// unchanged (positional initializers of it stay complete).
TEST(AbiLayout, KvStoreApi13) {
  PIN_SIZE(kvrt_kv_store_api_1_3, 120);
  PIN(kvrt_kv_store_api_1_3, base, 0);
  PIN(kvrt_kv_store_api_1_3, format, 112);
}

TEST(AbiLayout, KvFormat) {
  PIN_SIZE(kvrt_kv_format, 72);
  PIN(kvrt_kv_format, struct_size, 0);
  PIN(kvrt_kv_format, capabilities, 4);
  PIN(kvrt_kv_format, k_bits, 8);
  PIN(kvrt_kv_format, v_bits, 12);
  PIN(kvrt_kv_format, pack_order, 16);
  PIN(kvrt_kv_format, group_size, 20);
  PIN(kvrt_kv_format, scale_group_bytes, 24);
  PIN(kvrt_kv_format, k_zero_point, 32);
  PIN(kvrt_kv_format, v_zero_point, 40);
  PIN(kvrt_kv_format, bound_flags, 48);
  PIN(kvrt_kv_format, reserved, 52);
  PIN(kvrt_kv_format, bound_element_relative, 56);
  PIN(kvrt_kv_format, bound_element_scale_units, 60);
  PIN(kvrt_kv_format, bound_row_rms_relative, 64);
  PIN(kvrt_kv_format, bound_row_rms_scale_units, 68);
}

TEST(AbiLayout, Codes13) {
  EXPECT_EQ(KVRT_DTYPE_INT4, 6u);
  EXPECT_EQ(KVRT_DTYPE_UINT4, 7u);
  EXPECT_EQ(KVRT_DTYPE_VENDOR_FIRST, 0x80000000u);
  EXPECT_TRUE(KVRT_DTYPE_IS_VENDOR(0x80000001u));
  EXPECT_FALSE(KVRT_DTYPE_IS_VENDOR(KVRT_DTYPE_INT4));
  EXPECT_EQ(KVRT_PACK_LOW_FIRST, 0u);
  EXPECT_EQ(KVRT_PACK_HIGH_FIRST, 1u);
  EXPECT_EQ(KVRT_KV_GATHER_THREAD_SAFE, 1u);
  EXPECT_EQ(KVRT_BOUND_ELEMENT, 1u);
  EXPECT_EQ(KVRT_BOUND_ROW_RMS, 2u);
}

TEST(AbiLayout, TheTableOfAnOlderStoreHasNo13Part) {
  kvrt_kv_store_api_1_3 t{};
  t.base.struct_size = sizeof(kvrt_kv_store_api);
  EXPECT_EQ(kvrt_kv_store_api_1_3_of(&t.base), nullptr);
  t.base.struct_size = sizeof(kvrt_kv_store_api_1_3);
  EXPECT_EQ(kvrt_kv_store_api_1_3_of(&t.base), &t);
  EXPECT_EQ(kvrt_kv_store_api_1_3_of(nullptr), nullptr);
}

TEST(AbiLayout, AttentionParams) {
  PIN_SIZE(kvrt_attention_params, 48);
  PIN(kvrt_attention_params, struct_size, 0);
  PIN(kvrt_attention_params, num_q_heads, 4);
  PIN(kvrt_attention_params, num_kv_heads, 8);
  PIN(kvrt_attention_params, qk_head_dim, 12);
  PIN(kvrt_attention_params, v_head_dim, 16);
  PIN(kvrt_attention_params, softmax_scale, 20);
  PIN(kvrt_attention_params, device, 24);
  PIN(kvrt_attention_params, v_offset, 40);  // ABI 1.1
  PIN(kvrt_attention_params, reserved, 44);
}

TEST(AbiLayout, AttentionBatch) {
  PIN_SIZE(kvrt_attention_batch, 48);
  PIN(kvrt_attention_batch, struct_size, 0);
  PIN(kvrt_attention_batch, batch_size, 4);
  PIN(kvrt_attention_batch, page_size, 8);
  PIN(kvrt_attention_batch, causal, 12);
  PIN(kvrt_attention_batch, qo_indptr, 16);
  PIN(kvrt_attention_batch, kv_page_indptr, 24);
  PIN(kvrt_attention_batch, kv_page_indices, 32);
  PIN(kvrt_attention_batch, kv_last_page_len, 40);
}

TEST(AbiLayout, AttentionRunArgs) {
  PIN_SIZE(kvrt_attention_run_args, 80);
  PIN(kvrt_attention_run_args, struct_size, 0);
  PIN(kvrt_attention_run_args, layer, 4);
  PIN(kvrt_attention_run_args, q_dtype, 8);
  PIN(kvrt_attention_run_args, out_dtype, 12);
  PIN(kvrt_attention_run_args, layout, 16);
  PIN(kvrt_attention_run_args, store_api, 24);
  PIN(kvrt_attention_run_args, store, 32);
  PIN(kvrt_attention_run_args, q, 40);
  PIN(kvrt_attention_run_args, out, 48);
  PIN(kvrt_attention_run_args, q_row_stride, 56);
  PIN(kvrt_attention_run_args, out_row_stride, 64);
  PIN(kvrt_attention_run_args, stream, 72);
}

TEST(AbiLayout, AttentionApi) {
  PIN_SIZE(kvrt_attention_api, 72);
  PIN(kvrt_attention_api, struct_size, 0);
  PIN(kvrt_attention_api, reserved, 4);
  PIN(kvrt_attention_api, create, 8);
  PIN(kvrt_attention_api, destroy, 16);
  PIN(kvrt_attention_api, supports, 24);
  PIN(kvrt_attention_api, workspace_size, 32);
  PIN(kvrt_attention_api, plan, 40);
  PIN(kvrt_attention_api, run, 48);
  PIN(kvrt_attention_api, plan_sharded, 56);  // ABI 1.4
  PIN(kvrt_attention_api, run_lse, 64);       // ABI 1.4
}

TEST(AbiLayout, AttentionShard) {  // ABI 1.4
  PIN_SIZE(kvrt_attention_shard, 24);
  PIN(kvrt_attention_shard, struct_size, 0);
  PIN(kvrt_attention_shard, count, 4);
  PIN(kvrt_attention_shard, index, 8);
  PIN(kvrt_attention_shard, interleave, 12);
  PIN(kvrt_attention_shard, kv_len, 16);
}

TEST(AbiLayout, Version) {
  EXPECT_EQ(KVRT_ABI_MAJOR, 1u);
  // 1.1: V width and offset, streams, tier_pages; 1.2: device writes; 1.3: formats (sub-byte,
  // vendor codes, groups, zero points, error bounds, gather_thread_safe); 1.4: context
  // parallelism (plan_sharded, run_lse, kvrt_attention_shard).
  EXPECT_EQ(KVRT_ABI_MINOR, 4u);
}
