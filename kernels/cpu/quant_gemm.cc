// Quantized-weight matrix products (quant_gemm.h). A micro-kernel computes up to MR rows of x
// times one panel of 16 output columns over the whole k, group by group: it decodes a group's
// codes once into f32 in registers, multiplies them into per-group sums of every row, and adds
// each group's sum times its scale into the row's total (an int4 group with zero points also
// takes away z * s * the group's sum of x). So each packed byte is read once per MR rows, and
// nothing is decoded to memory.
//
// Decoding: an int4 code picks its value from a 16-entry table (AVX-512's vpermps: (u - 8) or u),
// or is masked and converted (AVX2); an E4M3 code becomes the high byte of an IEEE half (one
// arithmetic shift and a mask) that F16C widens exactly, the 2^-8 this leaves folded into the
// block's scale at packing.
#include "kernels/cpu/quant_gemm.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/unroll.h"
#include "kernels/shared/fp8_e4m3.h"

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#include <immintrin.h>
#define KVRT_QGEMM_X86 1
#define KVRT_QAVX2 __attribute__((target("avx2,fma,f16c")))
#define KVRT_QAVX512 __attribute__((target("avx512f")))
#define KVRT_QAVX512BW __attribute__((target("avx512f,avx512bw")))
#define KVRT_QVNNI __attribute__((target("avx512f,avx512bw,avx512vnni")))
#define KVRT_QBF16 __attribute__((target("avx512f,avx512bw,avx512bf16")))
#endif

namespace kvrt::kernels {

using shared::e4m3_decode;
namespace {

constexpr size_t kNr = 16;  // output columns per panel
// How far ahead a micro-kernel asks for the codes (as gemm.cc's bf16 kernels do).
constexpr size_t kPrefetch = 2048;

size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
size_t panel_count(size_t n) { return ceil_div(n, kNr); }

// ---- int4 layout ------------------------------------------------------------------------------
size_t int4_scale_bytes(const Int4Format& f) { return kNr * (f.bf16_scales ? 2 : 4); }
size_t int4_header(const Int4Format& f) {
  return int4_scale_bytes(f) + (f.zero_points ? kNr : 0);
}
size_t int4_group_bytes(const Int4Format& f) { return int4_header(f) + f.group / 8 * 64; }
size_t int4_panel_bytes(size_t k, const Int4Format& f) {
  return ceil_div(k, f.group) * int4_group_bytes(f);
}

// ---- fp8 layout -------------------------------------------------------------------------------
constexpr size_t kFp8Header = kNr * 4;
size_t fp8_group_bytes(const Fp8Format& f) { return kFp8Header + f.block_k * kNr; }
size_t fp8_panel_bytes(size_t k, const Fp8Format& f) {
  return ceil_div(k, f.block_k) * fp8_group_bytes(f);
}

// Where input i of an 8-input step sits in its row's 32-bit lane: byte b holds input b in its
// low nibble and input 4 + b in its high one, so that the lane's bytes, masked or shifted by 4
// and masked, are four consecutive inputs (what vpdpbusd takes).
constexpr int nibble_shift(size_t i) { return static_cast<int>(i < 4 ? 8 * i : 8 * (i - 4) + 4); }
// The input at shift 4j of a lane: the inverse of nibble_shift.
constexpr size_t input_at(int j) { return j % 2 == 0 ? j / 2 : 4 + j / 2; }

float bf16_bits_value(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float v;
  std::memcpy(&v, &bits, 4);
  return v;
}

// A panel's header scales as f32.
void read_scales(const uint8_t* p, bool bf16, float* s) {
  for (size_t c = 0; c < kNr; ++c) {
    if (bf16) {
      uint16_t b;
      std::memcpy(&b, p + 2 * c, 2);
      s[c] = bf16_bits_value(b);
    } else {
      std::memcpy(&s[c], p + 4 * c, 4);
    }
  }
}

// E4M3 code / 256, as the high byte of a half reads it (the packed kernels' decoding).
float e4m3_over_256(uint8_t code) { return e4m3_decode(code) * (1.0f / 256.0f); }

// The bf16 bits of E4M3 codes 0-7 (exponent 0: zero and the subnormals m * 2^-9) / 256, that is
// of m * 2^-17 = (m / 2^p) * 2^(p - 17) with p the top bit of m; the rest unused. fp8_bf16 looks
// a code up here where its exponent trick cannot decode it.
constexpr std::array<uint16_t, 32> kSubnormalBf16 = [] {
  std::array<uint16_t, 32> bits{};
  for (int m = 1; m < 8; ++m) {
    const int p = m >= 4 ? 2 : m >= 2 ? 1 : 0;
    bits[m] = static_cast<uint16_t>(((127 - 17 + p) << 7) | ((m - (1 << p)) << (7 - p)));
  }
  return bits;
}();

// One micro-kernel: `rows` (<= MR) rows of x (padded to whole groups, ldx floats apart) times
// one panel, into y's first `cols` columns. xsum: each row's sum of x per group (int4 with zero
// points only), `groups` per row.
struct Args {
  const float* x;
  size_t ldx;
  const int8_t* xq;     // Activations::kInt8's x as int8 codes (ldx apart), for VNNI
  const float* xscale;  // and their scale, `groups` a row
  const int32_t* qsum;  // and the sum of each group's codes
  const float* xsum;
  const uint16_t* xb;  // Activations::kBf16's x as bf16 bits (ldx apart), for the bf16 dot
  size_t groups;
  size_t group;  // inputs per group
  const uint8_t* panel;
  float* y;
  size_t ldy;
  size_t cols;
};
using PanelFn = void (*)(const Args& a);

// ---- scalar -----------------------------------------------------------------------------------
template <int MR, bool BF16S, bool ZP>
void int4_scalar(const Args& a) {
  float acc[MR][kNr] = {};
  const Int4Format f{a.group, BF16S, ZP};
  const uint8_t* p = a.panel;
  for (size_t g = 0; g < a.groups; ++g, p += int4_group_bytes(f)) {
    float s[kNr];
    read_scales(p, BF16S, s);
    const uint8_t* z = p + int4_scale_bytes(f);
    const uint8_t* codes = p + int4_header(f);
    for (int r = 0; r < MR; ++r) {
      const float* xg = a.x + r * a.ldx + g * a.group;
      for (size_t c = 0; c < kNr; ++c) {
        const float zc = ZP ? static_cast<float>(z[c]) : 8.0f;
        float sum = 0;
        for (size_t i = 0; i < a.group; ++i) {
          uint32_t lane;
          std::memcpy(&lane, codes + (i / 8) * 64 + c * 4, 4);
          sum += xg[i] * (static_cast<float>((lane >> nibble_shift(i % 8)) & 0xF) - zc);
        }
        acc[r][c] += sum * s[c];
      }
    }
  }
  for (int r = 0; r < MR; ++r) std::memcpy(a.y + r * a.ldy, acc[r], a.cols * 4);
}

template <int MR>
void fp8_scalar(const Args& a) {
  float acc[MR][kNr] = {};
  const size_t group_bytes = kFp8Header + a.group * kNr;
  const uint8_t* p = a.panel;
  for (size_t g = 0; g < a.groups; ++g, p += group_bytes) {
    float s[kNr];
    read_scales(p, false, s);
    const uint8_t* codes = p + kFp8Header;
    for (int r = 0; r < MR; ++r) {
      const float* xg = a.x + r * a.ldx + g * a.group;
      for (size_t c = 0; c < kNr; ++c) {
        float sum = 0;
        for (size_t i = 0; i < a.group; ++i) {
          sum += xg[i] * e4m3_over_256(codes[(i / 2) * 32 + c * 2 + (i & 1)]);
        }
        acc[r][c] += sum * s[c];
      }
    }
  }
  for (int r = 0; r < MR; ++r) std::memcpy(a.y + r * a.ldy, acc[r], a.cols * 4);
}

#ifdef KVRT_QGEMM_X86
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

// ---- AVX2 (8 lanes: a panel is two halves) ----------------------------------------------------
KVRT_QAVX2 inline __m256 avx2_scales(const uint8_t* p, bool bf16, int half) {
  if (bf16) {
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * half));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(b), 16));
  }
  return _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * half);
}

