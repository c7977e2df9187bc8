// What this machine can do at best, measured in the benchmark's own process, so a benchmark's
// figures can be given as fractions of it (timings move between processes; ratios in one run
// do not): a streaming read's bandwidth over every core, and the arithmetic peak of the best
// instruction the CPU has for f32 (FMA) and for bf16 (the AVX-512 BF16 dot product), each
// from a loop of independent multiply-adds on every core.
#pragma once

#include <benchmark/benchmark.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <vector>

namespace kvrt::bench {

namespace detail {
constexpr int64_t kIterations = int64_t{1} << 22;

// Ten independent multiply-add chains, in registers (an array of accumulators is kept in
// memory by GCC, and the loop then measures store forwarding, not the FMA units). Each chain
// starts from a value of its own: chains that all start from zero compute the same thing, and
// GCC merges them into one (the loop then ran one FMA per iteration, counted as ten: a "peak"
// 2.5x what the FMA units can do, on an AVX-512 EPYC).
#define KVRT_TEN(op) op(0) op(1) op(2) op(3) op(4) op(5) op(6) op(7) op(8) op(9)
#define KVRT_DECLARE(i) auto a##i = START(i);
#define KVRT_STEP(i) a##i = STEP(a##i);
#define KVRT_FOLD(i) total = ADD(total, a##i);

// Each returns the flops one thread did.
__attribute__((target("avx2,fma"))) inline double fma_avx2() {
  const __m256 zero = _mm256_set1_ps(0.0f), x = _mm256_set1_ps(0.999f), y = _mm256_set1_ps(1e-3f);
#define START(i) _mm256_set1_ps(1e-3f * (i))
#define STEP(a) _mm256_fmadd_ps(a, x, y)
#define ADD _mm256_add_ps
  KVRT_TEN(KVRT_DECLARE)
  for (int64_t i = 0; i < kIterations; ++i) {
    KVRT_TEN(KVRT_STEP)
  }
  __m256 total = zero;
  KVRT_TEN(KVRT_FOLD)
#undef START
#undef STEP
#undef ADD
  float out[8];
  _mm256_storeu_ps(out, total);
  benchmark::DoNotOptimize(out[0]);
  return 2.0 * 8 * 10 * static_cast<double>(kIterations);
}

__attribute__((target("avx512f"))) inline double fma_avx512() {
  const __m512 zero = _mm512_set1_ps(0.0f), x = _mm512_set1_ps(0.999f), y = _mm512_set1_ps(1e-3f);
#define START(i) _mm512_set1_ps(1e-3f * (i))
#define STEP(a) _mm512_fmadd_ps(a, x, y)
#define ADD _mm512_add_ps
  KVRT_TEN(KVRT_DECLARE)
  for (int64_t i = 0; i < kIterations; ++i) {
    KVRT_TEN(KVRT_STEP)
  }
  __m512 total = zero;
  KVRT_TEN(KVRT_FOLD)
#undef START
#undef STEP
#undef ADD
  float out[16];
  _mm512_storeu_ps(out, total);
  benchmark::DoNotOptimize(out[0]);
  return 2.0 * 16 * 10 * static_cast<double>(kIterations);
}

// vdpbf16ps: 32 bf16 products summed pairwise into 16 f32 lanes, 64 flops.
__attribute__((target("avx512f,avx512bf16"))) inline double dot_bf16_avx512() {
  const __m512 zero = _mm512_set1_ps(0.0f);
  const __m512bh x = (__m512bh)_mm512_set1_epi16(0x3f80), y = (__m512bh)_mm512_set1_epi16(0x3a83);
#define START(i) _mm512_set1_ps(1e-3f * (i))
#define STEP(a) _mm512_dpbf16_ps(a, x, y)
#define ADD _mm512_add_ps
  KVRT_TEN(KVRT_DECLARE)
  for (int64_t i = 0; i < kIterations; ++i) {
    KVRT_TEN(KVRT_STEP)
  }
  __m512 total = zero;
  KVRT_TEN(KVRT_FOLD)
#undef START
#undef STEP
#undef ADD
  float out[16];
  _mm512_storeu_ps(out, total);
  benchmark::DoNotOptimize(out[0]);
  return 2.0 * 32 * 10 * static_cast<double>(kIterations);
}
#undef KVRT_TEN
#undef KVRT_DECLARE
#undef KVRT_STEP
#undef KVRT_FOLD

// Sums n (a multiple of 8) words with 256-bit loads, two chains.
__attribute__((target("avx2"))) inline uint64_t sum_avx2(const uint64_t* p, size_t n) {
  __m256i s0 = _mm256_setzero_si256(), s1 = s0;
  for (size_t i = 0; i < n; i += 8) {
    s0 = _mm256_add_epi64(s0, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)));
    s1 = _mm256_add_epi64(s1, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i + 4)));
  }
  uint64_t out[4];
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_add_epi64(s0, s1));
  return out[0] + out[1] + out[2] + out[3];
}
inline uint64_t sum_scalar(const uint64_t* p, size_t n) {
  uint64_t sum = 0;
  for (size_t i = 0; i < n; i += 4) sum += p[i] + p[i + 1] + p[i + 2] + p[i + 3];
  return sum;
}
}  // namespace detail

