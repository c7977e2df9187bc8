// Write and gather throughput of each KV store, beside memcpy of the same bytes measured in
// the same process (counters memcpy_GBps and vs_memcpy).
//   ./build/bin/kv_store_bench [--benchmark_filter=write]
// Bytes counted: write = the f32 (or bf16) K+V input consumed; gather = the f32 K+V produced.
#include <benchmark/benchmark.h>

#include <chrono>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "core/plugin/registry.h"

namespace {

using kvrt::plugin::LoadedPlugin;
using kvrt::plugin::Registry;

constexpr uint32_t kHeads = 8, kPageSize = 16, kTokensPerCall = 256, kPoolTokens = 8192;

Registry& registry() {
  static Registry* r = new Registry();
  return *r;
}

// GB/s of memcpy of `bytes` per call, repeated like the benchmark loop. With `ring` > 1 the
// destination walks a ring of that many buffers, as the stores' writes walk a KV pool bigger
// than the caches; with 1 it stays in cache.
double memcpy_rate(size_t bytes, int64_t repeats, size_t ring) {
  std::vector<uint8_t> src(bytes, 1), dst(bytes * ring);
  auto start = std::chrono::steady_clock::now();
  for (int64_t i = 0; i < repeats; ++i) {
    std::memcpy(dst.data() + (i % ring) * bytes, src.data(), bytes);
    benchmark::DoNotOptimize(dst.data());
    benchmark::ClobberMemory();
  }
  double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return static_cast<double>(bytes) * repeats / seconds / 1e9;
}

struct StoreFixture {
  const LoadedPlugin* plugin = nullptr;
  kvrt_kv_store* store = nullptr;
  kvrt_kv_geometry g{};
  std::string error;