// Each decoded weight is scaled at once (w = u * s - z * s), so a row needs one sum per half;
// rows of few keep two, even and odd inputs apart (the FMA's latency).
template <int MR, bool BF16S, bool ZP>
KVRT_QAVX2 void int4_avx2(const Args& a) {
  constexpr int CH = MR <= 2 ? 2 : 1;
  __m256 acc[CH][2][MR];
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) {
    for (int c = 0; c < CH; ++c) acc[c][0][r] = acc[c][1][r] = _mm256_setzero_ps();
  }
  const Int4Format f{a.group, BF16S, ZP};
  const size_t steps = a.group / 8, group_bytes = int4_group_bytes(f);
  const __m256i nibble = _mm256_set1_epi32(0xF);
  const uint8_t* p = a.panel;
  for (size_t g = 0; g < a.groups; ++g, p += group_bytes) {
    __m256 s[2], zs[2];
    for (int h = 0; h < 2; ++h) {
      s[h] = avx2_scales(p, BF16S, h);
      const __m256 z =
          ZP ? _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64(
                   reinterpret_cast<const __m128i*>(p + int4_scale_bytes(f) + 8 * h))))
             : _mm256_set1_ps(8.0f);
      zs[h] = _mm256_mul_ps(z, s[h]);
    }
    const uint8_t* codes = p + int4_header(f);
    const float* xg = a.x + g * a.group;
    for (size_t t = 0; t < steps; ++t) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + t * 64 + kPrefetch), _MM_HINT_T0);
      for (int h = 0; h < 2; ++h) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + t * 64 + 32 * h));
        KVRT_UNROLL
        for (int j = 0; j < 8; ++j) {
          const __m256 u =
              _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srli_epi32(v, 4 * j), nibble));
          const __m256 w = _mm256_fmsub_ps(u, s[h], zs[h]);
          KVRT_UNROLL
          for (int r = 0; r < MR; ++r) {
            __m256& sum = acc[j % CH][h][r];
            sum = _mm256_fmadd_ps(_mm256_set1_ps(xg[r * a.ldx + 8 * t + input_at(j)]), w, sum);
          }
        }
      }
    }
  }
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) {
    alignas(32) float out[kNr];
    for (int h = 0; h < 2; ++h) {
      __m256 sum = acc[0][h][r];
      if constexpr (CH > 1) sum = _mm256_add_ps(sum, acc[1][h][r]);
      _mm256_store_ps(out + 8 * h, sum);
    }
    std::memcpy(a.y + r * a.ldy, out, a.cols * 4);
  }
}

// The E4M3 codes of one 16-bit lane's low (`high` false) or high byte as halves: sign, then
// exponent and mantissa one place down (value / 256).
KVRT_QAVX2 inline __m256i avx2_fp8_halves(__m256i v, bool high) {
  const __m256i mask = _mm256_set1_epi16(static_cast<int16_t>(0xBF80));
  const __m256i top = high ? v : _mm256_slli_epi16(v, 8);
  return _mm256_and_si256(_mm256_srai_epi16(top, 1), mask);
}

