// The CUDA paged attention (kernels/cuda/paged_attention.cu) against attn_cpu on the same bytes:
// a CPU store (bf16, fp8 with per-token-head or per-tensor scales, f32) gets random K/V in
// shuffled pages; attn_cpu computes the reference on the CPU; the store's pages and scales are
// copied to the device unchanged and the CUDA kernel reads them through the same layout. Random
// batches of decodes (short, across page boundaries, long enough to split) and a causal prefill
// chunk after earlier context, GQA 1-8, head dims 64, 128, 256 and MLA's 576 with V its first
// 512, page sizes 1, 16 and 128. Needs a GPU: without one every test skips, saying why.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/capacity/capacity.h"
#include "core/plugin/registry.h"
#include "kernels/cuda/paged_attention.h"
#include "tests/kernels/cuda/cuda_device.h"

namespace kvrt::cuda {
namespace {

// A host range copied to the device, and the device address of any host pointer inside it.
struct Mirror {
  const uint8_t* lo = nullptr;
  uint8_t* device = nullptr;
  void copy(const void* begin, const void* end) {
    lo = static_cast<const uint8_t*>(begin);
    const size_t bytes = static_cast<size_t>(static_cast<const uint8_t*>(end) - lo);
    ASSERT_EQ(cudaMalloc(&device, bytes), cudaSuccess);
    ASSERT_EQ(cudaMemcpy(device, lo, bytes, cudaMemcpyHostToDevice), cudaSuccess);
  }
  const void* at(const void* host) const {
    return host == nullptr ? nullptr : device + (static_cast<const uint8_t*>(host) - lo);
  }
  ~Mirror() { cudaFree(device); }
};

struct Shape {
  uint32_t q_heads, kv_heads, qk_dim, v_dim, latent_v;  // latent_v: V the K row's first values
};

void check(const char* store_name, const char* scale_mode, const Shape& sh, uint32_t page_size,
           uint32_t seed) {
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  plugin::Registry registry;
  Result<const plugin::LoadedPlugin*> store_plugin = registry.load_kv_store(store_name);
  Result<const plugin::LoadedPlugin*> attn_plugin = registry.load("attn_cpu");
  ASSERT_TRUE(store_plugin.ok() && attn_plugin.ok());
  const kvrt_kv_store_api& kv = (*store_plugin)->kv;
  const kvrt_attention_api& api = (*attn_plugin)->attention;
  toml::table config;
  if (scale_mode != nullptr) {
    config.insert("scale_mode", scale_mode);
    if (std::string(scale_mode) == "per_tensor") {
      config.insert("k_scale", 0.02);
      config.insert("v_scale", 0.02);
    }
  }
  std::mt19937 rng(seed);
  // Sequences (kv length, query rows).
  const std::vector<std::pair<uint32_t, uint32_t>> seqs = {
      {1, 1}, {page_size + 1, 1}, {1000, 1}, {3000 + rng() % 500, 1}, {300, 20}};
  std::vector<int32_t> qo{0}, indptr{0}, pages, last;
  for (const auto& [kv_len, q_len] : seqs) {
    for (uint32_t p = 0; p < (kv_len + page_size - 1) / page_size; ++p) {
      pages.push_back(static_cast<int32_t>(pages.size()));
    }
    qo.push_back(qo.back() + static_cast<int32_t>(q_len));
    indptr.push_back(static_cast<int32_t>(pages.size()));
    last.push_back(static_cast<int32_t>((kv_len - 1) % page_size + 1));
  }
  const auto num_pages = static_cast<uint32_t>(pages.size());
  std::shuffle(pages.begin(), pages.end(), rng);
  // MHA / GQA heads, or an MLA latent of latent_v + (qk_dim - latent_v) rope values.
  const capacity::KvShape shape =
      sh.latent_v != 0
          ? capacity::KvShape{.layers = 1, .kv_lora_rank = sh.latent_v,
                              .qk_rope_head_dim = sh.qk_dim - sh.latent_v}
          : capacity::KvShape{.layers = 1, .kv_heads = sh.kv_heads, .head_dim = sh.qk_dim,
                              .v_head_dim = sh.v_dim};
  Result<kvrt_kv_geometry> geometry = capacity::kv_geometry(shape, 1, page_size, KVRT_DTYPE_F32);
  ASSERT_TRUE(geometry.ok()) << geometry.status().message();
  const kvrt_kv_geometry& g = *geometry;
  kvrt_kv_store* store = nullptr;
  ASSERT_EQ(kv.create((*store_plugin)->host_api(), &g, num_pages, plugin::as_config(&config), &store),
            KVRT_OK);
  std::vector<int64_t> slots(size_t{num_pages} * page_size);
  std::iota(slots.begin(), slots.end(), 0);
  std::normal_distribution<float> normal;
  std::vector<float> k(slots.size() * sh.kv_heads * sh.qk_dim), v(slots.size() * sh.kv_heads * sh.v_dim);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  kvrt_kv_write w{};
  w.struct_size = sizeof(w);
  w.dtype = KVRT_DTYPE_F32;
  w.num_tokens = static_cast<uint32_t>(slots.size());
  w.slots = slots.data();
  w.k = k.data();
  w.v = sh.latent_v != 0 ? nullptr : v.data();
  ASSERT_EQ(kv.write(store, &w), KVRT_OK);
  kvrt_kv_layout l{};
  l.struct_size = sizeof(l);
  ASSERT_EQ(kv.layout(store, 0, &l), KVRT_OK);

  // The reference: attn_cpu on the CPU.
  kvrt_attention_params p{};
  p.struct_size = sizeof(p);
  p.num_q_heads = sh.q_heads;
  p.num_kv_heads = sh.kv_heads;
  p.qk_head_dim = sh.qk_dim;
  p.v_head_dim = sh.v_dim;
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(sh.qk_dim));
  p.device = g.device;
  kvrt_attention* attn = nullptr;
  ASSERT_EQ(api.create((*attn_plugin)->host_api(), &p, nullptr, &attn), KVRT_OK);
  kvrt_attention_batch b{sizeof(b),     static_cast<uint32_t>(seqs.size()), page_size, 1,
                         qo.data(),     indptr.data(),                      pages.data(),
                         last.data()};
  uint64_t ws = 0;
  ASSERT_EQ(api.workspace_size(attn, &b, &ws), KVRT_OK);
  std::vector<uint8_t> workspace(ws);
  ASSERT_EQ(api.plan(attn, &b, workspace.data(), ws), KVRT_OK);
  const size_t rows = static_cast<size_t>(qo.back());
  std::vector<float> q(rows * sh.q_heads * sh.qk_dim), want(rows * sh.q_heads * sh.v_dim);
  for (float& x : q) x = normal(rng);
  kvrt_attention_run_args args{};
  args.struct_size = sizeof(args);
  args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
  args.layout = &l;
  args.store_api = &kv;
  args.store = store;
  args.q = q.data();
  args.out = want.data();
  ASSERT_EQ(api.run(attn, &args), KVRT_OK);

