// attn_cuda through the C ABI, as the core uses it, against attn_cpu: the same random K/V written
// into a store on the CPU and into the same store on the GPU (its device pool and device write
// path, ABI 1.2's device slots), shuffled pages, a batch of decode rows and causal prefill rows
// after earlier context, then each plugin's attention over its own store with the same queries.
// Stores bf16, f32 and fp8 (both scale modes), page sizes 1-128, GQA 1-8, head dims 64, 128, 256
// and an MLA latent of 576 whose first 512 values are V, long rows split over chunks. Also its
// refusals: a CPU device, pages in host memory, a bad batch. The device tests skip without a GPU;
// the refusals that need none run everywhere.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/backend/cuda_memory.h"
#include "core/capacity/capacity.h"
#include "core/plugin/registry.h"
#include "kvrt/plugin.hpp"
#include "tests/kernels/cuda/cuda_device.h"

namespace kvrt::plugin {
namespace {

constexpr kvrt_device kCpu{sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
constexpr kvrt_device kGpu{sizeof(kvrt_device), KVRT_DEVICE_CUDA, 0, 0};

struct Shape {
  uint32_t q_heads, kv_heads, qk_dim;
  uint32_t latent_v = 0;  // MLA: V is the K row's first latent_v values
};

// One registry per device: the GPU's hands the plugins CUDA memory.
struct Loaded {
  std::unique_ptr<Registry> registry;
  const LoadedPlugin* store = nullptr;
  const LoadedPlugin* attention = nullptr;
};

Loaded load(const kvrt_device& device, const std::string& store, const std::string& attention) {
  static backend::CudaMemory cuda_memory;
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  Loaded l;
  l.registry = std::make_unique<Registry>(device);
  if (device.kind == KVRT_DEVICE_CUDA) l.registry->set_device_memory(&cuda_memory);
  Result<const LoadedPlugin*> s = l.registry->load_kv_store(store);
  Result<const LoadedPlugin*> a = l.registry->load(attention);
  EXPECT_TRUE(s.ok()) << s.status().message();
  EXPECT_TRUE(a.ok()) << a.status().message();
  if (s.ok()) l.store = *s;
  if (a.ok()) l.attention = *a;
  return l;
}

kvrt_attention_params params(const Shape& sh, const kvrt_device& device) {
  kvrt_attention_params p{};
  p.struct_size = sizeof(p);
  p.num_q_heads = sh.q_heads;
  p.num_kv_heads = sh.kv_heads;
  p.qk_head_dim = sh.qk_dim;
  p.v_head_dim = sh.latent_v != 0 ? sh.latent_v : sh.qk_dim;
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(sh.qk_dim));
  p.device = device;
  return p;
}

// One layer of the shape's KV (an MLA latent of qk_dim whose first latent_v values are V), from
// the one geometry builder.
kvrt_kv_geometry geometry(const Shape& sh, uint32_t page_size) {
  capacity::KvShape kv;
  kv.layers = 1;
  kv.kv_heads = sh.kv_heads;
  if (sh.latent_v != 0) {
    kv.kv_lora_rank = sh.latent_v;
    kv.qk_rope_head_dim = sh.qk_dim - sh.latent_v;
  } else {
    kv.head_dim = kv.v_head_dim = sh.qk_dim;
  }
  Result<kvrt_kv_geometry> g = capacity::kv_geometry(kv, 1, page_size, KVRT_DTYPE_F32);
  EXPECT_TRUE(g.ok()) << g.status().message();
  return g.ok() ? *g : kvrt_kv_geometry{};
}

TEST(AttnCudaRefusals, ACpuDeviceIsRefusedByName) {
  Loaded l = load(kCpu, "kv_bf16_paged", "attn_cuda");
  ASSERT_NE(l.attention, nullptr);
  const kvrt_attention_params p = params({8, 8, 64}, kCpu);
  kvrt_attention* attn = nullptr;
  clear_last_error();
  EXPECT_EQ(l.attention->attention.create(l.attention->host_api(), &p, nullptr, &attn),
            KVRT_ERR_UNSUPPORTED);
  EXPECT_EQ(take_last_error(), "attn_cuda serves CUDA devices only");
}

TEST(AttnCudaRefusals, NoGpuIsRefusedWithTheReason) {
  if (cuda::no_cuda_device().empty()) GTEST_SKIP() << "a CUDA device is present";
  Loaded l = load(kCpu, "kv_bf16_paged", "attn_cuda");
  ASSERT_NE(l.attention, nullptr);
  const kvrt_attention_params p = params({8, 8, 64}, kGpu);
  kvrt_attention* attn = nullptr;
  clear_last_error();
  EXPECT_EQ(l.attention->attention.create(l.attention->host_api(), &p, nullptr, &attn),
            KVRT_ERR_UNSUPPORTED);
  EXPECT_EQ(take_last_error().rfind("no CUDA device", 0), 0u);
}

// A store of `num_pages` on one device, filled with the same rows either way.
struct Store {
  const LoadedPlugin* plugin = nullptr;
  kvrt_kv_store* handle = nullptr;
  ~Store() {
    if (handle != nullptr) plugin->kv.destroy(handle);
  }
};

void create_store(const Loaded& l, const kvrt_kv_geometry& g, uint64_t pages,
                  const toml::table& config, Store* out) {
  out->plugin = l.store;
  clear_last_error();
  ASSERT_EQ(l.store->kv.create(l.store->host_api(), &g, pages, as_config(&config), &out->handle),
            KVRT_OK)
      << take_last_error();
}

// Writes rows [n][heads * dim] (K, and V unless the latent holds it) into slots, on either
// device (the GPU's rows and slots are copied to device memory first).
void write_rows(const Store& s, const kvrt_kv_geometry& g, const std::vector<float>& k,
                const std::vector<float>& v, const std::vector<int64_t>& slots) {
  kvrt_kv_write w{};
  w.struct_size = sizeof(w);
  w.dtype = KVRT_DTYPE_F32;
  w.num_tokens = static_cast<uint32_t>(slots.size());
  w.slots = slots.data();
  w.k = k.data();
  w.v = g.v_head_dim != 0 ? v.data() : nullptr;
  float *dk = nullptr, *dv = nullptr;
  int64_t* ds = nullptr;
  if (g.device.kind == KVRT_DEVICE_CUDA) {
    CUDA_OK(cudaMalloc(&dk, k.size() * 4));
    CUDA_OK(cudaMalloc(&dv, v.size() * 4));
    CUDA_OK(cudaMalloc(&ds, slots.size() * 8));
    CUDA_OK(cudaMemcpy(dk, k.data(), k.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(dv, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    CUDA_OK(cudaMemcpy(ds, slots.data(), slots.size() * 8, cudaMemcpyHostToDevice));
    w.k = dk;
    w.v = g.v_head_dim != 0 ? dv : nullptr;
    w.device_slots = ds;
  }
  clear_last_error();
  EXPECT_EQ(s.plugin->kv.write(s.handle, &w), KVRT_OK) << take_last_error();
  if (g.device.kind == KVRT_DEVICE_CUDA) {
    CUDA_OK(cudaDeviceSynchronize());
    CUDA_OK(cudaFree(dk));
    CUDA_OK(cudaFree(dv));
    CUDA_OK(cudaFree(ds));
  }
}

// Runs `attention` over `store` for the batch; returns the output rows (host). With `shard`,
// through plan_sharded and run_lse (ABI 1.4), the log-sum-exps into *lse.
std::vector<float> attend(const Loaded& l, const Store& store, const kvrt_attention_params& p,
                          const kvrt_attention_batch& batch, const std::vector<float>& q,
                          size_t out_floats, const kvrt_attention_shard* shard = nullptr,
                          std::vector<float>* lse = nullptr) {
  kvrt_attention* attn = nullptr;
  clear_last_error();
  EXPECT_EQ(l.attention->attention.create(l.attention->host_api(), &p, nullptr, &attn), KVRT_OK)
      << take_last_error();
  if (attn == nullptr) return {};
  kvrt_kv_layout layout{};
  layout.struct_size = sizeof(layout);
  store.plugin->kv.layout(store.handle, 0, &layout);
  EXPECT_EQ(l.attention->attention.supports(attn, &layout), KVRT_OK) << take_last_error();
  uint64_t bytes = 0;
  l.attention->attention.workspace_size(attn, &batch, &bytes);
  std::vector<uint8_t> workspace(bytes);
  if (shard != nullptr) {
    EXPECT_EQ(l.attention->attention.plan_sharded(attn, &batch, shard, workspace.data(), bytes),
              KVRT_OK)
        << take_last_error();
  } else {
    EXPECT_EQ(l.attention->attention.plan(attn, &batch, workspace.data(), bytes), KVRT_OK)
        << take_last_error();
  }
  std::vector<float> out(out_floats, NAN);
  const bool gpu = p.device.kind == KVRT_DEVICE_CUDA;
  float *dq = nullptr, *dout = nullptr, *dlse = nullptr;
  const size_t rows = out_floats / (size_t{p.num_q_heads} * p.v_head_dim);
  if (lse != nullptr) lse->assign(rows * p.num_q_heads, NAN);
  if (gpu) {
    EXPECT_EQ(cudaMalloc(&dq, q.size() * 4), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&dout, out.size() * 4), cudaSuccess);
    if (lse != nullptr) {
      EXPECT_EQ(cudaMalloc(&dlse, lse->size() * 4), cudaSuccess);
    }
    EXPECT_EQ(cudaMemcpy(dq, q.data(), q.size() * 4, cudaMemcpyHostToDevice), cudaSuccess);
  }
  kvrt_attention_run_args args{};
  args.struct_size = sizeof(args);
  args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
  args.layout = &layout;
  args.store_api = &store.plugin->kv;
  args.store = store.handle;
  args.q = gpu ? static_cast<const void*>(dq) : q.data();
  args.out = gpu ? static_cast<void*>(dout) : out.data();
  if (lse != nullptr) {
    EXPECT_EQ(l.attention->attention.run_lse(attn, &args, gpu ? dlse : lse->data(), 0), KVRT_OK)
        << take_last_error();
  } else {
    EXPECT_EQ(l.attention->attention.run(attn, &args), KVRT_OK) << take_last_error();
  }
  if (gpu) {
    EXPECT_EQ(cudaMemcpy(out.data(), dout, out.size() * 4, cudaMemcpyDeviceToHost), cudaSuccess);
    if (lse != nullptr) {
      EXPECT_EQ(cudaMemcpy(lse->data(), dlse, lse->size() * 4, cudaMemcpyDeviceToHost),
                cudaSuccess);
    }
    (void)cudaFree(dq);
    (void)cudaFree(dout);
    (void)cudaFree(dlse);
  }
  l.attention->attention.destroy(attn);
  return out;
}

struct Case {
  std::string store;
  const char* scale_mode;  // nullptr: the store's default
  Shape shape;
  uint32_t page_size;
  // (ABI 1.4) > 1: the stores keep shard 1 of this many of every sequence's tokens (single
  // tokens dealt out in turn), attended with plan_sharded + run_lse, whose log-sum-exps are
  // compared too.
  uint32_t shards = 1;
};

// Sequences of (KV length, query rows): decodes across page boundaries, one long enough to be
// split into chunks, and a causal prefill after earlier context.
const std::vector<std::pair<uint32_t, uint32_t>> kSequences = {{1, 1},    {17, 1},  {128, 1},
                                                               {1500, 1}, {90, 20}, {33, 33}};

void check(const Case& c) {
  SCOPED_TRACE(c.store + (c.scale_mode ? std::string(" ") + c.scale_mode : "") + ", heads " +
               std::to_string(c.shape.q_heads) + "/" + std::to_string(c.shape.kv_heads) + ", dim " +
               std::to_string(c.shape.qk_dim) + ", page size " + std::to_string(c.page_size));
  const Shape& sh = c.shape;
  toml::table config;
  if (c.scale_mode != nullptr) config.insert("scale_mode", c.scale_mode);
  if (c.scale_mode != nullptr && std::string(c.scale_mode) == "per_tensor") {
    config.insert("k_scale", 0.02);
    config.insert("v_scale", 0.015);
  }
  // The tokens the stores keep of a sequence of kv_len: all, or shard 1's.
  const uint32_t index = c.shards > 1 ? 1 : 0;
  const sdk::Shard counting{std::max(1u, c.shards), index, 1, nullptr};
  auto kept = [&](uint32_t kv_len) {
    return static_cast<uint32_t>(counting.tokens_before(kv_len));
  };
  uint32_t pages = 0;
  for (const auto& [kv_len, rows] : kSequences) {
    pages += (kept(kv_len) + c.page_size - 1) / c.page_size;
  }
  kvrt_kv_geometry g = geometry(sh, c.page_size);

  // Shuffled pages, each sequence's in order of its positions.
  std::mt19937 rng(c.page_size * 131 + sh.qk_dim);
  std::vector<int32_t> page_ids(pages);
  std::iota(page_ids.begin(), page_ids.end(), 0);
  std::shuffle(page_ids.begin(), page_ids.end(), rng);
  std::vector<int32_t> qo{0}, indptr{0}, last, whole;
  std::vector<int64_t> slots;
  for (const auto& [kv_len, rows] : kSequences) {
    const uint32_t local = kept(kv_len);
    const uint32_t n = (local + c.page_size - 1) / c.page_size;
    for (uint32_t t = 0; t < local; ++t) {
      slots.push_back(int64_t{page_ids[indptr.back() + t / c.page_size]} * c.page_size +
                      t % c.page_size);
    }
    indptr.push_back(indptr.back() + static_cast<int32_t>(n));
    qo.push_back(qo.back() + static_cast<int32_t>(rows));
    last.push_back(n == 0 ? 0 : static_cast<int32_t>(local - (n - 1) * c.page_size));
    whole.push_back(static_cast<int32_t>(kv_len));
  }
  const kvrt_attention_shard shard{sizeof(kvrt_attention_shard), c.shards, index, 1,
                                   whole.data()};
  const kvrt_attention_shard* sharded = c.shards > 1 ? &shard : nullptr;
  std::vector<float> cpu_lse, gpu_lse;
  std::normal_distribution<float> normal;
  const size_t row = size_t{sh.kv_heads} * sh.qk_dim;
  std::vector<float> k(slots.size() * row), v(slots.size() * row),
      q(qo.back() * size_t{sh.q_heads} * sh.qk_dim);
  for (float& x : k) x = normal(rng);
  for (float& x : v) x = normal(rng);
  for (float& x : q) x = 0.3f * normal(rng);
  const kvrt_attention_batch batch{sizeof(batch),   static_cast<uint32_t>(kSequences.size()),
                                   c.page_size,     1,
                                   qo.data(),       indptr.data(),
                                   page_ids.data(), last.data()};
  const size_t out_floats = qo.back() * size_t{sh.q_heads} * g.v_width;

  Loaded cpu = load(kCpu, c.store, "attn_cpu");
  Loaded gpu = load(kGpu, c.store, "attn_cuda");
  ASSERT_NE(cpu.store, nullptr);
  ASSERT_NE(gpu.store, nullptr);
  Store cpu_store, gpu_store;
  g.device = kCpu;
  create_store(cpu, g, pages, config, &cpu_store);
  write_rows(cpu_store, g, k, v, slots);
  const std::vector<float> want = attend(cpu, cpu_store, params(sh, kCpu), batch, q, out_floats,
                                         sharded, sharded ? &cpu_lse : nullptr);
  g.device = kGpu;
  create_store(gpu, g, pages, config, &gpu_store);
  write_rows(gpu_store, g, k, v, slots);
  const std::vector<float> got = attend(gpu, gpu_store, params(sh, kGpu), batch, q, out_floats,
                                        sharded, sharded ? &gpu_lse : nullptr);
  ASSERT_EQ(got.size(), want.size());
  // Both read the same stored bytes (the device encodings are the CPU's, bit for bit); what
  // differs is f32 summation order, so the outputs agree to a few ulps of the values' scale.
  double worst = 0;
  size_t at = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = std::fabs(double{got[i]} - want[i]);
    if (!(d <= worst)) worst = d, at = i;  // NaN sticks
  }
  EXPECT_LE(worst, 1e-4) << "element " << at << ": GPU " << got[at] << ", CPU " << want[at];
  ASSERT_EQ(gpu_lse.size(), cpu_lse.size());
  for (size_t i = 0; i < gpu_lse.size(); ++i) {
    if (std::isinf(cpu_lse[i])) {  // a row that sees none of the shard's tokens
      EXPECT_EQ(gpu_lse[i], cpu_lse[i]) << "log-sum-exp " << i;
    } else {
      EXPECT_NEAR(gpu_lse[i], cpu_lse[i], 1e-4 * std::max(1.0f, std::fabs(cpu_lse[i])))
          << "log-sum-exp " << i;
    }
  }
}

class AttnCuda : public ::testing::Test {
 protected:
  void SetUp() override { REQUIRE_GPU(); }
};

// ABI 1.4: one shard of two of every sequence, through plan_sharded and run_lse: the output and
// the log-sum-exps equal attn_cpu's (which the conformance suite holds to the reference).
TEST_F(AttnCuda, ShardedRunLseEqualsAttnCpus) {
  for (uint32_t page_size : {1u, 16u}) {
    check({"kv_bf16_paged", nullptr, {32, 8, 128}, page_size, 2});
  }
  check({"kv_bf16_paged", nullptr, {16, 1, 576, 512}, 16, 2});  // an MLA latent
}

TEST_F(AttnCuda, EqualsAttnCpuOverEveryStoreAndPageSize) {
  for (const char* store : {"kv_bf16_paged", "kv_f32_paged", "kv_fp8_e4m3"}) {
    for (uint32_t page_size : {1u, 16u, 128u}) check({store, nullptr, {32, 8, 128}, page_size});
  }
  check({"kv_fp8_e4m3", "per_tensor", {32, 8, 128}, 16});
}

TEST_F(AttnCuda, EqualsAttnCpuOverGqaAndHeadDims) {
  for (const Shape& sh : {Shape{8, 8, 64}, Shape{16, 2, 256}, Shape{12, 4, 64}, Shape{8, 1, 128}}) {
    check({"kv_bf16_paged", nullptr, sh, 16});
    check({"kv_fp8_e4m3", nullptr, sh, 16});
  }
}

TEST_F(AttnCuda, EqualsAttnCpuOverAnMlaLatent) {
  check({"kv_bf16_paged", nullptr, {16, 1, 576, 512}, 16});
  check({"kv_fp8_e4m3", nullptr, {16, 1, 576, 512}, 1});
}

TEST_F(AttnCuda, DeclinesPagesInHostMemory) {
  Loaded cpu = load(kCpu, "kv_bf16_paged", "attn_cpu");
  Loaded gpu = load(kGpu, "kv_bf16_paged", "attn_cuda");
  kvrt_kv_geometry g = geometry({8, 8, 64}, 16);
  g.device = kCpu;
  Store host_store;
  create_store(cpu, g, 4, toml::table{}, &host_store);
  kvrt_kv_layout layout{};
  layout.struct_size = sizeof(layout);
  host_store.plugin->kv.layout(host_store.handle, 0, &layout);
  const kvrt_attention_params p = params({8, 8, 64}, kGpu);
  kvrt_attention* attn = nullptr;
  ASSERT_EQ(gpu.attention->attention.create(gpu.attention->host_api(), &p, nullptr, &attn),
            KVRT_OK);
  clear_last_error();
  EXPECT_EQ(gpu.attention->attention.supports(attn, &layout), KVRT_ERR_UNSUPPORTED);
  EXPECT_NE(take_last_error().find("device memory only"), std::string::npos);
  gpu.attention->attention.destroy(attn);
}

TEST_F(AttnCuda, RefusesABatchThatWouldReadOutsideThePages) {
  Loaded gpu = load(kGpu, "kv_bf16_paged", "attn_cuda");
  const kvrt_attention_params p = params({8, 8, 64}, kGpu);
  kvrt_attention* attn = nullptr;
  ASSERT_EQ(gpu.attention->attention.create(gpu.attention->host_api(), &p, nullptr, &attn),
            KVRT_OK);
  std::vector<int32_t> qo{0, 1}, indptr{0, 1}, pages{0}, last{17};  // 17 > page size 16
  const kvrt_attention_batch b{sizeof(b),    1,          16, 1, qo.data(), indptr.data(),
                               pages.data(), last.data()};
  uint64_t bytes = 0;
  gpu.attention->attention.workspace_size(attn, &b, &bytes);
  std::vector<uint8_t> workspace(bytes);
  clear_last_error();
  EXPECT_EQ(gpu.attention->attention.plan(attn, &b, workspace.data(), bytes),
            KVRT_ERR_INVALID_ARGUMENT);
  EXPECT_EQ(take_last_error(), "sequence 0: kv_last_page_len 17 outside 1..16");
  gpu.attention->attention.destroy(attn);
}

}  // namespace
}  // namespace kvrt::plugin