// Per block, each row's sums of x times the decoded codes, then one FMA by the block's scales
// into the row's totals (held in memory: they change once a block).
template <int MR>
KVRT_QAVX2 void fp8_avx2(const Args& a) {
  constexpr int CH = MR <= 2 ? 2 : 1;
  alignas(32) float acc[MR][kNr] = {};
  const size_t pairs = a.group / 2, group_bytes = kFp8Header + a.group * kNr;
  const uint8_t* p = a.panel;
  for (size_t g = 0; g < a.groups; ++g, p += group_bytes) {
    __m256 sum[CH][2][MR];
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < CH; ++c) sum[c][0][r] = sum[c][1][r] = _mm256_setzero_ps();
    }
    const uint8_t* codes = p + kFp8Header;
    const float* xg = a.x + g * a.group;
    for (size_t t = 0; t < pairs; ++t) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + t * 32 + kPrefetch), _MM_HINT_T0);
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + t * 32));
      KVRT_UNROLL
      for (int e = 0; e < 2; ++e) {
        const __m256i halves = avx2_fp8_halves(v, e == 1);
        const __m256 w[2] = {_mm256_cvtph_ps(_mm256_castsi256_si128(halves)),
                             _mm256_cvtph_ps(_mm256_extracti128_si256(halves, 1))};
        KVRT_UNROLL
        for (int r = 0; r < MR; ++r) {
          const __m256 xv = _mm256_set1_ps(xg[r * a.ldx + 2 * t + e]);
          for (int h = 0; h < 2; ++h) {
            __m256& sh = sum[e % CH][h][r];
            sh = _mm256_fmadd_ps(xv, w[h], sh);
          }
        }
      }
    }
    KVRT_UNROLL
    for (int h = 0; h < 2; ++h) {
      const __m256 s = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * h);
      KVRT_UNROLL
      for (int r = 0; r < MR; ++r) {
        __m256 total = sum[0][h][r];
        if constexpr (CH > 1) total = _mm256_add_ps(total, sum[1][h][r]);
        _mm256_store_ps(acc[r] + 8 * h,
                        _mm256_fmadd_ps(total, s, _mm256_load_ps(acc[r] + 8 * h)));
      }
    }
  }
  for (int r = 0; r < MR; ++r) std::memcpy(a.y + r * a.ldy, acc[r], a.cols * 4);
}

// ---- AVX-512F (16 lanes: a panel is one register) ---------------------------------------------
// A group header's 16 scales as f32 (bf16 widened, or f32 as stored).
KVRT_QAVX512 inline __m512 avx512_scales(const uint8_t* p, bool bf16) {
  if (bf16) {
    const __m256i b = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(b), 16));
  }
  return _mm512_loadu_ps(reinterpret_cast<const float*>(p));
}

// Each row's 16 totals into y's first a.cols columns.
template <int MR>
KVRT_QAVX512 inline void avx512_store(const __m512 (&acc)[MR], const Args& a) {
  const __mmask16 mask = static_cast<__mmask16>((1u << a.cols) - 1);
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) _mm512_mask_storeu_ps(a.y + r * a.ldy, mask, acc[r]);
}

// Per group, each row's sum of x times the decoded codes (in CH independent chains for few
// rows), then one FMA by the group's scales into the row's total.
template <int MR, bool BF16S, bool ZP>
KVRT_QAVX512 void int4_avx512(const Args& a) {
  constexpr int CH = MR <= 2 ? 4 : (MR <= 4 ? 2 : 1);
  __m512 acc[MR];
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  const Int4Format f{a.group, BF16S, ZP};
  const size_t steps = a.group / 8, group_bytes = int4_group_bytes(f);
  const __m512 table = ZP ? _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15)
                          : _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
  const uint8_t* p = a.panel;
  for (size_t g = 0; g < a.groups; ++g, p += group_bytes) {
    const __m512 s = avx512_scales(p, BF16S);
    __m512 sum[CH][MR];
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < CH; ++c) sum[c][r] = _mm512_setzero_ps();
    }
    const uint8_t* codes = p + int4_header(f);
    const float* xg = a.x + g * a.group;
    for (size_t t = 0; t < steps; ++t) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + t * 64 + kPrefetch), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(codes + t * 64);
      KVRT_UNROLL
      for (int j = 0; j < 8; ++j) {
        const __m512 w =
            _mm512_permutexvar_ps(j == 0 ? v : _mm512_srli_epi32(v, 4 * j), table);
        KVRT_UNROLL
        for (int r = 0; r < MR; ++r) {
          __m512& sj = sum[j % CH][r];
          sj = _mm512_fmadd_ps(_mm512_set1_ps(xg[r * a.ldx + 8 * t + input_at(j)]), w, sj);
        }
      }
    }
    __m512 zs = _mm512_setzero_ps();
    if constexpr (ZP) {
      const __m128i z = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + int4_scale_bytes(f)));
      zs = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(z)), s);
    }
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      __m512 total = sum[0][r];
      for (int c = 1; c < CH; ++c) total = _mm512_add_ps(total, sum[c][r]);
      acc[r] = _mm512_fmadd_ps(total, s, acc[r]);
      if constexpr (ZP) {
        acc[r] = _mm512_fnmadd_ps(zs, _mm512_set1_ps(a.xsum[r * a.groups + g]), acc[r]);
      }
    }
  }
  avx512_store<MR>(acc, a);
}

