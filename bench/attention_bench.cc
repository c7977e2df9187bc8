// Decode attention throughput of attn_cpu over the shipped stores, as effective KV bytes read per
// second beside memcpy of the same byte count measured in the same run, for paged (shuffled page
// ids) and contiguous (page ids 0..n-1 in order) page tables.
//   ./build/bin/attention_bench [--benchmark_filter=bf16/4096]
// Shapes, each with page size 16, one decode row per sequence, f32 Q and output, and the threads
// OpenMP is given (OMP_NUM_THREADS, else the machine's cores):
//   decode/...           Llama-3-8B-like: 32 query heads over 8 KV heads of dim 128 (GQA 4), one
//                        layer;
//   decode_synth76m/...  synth-76m as e2e_bench runs it: 12 query heads over 4 KV heads of dim 64
//                        (GQA 3), all 12 layers in turn per step, as a model's decode step does;
//   decode_mla/...       Kimi-K2 / synth-mla's absorbed MLA: 16 query heads over one 576-wide
//                        latent (512 + 64), V the latent's first 512 values, one layer.
// Counters:
//   kv_GBps      bytes of K+V the step reads (the store's bytes per token, scales included,
//                times the context tokens of the batch) per second;
//   memcpy_GBps  memcpy of the same bytes per copy, from and to buffers of that size (capped at
//                256 MiB per copy, repeated to the same total), measured right after;
//   vs_memcpy    kv_GBps / memcpy_GBps.
#include <benchmark/benchmark.h>
#include <cblas.h>

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

constexpr uint32_t kPageSize = 16;

struct Shape {
  uint32_t q_heads, kv_heads, head_dim, layers;
  uint32_t latent_v = 0;  // MLA: V is the K row's first latent_v values (0: V rows of its own)
  uint32_t v_dim = 0;     // V rows of their own this wide (0: head_dim)
};
constexpr Shape kLlama8B{32, 8, 128, 1};
constexpr Shape kSynth76M{12, 4, 64, 12};
constexpr Shape kMla{16, 1, 576, 1, 512};
// The same attention expanded: per-head K of qk_nope + qk_rope = 192, V of 128.
constexpr Shape kMlaExpanded{16, 16, 192, 1, 0, 128};

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

