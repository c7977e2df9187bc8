// The device write paths (kernels/cuda/kv_write.cu) against the CPU stores, byte for byte: the
// same f32 rows written into shuffled slots by kv_bf16_paged / kv_fp8_e4m3 on the CPU and by the
// CUDA kernels into device memory with the CPU store's own layout strides must leave the same
// bf16 values, E4M3 codes and per-token-head scales (and the same codes with one scale per
// tensor). Needs a GPU: without one every test skips, saying why.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "core/capacity/capacity.h"
#include "core/plugin/registry.h"
#include "kernels/cuda/kv_write.h"
#include "tests/kernels/cuda/cuda_device.h"

namespace kvrt::cuda {
namespace {

struct Case {
  const char* store;
  const char* scale_mode;  // kv_fp8_e4m3's, or nullptr
};

void check_store(const Case& c, uint32_t heads, uint32_t dim, uint32_t page_size) {
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  plugin::Registry registry;
  Result<const plugin::LoadedPlugin*> loaded = registry.load_kv_store(c.store);
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  const kvrt_kv_store_api& kv = (*loaded)->kv;
  toml::table config;
  if (c.scale_mode != nullptr) {
    config.insert("scale_mode", c.scale_mode);
    if (std::string(c.scale_mode) == "per_tensor") {
      config.insert("k_scale", 0.05);
      config.insert("v_scale", 0.05);
    }
  }
  Result<kvrt_kv_geometry> g = capacity::kv_geometry(
      {.layers = 1, .kv_heads = heads, .head_dim = dim, .v_head_dim = dim}, 1, page_size,
      KVRT_DTYPE_F32);
  ASSERT_TRUE(g.ok()) << g.status().message();
  const uint32_t pages = 12;
  kvrt_kv_store* store = nullptr;
  ASSERT_EQ(kv.create((*loaded)->host_api(), &*g, pages, plugin::as_config(&config), &store),
            KVRT_OK);
  // Rows of every magnitude, in a shuffled half of the slots.
  std::mt19937 rng(page_size * 31 + dim);
  std::normal_distribution<float> normal;
  std::vector<int64_t> slots(size_t{pages} * page_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::shuffle(slots.begin(), slots.end(), rng);
  slots.resize(slots.size() / 2);
  const size_t row = size_t{heads} * dim;
  std::vector<float> k(slots.size() * row);
  for (size_t i = 0; i < k.size(); ++i) k[i] = normal(rng) * std::ldexp(1.0f, int(i / dim % 24) - 12);
  kvrt_kv_write w{};
  w.struct_size = sizeof(w);
  w.dtype = KVRT_DTYPE_F32;
  w.num_tokens = static_cast<uint32_t>(slots.size());
  w.slots = slots.data();
  w.k = k.data();
  w.v = k.data();
  ASSERT_EQ(kv.write(store, &w), KVRT_OK);
  kvrt_kv_layout l{};
  l.struct_size = sizeof(l);
  ASSERT_EQ(kv.layout(store, 0, &l), KVRT_OK);

  // The same rows through the device kernel, into pages with the CPU layout's strides.
  const size_t pool_bytes = static_cast<size_t>(l.k_page_stride) * pages;
  const bool token_scales = l.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD;
  const size_t scale_bytes = token_scales ? static_cast<size_t>(l.scale_page_stride) * pages : 0;
  void *d_pool = nullptr, *d_scales = nullptr, *d_in = nullptr, *d_slots = nullptr;
  CUDA_OK(cudaMalloc(&d_pool, pool_bytes));
  CUDA_OK(cudaMemset(d_pool, 0, pool_bytes));
  if (token_scales) {
    CUDA_OK(cudaMalloc(&d_scales, scale_bytes));
  }
  CUDA_OK(cudaMalloc(&d_in, k.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_slots, slots.size() * sizeof(int64_t)));
  CUDA_OK(cudaMemcpy(d_in, k.data(), k.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(d_slots, slots.data(), slots.size() * sizeof(int64_t),
                     cudaMemcpyHostToDevice));
  KvWriteTarget t;
  t.base = d_pool;
  t.page_stride = l.k_page_stride;
  t.token_stride = l.k_token_stride;
  t.head_stride = l.k_head_stride;
  t.scales = static_cast<float*>(d_scales);
  t.scale_page_stride = l.scale_page_stride;
  t.scale_token_stride = l.scale_token_stride;
  t.scale_head_stride = l.scale_head_stride;
  if (l.scale_mode == KVRT_SCALE_PER_TENSOR) t.tensor_scale = *l.k_scale;
  const bool fp8 = l.k_dtype == KVRT_DTYPE_FP8_E4M3;
  auto* in = static_cast<const float*>(d_in);
  auto* s = static_cast<const int64_t*>(d_slots);
  const auto tokens = static_cast<int32_t>(slots.size());
  CUDA_OK(fp8 ? write_e4m3(in, row, tokens, heads, dim, s, page_size, t, nullptr)
              : write_bf16(in, row, tokens, heads, dim, s, page_size, t, nullptr));
  CUDA_OK(cudaDeviceSynchronize());
  std::vector<uint8_t> pool(pool_bytes), scales(scale_bytes);
  CUDA_OK(cudaMemcpy(pool.data(), d_pool, pool_bytes, cudaMemcpyDeviceToHost));
  if (token_scales) {
    CUDA_OK(cudaMemcpy(scales.data(), d_scales, scale_bytes, cudaMemcpyDeviceToHost));
  }
  const size_t elem = fp8 ? 1 : 2;
  for (int64_t slot : slots) {
    const int64_t page = slot / page_size, offset = slot % page_size;
    for (uint32_t h = 0; h < heads; ++h) {
      const int64_t at = page * l.k_page_stride + offset * l.k_token_stride + h * l.k_head_stride;
      ASSERT_EQ(std::memcmp(pool.data() + at, static_cast<const uint8_t*>(l.k_base) + at,
                            dim * elem),
                0)
          << c.store << " slot " << slot << " head " << h;
      if (token_scales) {
        const int64_t sat = page * l.scale_page_stride + offset * l.scale_token_stride +
                            h * l.scale_head_stride;
        ASSERT_EQ(std::memcmp(scales.data() + sat,
                              reinterpret_cast<const uint8_t*>(l.k_scale) + sat, 4),
                  0)
            << "scale of slot " << slot << " head " << h;
      }
    }
  }
  cudaFree(d_pool);
  cudaFree(d_scales);
  cudaFree(d_in);
  cudaFree(d_slots);
  kv.destroy(store);
}

TEST(KvWriteCuda, DeviceWritesAreTheCpuStoresBytes) {
  REQUIRE_GPU();
  for (const Case c : {Case{"kv_bf16_paged", nullptr}, Case{"kv_fp8_e4m3", "per_token_head"},
                       Case{"kv_fp8_e4m3", "per_tensor"}}) {
    for (const auto& [heads, dim, page] : {std::tuple{8u, 128u, 16u}, std::tuple{1u, 576u, 64u},
                                            std::tuple{2u, 64u, 1u}, std::tuple{4u, 256u, 128u}}) {
      SCOPED_TRACE(std::string(c.store) + (c.scale_mode ? std::string(" ") + c.scale_mode : "") +
                   ", heads " + std::to_string(heads) + ", dim " + std::to_string(dim) +
                   ", page " + std::to_string(page));
      check_store(c, heads, dim, page);
      if (HasFatalFailure()) return;
    }
  }
}

TEST(KvWriteCuda, BadArgumentsAreRefusedBeforeALaunch) {
  KvWriteTarget t;  // base NULL
  float x = 0;
  int64_t slot = 0;
  EXPECT_EQ(write_bf16(&x, 1, 1, 1, 1, &slot, 16, t, nullptr), cudaErrorInvalidValue);
  EXPECT_EQ(write_e4m3(&x, 1, 0, 1, 1, &slot, 16, t, nullptr), cudaSuccess);  // nothing to do
}

}  // namespace
}  // namespace kvrt::cuda
