// The 4-bit KV format's kernels: the fast Walsh-Hadamard transform against the dense matrix,
// its own inverse and norm-keeping; int4 codes against hand-worked rows, rounding to nearest,
// and the edge cases (zero, infinite and NaN input).
#include "kernels/cpu/int4.h"

#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <limits>
#include <random>
#include <vector>

namespace kvrt::kernels {
namespace {

std::vector<float> random_row(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0, 1);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  return x;
}

TEST(Int4, HadamardBlockIsTheLargestPowerOfTwoDividingTheRowUpToTheCap) {
  EXPECT_EQ(hadamard_block_for(8, 64), 8u);
  EXPECT_EQ(hadamard_block_for(128, 64), 64u);
  EXPECT_EQ(hadamard_block_for(576, 128), 64u);
  EXPECT_EQ(hadamard_block_for(48, 64), 16u);
  EXPECT_EQ(hadamard_block_for(6, 64), 2u);
}

TEST(Int4, HadamardMatchesTheDenseMatrixAndInvertsItself) {
  for (size_t block : {2u, 4u, 16u, 64u, 128u}) {
    const size_t n = block * 3;
    std::vector<float> x = random_row(n, static_cast<uint32_t>(block));
    std::vector<float> fast = x, dense = x;
    hadamard_blocks(fast.data(), n, block);
    reference::hadamard_blocks(dense.data(), n, block);
    double norm_x = 0, norm_h = 0;
    for (size_t i = 0; i < n; ++i) {
      EXPECT_NEAR(fast[i], dense[i], 1e-5) << "block " << block << " element " << i;
      norm_x += double{x[i]} * x[i], norm_h += double{fast[i]} * fast[i];
    }
    EXPECT_NEAR(norm_h, norm_x, 1e-5 * norm_x) << "block " << block;
    hadamard_blocks(fast.data(), n, block);
    for (size_t i = 0; i < n; ++i) EXPECT_NEAR(fast[i], x[i], 1e-5) << "block " << block;
  }
}

TEST(Int4, HadamardSpreadsAnOutlierOverItsBlock) {
  std::vector<float> x(16, 0.0f);
  x[3] = 4.0f;
  hadamard_blocks(x.data(), 16, 16);
  for (float v : x) EXPECT_FLOAT_EQ(std::fabs(v), 1.0f);  // 4 / sqrt(16) everywhere
}

TEST(Int4, CodesOfAHandWorkedRow) {
  // amax 3.5: scale 0.5; x / scale = 7, -7, 1, -0.6 (-> -1), 0.4 (-> 0), 2.5 (-> 2, to even)
  const std::vector<float> x = {3.5f, -3.5f, 0.5f, -0.3f, 0.2f, 1.25f};
  std::vector<uint8_t> codes(3);
  EXPECT_FLOAT_EQ(quantize_row_int4(x.data(), 6, codes.data()), 0.5f);
  EXPECT_EQ(codes[0], 0x97);  // 7 low, -7 (0x9) high
  EXPECT_EQ(codes[1], 0xF1);  // 1, -1
  EXPECT_EQ(codes[2], 0x20);  // 0, 2
  std::vector<float> y(6);
  dequantize_row_int4(codes.data(), 6, 0.5f, y.data());
  const std::vector<float> want = {3.5f, -3.5f, 0.5f, -0.5f, 0.0f, 1.0f};
  for (size_t i = 0; i < 6; ++i) EXPECT_FLOAT_EQ(y[i], want[i]) << i;
}

TEST(Int4, RoundsToNearestWithinHalfAStep) {
  for (uint32_t seed = 0; seed < 20; ++seed) {
    const std::vector<float> x = random_row(64, seed);
    std::vector<uint8_t> codes(32);
    const float scale = quantize_row_int4(x.data(), 64, codes.data());
    std::vector<float> y(64);
    dequantize_row_int4(codes.data(), 64, scale, y.data());
    for (size_t i = 0; i < 64; ++i) {
      EXPECT_LE(std::fabs(y[i] - x[i]), 0.5f * scale * (1 + 1e-6f)) << "seed " << seed;
    }
  }
}

TEST(Int4, ZeroInfiniteAndNaNRowsGiveFiniteScalesAndNoUndefinedCodes) {
  std::vector<uint8_t> codes(2);
  const std::vector<float> zero(4, 0.0f);
  EXPECT_EQ(quantize_row_int4(zero.data(), 4, codes.data()), 1.0f);
  EXPECT_EQ(codes[0], 0);
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const std::vector<float> odd = {inf, 1.0f, nan, -inf};
  const float scale = quantize_row_int4(odd.data(), 4, codes.data());
  EXPECT_EQ(scale, FLT_MAX / 7);
  EXPECT_EQ(codes[0], 0x07);  // +inf -> 7; 1 -> 0
  EXPECT_EQ(codes[1], 0x90);  // NaN -> 0; -inf -> -7
}

}  // namespace
}  // namespace kvrt::kernels
