// bf16-weight matrix products over packed panels (gemm.h). A micro-kernel computes MR rows x one
// panel of 16 columns over the whole k: per pair of k it loads the panel's 64-byte group once,
// widens it (or, with the bf16 dot product, takes it as it is) and adds it into MR x 16 sums held
// in registers, so each weight is read from memory once per MR rows and each x value once per
// panel. The driver walks blocks of panels that stay in L2 while every MR-row block of x passes
// over them, and splits the blocks over the threads.
//
// Each instruction set has its own micro-kernels, compiled with a target attribute and chosen at
// run time from cpuid, so one binary runs on the AVX2 class and uses AVX-512 (BF16) where the
// CPU has it. Highway 1.0.3 (Debian's) has no target that emits vdpbf16ps, hence intrinsics.
#include "kernels/cpu/gemm.h"

#include <algorithm>
#include <cstring>
#include <utility>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/unroll.h"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define KVRT_GEMM_X86 1
#define KVRT_AVX2 __attribute__((target("avx2,fma")))
#define KVRT_INLINE inline __attribute__((always_inline))
#define KVRT_AVX512 __attribute__((target("avx512f")))
#define KVRT_AVX512BF16 __attribute__((target("avx512f,avx512bf16")))
#endif

namespace kvrt::kernels {
namespace {

constexpr size_t kNr = 16;          // columns per panel
constexpr size_t kGroup = 2 * kNr;  // uint16_t per pair of k in a panel
// How far ahead of the group it reads a micro-kernel asks for the weights (4 KiB, into the next
// panel near a panel's end). The hardware prefetcher alone left the memory bus idle while the
// FMAs ran: in one run on the AVX2 class (2 threads, 2048 x 768, weights from memory) this took
// m = 8 from 8-11 to 13-16 GB/s of weights and m = 16 from 5 to 9 (1 KiB ahead: 8-12 and 7).
constexpr size_t kPrefetch = 2048;

size_t even(size_t k) { return (k + 1) & ~size_t{1}; }
size_t panel_count(size_t n) { return (n + kNr - 1) / kNr; }

float bf16_value(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// One micro-kernel: `rows` (<= its MR) rows of x times one panel, into y's first `cols` (<= 16)
// columns. x is f32 (ldx floats per row) except for the bf16 dot product, which reads x rounded
// to bf16 (ldx per row, each row padded with a zero to whole pairs).
using PanelFn = void (*)(const void* x, size_t ldx, size_t k, const uint16_t* panel, float* y,
                         size_t ldy, size_t cols);

void store_cols(const float* sums, float* y, size_t cols) { std::memcpy(y, sums, cols * 4); }

template <int MR>
void panel_scalar(const void* xv, size_t ldx, size_t k, const uint16_t* panel, float* y, size_t ldy,
                  size_t cols) {
  const auto* x = static_cast<const float*>(xv);
  for (int r = 0; r < MR; ++r) {
    float sums[kNr] = {};
    for (size_t i = 0; i < k; ++i) {
      const float a = x[r * ldx + i];
      const uint16_t* g = panel + (i / 2) * kGroup + (i & 1);
      for (size_t c = 0; c < kNr; ++c) sums[c] += a * bf16_value(g[2 * c]);
    }
    store_cols(sums, y + r * ldy, cols);
  }
}

#ifdef KVRT_GEMM_X86
// One x value broadcast to 8 lanes. A scalar load and a register broadcast, not vbroadcastss
// from memory: on the AVX2 class (Zen 3, one thread) a loop of 2 FMAs per broadcast ran at 0.5
// of a register-only FMA loop with the memory form and at 0.9 with this one.
KVRT_AVX2 KVRT_INLINE __m256 broadcast_x(const float* p) {
  return _mm256_broadcastss_ps(_mm_load_ss(p));
}

// One k's x values (x[r * ldx] for each row) times the widened halves w0 (columns 0-7) and w1
// (8-15), into one set's MR x 2 sums.
template <int MR>
KVRT_AVX2 KVRT_INLINE void fma_rows(const float* x, size_t ldx, __m256 w0, __m256 w1,
                                    __m256 (&acc)[MR][2]) {
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) {
    const __m256 a = broadcast_x(x + r * ldx);
    acc[r][0] = _mm256_fmadd_ps(a, w0, acc[r][0]);
    acc[r][1] = _mm256_fmadd_ps(a, w1, acc[r][1]);
  }
}

// AVX2, one pair of k (q) into the sums of set E (its even k) and set O (its odd k): a group is
// two 256-bit halves (columns 0-7 and 8-15); each row's x value for the even k meets the widened
// even halves, then the odd k the odd halves, with only one half-group of widened weights live
// at a time (the odd halves are cleared by a shift right and back, not an AND, whose mask would
// take one more register).
template <int MR, int E, int O, int S>
KVRT_AVX2 KVRT_INLINE void pair_avx2(const float* x, size_t ldx, size_t q, const uint16_t* panel,
                                     __m256 (&acc)[S][MR][2]) {
  const uint16_t* g = panel + q * kGroup;
  _mm_prefetch(reinterpret_cast<const char*>(g + kPrefetch), _MM_HINT_T0);
  const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
  const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + kNr));
  const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
  const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
  fma_rows<MR>(x + 2 * q, ldx, e0, e1, acc[E]);
  __m256 o0, o1;
  if constexpr (MR <= 2) {  // registers to spare for the mask: one op, not two
    const __m256i high = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
    o0 = _mm256_castsi256_ps(_mm256_and_si256(v0, high));
    o1 = _mm256_castsi256_ps(_mm256_and_si256(v1, high));
  } else {
    o0 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(v0, 16), 16));
    o1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_srli_epi32(v1, 16), 16));
  }
  fma_rows<MR>(x + 2 * q + 1, ldx, o0, o1, acc[O]);
}

