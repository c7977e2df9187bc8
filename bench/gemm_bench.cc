// The CPU backend's matrix products with bf16 weights (y[m][n] = x[m][k] w[n][k]^T, x and y in
// f32), the path every projection of a model takes (CpuBackend::matmul: the packed kernel of
// kernels/cpu/gemm.h at every m, on the instruction set it picks at run time, printed on stderr
// with the machine's peak), beside what this machine can do,
// measured in the same run (bench/roofline.h): the arithmetic peak of its best instruction for
// bf16 weights and the bandwidth of a streaming read. Each case reports
//   GFLOPs              2 m n k per product over the time
//   peak_fraction       of the arithmetic peak (AVX-512 BF16 dot where the CPU has it, else FMA)
//   bandwidth_fraction  the weights' bytes per second over the read bandwidth
//   roofline_fraction   over min(peak, bandwidth x m): a product does 2 m n k flops on 2 n k
//                       bytes of weights, m flops per byte
// The weights cycle through enough copies to be read from memory, not cache, as a decode
// step reads them. Shapes: m = 1, 8, 16, 64, 256, 512 on synth-76m's MLP up-projection, then
// every projection of synth-76m and of synth-mla at m = 8 and 64. Two references on the
// up-projection: matmul_bf16_in_cache (one copy of the weights, so the kernel's arithmetic
// alone) and widened_sgemm (the weights widened to f32 per product, then OpenBLAS's sgemm:
// the path products above 16 rows took before the packed kernel). matmul_bf16_x is
// model.matmul_precision = "medium" (x rounded to bf16: the AVX-512 BF16 dot product where the
// CPU has it, else the rounding pass before the same FMA kernel) on the up-projection.
// matmul_int4 / matmul_int4_x / matmul_fp8 / matmul_fp8_x: the same product with the weights
// quantized and packed (kernels/cpu/quant_gemm.h; int4_x multiplies int8 activations, AVX-512
// VNNI where the CPU has it; fp8_x bf16 ones, the AVX-512 BF16 dot product where the CPU has
// it); their bandwidth_fraction counts the packed bytes. On an AVX-512 CPU, the
// *_avx2 cases run the AVX2 class's kernels for bf16, int4 and fp8 side by side.
//   ./build/bin/gemm_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "bench/roofline.h"
#include "core/backend/cpu_backend.h"
#include "kernels/cpu/convert.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/quant_gemm.h"

