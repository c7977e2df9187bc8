// The quantized-weight products (int4 groups, fp8 blocks) against their scalar references, which
// dequantize first and sum in double: every instruction set this CPU has (the others skip,
// saying so), every m a micro-kernel or its remainder takes, cut groups and blocks (k and n not
// multiples of them), the MoE expert shapes, symmetric and asymmetric int4, bf16 and f32 scales,
// strided rows, with and without threads, x as it is, rounded to bf16 and quantized to int8
// (AVX-512 VNNI where the CPU has it); and every E4M3 code decoded as the reference decodes it.
#include "kernels/cpu/quant_gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/shared/fp8_e4m3.h"

namespace kvrt::kernels {
using shared::e4m3_decode;

namespace {

constexpr GemmIsa kIsas[] = {GemmIsa::kScalar, GemmIsa::kAvx2, GemmIsa::kAvx512};

// The activation modes and the thread counts each is run with.
struct Mode {
  Activations activations;
  int threads;
};
constexpr Mode kModes[] = {{Activations::kF32, 1},
                         {Activations::kBf16, 2},
                         {Activations::kInt8, 1},
                         {Activations::kInt8, 2}};
const char* name(Activations a) {
  return a == Activations::kF32 ? "f32" : a == Activations::kBf16 ? "bf16" : "int8";
}

struct Shape {
  size_t n, k;
};
// Cut panels and groups, synth-76m's projections, a DeepSeek-V3-style expert (of tiny-kimi-k25's
// and synth-mla's sizes), and k below one group.
constexpr Shape kShapes[] = {{16, 32}, {19, 40}, {33, 200}, {768, 768}, {256, 1024},
                             {1024, 256}, {40, 24}};
constexpr size_t kRows[] = {1, 2, 3, 6, 9, 17};
// The rows of x a shape is tried with: every remainder on the small shapes, one row and one
// past a whole micro-kernel on the large ones (whose references dominate the test's time).
std::vector<size_t> rows_for(const Shape& s) {
  if (s.n * s.k < 20000) return {std::begin(kRows), std::end(kRows)};
  return {1, 9};
}

std::vector<float> random_x(size_t m, size_t k, size_t ldx, std::mt19937& rng) {
  std::normal_distribution<float> d(0.0f, 1.0f);
  std::vector<float> x(m * ldx, 1e30f);  // the stride's gap must not be read
  for (size_t r = 0; r < m; ++r)
    for (size_t i = 0; i < k; ++i) x[r * ldx + i] = d(rng);
  return x;
}

// |y - want| <= a bound on the f32 sums' rounding: 2^-20 of sum |x| |w|, per output.
void expect_close(const std::vector<float>& y, size_t ldy, const std::vector<float>& want,
                  const std::vector<float>& bound, size_t m, size_t n, const std::string& what) {
  int bad = 0;
  for (size_t r = 0; r < m; ++r) {
    for (size_t j = 0; j < n; ++j) {
      const float got = y[r * ldy + j], w = want[r * n + j];
      if (!(std::fabs(got - w) <= bound[r * n + j] * 1e-6f + 1e-6f) && ++bad <= 3) {
        ADD_FAILURE() << what << " row " << r << " col " << j << ": " << got << " want " << w;
      }
    }
  }
  EXPECT_EQ(bad, 0) << what;
}

std::vector<float> abs_bound(const std::vector<float>& x, size_t m, size_t k,
                             const std::vector<float>& w, size_t n) {
  std::vector<float> b(m * n);
  for (size_t r = 0; r < m; ++r)
    for (size_t j = 0; j < n; ++j) {
      double s = 0;
      for (size_t i = 0; i < k; ++i) s += std::fabs(double{x[r * k + i]} * w[j * k + i]);
      b[r * n + j] = static_cast<float>(s);
    }
  return b;
}

// Compact x (ldx == k) for the references.
std::vector<float> compact(const std::vector<float>& x, size_t m, size_t k, size_t ldx) {
  std::vector<float> c(m * k);
  for (size_t r = 0; r < m; ++r)
    for (size_t i = 0; i < k; ++i) c[r * k + i] = x[r * ldx + i];
  return c;
}

float bf16_round(float v) {
  uint32_t bits;
  std::memcpy(&bits, &v, 4);
  bits = (bits + 0x7FFFu + ((bits >> 16) & 1u)) & 0xFFFF0000u;
  std::memcpy(&v, &bits, 4);
  return v;
}

// x (rows of k) as the kernels multiply it.
std::vector<float> as_multiplied(const std::vector<float>& x, size_t k, size_t group,
                                 Activations a) {
  std::vector<float> r(x);
  if (a == Activations::kBf16) {
    for (float& v : r) v = bf16_round(v);
  } else if (a == Activations::kInt8) {
    std::vector<int8_t> q(k);
    std::vector<float> scales((k + group - 1) / group);
    for (size_t row = 0; row < x.size() / k; ++row) {
      reference::quantize_groups_int8(x.data() + row * k, k, group, q.data(), scales.data(),
                                      nullptr, r.data() + row * k);
    }
  }
  return r;
}

// One packed product against its reference at every row count and mode of `s`: product(x, ldx,
// m, y, ldy, mode) runs the kernel, reference(xr, m, want) the dequantize-first reference on x as
// the mode multiplies it; w (the dequantized weights) bounds the sums. x and y are strided
// (`pad` more than k and n) and nothing may be written past n.
template <typename Product, typename Reference>
void check_every_mode(const Shape& s, size_t group, size_t pad, const std::vector<float>& w,
                      std::mt19937& rng, const std::string& what, Product product,
                      Reference reference) {
  for (size_t m : rows_for(s)) {
    const size_t ldx = s.k + pad, ldy = s.n + pad + 1;
    const std::vector<float> x = random_x(m, s.k, ldx, rng), xc = compact(x, m, s.k, ldx);
    for (const Mode run : kModes) {
      const std::vector<float> xr = as_multiplied(xc, s.k, group, run.activations);
      std::vector<float> want(m * s.n);
      reference(xr, m, want.data());
      const std::vector<float> bound = abs_bound(xr, m, s.k, w, s.n);
      std::vector<float> y(m * ldy, -7.0f);
      product(x.data(), ldx, m, y.data(), ldy, run);
      expect_close(y, ldy, want, bound, m, s.n,
                   what + " " + name(run.activations) + " n " + std::to_string(s.n) + " k " +
                       std::to_string(s.k) + " m " + std::to_string(m));
      for (size_t r = 0; r < m; ++r)
        for (size_t j = s.n; j < ldy; ++j) ASSERT_EQ(y[r * ldy + j], -7.0f);
    }
  }
}

struct Int4Case {
  size_t group;
  bool bf16_scales, zero_points;
};

class QuantGemmInt4 : public ::testing::TestWithParam<std::tuple<GemmIsa, Int4Case>> {};

TEST_P(QuantGemmInt4, MatchesTheDequantizedReference) {
  const auto [isa, c] = GetParam();
  if (!gemm_isa_supported(isa)) GTEST_SKIP() << gemm_isa_name(isa) << ": not on this CPU";
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> code(0, 15);
  std::uniform_real_distribution<float> scale(0.001f, 0.05f);
  const Int4Format f{c.group, c.bf16_scales, c.zero_points};
  for (const Shape& s : kShapes) {
    const size_t groups = (s.k + c.group - 1) / c.group;
    std::vector<uint8_t> codes(s.n * s.k), zeros;
    for (auto& v : codes) v = static_cast<uint8_t>(code(rng));
    std::vector<float> scales(s.n * groups);
    for (auto& v : scales) v = c.bf16_scales ? bf16_round(scale(rng)) : scale(rng);
    if (c.zero_points) {
      zeros.resize(s.n * groups);
      for (auto& v : zeros) v = static_cast<uint8_t>(code(rng));
    }
    ASSERT_EQ(scales_are_bf16(scales.data(), scales.size()), c.bf16_scales);
    std::vector<uint8_t> packed(packed_int4_bytes(s.n, s.k, f));
    pack_int4(codes.data(), scales.data(), zeros.empty() ? nullptr : zeros.data(), s.n, s.k, f,
              packed.data());
    std::vector<float> w(s.n * s.k);
    for (size_t j = 0; j < s.n; ++j)
      for (size_t i = 0; i < s.k; ++i) {
        const size_t g = j * groups + i / c.group;
        w[j * s.k + i] =
            (float(codes[j * s.k + i]) - (zeros.empty() ? 8.0f : float(zeros[g]))) * scales[g];
      }
    check_every_mode(
        s, c.group, 3, w, rng, gemm_isa_name(isa),
        [&](const float* x, size_t ldx, size_t m, float* y, size_t ldy, const Mode& run) {
          matmul_packed_int4(x, ldx, m, s.k, packed.data(), s.n, f, y, ldy, run.threads, isa,
                             run.activations);
        },
        [&](const std::vector<float>& xr, size_t m, float* want) {
          reference::matmul_int4(xr.data(), m, s.k, codes.data(), scales.data(),
                                 zeros.empty() ? nullptr : zeros.data(), s.n, c.group, want);
        });
  }
}

INSTANTIATE_TEST_SUITE_P(
    Formats, QuantGemmInt4,
    ::testing::Combine(::testing::ValuesIn(kIsas),
                       ::testing::Values(Int4Case{32, true, false}, Int4Case{32, false, false},
                                         Int4Case{32, true, true}, Int4Case{128, false, true},
                                         Int4Case{64, true, false}, Int4Case{8, true, false})),
    [](const auto& info) {
      const Int4Case& c = std::get<1>(info.param);
      return std::string(gemm_isa_name(std::get<0>(info.param))) + "_g" +
             std::to_string(c.group) + (c.bf16_scales ? "_bf16" : "_f32") +
             (c.zero_points ? "_asym" : "_sym");
    });

class QuantGemmFp8 : public ::testing::TestWithParam<GemmIsa> {};

TEST_P(QuantGemmFp8, MatchesTheDequantizedReference) {
  const GemmIsa isa = GetParam();
  if (!gemm_isa_supported(isa)) GTEST_SKIP() << gemm_isa_name(isa) << ": not on this CPU";
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  std::uniform_real_distribution<float> scale(0.0005f, 0.02f);
  for (const Fp8Format f : {Fp8Format{128, 128}, Fp8Format{16, 32}, Fp8Format{128, 4}}) {
    for (const Shape& s : kShapes) {
      const size_t nb = (s.n + f.block_n - 1) / f.block_n, kb = (s.k + f.block_k - 1) / f.block_k;
      std::vector<uint8_t> codes(s.n * s.k);
      for (auto& v : codes) {
        v = static_cast<uint8_t>(byte(rng));
        if ((v & 0x7F) == 0x7F) v ^= 1;  // no NaN codes: a checkpoint's weights are finite
      }
      std::vector<float> scales(nb * kb);
      for (auto& v : scales) v = scale(rng);
      std::vector<uint8_t> packed(packed_fp8_bytes(s.n, s.k, f));
      pack_fp8(codes.data(), scales.data(), s.n, s.k, f, packed.data());
      std::vector<float> w(s.n * s.k);
      for (size_t j = 0; j < s.n; ++j)
        for (size_t i = 0; i < s.k; ++i)
          w[j * s.k + i] =
              e4m3_decode(codes[j * s.k + i]) * scales[(j / f.block_n) * kb + i / f.block_k];
      check_every_mode(
          s, f.block_k, 1, w, rng,
          std::string(gemm_isa_name(isa)) + " block " + std::to_string(f.block_n) + "x" +
              std::to_string(f.block_k),
          [&](const float* x, size_t ldx, size_t m, float* y, size_t ldy, const Mode& run) {
            matmul_packed_fp8(x, ldx, m, s.k, packed.data(), s.n, f, y, ldy, run.threads, isa,
                              run.activations);
          },
          [&](const std::vector<float>& xr, size_t m, float* want) {
            reference::matmul_fp8(xr.data(), m, s.k, codes.data(), scales.data(), s.n, f, want);
          });
    }
  }
}

// Each finite code alone (one weight of 1 at a time, scale 1): the kernel's value is the
// reference's exactly, subnormals and signs included.
TEST_P(QuantGemmFp8, EveryFiniteCodeDecodesExactly) {
  const GemmIsa isa = GetParam();
  if (!gemm_isa_supported(isa)) GTEST_SKIP() << gemm_isa_name(isa) << ": not on this CPU";
  const Fp8Format f{16, 4};
  const size_t n = 256, k = 4;
  std::vector<uint8_t> codes(n * k, 0);
  for (size_t j = 0; j < n; ++j) codes[j * k + j % k] = static_cast<uint8_t>(j);
  std::vector<float> scales(n / 16, 1.0f);
  std::vector<uint8_t> packed(packed_fp8_bytes(n, k, f));
  pack_fp8(codes.data(), scales.data(), n, k, f, packed.data());
  // Row i of x picks input i.
  std::vector<float> x(k * k, 0.0f), y(k * n);
  for (size_t i = 0; i < k; ++i) x[i * k + i] = 1.0f;
  // Also with x in bf16 (1 is exact), which the bf16 dot product takes where the CPU has it.
  for (const Activations a : {Activations::kF32, Activations::kBf16}) {
    matmul_packed_fp8(x.data(), k, k, k, packed.data(), n, f, y.data(), n, 1, isa, a);
    for (size_t j = 0; j < n; ++j) {
      if ((j & 0x7F) == 0x7F) continue;  // NaN
      EXPECT_EQ(y[(j % k) * n + j], e4m3_decode(static_cast<uint8_t>(j)))
          << "code " << j << ", x " << name(a);
    }
  }
}

// Online quantization: every int4 weight within half a step of its value (s = amax / 7.5 in
// bf16, exact in the packed header), zeros for a group of zeros; every fp8 weight within E4M3's
// half step (2^-4 of it) or, below its normal range, half its smallest step.
TEST(QuantizeWeights, Int4AndFp8ReproduceTheWeightsWithinHalfAStep) {
  std::mt19937 rng(5);
  std::normal_distribution<float> d(0.0f, 0.02f);
  const size_t n = 37, k = 200;  // a cut group and a cut block
  std::vector<float> w(n * k);
  for (float& v : w) v = d(rng);
  for (size_t i = 0; i < 32; ++i) w[3 * k + i] = 0.0f;  // row 3's first group: zeros
  w[5 * k + 7] = 1.0f;                                    // an outlier in row 5's first group
  std::vector<uint8_t> codes(n * k);
  std::vector<float> scales(n * ((k + 31) / 32));
  quantize_int4(w.data(), n, k, 32, codes.data(), scales.data());
  EXPECT_TRUE(scales_are_bf16(scales.data(), scales.size()));
  EXPECT_EQ(scales[3 * 7], 0.0f);
  for (size_t j = 0; j < n; ++j) {
    for (size_t i = 0; i < k; ++i) {
      const float s = scales[j * 7 + i / 32];
      const float back = (float(codes[j * k + i]) - 8.0f) * s;
      ASSERT_LE(std::fabs(back - w[j * k + i]), 0.5f * s * 1.0001f + 1e-9f) << j << "," << i;
    }
  }
  EXPECT_EQ(codes[5 * k + 7], 15);  // the outlier: 7.5 steps, rounded then clamped to 7
  const Fp8Format f{16, 128};
  const size_t nb = 3, kb = 2;
  std::vector<float> fs(nb * kb);
  quantize_fp8(w.data(), n, k, f, codes.data(), fs.data());
  for (size_t j = 0; j < n; ++j) {
    for (size_t i = 0; i < k; ++i) {
      const float s = fs[(j / 16) * kb + i / 128];
      const float back = e4m3_decode(codes[j * k + i]) * s, v = w[j * k + i];
      ASSERT_LE(std::fabs(back - v), std::max(std::fabs(v) / 16, s * 0.001953125f / 2) * 1.0001f)
          << j << "," << i;
    }
  }
}

// kAvx512Bf16: x in bf16 meets the codes in the bf16 dot product (fp8_bf16); other x as kAvx512.
INSTANTIATE_TEST_SUITE_P(Isas, QuantGemmFp8,
                         ::testing::Values(GemmIsa::kScalar, GemmIsa::kAvx2, GemmIsa::kAvx512,
                                           GemmIsa::kAvx512Bf16),
                         [](const auto& info) { return std::string(gemm_isa_name(info.param)); });

}  // namespace
}  // namespace kvrt::kernels