// AVX2: MR x 2 sums per set. An FMA's result is ready ~4-5 cycles after it issues and two issue
// per cycle, so about ten independent sums keep both FMA units busy: six rows (12 sums) take a
// pair's even and odd k into one set; two or three rows keep the odd k apart (8 or 12 sums);
// one row also takes every other pair apart (8 sums), and one or two rows clear the odd halves
// with an AND, having a register to spare for its mask. The sets are added at the end. Against
// the kernel before these three changes, interleaved in one process (AVX2 class, Zen 3, 2048 x
// 768 weights in cache, best of 15): 1.05-1.3x at m = 1, 1.08-1.13x at m = 2, 1.04-1.08x at
// m = 3, the same at m = 8.
template <int MR>
KVRT_AVX2 void panel_avx2(const void* xv, size_t ldx, size_t k, const uint16_t* panel, float* y,
                          size_t ldy, size_t cols) {
  const auto* x = static_cast<const float*>(xv);
  constexpr int S = MR == 1 ? 4 : MR <= 3 ? 2 : 1;
  constexpr int O = S == 1 ? 0 : 1;
  __m256 acc[S][MR][2];
  KVRT_UNROLL
  for (int s = 0; s < S; ++s) {
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) acc[s][r][0] = acc[s][r][1] = _mm256_setzero_ps();
  }
  const size_t pairs = k / 2;
  size_t q = 0;
  if constexpr (S == 4) {
    for (; q + 2 <= pairs; q += 2) {
      pair_avx2<MR, 0, 1>(x, ldx, q, panel, acc);
      pair_avx2<MR, 2, 3>(x, ldx, q + 1, panel, acc);
    }
  }
  for (; q < pairs; ++q) pair_avx2<MR, 0, O>(x, ldx, q, panel, acc);
  if (k & 1) {  // the last k alone: its group's odd halves are zero padding
    const uint16_t* g = panel + pairs * kGroup;
    const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g));
    const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(g + kNr));
    const __m256 e0 = _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16));
    const __m256 e1 = _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16));
    fma_rows<MR>(x + k - 1, ldx, e0, e1, acc[0]);
  }
  KVRT_UNROLL
  for (int s = 1; s < S; ++s) {
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      acc[0][r][0] = _mm256_add_ps(acc[0][r][0], acc[s][r][0]);
      acc[0][r][1] = _mm256_add_ps(acc[0][r][1], acc[s][r][1]);
    }
  }
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) {
    const __m256 lo = acc[0][r][0], hi = acc[0][r][1];
    float* yr = y + r * ldy;
    if (cols == kNr) {
      _mm256_storeu_ps(yr, lo);
      _mm256_storeu_ps(yr + 8, hi);
    } else {
      alignas(32) float sums[kNr];
      _mm256_store_ps(sums, lo);
      _mm256_store_ps(sums + 8, hi);
      store_cols(sums, yr, cols);
    }
  }
}