namespace {

using namespace kvrt;

const bench::Peak& peak() {
  static const bench::Peak p = bench::arithmetic_peak();
  return p;
}

double read_GBps() {
  static const double gbps = bench::read_bandwidth_GBps(size_t{256} << 20);
  return gbps;
}

struct Shape {
  const char* name;
  int64_t n, k;
};

// synth-76m (hidden 768, 12 heads of 64, 4 KV heads, MLP 2048, vocabulary 512, tied).
constexpr Shape kSynth76m[] = {{"synth76m_q_o", 768, 768},
                               {"synth76m_kv", 256, 768},
                               {"synth76m_gate_up", 2048, 768},
                               {"synth76m_down", 768, 2048},
                               {"synth76m_lm_head", 512, 768}};
// synth-mla (hidden 1024, 16 heads, q_lora 384, kv_lora 512 + rope 64, nope 128, v 128,
// dense MLP 2816, experts of 256).
constexpr Shape kSynthMla[] = {
    {"synthmla_q_a", 384, 1024},        {"synthmla_q_b", 3072, 384},
    {"synthmla_kv_a", 576, 1024},       {"synthmla_o", 1024, 2048},
    {"synthmla_mlp_up", 2816, 1024},    {"synthmla_expert_up", 256, 1024},
    {"synthmla_expert_down", 1024, 256}};

// Where the weights are read from, and by what.
enum class Mode {
  kMemory,  // CpuBackend::matmul, the weights cycling through 64 MiB: as a decode step reads
  kCache,   // the same on one copy of the weights, which stays in cache: the kernel's own rate
  kWidenedSgemm,  // the baseline: what CpuBackend did before the packed kernel at m > 16, each
                  // thread widening its band of bf16 weights to f32, then OpenBLAS's sgemm
  kMemoryBf16X,   // kMemory with x rounded to bf16 (model.matmul_precision = "medium")
  kMemoryInt4,    // kMemory with int4 weights (group 32, bf16 scales: quant_gemm.h), f32 x
  kMemoryInt4X,   // the same with x quantized to int8 (AVX-512 VNNI where the CPU has it)
  kMemoryFp8,     // kMemory with fp8 E4M3 weights (128 x 128 blocks), f32 x
  kMemoryFp8X     // the same with x rounded to bf16 (the AVX-512 BF16 dot where the CPU has it)
};

// One copy of quantized weights, packed (random codes: the speed does not depend on them).
std::vector<uint8_t> packed_quantized(bool int4, int64_t n, int64_t k, std::mt19937& rng) {
  std::uniform_int_distribution<int> byte(0, 255);
  std::vector<uint8_t> codes(static_cast<size_t>(n * k));
  for (uint8_t& c : codes) {
    c = static_cast<uint8_t>(byte(rng) & (int4 ? 0xF : 0x7E));
  }
  std::vector<uint8_t> packed;
  if (int4) {
    const kernels::Int4Format f;
    std::vector<float> scales(static_cast<size_t>(n * ((k + 31) / 32)), 0.00390625f);
    packed.resize(kernels::packed_int4_bytes(n, k, f));
    kernels::pack_int4(codes.data(), scales.data(), nullptr, n, k, f, packed.data());
  } else {
    const kernels::Fp8Format f;
    std::vector<float> scales(static_cast<size_t>(((n + 127) / 128) * ((k + 127) / 128)), 1e-3f);
    packed.resize(kernels::packed_fp8_bytes(n, k, f));
    kernels::pack_fp8(codes.data(), scales.data(), n, k, f, packed.data());
  }
  return packed;
}

// isa: the instruction set the product runs on (kAuto: the backend's choice; kAvx2 on an
// AVX-512 CPU: the AVX2 class's kernels, on this machine's memory and clocks).
void BM_Matmul(benchmark::State& state, Shape shape, Mode mode, kernels::GemmIsa isa) {
  const int64_t m = state.range(0), n = shape.n, k = shape.k;
  const int threads = omp_get_num_procs();
  openblas_set_num_threads(1);  // as Engine::create: each OpenMP thread runs its own band
  backend::CpuBackend backend(/*bf16_weights=*/true, threads,
                              /*bf16_activations=*/mode == Mode::kMemoryBf16X);
  // Enough copies that cycling through them reads 64 MiB of weights, whatever their format.
  const bool int4 = mode == Mode::kMemoryInt4 || mode == Mode::kMemoryInt4X;
  const bool fp8 = mode == Mode::kMemoryFp8 || mode == Mode::kMemoryFp8X;
  const int64_t copy_bytes = int4 ? n * k / 2 : fp8 ? n * k : 2 * n * k;
  const int64_t copies =
      mode == Mode::kCache ? 1 : std::max<int64_t>(1, (int64_t{64} << 20) / copy_bytes);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0, 0.02f);
  std::vector<std::unique_ptr<backend::Matrix>> w;
  std::vector<std::vector<uint16_t>> rows;  // row-major bf16 (the baseline), or packed (isa)
  std::vector<std::vector<uint8_t>> quantized;
  const bool quant = int4 || fp8;
  for (int64_t c = 0; c < copies; ++c) {
    if (quant) {
      quantized.push_back(packed_quantized(int4, n, k, rng));
      continue;
    }
    if (isa != kernels::GemmIsa::kAuto) {  // bf16 on a named instruction set: packed here
      std::vector<float> data(static_cast<size_t>(n * k));
      for (float& v : data) v = normal(rng);
      rows.emplace_back(kernels::packed_bf16_size(n, k));
      kernels::pack_bf16_from_f32(data.data(), n, k, rows.back().data());
      continue;
    }
    std::vector<float> data(static_cast<size_t>(n * k));
    for (float& v : data) v = normal(rng);
    if (mode == Mode::kWidenedSgemm) {
      rows.emplace_back(data.size());
      kernels::f32_to_bf16(data.data(), rows.back().data(), data.size());
    } else {
      w.push_back(backend.upload_matrix(std::move(data), n, k));
    }
  }
  std::vector<float> x(static_cast<size_t>(m * k)), y(static_cast<size_t>(m * n)), widened;
  for (float& v : x) v = normal(rng);
  if (mode == Mode::kWidenedSgemm) widened.resize(static_cast<size_t>(n * k));
  backend.begin_step();
  int64_t products = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    if (!quant && isa != kernels::GemmIsa::kAuto) {
      kernels::matmul_packed_bf16(x.data(), k, m, k, rows[products % copies].data(), n, y.data(),
                                  n, threads, isa, mode == Mode::kMemoryBf16X);
    } else if (mode == Mode::kWidenedSgemm) {
      const uint16_t* wb = rows[products % copies].data();
#pragma omp parallel num_threads(threads)
      {
        const int64_t parts = omp_get_num_threads(), t = omp_get_thread_num();
        const int64_t band = (n + parts - 1) / parts;
        const int64_t begin = std::min(n, t * band), end = std::min(n, begin + band);
        if (begin < end) {
          kernels::bf16_to_f32(wb + begin * k, widened.data() + begin * k,
                               static_cast<size_t>((end - begin) * k));
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                      static_cast<int>(end - begin), static_cast<int>(k), 1.0f, x.data(),
                      static_cast<int>(k), widened.data() + begin * k, static_cast<int>(k), 0.0f,
                      y.data() + begin, static_cast<int>(n));
        }
      }
    } else if (int4) {
      kernels::matmul_packed_int4(x.data(), k, m, k, quantized[products % copies].data(), n, {},
                                  y.data(), n, threads, isa,
                                  mode == Mode::kMemoryInt4X ? kernels::Activations::kInt8
                                                             : kernels::Activations::kF32);
    } else if (fp8) {
      kernels::matmul_packed_fp8(
          x.data(), k, m, k, quantized[products % copies].data(), n, {}, y.data(), n, threads, isa,
          mode == Mode::kMemoryFp8X ? kernels::Activations::kBf16 : kernels::Activations::kF32);
    } else {
      backend.matmul(x.data(), m, *w[products % copies], y.data());
    }
    benchmark::DoNotOptimize(y.data());
    ++products;
  }
  const double seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  const double gflops = 2.0 * static_cast<double>(m * n * k) * products / seconds / 1e9;
  // The bytes each product reads: bf16's 2 per weight, or the packed codes and scales.
  const double bytes = quant ? static_cast<double>(quantized[0].size()) : 2.0 * double(n * k);
  const double weights_gbps = bytes * products / seconds / 1e9;
  const double roof =
      std::min(peak().best(), read_GBps() * 2.0 * double(n * k) / bytes * static_cast<double>(m));
  state.counters["GFLOPs"] = gflops;
  state.counters["peak_fraction"] = gflops / peak().best();
  state.counters["bandwidth_fraction"] = weights_gbps / read_GBps();
  state.counters["roofline_fraction"] = gflops / roof;
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  auto add = [](const char* prefix, Mode mode, const Shape& s, std::initializer_list<int64_t> ms,
                kernels::GemmIsa isa = kernels::GemmIsa::kAuto) {
    auto* b = benchmark::RegisterBenchmark((std::string(prefix) + s.name).c_str(), BM_Matmul, s,
                                           mode, isa);
    for (int64_t m : ms) b->Arg(m);
    b->ArgName("m")->UseRealTime()->Unit(benchmark::kMicrosecond);
  };
  const Shape& up = kSynth76m[2];
  add("matmul_bf16/", Mode::kMemory, up, {1, 8, 16, 64, 256, 512});
  add("matmul_bf16_in_cache/", Mode::kCache, up, {8, 64, 512});
  add("widened_sgemm/", Mode::kWidenedSgemm, up, {16, 64, 256, 512});
  add("matmul_bf16_x/", Mode::kMemoryBf16X, up, {1, 8, 64, 512});
  add("matmul_int4/", Mode::kMemoryInt4, up, {1, 8, 64, 512});
  add("matmul_int4_x/", Mode::kMemoryInt4X, up, {1, 8, 64, 512});
  add("matmul_fp8/", Mode::kMemoryFp8, up, {1, 8, 64, 512});
  add("matmul_fp8_x/", Mode::kMemoryFp8X, up, {1, 8, 64, 512});
  // The AVX2 class's kernels, where this CPU has more: bf16, int4 and fp8 side by side.
  if (kernels::gemm_isa_supported(kernels::GemmIsa::kAvx512)) {
    const kernels::GemmIsa avx2 = kernels::GemmIsa::kAvx2;
    add("matmul_bf16_avx2/", Mode::kMemory, up, {1, 8, 64}, avx2);
    add("matmul_int4_avx2/", Mode::kMemoryInt4, up, {1, 8, 64}, avx2);
    add("matmul_int4_x_avx2/", Mode::kMemoryInt4X, up, {1, 8, 64}, avx2);
    add("matmul_fp8_avx2/", Mode::kMemoryFp8, up, {1, 8, 64}, avx2);
  }
  for (const Shape& s : kSynth76m) add("matmul_bf16/", Mode::kMemory, s, {8, 64});
  for (const Shape& s : kSynthMla) add("matmul_bf16/", Mode::kMemory, s, {8, 64});
  // The machine, once, on stderr (stdout is the benchmark's: JSON when asked for).
  std::fprintf(stderr,
               "peak: f32 FMA (%s) %.1f GFLOP/s, bf16 dot %.1f GFLOP/s; read %.1f GB/s; "
               "products on %s (with x rounded to bf16: %s)\n",
               peak().f32_isa, peak().f32_gflops, peak().bf16_gflops, read_GBps(),
               kernels::gemm_isa_name(kernels::GemmIsa::kAuto),
               kernels::gemm_isa_name(kernels::gemm_best_isa(true)));
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
