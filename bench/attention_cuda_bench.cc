// Decode attention on a CUDA device through the product's path -- kv_bf16_paged / kv_fp8_e4m3
// with their pools in device memory (the host's accounted CUDA allocator), filled by their
// device write paths, read by attn_cuda -- as effective KV bytes read per second beside a
// device-to-device copy measured in the same run. One layer of Llama-3-8B's shape (32 query
// heads over 8 KV heads of dim 128), page size 16, shuffled page ids, one decode row per
// sequence. Skips without a GPU.
//   ./build/bin/attention_cuda_bench [--benchmark_filter=bf16/16384/32] [--benchmark_format=json]
// Counters:
//   kv_GBps      the store's bytes per token (scales included) times the batch's context tokens,
//                per second of attention (CUDA events around one run per iteration);
//   copy_GBps    cudaMemcpy device to device of the same byte count, counted once (what the
//                attention's reads are compared with: a copy reads each byte once);
//   vs_copy      kv_GBps / copy_GBps; the goal is 0.8 for bf16 at 16K, batch 32;
//   tokens_per_s decode rows (batch) per second of attention.
#include <benchmark/benchmark.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/backend/cuda_memory.h"
#include "core/capacity/capacity.h"
#include "core/plugin/registry.h"

namespace {

using kvrt::plugin::LoadedPlugin;
using kvrt::plugin::Registry;
using kvrt::plugin::take_last_error;

constexpr uint32_t kPageSize = 16, kQHeads = 32, kKvHeads = 8, kHeadDim = 128;

Registry& registry() {
  static Registry* r = [] {
    auto* reg = new Registry({sizeof(kvrt_device), KVRT_DEVICE_CUDA, 0, 0});
    static kvrt::backend::CudaMemory memory;
    reg->set_device_memory(&memory);
    return reg;
  }();
  return *r;
}

// Device memory for the benchmark's own buffers (Q, output, input rows, slots).
template <class T>
struct DeviceArray {
  T* data = nullptr;
  explicit DeviceArray(size_t n) { (void)cudaMalloc(&data, std::max<size_t>(n, 1) * sizeof(T)); }
  ~DeviceArray() { (void)cudaFree(data); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
  void upload(const std::vector<T>& host) {
    (void)cudaMemcpy(data, host.data(), host.size() * sizeof(T), cudaMemcpyHostToDevice);
  }
};

// GB/s of a device-to-device copy of `bytes`, counted once; the best of five.
double copy_rate(size_t bytes) {
  uint8_t *src = nullptr, *dst = nullptr;
  if (cudaMalloc(&src, bytes) != cudaSuccess || cudaMalloc(&dst, bytes) != cudaSuccess) return 0;
  (void)cudaMemset(src, 1, bytes);
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  (void)cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);  // warm-up
  double best = 0;
  for (int r = 0; r < 5; ++r) {
    cudaEventRecord(start);
    (void)cudaMemcpy(dst, src, bytes, cudaMemcpyDeviceToDevice);
    cudaEventRecord(stop);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    best = std::max(best, static_cast<double>(bytes) / (ms * 1e-3) / 1e9);
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  (void)cudaFree(src);
  (void)cudaFree(dst);
  return best;
}

void BM_DecodeCuda(benchmark::State& state, const std::string& store_name, bool per_tensor) {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    (void)cudaGetLastError();
    return state.SkipWithError("no CUDA device");
  }
  const auto context = static_cast<uint32_t>(state.range(0));
  const auto batch = static_cast<uint32_t>(state.range(1));
  Registry& reg = registry();
  auto store_plugin = reg.load_kv_store(store_name);
  auto attn_plugin = reg.load("attn_cuda");
  if (!store_plugin.ok() || !attn_plugin.ok()) {
    return state.SkipWithError("cannot load the store or attn_cuda (run from build/bin)");
  }
  const kvrt_kv_store_api& kv = (*store_plugin)->kv;
  const kvrt_attention_api& api = (*attn_plugin)->attention;
  toml::table config;
  if (per_tensor) config.insert("scale_mode", "per_tensor");