// GCC 12's AVX-512 intrinsics start some results from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports as a use of an uninitialised value (a known false positive).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// AVX-512F: a group is one 512-bit register; the same arithmetic as AVX2 on 16 lanes, with the
// even and odd k always in sums of their own (2 x 8 of the 32 registers).
template <int MR>
KVRT_AVX512 void panel_avx512(const void* xv, size_t ldx, size_t k, const uint16_t* panel, float* y,
                              size_t ldy, size_t cols) {
  const auto* x = static_cast<const float*>(xv);
  __m512 acc[2][MR];
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
  const __m512i high = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const size_t pairs = k / 2;
  for (size_t q = 0; q < pairs; ++q) {
    _mm_prefetch(reinterpret_cast<const char*>(panel + q * kGroup + kPrefetch), _MM_HINT_T0);
    const __m512i v = _mm512_loadu_si512(panel + q * kGroup);
    const __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    const __m512 o = _mm512_castsi512_ps(_mm512_and_si512(v, high));
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      const float* xr = x + r * ldx + 2 * q;
      acc[0][r] = _mm512_fmadd_ps(_mm512_set1_ps(xr[0]), e, acc[0][r]);
      acc[1][r] = _mm512_fmadd_ps(_mm512_set1_ps(xr[1]), o, acc[1][r]);
    }
  }
  if (k & 1) {
    const __m512i v = _mm512_loadu_si512(panel + pairs * kGroup);
    const __m512 e = _mm512_castsi512_ps(_mm512_slli_epi32(v, 16));
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      acc[0][r] = _mm512_fmadd_ps(_mm512_set1_ps(x[r * ldx + k - 1]), e, acc[0][r]);
    }
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, mask, _mm512_add_ps(acc[0][r], acc[1][r]));
  }
}

// A pair of bf16 x values, as the 32 bits vdpbf16ps takes broadcast to every lane.
KVRT_AVX512BF16 inline __m512bh bf16_pair(const uint16_t* p) {
  uint32_t bits;
  std::memcpy(&bits, p, 4);
  return (__m512bh)_mm512_set1_epi32(static_cast<int>(bits));
}

// AVX-512 BF16: vdpbf16ps multiplies a group by one row's pair of bf16 x values broadcast to
// every lane and adds both products into the column's f32 sum. Even and odd pairs go to sums
// of their own (the instruction's latency, as with the FMA above).
template <int MR>
KVRT_AVX512BF16 void panel_avx512bf16(const void* xv, size_t ldx, size_t k, const uint16_t* panel,
                                      float* y, size_t ldy, size_t cols) {
  const auto* x = static_cast<const uint16_t*>(xv);
  __m512 acc[2][MR];
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) acc[0][r] = acc[1][r] = _mm512_setzero_ps();
  const size_t pairs = even(k) / 2;  // x's padding pair holds a zero, as the weights' does
  size_t q = 0;
  for (; q + 2 <= pairs; q += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(panel + q * kGroup + kPrefetch), _MM_HINT_T0);
    _mm_prefetch(reinterpret_cast<const char*>(panel + (q + 1) * kGroup + kPrefetch), _MM_HINT_T0);
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + q * kGroup);
    const __m512bh w1 = (__m512bh)_mm512_loadu_si512(panel + (q + 1) * kGroup);
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      acc[0][r] = _mm512_dpbf16_ps(acc[0][r], bf16_pair(x + r * ldx + 2 * q), w0);
      acc[1][r] = _mm512_dpbf16_ps(acc[1][r], bf16_pair(x + r * ldx + 2 * (q + 1)), w1);
    }
  }
  if (q < pairs) {
    const __m512bh w0 = (__m512bh)_mm512_loadu_si512(panel + q * kGroup);
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r)
      acc[0][r] = _mm512_dpbf16_ps(acc[0][r], bf16_pair(x + r * ldx + 2 * q), w0);
  }
  const __mmask16 mask = static_cast<__mmask16>((1u << cols) - 1);
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) {
    _mm512_mask_storeu_ps(y + r * ldy, mask, _mm512_add_ps(acc[0][r], acc[1][r]));
  }
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // KVRT_GEMM_X86