// GB/s of a streaming read over `bytes` on every core, each core reading its own half (third,
// ...) with the widest loads the CPU has: what a decode step, which reads every weight once,
// can at best turn into tokens per second.
inline double read_bandwidth_GBps(size_t bytes) {
  const size_t cores = static_cast<size_t>(omp_get_num_procs());
  const size_t per_core = std::max<size_t>(bytes / sizeof(uint64_t) / cores / 8, 1) * 8;
  std::vector<uint64_t> buffer(per_core * cores, 1);
  const bool avx2 = __builtin_cpu_supports("avx2");
  uint64_t sink = 0;
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = std::chrono::steady_clock::now();
    uint64_t sum = 0;
#pragma omp parallel for reduction(+ : sum) schedule(static) num_threads(static_cast <int>(cores))
    for (size_t c = 0; c < cores; ++c) {
      const uint64_t* p = buffer.data() + c * per_core;
      sum += avx2 ? detail::sum_avx2(p, per_core) : detail::sum_scalar(p, per_core);
    }
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    sink += sum;
    best = std::max(best, static_cast<double>(buffer.size() * sizeof(uint64_t)) / s / 1e9);
  }
  benchmark::DoNotOptimize(sink);
  return best;
}

namespace detail {
// GFLOP/s of `loop` on every core at once (the best of three).
template <class Loop>
double on_every_core(const Loop& loop) {
  double best = 0;
  for (int rep = 0; rep < 3; ++rep) {
    double flops = 0;
    const auto start = std::chrono::steady_clock::now();
#pragma omp parallel reduction(+ : flops) num_threads(omp_get_num_procs())
    flops += loop();
    const double s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    best = std::max(best, flops / s / 1e9);
  }
  return best;
}
}  // namespace detail

struct Peak {
  double f32_gflops = 0;   // FMA, AVX-512 where the CPU has it, else AVX2 (0 without FMA)
  double bf16_gflops = 0;  // the AVX-512 BF16 dot product; 0 where the CPU has none
  const char* f32_isa = "none";
  // The best the CPU has for bf16 weights: the dot product where it exists, else f32 FMA on
  // widened weights.
  double best() const { return std::max(f32_gflops, bf16_gflops); }
};

inline Peak arithmetic_peak() {
  Peak p;
  if (__builtin_cpu_supports("avx512f")) {
    p.f32_gflops = detail::on_every_core(detail::fma_avx512);
    p.f32_isa = "avx512";
  } else if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) {
    p.f32_gflops = detail::on_every_core(detail::fma_avx2);
    p.f32_isa = "avx2";
  }
  if (__builtin_cpu_supports("avx512bf16")) {
    p.bf16_gflops = detail::on_every_core(detail::dot_bf16_avx512);
  }
  return p;
}

}  // namespace kvrt::bench