  StoreFixture(const std::string& name, uint32_t head_dim) {
    auto loaded = registry().load_kv_store(name);
    if (!loaded.ok()) {
      error = loaded.status().message();
      return;
    }
    plugin = *loaded;
    g.struct_size = sizeof(g);
    g.num_layers = 1;
    g.num_kv_heads = g.total_kv_heads = kHeads;
    g.k_head_dim = g.v_head_dim = head_dim;
    g.page_size = kPageSize;
    g.input_dtype = KVRT_DTYPE_F32;
    g.tp_size = 1;
    g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
    if (plugin->kv.create(plugin->host_api(), &g, kPoolTokens / kPageSize, nullptr, &store) !=
        KVRT_OK) {
      error = "create failed: " + kvrt::plugin::take_last_error();
    }
  }
  ~StoreFixture() {
    if (store != nullptr) plugin->kv.destroy(store);
  }
};

// Counters beside the store's own bytes_per_second:
//   memcpy_GBps      memcpy of the same bytes per call into a ring as large as the store's pool
//                    would be in the input's format (the baseline: the pool is not in cache);
//   memcpy_hot_GBps  the same memcpy into one cache-resident buffer;
//   vs_memcpy        the store's rate over memcpy_GBps.
void report(benchmark::State& state, size_t bytes_per_iteration, size_t ring) {
  const double bytes = static_cast<double>(bytes_per_iteration) * state.iterations();
  state.SetBytesProcessed(static_cast<int64_t>(bytes));
  const int64_t repeats = std::max<int64_t>(state.iterations(), 4 * static_cast<int64_t>(ring));
  const double memcpy_gbps = memcpy_rate(bytes_per_iteration, repeats, ring);
  state.counters["memcpy_GBps"] = memcpy_gbps;
  state.counters["memcpy_hot_GBps"] = memcpy_rate(bytes_per_iteration, repeats, 1);
  // The seconds memcpy would need for the store's bytes, divided (kIsRate) by the seconds the
  // store took: the ratio of the two rates.
  state.counters["vs_memcpy"] =
      benchmark::Counter(bytes / (memcpy_gbps * 1e9), benchmark::Counter::kIsRate);
}

void BM_Write(benchmark::State& state, const std::string& name, kvrt_dtype dtype) {
  const uint32_t head_dim = static_cast<uint32_t>(state.range(0));
  StoreFixture f(name, head_dim);
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  const size_t row = size_t{kHeads} * head_dim, elem = dtype == KVRT_DTYPE_F32 ? 4 : 2;
  std::vector<uint8_t> k(kTokensPerCall * row * elem), v(k.size());
  std::mt19937 rng(1);
  std::normal_distribution<float> normal;
  for (size_t i = 0; i < kTokensPerCall * row; ++i) {
    float a = normal(rng), b = normal(rng);
    if (dtype == KVRT_DTYPE_F32) {
      std::memcpy(&k[i * 4], &a, 4), std::memcpy(&v[i * 4], &b, 4);
    } else {
      uint32_t ab, bb;
      std::memcpy(&ab, &a, 4), std::memcpy(&bb, &b, 4);
      uint16_t ah = static_cast<uint16_t>(ab >> 16), bh = static_cast<uint16_t>(bb >> 16);
      std::memcpy(&k[i * 2], &ah, 2), std::memcpy(&v[i * 2], &bh, 2);
    }
  }
  std::vector<int64_t> slots(kTokensPerCall);
  int64_t next = 0;
  for (auto _ : state) {
    for (int64_t& s : slots) s = next++ % kPoolTokens;  // prefill-like: consecutive slots
    kvrt_kv_write w{
        sizeof(kvrt_kv_write), 0, dtype, kTokensPerCall, slots.data(), k.data(), v.data(), 0, 0,
        nullptr, nullptr};
    if (f.plugin->kv.write(f.store, &w) != KVRT_OK) {
      return state.SkipWithError(kvrt::plugin::take_last_error().c_str());
    }
    benchmark::ClobberMemory();
  }
  report(state, k.size() + v.size(), kPoolTokens / kTokensPerCall);
}

void BM_Gather(benchmark::State& state, const std::string& name) {
  const uint32_t head_dim = static_cast<uint32_t>(state.range(0));
  StoreFixture f(name, head_dim);
  if (!f.error.empty()) return state.SkipWithError(f.error.c_str());
  const size_t row = size_t{kHeads} * head_dim;
  std::vector<float> src(kTokensPerCall * row, 0.5f), k(src.size()), v(src.size());
  std::vector<int64_t> slots(kTokensPerCall);
  for (uint32_t i = 0; i < kTokensPerCall; ++i) slots[i] = i;
  kvrt_kv_write w{sizeof(kvrt_kv_write),
                  0,
                  KVRT_DTYPE_F32,
                  kTokensPerCall,
                  slots.data(),
                  src.data(),
                  src.data(),
                  0,
                  0,
                  nullptr,
                  nullptr};
  f.plugin->kv.write(f.store, &w);
  for (auto _ : state) {
    if (f.plugin->kv.gather(f.store, 0, kTokensPerCall, slots.data(), k.data(), v.data()) !=
        KVRT_OK) {
      return state.SkipWithError(kvrt::plugin::take_last_error().c_str());
    }
    benchmark::DoNotOptimize(k.data());
    benchmark::ClobberMemory();
  }
  report(state, (k.size() + v.size()) * sizeof(float), 1);  // gathers the same slots
}

void register_all() {
  for (const char* store : {"kv_bf16_paged", "kv_fp8_e4m3", "kv_int4", "kv_host_tiered"}) {
    for (auto [dtype, dname] :
         {std::pair{KVRT_DTYPE_F32, "f32"}, std::pair{KVRT_DTYPE_BF16, "bf16"}}) {
      benchmark::RegisterBenchmark((std::string("write/") + store + "/" + dname).c_str(), BM_Write,
                                   std::string(store), dtype)
          ->Arg(64)
          ->Arg(128)
          ->Arg(256);
    }
    benchmark::RegisterBenchmark((std::string("gather/") + store).c_str(), BM_Gather,
                                 std::string(store))
        ->Arg(64)
        ->Arg(128)
        ->Arg(256);
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