// An instruction set's micro-kernels, fn[rows - 1] for 1 .. mr rows.
struct Kernels {
  size_t mr;
  PanelFn fn[8];
};

template <template <int> class F, int... R>
constexpr Kernels make_kernels(std::integer_sequence<int, R...>) {
  return Kernels{sizeof...(R), {F<R + 1>::value...}};
}

#define KVRT_GEMM_KERNELS(name, fn, mr)      \
  template <int R>                           \
  struct name {                              \
    static constexpr PanelFn value = &fn<R>; \
  };                                         \
  constexpr Kernels name##_set = make_kernels<name>(std::make_integer_sequence<int, mr>{});

KVRT_GEMM_KERNELS(Scalar, panel_scalar, 4)
#ifdef KVRT_GEMM_X86
KVRT_GEMM_KERNELS(Avx2, panel_avx2, 6)
KVRT_GEMM_KERNELS(Avx512, panel_avx512, 8)
KVRT_GEMM_KERNELS(Avx512Bf16, panel_avx512bf16, 8)
#endif
#undef KVRT_GEMM_KERNELS

const Kernels& kernels_for(GemmIsa isa) {
  switch (isa) {
#ifdef KVRT_GEMM_X86
    case GemmIsa::kAvx2:
      return Avx2_set;
    case GemmIsa::kAvx512:
      return Avx512_set;
    case GemmIsa::kAvx512Bf16:
      return Avx512Bf16_set;
#endif
    default:
      return Scalar_set;
  }
}

// x rounded to bf16 for the dot product, each row padded with a zero to whole pairs.
void x_to_bf16(const float* x, size_t ldx, size_t m, size_t k, std::vector<uint16_t>& out) {
  out.assign(m * even(k), 0);
  for (size_t r = 0; r < m; ++r) f32_to_bf16(x + r * ldx, out.data() + r * even(k), k);
}

template <typename T, typename Convert>
void pack(const T* w, size_t n, size_t k, uint16_t* packed, Convert convert) {
  const size_t kp = even(k);
  std::fill(packed, packed + packed_bf16_size(n, k), uint16_t{0});
  std::vector<uint16_t> row(k);
  for (size_t j = 0; j < n; ++j) {
    convert(w + j * k, row.data(), k);
    uint16_t* dst = packed + (j / kNr) * kNr * kp + (j % kNr) * 2;
    for (size_t i = 0; i < k; ++i) dst[(i / 2) * kGroup + (i & 1)] = row[i];
  }
}

}  // namespace

bool gemm_isa_supported(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kAuto:
    case GemmIsa::kScalar:
      return true;
#ifdef KVRT_GEMM_X86
    case GemmIsa::kAvx2:
      return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
    case GemmIsa::kAvx512:
      return __builtin_cpu_supports("avx512f");
    case GemmIsa::kAvx512Bf16:
      return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bf16");
#endif
    default:
      return false;
  }
}

GemmIsa gemm_best_isa(bool allow_bf16_dot) {
  if (allow_bf16_dot && gemm_isa_supported(GemmIsa::kAvx512Bf16)) return GemmIsa::kAvx512Bf16;
  if (gemm_isa_supported(GemmIsa::kAvx512)) return GemmIsa::kAvx512;
  if (gemm_isa_supported(GemmIsa::kAvx2)) return GemmIsa::kAvx2;
  return GemmIsa::kScalar;
}

const char* gemm_isa_name(GemmIsa isa) {
  switch (isa) {
    case GemmIsa::kAvx2:
      return "avx2";
    case GemmIsa::kAvx512:
      return "avx512f";
    case GemmIsa::kAvx512Bf16:
      return "avx512bf16";
    case GemmIsa::kScalar:
      return "scalar";
    default:
      return gemm_isa_name(gemm_best_isa(false));
  }
}