// AVX-512 VNNI, for x quantized to int8 (Activations::kInt8): the low and the high nibbles of
// a step's 64 bytes are, masked, 64 unsigned bytes each, four inputs of each row a lane, which
// vpdpbusd multiplies by four int8 x values broadcast and adds into the lane's int32 sum: 64
// exact products an instruction, three decoding instructions per 128. A group's sum, less the
// zero point times x's sum, is scaled once by the weights' and x's scales.
template <int MR, bool BF16S, bool ZP>
KVRT_QVNNI void int4_vnni(const Args& a) {
  constexpr int CH = MR <= 2 ? 2 : 1;
  __m512 acc[MR];
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  const Int4Format f{a.group, BF16S, ZP};
  const size_t steps = a.group / 8, group_bytes = int4_group_bytes(f);
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const uint8_t* p = a.panel;
  for (size_t g = 0; g < a.groups; ++g, p += group_bytes) {
    const __m512 s = avx512_scales(p, BF16S);
    __m512i sum[CH][2][MR];
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < CH; ++c) sum[c][0][r] = sum[c][1][r] = _mm512_setzero_si512();
      // Symmetric: the sums start at -8 times x's sum, so they end as sum (u - 8) xq.
      if constexpr (!ZP) sum[0][0][r] = _mm512_set1_epi32(-8 * a.qsum[r * a.groups + g]);
    }
    const uint8_t* codes = p + int4_header(f);
    const int8_t* xg = a.xq + g * a.group;
    // Step t0 + c into chain c, c a constant once unrolled: sums indexed by the step's parity
    // would live in memory, each step waiting on the store of the one before.
    for (size_t t0 = 0; t0 < steps; t0 += CH) {
      KVRT_UNROLL
      for (int c = 0; c < CH; ++c) {
        const size_t t = t0 + c;
        if (t == steps) break;
        _mm_prefetch(reinterpret_cast<const char*>(codes + t * 64 + kPrefetch), _MM_HINT_T0);
        const __m512i v = _mm512_loadu_si512(codes + t * 64);
        const __m512i lo = _mm512_and_si512(v, low4);
        const __m512i hi = _mm512_and_si512(_mm512_srli_epi32(v, 4), low4);
        KVRT_UNROLL
        for (int r = 0; r < MR; ++r) {
          int32_t x0, x1;
          std::memcpy(&x0, xg + r * a.ldx + 8 * t, 4);
          std::memcpy(&x1, xg + r * a.ldx + 8 * t + 4, 4);
          sum[c][0][r] = _mm512_dpbusd_epi32(sum[c][0][r], lo, _mm512_set1_epi32(x0));
          sum[c][1][r] = _mm512_dpbusd_epi32(sum[c][1][r], hi, _mm512_set1_epi32(x1));
        }
      }
    }
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      __m512i total = _mm512_add_epi32(sum[0][0][r], sum[0][1][r]);
      for (int c = 1; c < CH; ++c) {
        total = _mm512_add_epi32(total, _mm512_add_epi32(sum[c][0][r], sum[c][1][r]));
      }
      const size_t rg = r * a.groups + g;
      __m512 dot = _mm512_cvtepi32_ps(total);
      if constexpr (ZP) {  // sum (u - z) xq = sum u xq - z sum xq, exact in f32 (|.| < 2^24)
        const __m512 z = _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + int4_scale_bytes(f)))));
        dot = _mm512_fnmadd_ps(z, _mm512_set1_ps(static_cast<float>(a.qsum[rg])), dot);
      }
      acc[r] = _mm512_fmadd_ps(dot, _mm512_mul_ps(s, _mm512_set1_ps(a.xscale[rg])), acc[r]);
    }
  }
  avx512_store<MR>(acc, a);
}

// AVX2, for x quantized to int8: the same bytes as VNNI's, multiplied by vpmaddubsw (unsigned
// codes times int8 x, adjacent pairs summed into 16 bits: at most 2 x 15 x 127, no saturation)
// and summed into int32 by vpmaddwd against ones; a panel is two halves of 8 rows.
template <int MR, bool BF16S, bool ZP>
KVRT_QAVX2 void int4_avx2_int8(const Args& a) {
  __m256 acc[2][MR];
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) acc[0][r] = acc[1][r] = _mm256_setzero_ps();
  const Int4Format f{a.group, BF16S, ZP};
  const size_t steps = a.group / 8, group_bytes = int4_group_bytes(f);
  const __m256i low4 = _mm256_set1_epi8(0x0F), ones = _mm256_set1_epi16(1);
  const uint8_t* p = a.panel;
  for (size_t g = 0; g < a.groups; ++g, p += group_bytes) {
    __m256i sum[2][MR];
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      // Symmetric: the sums start at -8 times x's sum, so they end as sum (u - 8) xq.
      sum[0][r] = sum[1][r] =
          ZP ? _mm256_setzero_si256() : _mm256_set1_epi32(-8 * a.qsum[r * a.groups + g]);
    }
    const uint8_t* codes = p + int4_header(f);
    const int8_t* xg = a.xq + g * a.group;
    for (size_t t = 0; t < steps; ++t) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + t * 64 + kPrefetch), _MM_HINT_T0);
      KVRT_UNROLL
      for (int h = 0; h < 2; ++h) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + t * 64 + 32 * h));
        const __m256i lo = _mm256_and_si256(v, low4);
        const __m256i hi = _mm256_and_si256(_mm256_srli_epi16(v, 4), low4);
        KVRT_UNROLL
        for (int r = 0; r < MR; ++r) {
          int32_t x0, x1;
          std::memcpy(&x0, xg + r * a.ldx + 8 * t, 4);
          std::memcpy(&x1, xg + r * a.ldx + 8 * t + 4, 4);
          const __m256i pairs = _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_set1_epi32(x0)),
                                                 _mm256_maddubs_epi16(hi, _mm256_set1_epi32(x1)));
          sum[h][r] = _mm256_add_epi32(sum[h][r], _mm256_madd_epi16(pairs, ones));
        }
      }
    }
    KVRT_UNROLL
    for (int h = 0; h < 2; ++h) {
      const __m256 s = avx2_scales(p, BF16S, h);
      KVRT_UNROLL
      for (int r = 0; r < MR; ++r) {
        const size_t rg = r * a.groups + g;
        __m256 dot = _mm256_cvtepi32_ps(sum[h][r]);
        if constexpr (ZP) {
          const __m256 z = _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(
              _mm_loadl_epi64(reinterpret_cast<const __m128i*>(p + int4_scale_bytes(f) + 8 * h))));
          dot = _mm256_fnmadd_ps(z, _mm256_set1_ps(static_cast<float>(a.qsum[rg])), dot);
        }
        acc[h][r] = _mm256_fmadd_ps(dot, _mm256_mul_ps(s, _mm256_set1_ps(a.xscale[rg])), acc[h][r]);
      }
    }
  }
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) {
    alignas(32) float out[kNr];
    _mm256_store_ps(out, acc[0][r]);
    _mm256_store_ps(out + 8, acc[1][r]);
    std::memcpy(a.y + r * a.ldy, out, a.cols * 4);
  }
}