  const uint32_t pages_per_seq = context / kPageSize;
  const uint64_t num_pages = uint64_t{pages_per_seq} * batch;
  kvrt::capacity::KvShape shape;
  shape.layers = 1;
  shape.kv_heads = kKvHeads;
  shape.head_dim = shape.v_head_dim = kHeadDim;
  kvrt::Result<kvrt_kv_geometry> geometry =
      kvrt::capacity::kv_geometry(shape, 1, kPageSize, KVRT_DTYPE_F32);
  if (!geometry.ok()) return state.SkipWithError(geometry.status().message().c_str());
  kvrt_kv_geometry g = *geometry;
  g.device = reg.device();
  kvrt_kv_store* store = nullptr;
  if (kv.create((*store_plugin)->host_api(), &g, num_pages, kvrt::plugin::as_config(&config),
                &store) != KVRT_OK) {
    return state.SkipWithError(("store create: " + take_last_error()).c_str());
  }
  // Every slot filled through the store's device write (random rows, reused per chunk).
  {
    const uint32_t chunk = 4096;
    const size_t row = size_t{kKvHeads} * kHeadDim;
    std::vector<float> host(chunk * row);
    std::mt19937 rng(1);
    std::normal_distribution<float> normal;
    for (float& x : host) x = normal(rng);
    DeviceArray<float> rows(host.size());
    rows.upload(host);
    std::vector<int64_t> slots(chunk);
    DeviceArray<int64_t> device_slots(chunk);
    for (uint64_t s0 = 0; s0 < num_pages * kPageSize; s0 += chunk) {
      const auto n = static_cast<uint32_t>(std::min<uint64_t>(chunk, num_pages * kPageSize - s0));
      std::iota(slots.begin(), slots.begin() + n, static_cast<int64_t>(s0));
      device_slots.upload(slots);
      kvrt_kv_write w{};
      w.struct_size = sizeof(w);
      w.dtype = KVRT_DTYPE_F32;
      w.num_tokens = n;
      w.slots = slots.data();
      w.k = w.v = rows.data;
      w.device_slots = device_slots.data;
      if (kv.write(store, &w) != KVRT_OK) {
        kv.destroy(store);
        return state.SkipWithError(("store write: " + take_last_error()).c_str());
      }
      (void)cudaDeviceSynchronize();  // the next chunk's slots reuse the device array
    }
  }
  kvrt_kv_info info{};
  info.struct_size = sizeof(info);
  kv.info(store, &info);
  kvrt_kv_layout layout{};
  layout.struct_size = sizeof(layout);
  kv.layout(store, 0, &layout);

  std::vector<int32_t> pages(num_pages);
  std::iota(pages.begin(), pages.end(), 0);
  std::shuffle(pages.begin(), pages.end(), std::mt19937(2));
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
  if (api.plan(attn, &b, workspace.data(), ws_bytes) != KVRT_OK) {
    api.destroy(attn);
    kv.destroy(store);
    return state.SkipWithError(("plan: " + take_last_error()).c_str());
  }
  DeviceArray<float> q(size_t{batch} * kQHeads * kHeadDim), out(size_t{batch} * kQHeads * kHeadDim);
  (void)cudaMemset(q.data, 0, size_t{batch} * kQHeads * kHeadDim * sizeof(float));
  cudaStream_t stream;
  cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  kvrt_attention_run_args args{};
  args.struct_size = sizeof(args);
  args.q_dtype = args.out_dtype = KVRT_DTYPE_F32;
  args.layout = &layout;
  args.store_api = &kv;
  args.store = store;
  args.q = q.data;
  args.out = out.data;
  args.stream = stream;
  cudaEvent_t start, stop;
  cudaEventCreate(&start);
  cudaEventCreate(&stop);
  (void)api.run(attn, &args);  // warm-up
  double seconds = 0;
  int64_t runs = 0;
  for (auto _ : state) {
    cudaEventRecord(start, stream);
    if (api.run(attn, &args) != KVRT_OK) {
      state.SkipWithError(("run: " + take_last_error()).c_str());
      break;
    }
    cudaEventRecord(stop, stream);
    cudaEventSynchronize(stop);
    float ms = 0;
    cudaEventElapsedTime(&ms, start, stop);
    state.SetIterationTime(ms * 1e-3);
    seconds += ms * 1e-3;
    ++runs;
  }
  if (cudaError_t e = cudaStreamSynchronize(stream); e != cudaSuccess) {
    state.SkipWithError(cudaGetErrorString(e));
  }
  const double kv_bytes = static_cast<double>(info.bytes_per_token) * context * batch;
  const double copy = copy_rate(static_cast<size_t>(kv_bytes));
  const double kv_rate = seconds > 0 ? kv_bytes * static_cast<double>(runs) / seconds / 1e9 : 0;
  state.counters["kv_GBps"] = kv_rate;
  state.counters["copy_GBps"] = copy;
  state.counters["vs_copy"] = copy > 0 ? kv_rate / copy : 0;
  state.counters["tokens_per_s"] =
      seconds > 0 ? static_cast<double>(batch) * static_cast<double>(runs) / seconds : 0;
  state.counters["kv_MiB"] = kv_bytes / (1 << 20);
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  cudaStreamDestroy(stream);
  api.destroy(attn);
  kv.destroy(store);
}

void Args(benchmark::internal::Benchmark* b) {
  for (int64_t context : {4096, 16384}) {
    for (int64_t batch : {1, 32}) b->Args({context, batch});
  }
  b->UseManualTime()->Unit(benchmark::kMicrosecond)->MinTime(0.2);
}

BENCHMARK_CAPTURE(BM_DecodeCuda, bf16, std::string("kv_bf16_paged"), false)->Apply(Args);
BENCHMARK_CAPTURE(BM_DecodeCuda, fp8, std::string("kv_fp8_e4m3"), false)->Apply(Args);
BENCHMARK_CAPTURE(BM_DecodeCuda, fp8_per_tensor, std::string("kv_fp8_e4m3"), true)->Apply(Args);

}  // namespace

BENCHMARK_MAIN();