size_t packed_bf16_size(size_t n, size_t k) { return panel_count(n) * kNr * even(k); }

void pack_bf16(const uint16_t* w, size_t n, size_t k, uint16_t* packed) {
  pack(w, n, k, packed,
       [](const uint16_t* in, uint16_t* out, size_t len) { std::copy(in, in + len, out); });
}

void pack_bf16_from_f32(const float* w, size_t n, size_t k, uint16_t* packed) {
  pack(w, n, k, packed,
       [](const float* in, uint16_t* out, size_t len) { f32_to_bf16(in, out, len); });
}

void matmul_packed_bf16(const float* x, size_t ldx, size_t m, size_t k, const uint16_t* packed,
                        size_t n, float* y, size_t ldy, int threads, GemmIsa isa, bool bf16_x) {
  if (m == 0 || n == 0) return;
  if (k == 0) {  // empty sums
    for (size_t r = 0; r < m; ++r) std::fill(y + r * ldy, y + r * ldy + n, 0.0f);
    return;
  }
  if (isa == GemmIsa::kAuto) {  // cpuid once, not per product
    static const GemmIsa best = gemm_best_isa(false), best_dot = gemm_best_isa(true);
    isa = bf16_x ? best_dot : best;
  }
  const Kernels& kern = kernels_for(isa);
  const void* xs = x;
  size_t xld = ldx;
  thread_local std::vector<uint16_t> rounded;
  thread_local std::vector<float> widened;
  if (isa == GemmIsa::kAvx512Bf16) {
    x_to_bf16(x, ldx, m, k, rounded);
    xs = rounded.data();
    xld = even(k);
  } else if (bf16_x) {  // the rounded values, back in f32 for the FMA kernels
    x_to_bf16(x, ldx, m, k, rounded);
    widened.resize(rounded.size());
    bf16_to_f32(rounded.data(), widened.data(), rounded.size());
    xs = widened.data();
    xld = even(k);
  }
  const size_t panels = panel_count(n), stride = kNr * even(k);
  // With more rows than one micro-kernel takes, blocks of panels (up to 256 KiB) stay in L2
  // while each block of rows passes over them; decode-sized products stream panel by panel.
  // Tried and not kept (interleaved in one process, AVX2 class, 2 threads): slices of 256 k so
  // that a panel's slice and the rows' stay in L1 (5-10% slower at m = 8-512, k = 768 and
  // 2048), and prefetching the next block into L2 during the first pass (5-10% slower).
  const size_t per_block =
      m <= kern.mr ? 1 : std::clamp<size_t>((size_t{256} << 10) / (2 * stride), 1, 8);
  const size_t blocks = (panels + per_block - 1) / per_block;
  const size_t x_elem = isa == GemmIsa::kAvx512Bf16 ? sizeof(uint16_t) : sizeof(float);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && blocks > 1)
  for (size_t b = 0; b < blocks; ++b) {
    const size_t p0 = b * per_block, p1 = std::min(panels, p0 + per_block);
    for (size_t r = 0; r < m; r += kern.mr) {
      const size_t rows = std::min(kern.mr, m - r);
      const void* xr = static_cast<const char*>(xs) + r * xld * x_elem;
      for (size_t p = p0; p < p1; ++p) {
        kern.fn[rows - 1](xr, xld, k, packed + p * stride, y + r * ldy + p * kNr, ldy,
                          std::min(kNr, n - p * kNr));
      }
    }
  }
}

namespace reference {
void matmul_bf16(const float* x, size_t m, size_t k, const uint16_t* w, size_t n, float* y) {
  for (size_t r = 0; r < m; ++r) {
    for (size_t j = 0; j < n; ++j) {
      double sum = 0;
      for (size_t i = 0; i < k; ++i) sum += double{x[r * k + i]} * bf16_value(w[j * k + i]);
      y[r * n + j] = static_cast<float>(sum);
    }
  }
}
}  // namespace reference

}  // namespace kvrt::kernels