  // The same bytes on the device, read by the CUDA kernel.
  const size_t elem = l.k_dtype == KVRT_DTYPE_FP8_E4M3 ? 1 : l.k_dtype == KVRT_DTYPE_BF16 ? 2 : 4;
  auto end_of = [&](const void* base, int64_t page_stride, int64_t token_stride,
                    int64_t head_stride, size_t bytes) {
    return static_cast<const uint8_t*>(base) + (num_pages - 1) * page_stride +
           (page_size - 1) * token_stride + (sh.kv_heads - 1) * head_stride + bytes;
  };
  const uint8_t* k_end = end_of(l.k_base, l.k_page_stride, l.k_token_stride, l.k_head_stride,
                                sh.qk_dim * elem);
  const uint8_t* v_end = end_of(l.v_base, l.v_page_stride, l.v_token_stride, l.v_head_stride,
                                sh.v_dim * elem);
  Mirror pool;
  pool.copy(std::min(static_cast<const void*>(l.k_base), static_cast<const void*>(l.v_base)),
            std::max(k_end, v_end));
  Mirror scales;
  PagedKv d{};
  d.k_base = pool.at(l.k_base);
  d.v_base = pool.at(l.v_base);
  d.k_page_stride = l.k_page_stride;
  d.k_token_stride = l.k_token_stride;
  d.k_head_stride = l.k_head_stride;
  d.v_page_stride = l.v_page_stride;
  d.v_token_stride = l.v_token_stride;
  d.v_head_stride = l.v_head_stride;
  d.dtype = elem == 1 ? KvDtype::kE4M3 : elem == 2 ? KvDtype::kBf16 : KvDtype::kF32;
  if (l.scale_mode == KVRT_SCALE_PER_TENSOR) {
    d.scales = KvScales::kPerTensor;
    d.k_tensor_scale = *l.k_scale;
    d.v_tensor_scale = *l.v_scale;
  } else if (l.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD) {
    d.scales = KvScales::kPerTokenHead;
    const auto* ks = reinterpret_cast<const uint8_t*>(l.k_scale);
    const auto* vs = reinterpret_cast<const uint8_t*>(l.v_scale);
    const uint8_t* ks_end = end_of(ks, l.scale_page_stride, l.scale_token_stride,
                                   l.scale_head_stride, 4);
    const uint8_t* vs_end = end_of(vs, l.scale_page_stride, l.scale_token_stride,
                                   l.scale_head_stride, 4);
    scales.copy(std::min(ks, vs), std::max(ks_end, vs_end));
    d.k_scales = static_cast<const float*>(scales.at(l.k_scale));
    d.v_scales = static_cast<const float*>(scales.at(l.v_scale));
    d.scale_page_stride = l.scale_page_stride;
    d.scale_token_stride = l.scale_token_stride;
    d.scale_head_stride = l.scale_head_stride;
  }
  AttentionDims dims{static_cast<int32_t>(sh.q_heads), static_cast<int32_t>(sh.kv_heads),
                     static_cast<int32_t>(sh.qk_dim), static_cast<int32_t>(sh.v_dim),
                     p.softmax_scale};
  Mirror arrays[4];
  auto upload = [&](Mirror& m, const std::vector<int32_t>& a) {
    m.copy(a.data(), a.data() + a.size());
    return static_cast<const int32_t*>(m.at(a.data()));
  };
  DeviceBatch db;
  db.qo_indptr = upload(arrays[0], qo);
  db.kv_page_indptr = upload(arrays[1], indptr);
  db.kv_page_indices = upload(arrays[2], pages);
  db.kv_last_page_len = upload(arrays[3], last);
  db.batch_size = static_cast<int32_t>(seqs.size());
  db.total_rows = static_cast<int32_t>(rows);
  db.page_size = static_cast<int32_t>(page_size);
  std::vector<float> got(want.size(), NAN);
  float *d_q = nullptr, *d_out = nullptr;
  void* d_ws = nullptr;
  const int32_t max_splits = 8;
  const size_t ws_bytes = paged_attention_workspace(db.total_rows, dims, max_splits);
  CUDA_OK(cudaMalloc(&d_q, q.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_out, got.size() * sizeof(float)));
  CUDA_OK(cudaMalloc(&d_ws, ws_bytes));
  CUDA_OK(cudaMemcpy(d_q, q.data(), q.size() * sizeof(float), cudaMemcpyHostToDevice));
  CUDA_OK(paged_attention(db, d, dims, d_q, sh.q_heads * sh.qk_dim, d_out, sh.q_heads * sh.v_dim,
                          256, max_splits, d_ws, ws_bytes, nullptr));
  CUDA_OK(cudaMemcpy(got.data(), d_out, got.size() * sizeof(float), cudaMemcpyDeviceToHost));
  cudaFree(d_q);
  cudaFree(d_out);
  cudaFree(d_ws);
  // Both sum in f32 in different orders: within 1e-4 of the output's scale.
  float scale = 0;
  for (float x : want) scale = std::max(scale, std::fabs(x));
  for (size_t i = 0; i < want.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-4f * scale + 1e-6f)
        << store_name << (scale_mode ? std::string(" ") + scale_mode : "") << ", element " << i
        << " of " << want.size() << " (row " << i / (sh.q_heads * sh.v_dim) << ")";
  }
  api.destroy(attn);
  kv.destroy(store);
}

