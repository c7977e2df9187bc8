// The packed bf16-weight product against its scalar reference (row-major weights, sums in
// double), for every instruction set this CPU has (the others skip, saying so), at every m a
// micro-kernel or its remainder takes, odd k and n, k on both sides of a slice's 256, strided
// rows, with and without threads, and with x as it is and rounded to bf16 (bf16_x).
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/convert.h"

namespace kvrt::kernels {
namespace {

std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  f32_to_bf16(v.data(), out.data(), v.size());
  return out;
}

TEST(GemmPack, LayoutIsPanelsOfSixteenColumnsByPairsOfK) {
  const size_t n = 19, k = 5;  // two panels, the second of three columns; k padded to 6
  std::vector<uint16_t> w(n * k);
  for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint16_t>(i + 1);
  ASSERT_EQ(packed_bf16_size(n, k), 2u * 16 * 6);
  std::vector<uint16_t> packed(packed_bf16_size(n, k), 0xFFFF);
  pack_bf16(w.data(), n, k, packed.data());
  for (size_t p = 0; p < 2; ++p) {
    for (size_t q = 0; q < 3; ++q) {
      for (size_t c = 0; c < 16; ++c) {
        for (size_t e = 0; e < 2; ++e) {
          const size_t j = p * 16 + c, i = 2 * q + e;
          const uint16_t want = j < n && i < k ? w[j * k + i] : 0;
          EXPECT_EQ(packed[p * 16 * 6 + q * 32 + c * 2 + e], want) << j << "," << i;
        }
      }
    }
  }
  // From f32: the same bits as rounding first.
  std::vector<float> wf(n * k);
  for (size_t i = 0; i < wf.size(); ++i) wf[i] = 0.1f * static_cast<float>(i) - 3.3f;
  std::vector<uint16_t> a(packed.size()), b(packed.size());
  pack_bf16(to_bf16(wf).data(), n, k, a.data());
  pack_bf16_from_f32(wf.data(), n, k, b.data());
  EXPECT_EQ(a, b);
}

// Each instruction set with x as it is and with x rounded to bf16 first (bf16_x).
class GemmIsaTest : public ::testing::TestWithParam<std::tuple<GemmIsa, bool>> {};

TEST_P(GemmIsaTest, MatchesReference) {
  const auto [isa, bf16_x] = GetParam();
  if (!gemm_isa_supported(isa)) GTEST_SKIP() << gemm_isa_name(isa) << ": not on this CPU";
  const bool rounds = bf16_x || isa == GemmIsa::kAvx512Bf16;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (size_t m : {1u, 2u, 3u, 4u, 5u, 6u, 7u, 8u, 9u, 13u, 16u, 17u, 33u}) {
    for (size_t k : {0u, 1u, 2u, 7u, 8u, 13u, 64u, 255u, 256u, 257u, 769u}) {
      for (size_t n : {1u, 16u, 17u, 71u}) {
        // Rows further apart than k and n, as matmul_strided passes them.
        const size_t ldx = k + 3, ldy = n + 5;
        std::vector<float> x(m * ldx), dense(m * k), wf(n * k);
        for (float& v : x) v = normal(rng);
        for (float& v : wf) v = normal(rng) * 0.05f;
        for (size_t r = 0; r < m; ++r) {
          for (size_t i = 0; i < k; ++i) dense[r * k + i] = x[r * ldx + i];
        }
        if (rounds) {  // x rounded to bf16 (the dot product always rounds): so is the reference's
          const auto xb = to_bf16(dense);
          bf16_to_f32(xb.data(), dense.data(), xb.size());
        }
        const auto w = to_bf16(wf);
        std::vector<float> want(m * n);
        reference::matmul_bf16(dense.data(), m, k, w.data(), n, want.data());
        std::vector<uint16_t> packed(packed_bf16_size(n, k));
        pack_bf16(w.data(), n, k, packed.data());
        for (int threads : {1, 2}) {
          std::vector<float> y(m * ldy, -7.0f);
          matmul_packed_bf16(x.data(), ldx, m, k, packed.data(), n, y.data(), ldy, threads, isa,
                             bf16_x);
          for (size_t r = 0; r < m; ++r) {
            for (size_t j = 0; j < ldy; ++j) {
              const float got = y[r * ldy + j];
              if (j >= n) {  // past n: untouched
                ASSERT_EQ(got, -7.0f) << "wrote past n at row " << r << " column " << j;
                continue;
              }
              // f32 accumulation of k products against a double sum.
              ASSERT_NEAR(got, want[r * n + j], 1e-5 * std::sqrt(static_cast<double>(k)) + 1e-6)
                  << gemm_isa_name(isa) << (bf16_x ? " bf16_x" : "") << " m " << m << " k " << k
                  << " n " << n << " threads " << threads << " at " << r << "," << j;
            }
          }
        }
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, GemmIsaTest,
                         ::testing::Combine(::testing::Values(GemmIsa::kScalar, GemmIsa::kAvx2,
                                                              GemmIsa::kAvx512,
                                                              GemmIsa::kAvx512Bf16),
                                            ::testing::Bool()),
                         [](const auto& info) {
                           return std::string(gemm_isa_name(std::get<0>(info.param))) +
                                  (std::get<1>(info.param) ? "_bf16_x" : "");
                         });

TEST(GemmIsa, AutoIsTheBestSupported) {
  const GemmIsa best = gemm_best_isa(false);
  EXPECT_TRUE(gemm_isa_supported(best));
  EXPECT_NE(best, GemmIsa::kAvx512Bf16);  // never without being allowed to round x
  EXPECT_STREQ(gemm_isa_name(GemmIsa::kAuto), gemm_isa_name(best));
  if (gemm_isa_supported(GemmIsa::kAvx512Bf16)) {
    EXPECT_EQ(gemm_best_isa(true), GemmIsa::kAvx512Bf16);
  } else {
    EXPECT_EQ(gemm_best_isa(true), best);
  }
}

}  // namespace
}  // namespace kvrt::kernels