// AVX-512BW for the 16-bit shifts (every AVX-512 CPU kvrt meets has it; one without runs AVX2).
template <int MR>
KVRT_QAVX512BW void fp8_avx512(const Args& a) {
  constexpr int CH = MR <= 2 ? 4 : (MR <= 4 ? 2 : 1);
  __m512 acc[MR];
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  const size_t quads = a.group / 4, group_bytes = kFp8Header + a.group * kNr;
  const __m512i mask16 = _mm512_set1_epi16(static_cast<int16_t>(0xBF80));
  const uint8_t* p = a.panel;
  for (size_t g = 0; g < a.groups; ++g, p += group_bytes) {
    const __m512 s = _mm512_loadu_ps(reinterpret_cast<const float*>(p));
    __m512 sum[CH][MR];
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      for (int c = 0; c < CH; ++c) sum[c][r] = _mm512_setzero_ps();
    }
    const uint8_t* codes = p + kFp8Header;
    const float* xg = a.x + g * a.group;
    for (size_t t = 0; t < quads; ++t) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + t * 64 + kPrefetch), _MM_HINT_T0);
      const __m512i v = _mm512_loadu_si512(codes + t * 64);
      // Lanes 0-15: inputs 4t (low bytes) and 4t + 1 (high); lanes 16-31: 4t + 2 and 4t + 3.
      const __m512i low = _mm512_and_si512(_mm512_srai_epi16(_mm512_slli_epi16(v, 8), 1), mask16);
      const __m512i high = _mm512_and_si512(_mm512_srai_epi16(v, 1), mask16);
      const __m512 w[4] = {_mm512_cvtph_ps(_mm512_castsi512_si256(low)),
                           _mm512_cvtph_ps(_mm512_castsi512_si256(high)),
                           _mm512_cvtph_ps(_mm512_extracti64x4_epi64(low, 1)),
                           _mm512_cvtph_ps(_mm512_extracti64x4_epi64(high, 1))};
      KVRT_UNROLL
      for (int j = 0; j < 4; ++j) {
        KVRT_UNROLL
        for (int r = 0; r < MR; ++r) {
          __m512& sj = sum[j % CH][r];
          sj = _mm512_fmadd_ps(_mm512_set1_ps(xg[r * a.ldx + 4 * t + j]), w[j], sj);
        }
      }
    }
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      __m512 total = sum[0][r];
      for (int c = 1; c < CH; ++c) total = _mm512_add_ps(total, sum[c][r]);
      acc[r] = _mm512_fmadd_ps(total, s, acc[r]);
    }
  }
  avx512_store<MR>(acc, a);
}

// AVX-512 BF16, for x rounded to bf16 (Activations::kBf16): a code widened to 16 bits (sign
// extended) and shifted up 4 is, masked, a bf16 of exponent e and the code's 3 mantissa bits;
// adding 112 to the exponent makes it the code's value / 256 (as the other kernels decode). A
// code of exponent 0 (zero, subnormal) takes its value from a table instead, by a masked vpermw
// on its low bits, the sign restored after. vdpbf16ps then multiplies a step's two pairs of
// inputs into 16 columns: 32 products an instruction. A NaN code reads as a finite value
// (quant_gemm.h).
template <int MR>
KVRT_QBF16 void fp8_bf16(const Args& a) {
  constexpr int S = MR <= 4 ? 2 : 1;  // sums a row (the step's two halves apart for few rows)
  __m512 acc[MR];
  KVRT_UNROLL
  for (int r = 0; r < MR; ++r) acc[r] = _mm512_setzero_ps();
  const size_t quads = a.group / 4, group_bytes = kFp8Header + a.group * kNr;
  const __m512i keep = _mm512_set1_epi16(static_cast<int16_t>(0x87F0));
  const __m512i bias = _mm512_set1_epi16(112 << 7), exponent = _mm512_set1_epi16(0x78);
  const __m512i sign = _mm512_set1_epi16(static_cast<int16_t>(0x8000));
  const __m512i subnormals = _mm512_loadu_si512(kSubnormalBf16.data());
  const uint8_t* p = a.panel;
  for (size_t g = 0; g < a.groups; ++g, p += group_bytes) {
    const __m512 s = _mm512_loadu_ps(reinterpret_cast<const float*>(p));
    __m512 sum[S][MR];
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      for (int h = 0; h < S; ++h) sum[h][r] = _mm512_setzero_ps();
    }
    const uint8_t* codes = p + kFp8Header;
    const uint16_t* xg = a.xb + g * a.group;
    for (size_t t = 0; t < quads; ++t) {
      _mm_prefetch(reinterpret_cast<const char*>(codes + t * 64 + kPrefetch), _MM_HINT_T0);
      KVRT_UNROLL
      for (int h = 0; h < 2; ++h) {  // inputs 4t + 2h and 4t + 2h + 1 of the 16 columns
        const __m512i v = _mm512_cvtepi8_epi16(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + t * 64 + 32 * h)));
        __m512i w = _mm512_add_epi16(_mm512_and_si512(_mm512_slli_epi16(v, 4), keep), bias);
        w = _mm512_mask_permutexvar_epi16(w, _mm512_testn_epi16_mask(v, exponent), v, subnormals);
        w = _mm512_ternarylogic_epi32(w, v, sign, 0xF8);  // w | (v & sign)
        KVRT_UNROLL
        for (int r = 0; r < MR; ++r) {
          int32_t pair;
          std::memcpy(&pair, xg + r * a.ldx + 4 * t + 2 * h, 4);
          __m512& sum_h = sum[h % S][r];
          sum_h = _mm512_dpbf16_ps(sum_h, (__m512bh)w, (__m512bh)_mm512_set1_epi32(pair));
        }
      }
    }
    KVRT_UNROLL
    for (int r = 0; r < MR; ++r) {
      const __m512 total = S == 2 ? _mm512_add_ps(sum[0][r], sum[S - 1][r]) : sum[0][r];
      acc[r] = _mm512_fmadd_ps(total, s, acc[r]);
    }
  }
  avx512_store<MR>(acc, a);
}
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif  // KVRT_QGEMM_X86

