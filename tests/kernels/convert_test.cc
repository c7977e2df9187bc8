// Tests of the CPU conversion kernels: known E4M3 / bf16 rounding cases, and bit-exact agreement of
// the SIMD kernels with the scalar references on every SIMD target this CPU supports (dispatch is
// forced to each target in turn, so the non-best targets are tested too).
#include "kernels/cpu/convert.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <iostream>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "hwy/targets.h"

namespace kvrt::kernels {
namespace {

constexpr float kNaN = std::numeric_limits<float>::quiet_NaN();
constexpr float kInf = std::numeric_limits<float>::infinity();

uint32_t Bits(float x) { return std::bit_cast<uint32_t>(x); }
float FromBits(uint32_t bits) { return std::bit_cast<float>(bits); }
bool IsNaNCode(uint8_t code) { return (code & 0x7F) == 0x7F; }
bool IsBf16NaN(uint16_t bits) { return (bits & 0x7F80) == 0x7F80 && (bits & 0x007F) != 0; }

// Runs fn() once per compiled-in SIMD target the CPU supports, with dispatch forced to it.
template <class Fn>
void ForEachTarget(const Fn& fn) {
  struct Restore {
    ~Restore() { hwy::SetSupportedTargetsForTest(0); }
  } restore;
  for (int64_t target : hwy::SupportedAndGeneratedTargets()) {
    hwy::SetSupportedTargetsForTest(target);
    SCOPED_TRACE(std::string("SIMD target ") + hwy::TargetName(target));
    ASSERT_STREQ(simd_target(), hwy::TargetName(target));
    fn();
  }
}

std::vector<uint8_t> SimdE4M3(const std::vector<float>& in, float inv_scale = 1.0f) {
  std::vector<uint8_t> out(in.size());
  f32_to_e4m3(in.data(), out.data(), in.size(), inv_scale);
  return out;
}

std::vector<uint8_t> ReferenceE4M3(const std::vector<float>& in, float inv_scale = 1.0f) {
  std::vector<uint8_t> out(in.size());
  reference::f32_to_e4m3(in.data(), out.data(), in.size(), inv_scale);
  return out;
}

// Expects both the reference and every SIMD target to encode in[i] as expected[i].
void ExpectEncodes(const std::vector<float>& in, const std::vector<uint8_t>& expected) {
  ASSERT_EQ(in.size(), expected.size());
  const std::vector<uint8_t> ref = ReferenceE4M3(in);
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(+ref[i], +expected[i]) << "reference, input " << in[i];
  }
  ForEachTarget([&] {
    const std::vector<uint8_t> simd = SimdE4M3(in);
    for (size_t i = 0; i < in.size(); ++i) {
      EXPECT_EQ(+simd[i], +expected[i]) << "SIMD, input " << in[i];
    }
  });
}

// A mix of values that stress E4M3 and bf16 rounding: arbitrary bit patterns (NaN, inf,
// subnormal f32), values across the E4M3 range, and values within a few ulps of E4M3 midpoints.
std::vector<float> RandomFloats(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_real_distribution<float> exponent(-24.0f, 10.0f);
  std::uniform_int_distribution<int> code(0, 0x7D);
  std::uniform_int_distribution<int> nudge(-3, 3);
  std::vector<float> out(n);
  for (size_t i = 0; i < n; ++i) {
    const float sign = (any_bits(rng) & 1) ? -1.0f : 1.0f;
    switch (i % 4) {
      case 0:
        out[i] = FromBits(any_bits(rng));
        break;
      case 1:
        out[i] = sign * std::exp2(exponent(rng));
        break;
      case 2:
        out[i] = sign * std::uniform_real_distribution<float>(0.0f, 500.0f)(rng);
        break;
      default: {
        const auto c = static_cast<uint8_t>(code(rng));
        const float mid =
            (reference::e4m3_code_value(c) + reference::e4m3_code_value(c + 1)) / 2.0f;
        out[i] = sign * FromBits(Bits(mid) + nudge(rng));
      }
    }
  }
  return out;
}

// Lengths that exercise empty input, pure tails, whole vectors plus tails, and long runs.
constexpr size_t kLengths[] = {0, 1, 3, 7, 15, 17, 33, 1000};

// Every 4099th f32 bit pattern (4099 is odd, so all low-bit residues are visited).
std::vector<float> BitPatternSweep() {
  std::vector<float> out;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 4099) {
    out.push_back(FromBits(static_cast<uint32_t>(bits)));
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// E4M3

TEST(E4M3, DecodesAllCodesExactly) {
  std::vector<uint8_t> codes(256);
  for (int c = 0; c < 256; ++c) codes[c] = static_cast<uint8_t>(c);
  // Spot-check the reference against the format definition.
  EXPECT_EQ(reference::e4m3_code_value(0x38), 1.0f);
  EXPECT_EQ(reference::e4m3_code_value(0x7E), 448.0f);
  EXPECT_EQ(reference::e4m3_code_value(0xFE), -448.0f);
  EXPECT_EQ(reference::e4m3_code_value(0x08), std::ldexp(1.0f, -6));
  EXPECT_EQ(reference::e4m3_code_value(0x07), 7 * std::ldexp(1.0f, -9));
  EXPECT_EQ(reference::e4m3_code_value(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(Bits(reference::e4m3_code_value(0x80)), Bits(-0.0f));
  EXPECT_TRUE(std::isnan(reference::e4m3_code_value(0x7F)));
  EXPECT_TRUE(std::isnan(reference::e4m3_code_value(0xFF)));

  ForEachTarget([&] {
    std::vector<float> out(256);
    e4m3_to_f32(codes.data(), out.data(), 256, 1.0f);
    for (int c = 0; c < 256; ++c) {
      const float expected = reference::e4m3_code_value(static_cast<uint8_t>(c));
      if (IsNaNCode(static_cast<uint8_t>(c))) {
        EXPECT_TRUE(std::isnan(out[c])) << "code " << c;
      } else {
        EXPECT_EQ(Bits(out[c]), Bits(expected)) << "code " << c;
      }
    }
    // Scaled decode from an unaligned start with a tail.
    std::vector<float> scaled(255);
    e4m3_to_f32(codes.data() + 1, scaled.data(), 255, 0.375f);
    for (int c = 1; c < 256; ++c) {
      const float expected = reference::e4m3_code_value(static_cast<uint8_t>(c)) * 0.375f;
      if (!IsNaNCode(static_cast<uint8_t>(c))) {
        EXPECT_EQ(scaled[c - 1], expected) << c;
      }
    }
  });
}

TEST(E4M3, EveryCodeRoundTrips) {
  std::vector<float> values;
  std::vector<uint8_t> codes;
  for (int c = 0; c < 256; ++c) {
    if (IsNaNCode(static_cast<uint8_t>(c))) continue;
    values.push_back(reference::e4m3_code_value(static_cast<uint8_t>(c)));
    codes.push_back(static_cast<uint8_t>(c));  // includes 0x00 = +0 and 0x80 = -0
  }
  ExpectEncodes(values, codes);
}

TEST(E4M3, MidpointsRoundToEvenCodeAndNeighborsToNearest) {
  std::vector<float> in;
  std::vector<uint8_t> expected;
  auto add = [&](float x, uint8_t code) {
    in.push_back(x);
    expected.push_back(code);
    in.push_back(-x);
    expected.push_back(code | 0x80);
  };
  // Positive codes 0x00..0x7E increase in value; each adjacent pair has one even code.
  for (uint8_t c = 0; c < 0x7E; ++c) {
    const float lo = reference::e4m3_code_value(c);
    const float hi = reference::e4m3_code_value(c + 1);
    const float mid = (lo + hi) / 2.0f;  // exact: both have at most 4 significant bits
    add(mid, c % 2 == 0 ? c : static_cast<uint8_t>(c + 1));
    add(std::nextafter(mid, kInf), c + 1);
    add(std::nextafter(mid, 0.0f), c);
  }
  ExpectEncodes(in, expected);
}

TEST(E4M3, SaturatesFiniteAndInfinityAndKeepsNaN) {
  const std::vector<float> big = {448.0f, 448.5f, 463.0f, 464.0f,  479.0f,
                                  480.0f, 1e4f,   1e30f,  FLT_MAX, kInf};
  std::vector<float> in;
  std::vector<uint8_t> expected;
  for (float x : big) {
    in.push_back(x);
    expected.push_back(0x7E);
    in.push_back(-x);
    expected.push_back(0xFE);
  }
  in.push_back(kNaN);
  expected.push_back(0x7F);
  in.push_back(-kNaN);
  expected.push_back(0xFF);
  ExpectEncodes(in, expected);

  // A large inv_scale saturates rather than overflowing into the NaN code.
  const std::vector<float> ones = {1.0f, -1.0f, 3.0f};
  EXPECT_EQ(ReferenceE4M3(ones, 1e30f), (std::vector<uint8_t>{0x7E, 0xFE, 0x7E}));
  ForEachTarget([&] {
    EXPECT_EQ(SimdE4M3(ones, 1e30f), (std::vector<uint8_t>{0x7E, 0xFE, 0x7E}));
  });
}

TEST(E4M3, RoundsSubnormalsAndTinyValues) {
  const float u = std::ldexp(1.0f, -10);  // half of the smallest subnormal 2^-9
  ExpectEncodes({u, 3 * u, 5 * u, 7 * u, 13 * u, 15 * u, 2 * u, u / 2, std::nextafter(u, 1.0f),
                 std::nextafter(u, 0.0f), FLT_TRUE_MIN, -FLT_TRUE_MIN, -u, 0.0f, -0.0f,
                 std::ldexp(1.0f, -6), std::ldexp(1.0f, -7)},
                {0x00, 0x02, 0x02, 0x04, 0x06, 0x08, 0x01, 0x00, 0x01, 0x00, 0x00, 0x80, 0x80, 0x00,
                 0x80, 0x08, 0x04});
}

TEST(E4M3, AppliesInvScaleBeforeRounding) {
  // 896 * 0.5 = 448; 0.75 * 4 = 3 (code 0x44); 2^-12 * 8 = 2^-9 (code 0x01).
  const std::vector<float> in = {896.0f, 0.75f, std::ldexp(1.0f, -12)};
  const std::vector<float> inv = {0.5f, 4.0f, 8.0f};
  const std::vector<uint8_t> expected = {0x7E, 0x44, 0x01};
  for (size_t i = 0; i < in.size(); ++i) {
    EXPECT_EQ(+ReferenceE4M3({in[i]}, inv[i])[0], +expected[i]);
  }
  ForEachTarget([&] {
    for (size_t i = 0; i < in.size(); ++i) EXPECT_EQ(+SimdE4M3({in[i]}, inv[i])[0], +expected[i]);
  });
}

TEST(E4M3, SimdMatchesReferenceOnRandomInputs) {
  const std::vector<float> data = RandomFloats(1100, 1234);
  const float inv_scales[] = {1.0f, 0.5f, 1.0f / 3.0f, 37.25f, 1e-3f};
  std::vector<std::vector<uint8_t>> refs;
  for (float inv : inv_scales) refs.push_back(ReferenceE4M3(data, inv));
  for (size_t s = 0; s < refs.size(); ++s) {
    for (size_t i = 0; i < data.size(); ++i) {
      if (std::isfinite(data[i])) {
        ASSERT_FALSE(IsNaNCode(refs[s][i])) << data[i];
      }
    }
  }
  ForEachTarget([&] {
    for (size_t s = 0; s < refs.size(); ++s) {
      for (size_t n : kLengths) {
        for (size_t offset : {size_t{0}, size_t{1}, size_t{3}}) {  // unaligned starts
          std::vector<uint8_t> out(n + 2, 0xAA);
          f32_to_e4m3(data.data() + offset, out.data() + 1, n, inv_scales[s]);
          for (size_t i = 0; i < n; ++i) {
            ASSERT_EQ(+out[i + 1], +refs[s][offset + i])
                << "n " << n << " offset " << offset << " i " << i << " x " << data[offset + i]
                << " inv_scale " << inv_scales[s];
          }
          EXPECT_EQ(out[0], 0xAA);  // nothing written outside [0, n)
          EXPECT_EQ(out[n + 1], 0xAA);
        }
      }
    }
  });
}

TEST(E4M3, SimdMatchesReferenceOnBitPatternSweep) {
  const std::vector<float> data = BitPatternSweep();
  const std::vector<uint8_t> ref = ReferenceE4M3(data);
  ForEachTarget([&] {
    const std::vector<uint8_t> simd = SimdE4M3(data);
    for (size_t i = 0; i < data.size(); ++i) {
      ASSERT_EQ(+simd[i], +ref[i]) << "bits 0x" << std::hex << Bits(data[i]);
    }
  });
}

TEST(E4M3, Bf16InputMatchesReference) {
  std::vector<uint16_t> data(1100);
  const std::vector<float> f = RandomFloats(data.size(), 99);
  reference::f32_to_bf16(f.data(), data.data(), f.size());
  std::vector<uint8_t> ref(data.size());
  reference::bf16_to_e4m3(data.data(), ref.data(), data.size(), 0.25f);
  ForEachTarget([&] {
    for (size_t n : kLengths) {
      std::vector<uint8_t> out(n);
      bf16_to_e4m3(data.data() + 1, out.data(), n, 0.25f);
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(+out[i], +ref[i + 1]) << "n " << n << " i " << i;
    }
  });
}

// ---------------------------------------------------------------------------------------------
// bf16

TEST(Bf16, RoundsToNearestEven) {
  const std::vector<uint32_t> in = {
      0x3F808000,  // tie, even below -> 0x3F80
      0x3F818000,  // tie, even above -> 0x3F82
      0x3F808001, 0x3F807FFF, 0xBF818000,
      0x7F7F8000,              // tie at the top: rounds to the even pattern, inf
      0x7F7FFFFF,              // FLT_MAX is closer to 2^128 than to the largest bf16
      0x7F7F7FFF,              // just below that tie: largest finite bf16
      0x00008000, 0x00018000,  // subnormal ties
      0x7F800000, 0xFF800000, 0x80000000, 0x00000000};
  const std::vector<uint16_t> expected = {0x3F80, 0x3F82, 0x3F81, 0x3F80, 0xBF82, 0x7F80, 0x7F80,
                                          0x7F7F, 0x0000, 0x0002, 0x7F80, 0xFF80, 0x8000, 0x0000};
  std::vector<float> f(in.size());
  for (size_t i = 0; i < in.size(); ++i) f[i] = FromBits(in[i]);
  std::vector<uint16_t> out(in.size());
  reference::f32_to_bf16(f.data(), out.data(), f.size());
  EXPECT_EQ(out, expected) << "reference";
  ForEachTarget([&] {
    std::vector<uint16_t> simd(in.size());
    f32_to_bf16(f.data(), simd.data(), f.size());
    EXPECT_EQ(simd, expected);
  });
}

TEST(Bf16, NaNStaysQuietNaNWithSign) {
  // 0x7F800001 would truncate to inf; it must stay NaN.
  const std::vector<float> in = {FromBits(0x7F800001), FromBits(0xFF800001), FromBits(0x7FC00000),
                                 FromBits(0x7FFFFFFF)};
  const std::vector<uint16_t> expected = {0x7FC0, 0xFFC0, 0x7FC0, 0x7FFF};
  std::vector<uint16_t> out(in.size());
  reference::f32_to_bf16(in.data(), out.data(), in.size());
  EXPECT_EQ(out, expected) << "reference";
  ForEachTarget([&] {
    std::vector<uint16_t> simd(in.size());
    f32_to_bf16(in.data(), simd.data(), in.size());
    EXPECT_EQ(simd, expected);
  });
}

TEST(Bf16, AllPatternsRoundTripThroughF32) {
  std::vector<uint16_t> all(65536);
  for (uint32_t p = 0; p < 65536; ++p) all[p] = static_cast<uint16_t>(p);
  ForEachTarget([&] {
    std::vector<float> wide(all.size());
    bf16_to_f32(all.data(), wide.data(), all.size());
    std::vector<uint16_t> back(all.size());
    f32_to_bf16(wide.data(), back.data(), wide.size());
    for (uint32_t p = 0; p < 65536; ++p) {
      ASSERT_EQ(Bits(wide[p]), p << 16) << "widening 0x" << std::hex << p;
      if (IsBf16NaN(static_cast<uint16_t>(p))) {
        ASSERT_TRUE(IsBf16NaN(back[p])) << std::hex << p;
        ASSERT_EQ(back[p] & 0x8000, p & 0x8000) << std::hex << p;
      } else {
        ASSERT_EQ(back[p], p) << std::hex << p;
      }
    }
  });
}

TEST(Bf16, SimdMatchesReferenceOnRandomInputsAndSweep) {
  for (const std::vector<float>& data : {RandomFloats(1100, 7), BitPatternSweep()}) {
    std::vector<uint16_t> ref(data.size());
    reference::f32_to_bf16(data.data(), ref.data(), data.size());
    ForEachTarget([&] {
      std::vector<uint16_t> all(data.size());
      f32_to_bf16(data.data(), all.data(), data.size());
      for (size_t i = 0; i < data.size(); ++i) {
        ASSERT_EQ(all[i], ref[i]) << "bits 0x" << std::hex << Bits(data[i]);
      }
      for (size_t n : kLengths) {
        std::vector<uint16_t> out(n);
        f32_to_bf16(data.data() + 3, out.data(), n);
        for (size_t i = 0; i < n; ++i) ASSERT_EQ(out[i], ref[i + 3]) << "n " << n << " i " << i;
      }
    });
  }
}

// ---------------------------------------------------------------------------------------------
// abs_max

TEST(AbsMax, IgnoresNaNAndHandlesEdgeCases) {
  struct Case {
    std::vector<float> in;
    float expected;
  };
  const std::vector<Case> cases = {
      {{}, 0.0f},
      {{kNaN, -3.0f, 2.0f, kNaN}, 3.0f},
      {{kNaN, -kNaN, kNaN}, 0.0f},
      {{-kInf, 1.0f}, kInf},
      {{-0.0f}, 0.0f},
      {{FLT_TRUE_MIN, -2 * FLT_TRUE_MIN}, 2 * FLT_TRUE_MIN},
  };
  for (const Case& c : cases) {
    EXPECT_EQ(Bits(reference::abs_max_f32(c.in.data(), c.in.size())), Bits(c.expected));
  }
  ForEachTarget([&] {
    for (const Case& c : cases) {
      EXPECT_EQ(Bits(abs_max_f32(c.in.data(), c.in.size())), Bits(c.expected));
      std::vector<uint16_t> b(c.in.size());
      reference::f32_to_bf16(c.in.data(), b.data(), b.size());
      EXPECT_EQ(abs_max_bf16(b.data(), b.size()), reference::abs_max_bf16(b.data(), b.size()));
    }
    // The maximum and a NaN at every position of every short length (main loop and tail).
    for (size_t n = 1; n <= 40; ++n) {
      for (size_t pos = 0; pos < n; ++pos) {
        std::vector<float> in(n, 0.5f);
        in[pos] = -7.0f;
        in[n - 1 - pos] = kNaN;
        const float expected = (n - 1 - pos == pos) ? 0.5f : 7.0f;
        ASSERT_EQ(abs_max_f32(in.data(), n), n == 1 ? 0.0f : expected) << n << " " << pos;
        std::vector<uint16_t> b(n);
        reference::f32_to_bf16(in.data(), b.data(), n);
        ASSERT_EQ(abs_max_bf16(b.data(), n), n == 1 ? 0.0f : expected) << n << " " << pos;
      }
    }
  });
}

TEST(AbsMax, SimdMatchesReference) {
  const std::vector<float> data = RandomFloats(1100, 5);
  std::vector<uint16_t> b(data.size());
  reference::f32_to_bf16(data.data(), b.data(), b.size());
  ForEachTarget([&] {
    for (size_t n : kLengths) {
      for (size_t start = 0; start + n <= data.size(); start += 97) {
        ASSERT_EQ(Bits(abs_max_f32(data.data() + start, n)),
                  Bits(reference::abs_max_f32(data.data() + start, n)));
        ASSERT_EQ(Bits(abs_max_bf16(b.data() + start, n)),
                  Bits(reference::abs_max_bf16(b.data() + start, n)));
      }
    }
  });
}

// ---------------------------------------------------------------------------------------------
// quantize_rows

struct QuantizeCase {
  size_t rows, dim, in_stride, out_stride, scale_stride;  // strides in elements
};

// Rows of varied magnitude plus special rows: all zero, containing inf, containing NaN, tiny.
std::vector<float> QuantizeInput(const QuantizeCase& c, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal;
  std::vector<float> in(c.rows * c.in_stride, 12345.0f);  // padding must not be read as data
  for (size_t r = 0; r < c.rows; ++r) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(r * 7 % 40) - 20);
    for (size_t i = 0; i < c.dim; ++i) {
      float& x = in[r * c.in_stride + i];
      x = normal(rng) * magnitude;
      if (r % 8 == 1) x = 0.0f;
      if (r % 8 == 3 && i == c.dim / 2) x = -kInf;
      if (r % 8 == 5 && i == c.dim / 3) x = kNaN;
      if (r % 8 == 7) x *= std::ldexp(1.0f, -120);  // amax / 448 underflows below FLT_MIN
    }
  }
  return in;
}

TEST(QuantizeRows, SimdMatchesReferenceBitExact) {
  const QuantizeCase cases[] = {{9, 1, 3, 2, 1},    {9, 3, 3, 5, 2},        {9, 8, 8, 8, 1},
                                {9, 17, 20, 19, 3}, {16, 128, 128, 128, 1}, {9, 130, 133, 131, 2}};
  for (const QuantizeCase& c : cases) {
    SCOPED_TRACE("dim " + std::to_string(c.dim));
    const std::vector<float> in = QuantizeInput(c, static_cast<uint32_t>(c.dim));
    std::vector<uint16_t> in_bf16(in.size());
    reference::f32_to_bf16(in.data(), in_bf16.data(), in.size());
    const size_t out_size = c.rows * c.out_stride;
    const size_t scales_size = c.rows * c.scale_stride;
    std::vector<uint8_t> ref_codes(out_size, 0xAA), ref_bf16_codes(out_size, 0xAA);
    std::vector<float> ref_scales(scales_size, -1.0f), ref_bf16_scales(scales_size, -1.0f);
    reference::quantize_rows_e4m3_f32(in.data(), c.in_stride, c.rows, c.dim, ref_codes.data(),
                                      c.out_stride, ref_scales.data(), c.scale_stride);
    reference::quantize_rows_e4m3_bf16(in_bf16.data(), c.in_stride, c.rows, c.dim,
                                       ref_bf16_codes.data(), c.out_stride, ref_bf16_scales.data(),
                                       c.scale_stride);
    ForEachTarget([&] {
      std::vector<uint8_t> codes(out_size, 0xAA);
      std::vector<float> scales(scales_size, -1.0f);
      quantize_rows_e4m3_f32(in.data(), c.in_stride, c.rows, c.dim, codes.data(), c.out_stride,
                             scales.data(), c.scale_stride);
      EXPECT_EQ(codes, ref_codes);  // includes the untouched 0xAA padding
      for (size_t i = 0; i < scales_size; ++i) EXPECT_EQ(Bits(scales[i]), Bits(ref_scales[i]));

      std::fill(codes.begin(), codes.end(), 0xAA);
      std::fill(scales.begin(), scales.end(), -1.0f);
      quantize_rows_e4m3_bf16(in_bf16.data(), c.in_stride, c.rows, c.dim, codes.data(),
                              c.out_stride, scales.data(), c.scale_stride);
      EXPECT_EQ(codes, ref_bf16_codes);
      for (size_t i = 0; i < scales_size; ++i) {
        EXPECT_EQ(Bits(scales[i]), Bits(ref_bf16_scales[i]));
      }
    });
  }
}

TEST(QuantizeRows, DequantizedErrorWithinHalfUlpAndScaleIsAmaxOver448) {
  const QuantizeCase c = {40, 128, 128, 128, 1};
  std::mt19937 rng(42);
  std::normal_distribution<float> normal;
  std::vector<float> in(c.rows * c.dim);
  for (size_t r = 0; r < c.rows; ++r) {
    const float magnitude = std::ldexp(1.0f, static_cast<int>(r) - 20);  // 2^-20 .. 2^19
    for (size_t i = 0; i < c.dim; ++i) in[r * c.dim + i] = normal(rng) * magnitude;
  }
  ForEachTarget([&] {
    std::vector<uint8_t> codes(in.size());
    std::vector<float> scales(c.rows);
    quantize_rows_e4m3_f32(in.data(), c.in_stride, c.rows, c.dim, codes.data(), c.out_stride,
                           scales.data(), c.scale_stride);
    for (size_t r = 0; r < c.rows; ++r) {
      const float* x = &in[r * c.dim];
      const float amax = reference::abs_max_f32(x, c.dim);
      const float s = scales[r];
      ASSERT_EQ(s, amax / 448.0f) << "row " << r;
      std::vector<float> deq(c.dim);
      e4m3_to_f32(&codes[r * c.dim], deq.data(), c.dim, s);
      for (size_t i = 0; i < c.dim; ++i) {
        // With y = fl(x * fl(1/s)) and q its E4M3 rounding, RNE gives |y - q| <= 2^-4 |y| in the
        // normal range and <= 2^-10 (half of the subnormal step 2^-9) below it. Multiplying by s
        // and adding the f32 rounding of 1/s, x * inv and q * s (each <= 2^-24 relative) gives
        // |x - q*s| <= 2^-4 |x| + 2^-10 s + 2^-21 (|x| + s).
        const float ax = std::fabs(x[i]);
        const float bound = std::ldexp(ax, -4) + std::ldexp(s, -10) + std::ldexp(ax + s, -21);
        ASSERT_LE(std::fabs(x[i] - deq[i]), bound) << "row " << r << " i " << i << " x " << x[i];
        // The row maximum lands on the top code.
        if (ax == amax) {
          ASSERT_EQ(codes[r * c.dim + i] & 0x7F, 0x7E) << "row " << r;
        }
      }
    }
  });
}

TEST(QuantizeRows, SpecialRowsGiveUsableScalesAndNoNaNCodes) {
  const size_t dim = 19;
  std::vector<float> in(4 * dim, 0.0f);  // row 0: zeros
  for (size_t i = 0; i < dim; ++i) {
    in[dim + i] = i * 1e30f;                   // row 1: huge values and an inf
    in[2 * dim + i] = (i % 3) * FLT_TRUE_MIN;  // row 2: tiny
    in[3 * dim + i] = -FLT_MAX;                // row 3: huge, amax finite
  }
  in[dim + 5] = kInf;
  ForEachTarget([&] {
    std::vector<uint8_t> codes(in.size(), 0xAA);
    std::vector<float> scales(4);
    quantize_rows_e4m3_f32(in.data(), dim, 4, dim, codes.data(), dim, scales.data(), 1);
    EXPECT_EQ(scales[0], 1.0f);
    EXPECT_EQ(scales[1], FLT_MAX / 448.0f);
    EXPECT_EQ(scales[2], FLT_MIN);  // amax / 448 underflows; clamped so 1 / scale is finite
    EXPECT_EQ(scales[3], FLT_MAX / 448.0f);
    for (size_t i = 0; i < dim; ++i) {
      EXPECT_EQ(codes[i], 0x00) << i;
      EXPECT_FALSE(IsNaNCode(codes[dim + i])) << i;
      EXPECT_EQ(codes[2 * dim + i], 0x00) << i;  // 2 * FLT_TRUE_MIN / FLT_MIN = 2^-22 << 2^-10
      EXPECT_EQ(codes[3 * dim + i], 0xFE) << i;
    }
    EXPECT_EQ(codes[dim + 5], 0x7E);  // inf saturates
  });
}

// Each output of quantize_groups_int8 on every target equals the reference's, bit for bit.
void ExpectInt8GroupsMatchReference(const std::vector<float>& in, size_t group) {
  const size_t n = in.size(), groups = (n + group - 1) / group;
  std::vector<int8_t> want_q(n);
  std::vector<float> want_scales(groups), want_values(n);
  std::vector<int32_t> want_sums(groups);
  reference::quantize_groups_int8(in.data(), n, group, want_q.data(), want_scales.data(),
                                  want_sums.data(), want_values.data());
  ForEachTarget([&] {
    std::vector<int8_t> q(n, 99);
    std::vector<float> scales(groups, -1.0f), values(in);  // values in place, as prepare_x
    std::vector<int32_t> sums(groups, -1);
    quantize_groups_int8(values.data(), n, group, q.data(), scales.data(), sums.data(),
                         values.data());
    EXPECT_EQ(q, want_q) << "n " << n << ", group " << group;
    EXPECT_EQ(sums, want_sums) << "n " << n << ", group " << group;
    for (size_t g = 0; g < groups; ++g) EXPECT_EQ(Bits(scales[g]), Bits(want_scales[g])) << g;
    for (size_t i = 0; i < n; ++i) EXPECT_EQ(Bits(values[i]), Bits(want_values[i])) << i;
  });
}

TEST(QuantizeGroupsInt8, SimdMatchesReferenceBitExact) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (const size_t n : kLengths) {
    for (const size_t group : {size_t{1}, size_t{5}, size_t{8}, size_t{32}, size_t{128}}) {
      std::vector<float> gaussian(n);
      for (float& v : gaussian) v = normal(rng);
      ExpectInt8GroupsMatchReference(gaussian, group);
      ExpectInt8GroupsMatchReference(RandomFloats(n, 17 + static_cast<uint32_t>(n)), group);
    }
  }
}

TEST(QuantizeGroupsInt8, RoundsTiesToEvenAndZeroesWhatCannotBeScaled) {
  // Group 0: amax 127, so codes are the values rounded (ties to even); group 1: a NaN among
  // values; group 2: an inf (scale 0, every code 0); group 3: zeros; group 4: amax the smallest
  // subnormal, whose amax / 127 underflows (scale 0, every code 0).
  const float tiny = std::numeric_limits<float>::denorm_min();
  const std::vector<float> in = {
      127.0f, 2.5f, 3.5f, -2.5f, -0.5f, 1.49f, -126.6f, 0.0f, 1.0f, kNaN, -2.0f, 0.25f, 4.0f, 0.0f,
      0.0f,   0.0f, 1.0f, kInf,  3.0f,  -1.0f, 0.0f,    0.0f, 0.0f, 0.0f, 0.0f,  0.0f,  0.0f, 0.0f,
      0.0f,   0.0f, 0.0f, 0.0f,  tiny,  -tiny, 0.0f,    tiny, 0.0f, 0.0f, 0.0f,  0.0f};
  ForEachTarget([&] {
    std::vector<int8_t> q(in.size());
    std::vector<float> scales(5);
    std::vector<int32_t> sums(5);
    quantize_groups_int8(in.data(), in.size(), 8, q.data(), scales.data(), sums.data(), nullptr);
    EXPECT_EQ(std::vector<int8_t>(q.begin(), q.begin() + 8),
              (std::vector<int8_t>{127, 2, 4, -2, 0, 1, -127, 0}));
    EXPECT_EQ(sums[0], 127 + 2 + 4 - 2 + 1 - 127);
    EXPECT_EQ(scales[0], 1.0f);
    EXPECT_EQ(scales[1], 4.0f / 127.0f);
    EXPECT_EQ(q[9], 0);     // NaN
    EXPECT_EQ(q[12], 127);  // the group's amax
    EXPECT_EQ(scales[2], 0.0f);
    EXPECT_EQ(scales[3], 0.0f);
    for (size_t i = 16; i < in.size(); ++i) EXPECT_EQ(q[i], 0) << i;
    EXPECT_EQ(sums[2], 0);
    EXPECT_EQ(scales[4], 0.0f);
    EXPECT_EQ(sums[4], 0);
  });
}

TEST(Dispatch, PicksBestSupportedTarget) {
  const std::vector<int64_t> targets = hwy::SupportedAndGeneratedTargets();
  ASSERT_FALSE(targets.empty());
  EXPECT_STREQ(simd_target(), hwy::TargetName(targets.front()));
  std::cout << "dispatching to " << simd_target() << "\n";
}

}  // namespace
}  // namespace kvrt::kernels
