// Decode attention throughput of attn_cpu over the shipped stores, as effective KV bytes read per
// second beside memcpy of the same byte count measured in the same run, for paged (shuffled page
// ids) and contiguous (page ids 0..n-1 in order) page tables.
//   ./build/bin/attention_bench [--benchmark_filter=bf16/4096]
// Shape: Llama-3-8B-like, 32 query heads over 8 KV heads of dim 128 (GQA 4), one layer, page
// size 16, one decode row per sequence, f32 Q and output, single thread.
// Counters:
//   kv_GBps      bytes of K+V the step reads (the store's bytes per token, scales included,
//                times the context tokens of the batch) per second;
//   memcpy_GBps  memcpy of the same bytes per copy, from and to buffers of that size (capped at
//                256 MiB per copy, repeated to the same total), measured right after;
//   vs_memcpy    kv_GBps / memcpy_GBps.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/plugin/registry.h"

namespace {

using kvrt::plugin::LoadedPlugin;
using kvrt::plugin::Registry;
using kvrt::plugin::take_last_error;

constexpr uint32_t kQHeads = 32, kKvHeads = 8, kHeadDim = 128, kPageSize = 16;

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// GB/s of memcpy moving `bytes` (counted once, like the attention's reads).
double memcpy_rate(size_t bytes) {
  const size_t block = std::min<size_t>(bytes, size_t{256} << 20);
  std::vector<uint8_t> src(block, 1), dst(block, 0);
  std::memcpy(dst.data(), src.data(), block);  // fault the pages in
  const size_t copies = std::max<size_t>(1, (bytes + block - 1) / block);
  const int repeats = std::max(3, static_cast<int>((size_t{1} << 30) / (copies * block)));
  double best = 0;
  for (int r = 0; r < repeats; ++r) {
    const auto start = std::chrono::steady_clock::now();
    for (size_t c = 0; c < copies; ++c) {
      std::memcpy(dst.data(), src.data(), block);
      benchmark::ClobberMemory();
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, static_cast<double>(copies * block) / s / 1e9);
  }
  return best;
}

void BM_Decode(benchmark::State& state, const std::string& store_name, bool per_tensor,
               bool paged) {
  const auto context = static_cast<uint32_t>(state.range(0));
  const auto batch = static_cast<uint32_t>(state.range(1));
  Registry& reg = registry();
  auto store_plugin = reg.load_kv_store(store_name);
  auto attn_plugin = reg.load("attn_cpu");
  if (!store_plugin.ok() || !attn_plugin.ok()) {
    return state.SkipWithError("cannot load kv store or attn_cpu (run from build/bin)");
  }
  const kvrt_kv_store_api& kv = (*store_plugin)->kv;
  const kvrt_attention_api& api = (*attn_plugin)->attention;
  toml::table config;
  if (per_tensor) config.insert("scale_mode", "per_tensor");

  // The store: exactly the batch's pages.
  const uint32_t pages_per_seq = context / kPageSize;
  const uint64_t num_pages = uint64_t{pages_per_seq} * batch;
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = 1;
  g.num_kv_heads = g.total_kv_heads = kKvHeads;
  g.k_head_dim = g.v_head_dim = kHeadDim;
  g.page_size = kPageSize;
  g.input_dtype = KVRT_DTYPE_F32;
  g.tp_size = 1;
  g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
  kvrt_kv_store* store = nullptr;
  if (kv.create((*store_plugin)->host_api(), &g, num_pages, kvrt::plugin::as_config(&config),
                &store) != KVRT_OK) {
    return state.SkipWithError(("store create: " + take_last_error()).c_str());
  }
  // Fill every slot (random values, reused across chunks of 4096 tokens).
  {
    const uint32_t chunk = 4096;
    const size_t row = size_t{kKvHeads} * kHeadDim;
    std::vector<float> k(chunk * row), v(chunk * row);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    std::vector<int64_t> slots(chunk);
    for (uint64_t s0 = 0; s0 < num_pages * kPageSize; s0 += chunk) {
      const uint32_t n =
          static_cast<uint32_t>(std::min<uint64_t>(chunk, num_pages * kPageSize - s0));
      std::iota(slots.begin(), slots.begin() + n, static_cast<int64_t>(s0));
      kvrt_kv_write w{sizeof(w), 0, KVRT_DTYPE_F32, n, slots.data(), k.data(), v.data(), 0, 0};
      if (kv.write(store, &w) != KVRT_OK) {
        kv.destroy(store);
        return state.SkipWithError(("store write: " + take_last_error()).c_str());
      }
    }
  }
  kvrt_kv_info info{};
  info.struct_size = sizeof(info);
  kv.info(store, &info);
  kvrt_kv_layout layout{};
  layout.struct_size = sizeof(layout);
  kv.layout(store, 0, &layout);

  // The batch: one decode row per sequence over `context` tokens.
  std::vector<int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  if (paged) std::shuffle(pages.begin(), pages.end(), std::mt19937(2));
  std::vector<int32_t> qo(batch + 1), indptr(batch + 1), last(batch, kPageSize);
  for (uint32_t b = 0; b <= batch; ++b) {
    qo[b] = static_cast<int32_t>(b);
    indptr[b] = static_cast<int32_t>(b * pages_per_seq);
  }
  kvrt_attention_params p{};
  p.struct_size = sizeof(p);
  p.num_q_heads = kQHeads;
  p.num_kv_heads = kKvHeads;
  p.qk_head_dim = p.v_head_dim = kHeadDim;
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  p.device = g.device;
  kvrt_attention* attn = nullptr;
  if (api.create((*attn_plugin)->host_api(), &p, nullptr, &attn) != KVRT_OK) {
    kv.destroy(store);
    return state.SkipWithError(("attention create: " + take_last_error()).c_str());
  }
  kvrt_attention_batch b{sizeof(b), batch,         kPageSize,    1,
                         qo.data(), indptr.data(), pages.data(), last.data()};
  uint64_t ws_bytes = 0;
  api.workspace_size(attn, &b, &ws_bytes);
  std::vector<uint8_t> workspace(ws_bytes);
  api.plan(attn, &b, workspace.data(), ws_bytes);
  std::vector<float> q(size_t{batch} * kQHeads * kHeadDim, 0.1f), out(q.size());
  kvrt_attention_run_args args{};
  args.struct_size = sizeof(args);
  args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
  args.layout = &layout;
  args.store_api = &kv;
  args.store = store;
  args.q = q.data();
  args.out = out.data();

  for (auto _ : state) {
    if (api.run(attn, &args) != KVRT_OK) {
      state.SkipWithError(("run: " + take_last_error()).c_str());
      break;
    }
    benchmark::DoNotOptimize(out.data());
    benchmark::ClobberMemory();
  }
  const size_t kv_bytes = static_cast<size_t>(info.bytes_per_token) * context * batch;
  const double bytes = static_cast<double>(kv_bytes) * static_cast<double>(state.iterations());
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  state.counters["kv_GBps"] = benchmark::Counter(bytes / 1e9, benchmark::Counter::kIsRate);
  const double memcpy_gbps = memcpy_rate(kv_bytes);
  state.counters["memcpy_GBps"] = memcpy_gbps;
  state.counters["vs_memcpy"] =
      benchmark::Counter(bytes / (memcpy_gbps * 1e9), benchmark::Counter::kIsRate);
  state.counters["kv_MiB"] = static_cast<double>(kv_bytes) / (1 << 20);
  api.destroy(attn);
  kv.destroy(store);
}

void register_all() {
  struct Store {
    const char* label;
    const char* name;
    bool per_tensor;
  };
  for (Store s : {Store{"bf16", "kv_bf16_paged", false}, Store{"fp8", "kv_fp8_e4m3", false},
                  Store{"fp8_per_tensor", "kv_fp8_e4m3", true}}) {
    for (bool paged : {true, false}) {
      const std::string name =
          std::string("decode/") + s.label + (paged ? "/paged" : "/contiguous");
      auto* bm = benchmark::RegisterBenchmark(name.c_str(), BM_Decode, std::string(s.name),
                                              s.per_tensor, paged);
      bm->ArgNames({"ctx", "batch"})->UseRealTime()->Unit(benchmark::kMillisecond);
      for (int64_t context : {1024, 4096, 16384}) {
        for (int64_t batch : {1, 32}) bm->Args({context, batch});
      }
    }
  }
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