// An instruction set's micro-kernels for 1 .. mr rows.
struct Kernels {
  size_t mr;
  PanelFn fn[8];
};

template <template <int> class F, int... R>
constexpr Kernels make(std::integer_sequence<int, R...>) {
  return Kernels{sizeof...(R), {F<R + 1>::value...}};
}

#define KVRT_QKERNELS(name, expr, mr)                                                     \
  template <int R>                                                                        \
  struct name {                                                                           \
    static constexpr PanelFn value = expr;                                                \
  };                                                                                      \
  constexpr Kernels name##_set = make<name>(std::make_integer_sequence<int, mr>{});

#define KVRT_INT4_KERNELS(prefix, fn, mr)                    \
  KVRT_QKERNELS(prefix##Sym, (&fn<R, false, false>), mr)     \
  KVRT_QKERNELS(prefix##SymB, (&fn<R, true, false>), mr)     \
  KVRT_QKERNELS(prefix##Asym, (&fn<R, false, true>), mr)     \
  KVRT_QKERNELS(prefix##AsymB, (&fn<R, true, true>), mr)

KVRT_INT4_KERNELS(Int4Scalar, int4_scalar, 4)
KVRT_QKERNELS(Fp8Scalar, (&fp8_scalar<R>), 4)
#ifdef KVRT_QGEMM_X86
KVRT_INT4_KERNELS(Int4Avx2, int4_avx2, 4)
KVRT_QKERNELS(Fp8Avx2, (&fp8_avx2<R>), 4)
KVRT_INT4_KERNELS(Int4Avx512, int4_avx512, 8)
KVRT_INT4_KERNELS(Int4Vnni, int4_vnni, 8)
KVRT_INT4_KERNELS(Int4Avx2Int8, int4_avx2_int8, 4)
KVRT_QKERNELS(Fp8Avx512, (&fp8_avx512<R>), 8)
KVRT_QKERNELS(Fp8Bf16, (&fp8_bf16<R>), 8)
#endif
#undef KVRT_INT4_KERNELS
#undef KVRT_QKERNELS

#define KVRT_PICK_INT4(prefix)                                               \
  (f.zero_points ? (f.bf16_scales ? prefix##AsymB_set : prefix##Asym_set) \
                 : (f.bf16_scales ? prefix##SymB_set : prefix##Sym_set))

#ifdef KVRT_QGEMM_X86
// F16C (every AVX2 CPU kvrt meets has it; clang's __builtin_cpu_supports does not know the name).
bool has_f16c() {
  static const bool f16c = [] {
    unsigned a = 0, b = 0, c = 0, d = 0;
    return __get_cpuid(1, &a, &b, &c, &d) != 0 && (c & bit_F16C) != 0;
  }();
  return f16c;
}
#endif

// The instruction set a quantized product runs on: kAuto's best (AVX-512F, AVX2 + F16C, plain
// C++; the bf16 dot product names AVX-512F here); one the CPU lacks falls back to plain C++.
GemmIsa resolve(GemmIsa isa) {
  static const GemmIsa best = gemm_best_isa(false);
  if (isa == GemmIsa::kAuto || isa == GemmIsa::kAvx512Bf16) isa = best;
#ifdef KVRT_QGEMM_X86
  if (isa == GemmIsa::kAvx2 && !has_f16c()) return GemmIsa::kScalar;
#endif
  return gemm_isa_supported(isa) ? isa : GemmIsa::kScalar;
}

bool has_vnni() {
#ifdef KVRT_QGEMM_X86
  static const bool vnni =
      __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw");
  return vnni;
#else
  return false;
#endif
}

// `integer`: x as int8 codes, multiplied as integers (VNNI on AVX-512, vpmaddubsw on AVX2).
const Kernels& int4_kernels(GemmIsa isa, bool integer, const Int4Format& f) {
  switch (isa) {
#ifdef KVRT_QGEMM_X86
    case GemmIsa::kAvx2:
      return integer ? KVRT_PICK_INT4(Int4Avx2Int8) : KVRT_PICK_INT4(Int4Avx2);
    case GemmIsa::kAvx512:
      return integer ? KVRT_PICK_INT4(Int4Vnni) : KVRT_PICK_INT4(Int4Avx512);
#endif
    default:
      return KVRT_PICK_INT4(Int4Scalar);
  }
}
#undef KVRT_PICK_INT4

const Kernels& fp8_bf16_kernels() {
#ifdef KVRT_QGEMM_X86
  return Fp8Bf16_set;
#else
  return Fp8Scalar_set;
#endif
}

const Kernels& fp8_kernels(GemmIsa isa) {
  switch (isa) {
#ifdef KVRT_QGEMM_X86
    case GemmIsa::kAvx2:
      return Fp8Avx2_set;
    case GemmIsa::kAvx512:
      return Fp8Avx512_set;
#endif
    default:
      return Fp8Scalar_set;
  }
}

// x as the kernels read it: padded with zeros to whole groups, and as Activations says (f32,
// rounded to bf16, or int8 codes with their scales and sums, which the f32 kernels read back as
// code * scale); with `sums`, each row's sum per group of what the kernels multiply.
struct PreparedX {
  const float* x;
  size_t ldx;
  const int8_t* xq = nullptr;
  const float* xscale = nullptr;
  const int32_t* qsum = nullptr;
  const float* xsum = nullptr;
  const uint16_t* xb = nullptr;
};

PreparedX prepare_x(const float* x, size_t ldx, size_t m, size_t k, size_t group,
                    Activations mode, bool sums) {
  const size_t groups = ceil_div(k, group), kp = groups * group;
  thread_local std::vector<float> padded, xsum, xscale;
  thread_local std::vector<uint16_t> rounded;
  thread_local std::vector<int8_t> xq;
  thread_local std::vector<int32_t> qsum;
  PreparedX out{x, ldx};
  if (kp == k && mode == Activations::kF32 && !sums) return out;
  padded.assign(m * kp, 0.0f);
  for (size_t r = 0; r < m; ++r) std::copy(x + r * ldx, x + r * ldx + k, padded.data() + r * kp);
  if (mode == Activations::kBf16) {
    rounded.resize(m * kp);
    f32_to_bf16(padded.data(), rounded.data(), m * kp);
    bf16_to_f32(rounded.data(), padded.data(), m * kp);
    out.xb = rounded.data();
  } else if (mode == Activations::kInt8) {
    xq.resize(m * kp);
    xscale.resize(m * groups);
    qsum.resize(m * groups);
    for (size_t r = 0; r < m; ++r) {
      float* row = padded.data() + r * kp;
      quantize_groups_int8(row, kp, group, xq.data() + r * kp, xscale.data() + r * groups,
                           qsum.data() + r * groups, row);
    }
    out.xq = xq.data();
    out.xscale = xscale.data();
    out.qsum = qsum.data();
  }
  out.x = padded.data();
  out.ldx = kp;
  if (sums) {
    xsum.assign(m * groups, 0.0f);
    for (size_t r = 0; r < m; ++r) {
      for (size_t g = 0; g < groups; ++g) {
        float s = 0;
        for (size_t i = 0; i < group; ++i) s += padded[r * kp + g * group + i];
        xsum[r * groups + g] = s;
      }
    }
    out.xsum = xsum.data();
  }
  return out;
}

// The product over panels, in blocks of panels that stay in L2 while every block of rows passes
// over them, the blocks split over the threads.
void run_panels(const PreparedX& px, size_t m, size_t k, size_t group, const uint8_t* packed,
                size_t panel_bytes, size_t n, const Kernels& kern, float* y, size_t ldy,
                int threads) {
  const size_t groups = ceil_div(k, group);
  const size_t panels = panel_count(n);
  const size_t per_block =
      m <= kern.mr ? 1 : std::clamp<size_t>((size_t{256} << 10) / (2 * panel_bytes), 1, 8);
  const size_t blocks = ceil_div(panels, per_block);
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && blocks > 1)
  for (size_t b = 0; b < blocks; ++b) {
    const size_t p0 = b * per_block, p1 = std::min(panels, p0 + per_block);
    for (size_t r = 0; r < m; r += kern.mr) {
      const size_t rows = std::min(kern.mr, m - r);
      const size_t rg = r * groups;
      for (size_t p = p0; p < p1; ++p) {
        const Args a{px.x + r * px.ldx,
                     px.ldx,
                     px.xq != nullptr ? px.xq + r * px.ldx : nullptr,
                     px.xscale != nullptr ? px.xscale + rg : nullptr,
                     px.qsum != nullptr ? px.qsum + rg : nullptr,
                     px.xsum != nullptr ? px.xsum + rg : nullptr,
                     px.xb != nullptr ? px.xb + r * px.ldx : nullptr,
                     groups,
                     group,
                     packed + p * panel_bytes,
                     y + r * ldy + p * kNr,
                     ldy,
                     std::min(kNr, n - p * kNr)};
        kern.fn[rows - 1](a);
      }
    }
  }
}

void zero_rows(size_t m, size_t n, float* y, size_t ldy) {
  for (size_t r = 0; r < m; ++r) std::fill(y + r * ldy, y + r * ldy + n, 0.0f);
}

}  // namespace

bool scales_are_bf16(const float* scales, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, &scales[i], 4);
    if ((bits & 0xFFFFu) != 0) return false;
  }
  return true;
}

size_t packed_int4_bytes(size_t n, size_t k, const Int4Format& f) {
  return panel_count(n) * int4_panel_bytes(k, f);
}

void pack_int4(const uint8_t* codes, const float* scales, const uint8_t* zeros, size_t n, size_t k,
               const Int4Format& f, uint8_t* packed) {
  const size_t groups = ceil_div(k, f.group), panel_bytes = int4_panel_bytes(k, f);
  std::fill(packed, packed + packed_int4_bytes(n, k, f), uint8_t{0});
  for (size_t j = 0; j < n; ++j) {
    const size_t c = j % kNr;
    uint8_t* panel = packed + (j / kNr) * panel_bytes;
    for (size_t g = 0; g < groups; ++g) {
      uint8_t* p = panel + g * int4_group_bytes(f);
      const float s = scales[j * groups + g];
      if (f.bf16_scales) {
        uint32_t bits;
        std::memcpy(&bits, &s, 4);
        const uint16_t b = static_cast<uint16_t>(bits >> 16);
        std::memcpy(p + 2 * c, &b, 2);
      } else {
        std::memcpy(p + 4 * c, &s, 4);
      }
      const uint8_t z = f.zero_points ? zeros[j * groups + g] : uint8_t{8};
      if (f.zero_points) p[int4_scale_bytes(f) + c] = z;
      uint8_t* dst = p + int4_header(f);
      for (size_t i = 0; i < f.group; ++i) {
        const size_t at = g * f.group + i;
        // Past k: the zero point, a weight of 0.
        const uint32_t u = at < k ? codes[j * k + at] & 0xFu : z & 0xFu;
        uint32_t lane;
        std::memcpy(&lane, dst + (i / 8) * 64 + c * 4, 4);
        lane |= u << nibble_shift(i % 8);
        std::memcpy(dst + (i / 8) * 64 + c * 4, &lane, 4);
      }
    }
  }
  // Padded rows past n: codes at 8 with zero scales, so they add nothing.
  for (size_t j = n; j < panel_count(n) * kNr; ++j) {
    const size_t c = j % kNr;
    uint8_t* panel = packed + (j / kNr) * panel_bytes;
    for (size_t g = 0; g < groups; ++g) {
      uint8_t* dst = panel + g * int4_group_bytes(f) + int4_header(f);
      for (size_t t = 0; t < f.group / 8; ++t) {
        const uint32_t eights = 0x88888888u;
        std::memcpy(dst + t * 64 + c * 4, &eights, 4);
      }
      if (f.zero_points) panel[g * int4_group_bytes(f) + int4_scale_bytes(f) + c] = 8;
    }
  }
}

const char* int4_int8_kernel() {
  const GemmIsa best = resolve(GemmIsa::kAuto);
  if (best == GemmIsa::kAvx512 && has_vnni()) return "avx512vnni";
  if (best == GemmIsa::kAvx512 || best == GemmIsa::kAvx2) return "avx2";
  return "scalar";
}

void matmul_packed_int4(const float* x, size_t ldx, size_t m, size_t k, const uint8_t* packed,
                        size_t n, const Int4Format& f, float* y, size_t ldy, int threads,
                        GemmIsa isa, Activations activations) {
  if (m == 0 || n == 0) return;
  if (k == 0) return zero_rows(m, n, y, ldy);
  GemmIsa run = resolve(isa);
  // int8 x multiplied as integers: VNNI, or AVX2 where AVX-512 has none.
  if (activations == Activations::kInt8 && run == GemmIsa::kAvx512 && !has_vnni()) {
    run = resolve(GemmIsa::kAvx2);
  }
  const bool integer = activations == Activations::kInt8 &&
                       (run == GemmIsa::kAvx512 || run == GemmIsa::kAvx2);
  // The scalar kernels and AVX2's f32 one take zero points per weight; AVX-512F per group, with
  // x's sums (the integer kernels with its codes' sums).
  const bool sums = f.zero_points && run == GemmIsa::kAvx512 && !integer;
  const PreparedX px = prepare_x(x, ldx, m, k, f.group, activations, sums);
  run_panels(px, m, k, f.group, packed, int4_panel_bytes(k, f), n, int4_kernels(run, integer, f),
             y, ldy, threads);
}

size_t packed_fp8_bytes(size_t n, size_t k, const Fp8Format& f) {
  return panel_count(n) * fp8_panel_bytes(k, f);
}

void pack_fp8(const uint8_t* codes, const float* scales, size_t n, size_t k, const Fp8Format& f,
              uint8_t* packed) {
  const size_t groups = ceil_div(k, f.block_k), panel_bytes = fp8_panel_bytes(k, f);
  std::fill(packed, packed + packed_fp8_bytes(n, k, f), uint8_t{0});
  for (size_t j = 0; j < n; ++j) {
    const size_t c = j % kNr;
    uint8_t* panel = packed + (j / kNr) * panel_bytes;
    for (size_t g = 0; g < groups; ++g) {
      uint8_t* p = panel + g * fp8_group_bytes(f);
      // Times 256: the decoded codes are their values / 256.
      const float s = scales[(j / f.block_n) * groups + g] * 256.0f;
      std::memcpy(p + 4 * c, &s, 4);
      uint8_t* dst = p + kFp8Header;
      for (size_t i = 0; i < f.block_k; ++i) {
        const size_t at = g * f.block_k + i;
        dst[(i / 2) * 32 + c * 2 + (i & 1)] = at < k ? codes[j * k + at] : uint8_t{0};
      }
    }
  }
}

void matmul_packed_fp8(const float* x, size_t ldx, size_t m, size_t k, const uint8_t* packed,
                       size_t n, const Fp8Format& f, float* y, size_t ldy, int threads,
                       GemmIsa isa, Activations activations) {
  if (m == 0 || n == 0) return;
  if (k == 0) return zero_rows(m, n, y, ldy);
  GemmIsa run = resolve(isa);
#ifdef KVRT_QGEMM_X86
  if (run == GemmIsa::kAvx512 && !__builtin_cpu_supports("avx512bw")) run = resolve(GemmIsa::kAvx2);
#endif
  // x rounded to bf16 meets the codes in the bf16 dot product where the CPU has it (kAuto, or
  // kAvx512Bf16 named; kAvx512 named keeps the f32 kernel).
  const bool dot = activations == Activations::kBf16 &&
                   (isa == GemmIsa::kAuto || isa == GemmIsa::kAvx512Bf16) &&
                   gemm_isa_supported(GemmIsa::kAvx512Bf16);
  const PreparedX px = prepare_x(x, ldx, m, k, f.block_k, activations, /*sums=*/false);
  run_panels(px, m, k, f.block_k, packed, fp8_panel_bytes(k, f), n,
             dot ? fp8_bf16_kernels() : fp8_kernels(run), y, ldy, threads);
}

}  // namespace kvrt::kernels