// option: "" or one "key=value" of the store's (a string). gathered: attn_cpu reads the store
// through its gather() (the path of a format it does not read natively): the layouts it is given
// carry a vendor dtype instead of the store's own.
void BM_Decode(benchmark::State& state, Shape shape, const std::string& store_name,
               const std::string& option, bool paged, bool gathered) {
  const auto context = static_cast<uint32_t>(state.range(0));
  const auto batch = static_cast<uint32_t>(state.range(1));
  // Query rows per sequence: 1 (decode), or the whole context (a causal prefill).
  const auto rows = state.range(2) != 0 ? context : 1u;
  Registry& reg = registry();
  auto store_plugin = reg.load_kv_store(store_name);
  auto attn_plugin = reg.load("attn_cpu");
  if (!store_plugin.ok() || !attn_plugin.ok()) {
    return state.SkipWithError("cannot load kv store or attn_cpu (run from build/bin)");
  }
  const kvrt_kv_store_api& kv = (*store_plugin)->kv;
  const kvrt_attention_api& api = (*attn_plugin)->attention;
  toml::table config;
  if (const size_t eq = option.find('='); eq != std::string::npos) {
    config.insert(option.substr(0, eq), option.substr(eq + 1));
  }

  // The store: exactly the batch's pages.
  const uint32_t pages_per_seq = context / kPageSize;
  const uint64_t num_pages = uint64_t{pages_per_seq} * batch;
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = shape.layers;
  g.num_kv_heads = g.total_kv_heads = shape.kv_heads;
  g.k_head_dim = shape.head_dim;
  const uint32_t v_dim = shape.v_dim != 0 ? shape.v_dim : shape.head_dim;
  g.v_head_dim = shape.latent_v != 0 ? 0 : v_dim;
  g.v_width = shape.latent_v != 0 ? shape.latent_v : v_dim;
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
    const size_t row = size_t{shape.kv_heads} * std::max(shape.head_dim, v_dim);
    std::vector<float> k(chunk * row), v(chunk * row);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (float& x : k) x = normal(rng);
    for (float& x : v) x = normal(rng);
    std::vector<int64_t> slots(chunk);
    for (uint32_t layer = 0; layer < shape.layers; ++layer) {
      for (uint64_t s0 = 0; s0 < num_pages * kPageSize; s0 += chunk) {
        const uint32_t n =
            static_cast<uint32_t>(std::min<uint64_t>(chunk, num_pages * kPageSize - s0));
        std::iota(slots.begin(), slots.begin() + n, static_cast<int64_t>(s0));
        kvrt_kv_write w{sizeof(w),   layer,
                        KVRT_DTYPE_F32, n,
                        slots.data(),   k.data(),
                        shape.latent_v != 0 ? nullptr : v.data(), 0, 0, nullptr, nullptr};
        if (kv.write(store, &w) != KVRT_OK) {
          kv.destroy(store);
          return state.SkipWithError(("store write: " + take_last_error()).c_str());
        }
      }
    }
  }
  kvrt_kv_info info{};
  info.struct_size = sizeof(info);
  kv.info(store, &info);
  std::vector<kvrt_kv_layout> layouts(shape.layers);
  for (uint32_t layer = 0; layer < shape.layers; ++layer) {
    layouts[layer].struct_size = sizeof(kvrt_kv_layout);
    kv.layout(store, layer, &layouts[layer]);
    if (gathered) layouts[layer].k_dtype = layouts[layer].v_dtype = KVRT_DTYPE_VENDOR_FIRST | 1u;
  }

  // The batch: one decode row per sequence over `context` tokens.
  std::vector<int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  if (paged) std::shuffle(pages.begin(), pages.end(), std::mt19937(2));
  std::vector<int32_t> qo(batch + 1), indptr(batch + 1), last(batch, kPageSize);
  for (uint32_t b = 0; b <= batch; ++b) {
    qo[b] = static_cast<int32_t>(b * rows);
    indptr[b] = static_cast<int32_t>(b * pages_per_seq);
  }
  kvrt_attention_params p{};
  p.struct_size = sizeof(p);
  p.num_q_heads = shape.q_heads;
  p.num_kv_heads = shape.kv_heads;
  p.qk_head_dim = shape.head_dim;
  p.v_head_dim = g.v_width;
  p.softmax_scale = 1.0f / std::sqrt(static_cast<float>(shape.head_dim));
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
  std::vector<float> q(size_t{batch} * rows * shape.q_heads * shape.head_dim, 0.1f),
      out(size_t{batch} * rows * shape.q_heads * g.v_width);
  kvrt_attention_run_args args{};
  args.struct_size = sizeof(args);
  args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;

  args.store_api = &kv;
  args.store = store;
  args.q = q.data();
  args.out = out.data();

  for (auto _ : state) {
    bool ok = true;
    for (uint32_t layer = 0; layer < shape.layers && ok; ++layer) {
      args.layer = layer;
      args.layout = &layouts[layer];
      ok = api.run(attn, &args) == KVRT_OK;
    }
    if (!ok) {
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
  // Multiply-adds of Q.K and P.V (a causal prefill sees half the square).
  const auto ctx = static_cast<double>(context);
  const double pairs = rows == 1 ? ctx : ctx * (ctx + 1) / 2;
  const double flops = 2.0 * pairs * batch * shape.q_heads * (shape.head_dim + g.v_width) *
                       shape.layers * static_cast<double>(state.iterations());
  state.counters["GFLOPs"] = benchmark::Counter(flops / 1e9, benchmark::Counter::kIsRate);
  api.destroy(attn);
  kv.destroy(store);
}

// The expanded form's extra product: the context's latents [ctx][512] times kv_b_proj^T
// [512][16 x (128 + 128)], through the BLAS as the CPU backend runs a prefill's products.
void BM_MlaExpansion(benchmark::State& state) {
  const auto context = static_cast<int>(state.range(0));
  const int latent = 512, out = 16 * (128 + 128);
  std::vector<float> c(size_t(context) * latent, 0.01f), w(size_t(out) * latent, 0.02f),
      y(size_t(context) * out);
  for (auto _ : state) {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, context, out, latent, 1.0f, c.data(),
                latent, w.data(), latent, 0.0f, y.data(), out);
    benchmark::DoNotOptimize(y.data());
  }
  state.counters["GFLOPs"] = benchmark::Counter(
      2.0 * context * out * latent * static_cast<double>(state.iterations()) / 1e9,
      benchmark::Counter::kIsRate);
}