TEST(PagedAttentionCuda, MatchesAttnCpuOverTheSameBytes) {
  REQUIRE_GPU();
  struct StoreCase {
    const char* store;
    const char* scales;
  };
  uint32_t seed = 1;
  for (const Shape& sh : {Shape{32, 8, 128, 128, 0}, Shape{8, 8, 64, 64, 0},
                          Shape{4, 2, 256, 256, 0}, Shape{16, 1, 576, 512, 512}}) {
    for (const StoreCase& c : {StoreCase{"kv_bf16_paged", nullptr},
                               StoreCase{"kv_fp8_e4m3", "per_token_head"},
                               StoreCase{"kv_fp8_e4m3", "per_tensor"},
                               StoreCase{"kv_f32_paged", nullptr}}) {
      for (uint32_t page_size : {1u, 16u, 128u}) {
        SCOPED_TRACE("heads " + std::to_string(sh.q_heads) + "/" + std::to_string(sh.kv_heads) +
                     ", dims " + std::to_string(sh.qk_dim) + "/" + std::to_string(sh.v_dim) +
                     ", page " + std::to_string(page_size));
        check(c.store, c.scales, sh, page_size, seed++);
        if (HasFatalFailure()) return;
      }
    }
  }
}

TEST(PagedAttentionCuda, BadDimensionsAreRefusedBeforeALaunch) {
  DeviceBatch b;
  b.total_rows = 1;
  b.page_size = 16;
  PagedKv kv;
  AttentionDims dims{8, 3, 128, 128, 1.0f};  // 8 query heads over 3 KV heads
  EXPECT_EQ(paged_attention(b, kv, dims, nullptr, 0, nullptr, 0, 256, 1, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  dims = {8, 2, 1024, 128, 1.0f};  // a head wider than the kernel holds
  EXPECT_EQ(paged_attention(b, kv, dims, nullptr, 0, nullptr, 0, 256, 1, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
  dims = {8, 2, 128, 128, 1.0f};  // a workspace too small for 4 splits
  EXPECT_EQ(paged_attention(b, kv, dims, nullptr, 0, nullptr, 0, 256, 4, nullptr, 0, nullptr),
            cudaErrorInvalidValue);
}

}  // namespace
}  // namespace kvrt::cuda