void register_all() {
  struct Store {
    const char* label;
    const char* name;
    const char* option;
  };
  for (Store s : {Store{"bf16", "kv_bf16_paged", ""}, Store{"fp8", "kv_fp8_e4m3", ""},
                  Store{"fp8_per_tensor", "kv_fp8_e4m3", "scale_mode=per_tensor"}}) {
    for (bool paged : {true, false}) {
      const std::string name =
          std::string("decode/") + s.label + (paged ? "/paged" : "/contiguous");
      auto* bm = benchmark::RegisterBenchmark(name.c_str(), BM_Decode, kLlama8B,
                                              std::string(s.name), std::string(s.option), paged,
                                              false);
      bm->ArgNames({"ctx", "batch", "prefill"})->UseRealTime()->Unit(benchmark::kMillisecond);
      for (int64_t context : {1024, 4096, 16384}) {
        for (int64_t batch : {1, 32}) bm->Args({context, batch, 0});
      }
    }
  }
  // A store read through gather() (kv_bf16_paged's, thread-safe by its format, so on every
  // thread) against the same store read natively, in the case: batch 64, 2K context;
  // and kv_int4, which attn_cpu reads only through gather(), plain and rotated.
  struct Gathered {
    const char* name;
    const char* store;
    const char* option;
    bool gathered;
  };
  for (Gathered c : {Gathered{"decode_gather/bf16/native", "kv_bf16_paged", "", false},
                     Gathered{"decode_gather/bf16/gathered", "kv_bf16_paged", "", true},
                     Gathered{"decode_gather/int4/gathered", "kv_int4", "", false},
                     Gathered{"decode_gather/int4_hadamard/gathered", "kv_int4",
                              "rotation=hadamard", false}}) {
    auto* bm = benchmark::RegisterBenchmark(c.name, BM_Decode, kLlama8B, std::string(c.store),
                                            std::string(c.option), true, c.gathered);
    bm->ArgNames({"ctx", "batch", "prefill"})->UseRealTime()->Unit(benchmark::kMillisecond);
    bm->Args({2048, 64, 0});
  }
  for (Store s : {Store{"bf16", "kv_bf16_paged", ""}, Store{"fp8", "kv_fp8_e4m3", ""}}) {
    const std::string name = std::string("decode_synth76m/") + s.label + "/paged";
    auto* bm = benchmark::RegisterBenchmark(name.c_str(), BM_Decode, kSynth76M, std::string(s.name),
                                            std::string(s.option), true, false);
    bm->ArgNames({"ctx", "batch", "prefill"})->UseRealTime()->Unit(benchmark::kMillisecond);
    for (int64_t context : {1024, 4096}) bm->Args({context, 1, 0});
  }
  for (Store s : {Store{"bf16", "kv_bf16_paged", ""}, Store{"fp8", "kv_fp8_e4m3", ""}}) {
    const std::string name = std::string("decode_mla/") + s.label + "/paged";
    auto* bm = benchmark::RegisterBenchmark(name.c_str(), BM_Decode, kMla, std::string(s.name),
                                            std::string(s.option), true, false);
    bm->ArgNames({"ctx", "batch", "prefill"})->UseRealTime()->Unit(benchmark::kMillisecond);
    for (int64_t context : {4096, 16384}) {
      for (int64_t batch : {1, 16}) bm->Args({context, batch, 0});
    }
  }
  // MLA prefill, absorbed (over the latent, as kvrt runs it) against the expanded form's
  // attention (per-head K and V; the expansion's product, every context token's latent times
  // kv_b_proj, is BM_MlaExpansion).
  for (const auto& [label, shape] : {std::pair{"absorbed", kMla}, std::pair{"expanded", kMlaExpanded}}) {
    const std::string name = std::string("prefill_mla/") + label + "/bf16";
    auto* bm = benchmark::RegisterBenchmark(name.c_str(), BM_Decode, shape,
                                            std::string("kv_bf16_paged"), std::string(), true,
                                            false);
    bm->ArgNames({"ctx", "batch", "prefill"})->UseRealTime()->Unit(benchmark::kMillisecond);
    for (int64_t context : {256, 1024, 4096}) bm->Args({context, 1, 1});
  }
  auto* expansion = benchmark::RegisterBenchmark("prefill_mla/expansion", BM_MlaExpansion);
  expansion->ArgNames({"ctx"})->UseRealTime()->Unit(benchmark::kMillisecond);
  for (int64_t context : {256, 1024, 4096}) expansion->Arg(context);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  register_all();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
