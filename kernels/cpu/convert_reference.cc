// Scalar reference conversions. They follow the format definitions as directly as possible (value
// of a code from its fields, nearest representable value by search) and deliberately share no
// bit-level rounding tricks with the SIMD kernels in convert.cc, so that agreement between the two
// is evidence that both are right.
#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstring>
#include <limits>

#include "kernels/cpu/convert.h"

namespace kvrt::kernels::reference {
namespace {

constexpr float kE4M3Max = 448.0f;
constexpr uint8_t kE4M3MaxCode = 0x7E;
constexpr uint8_t kE4M3NaNCode = 0x7F;

uint32_t BitsOf(float x) {
  uint32_t bits;
  std::memcpy(&bits, &x, sizeof(bits));
  return bits;
}

float FloatOf(uint32_t bits) {
  float x;
  std::memcpy(&x, &bits, sizeof(x));
  return x;
}

// Value of a non-negative bf16 bit pattern (sign bit clear, not NaN) as a double. The pattern
// 0x7F80 (inf) counts as 2^128, the value it would have with an unbounded exponent, which is what
// round-to-nearest compares against when deciding whether a value overflows to infinity.
double Bf16MagnitudeValue(uint32_t pattern) {
  if (pattern == 0x7F80) return std::ldexp(1.0, 128);
  return static_cast<double>(FloatOf(pattern << 16));
}

// E4M3 code of a non-negative, non-NaN value by exhaustive search: the finite code whose value is
// nearest to `a`, ties to the code with an even mantissa (= even code, since adjacent codes differ
// by one). Values >= 448, including inf, saturate to 448.
//
// Exactness: distances are computed in double. When |a| >= 2^-11 the float `a` is a multiple of
// 2^-34 and every code value is a multiple of 2^-9 below 2^9, so a - v is exact (< 53 bits). When
// a < 2^-11 the nearest code is 0 by a margin far larger than any rounding error. Rounding is
// monotonic, so the comparison can never pick a farther code.
uint8_t EncodeMagnitude(float a) {
  static const std::array<double, kE4M3MaxCode + 1> kCodeValues = [] {
    std::array<double, kE4M3MaxCode + 1> values;
    for (size_t code = 0; code < values.size(); ++code) {
      values[code] = e4m3_code_value(static_cast<uint8_t>(code));
    }
    return values;
  }();
  if (a >= kE4M3Max) return kE4M3MaxCode;
  uint8_t best = 0;
  double best_dist = std::numeric_limits<double>::infinity();
  for (int code = 0; code <= kE4M3MaxCode; ++code) {
    const double dist = std::fabs(static_cast<double>(a) - kCodeValues[code]);
    if (dist < best_dist || (dist == best_dist && code % 2 == 0)) {
      best = static_cast<uint8_t>(code);
      best_dist = dist;
    }
  }
  return best;
}

uint8_t EncodeE4M3(float x) {
  const uint8_t sign = std::signbit(x) ? 0x80 : 0x00;
  if (std::isnan(x)) return kE4M3NaNCode | sign;
  return EncodeMagnitude(std::fabs(x)) | sign;
}

// The row scale rule documented in convert.h.
float RowScale(float amax) {
  if (amax == 0.0f) return 1.0f;
  if (std::isinf(amax)) return FLT_MAX / kE4M3Max;
  return std::fmax(amax / kE4M3Max, FLT_MIN);
}

template <typename T, typename AbsMax, typename Encode>
void QuantizeRows(const T* in, int64_t in_row_stride, size_t rows, size_t dim, uint8_t* out,
                  int64_t out_row_stride, float* scales, int64_t scale_stride, AbsMax abs_max,
                  Encode encode) {
  for (size_t r = 0; r < rows; ++r) {
    const int64_t ri = static_cast<int64_t>(r);
    const T* row_in = in + ri * in_row_stride;
    const float scale = RowScale(abs_max(row_in, dim));
    encode(row_in, out + ri * out_row_stride, dim, 1.0f / scale);
    scales[ri * scale_stride] = scale;
  }
}

}  // namespace

float e4m3_code_value(uint8_t code) {
  const bool negative = (code & 0x80) != 0;
  const int exponent = (code >> 3) & 0xF;
  const int mantissa = code & 0x7;
  float magnitude;
  if (exponent == 0xF && mantissa == 0x7) {
    magnitude = std::numeric_limits<float>::quiet_NaN();
  } else if (exponent == 0) {
    magnitude = std::ldexp(static_cast<float>(mantissa), -9);  // subnormal: m/8 * 2^(1-7)
  } else {
    magnitude = std::ldexp(static_cast<float>(8 + mantissa), exponent - 10);  // (1+m/8) * 2^(e-7)
  }
  return negative ? -magnitude : magnitude;
}

void f32_to_bf16(const float* in, uint16_t* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const uint32_t bits = BitsOf(in[i]);
    const uint32_t sign = (bits >> 16) & 0x8000;
    if (std::isnan(in[i])) {
      out[i] = static_cast<uint16_t>((bits >> 16) | 0x0040);  // set the quiet bit
      continue;
    }
    // The magnitude lies between two adjacent bf16 magnitudes: `below` (truncation) and the next
    // one up. Pick the nearer; on a tie the one with the even pattern.
    const double a = std::fabs(static_cast<double>(in[i]));
    const uint32_t below = (bits & 0x7FFFFFFF) >> 16;
    uint32_t result = below;
    if (!std::isinf(a) && Bf16MagnitudeValue(below) != a) {
      const uint32_t above = below + 1;
      const double to_below = a - Bf16MagnitudeValue(below);
      const double to_above = Bf16MagnitudeValue(above) - a;
      if (to_above < to_below || (to_above == to_below && above % 2 == 0)) result = above;
    }
    out[i] = static_cast<uint16_t>(result | sign);
  }
}

void bf16_to_f32(const uint16_t* in, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) out[i] = FloatOf(static_cast<uint32_t>(in[i]) << 16);
}

void f32_to_e4m3(const float* in, uint8_t* out, size_t n, float inv_scale) {
  for (size_t i = 0; i < n; ++i) out[i] = EncodeE4M3(in[i] * inv_scale);
}

void bf16_to_e4m3(const uint16_t* in, uint8_t* out, size_t n, float inv_scale) {
  for (size_t i = 0; i < n; ++i) {
    float x;
    bf16_to_f32(&in[i], &x, 1);
    out[i] = EncodeE4M3(x * inv_scale);
  }
}

void e4m3_to_f32(const uint8_t* in, float* out, size_t n, float scale) {
  for (size_t i = 0; i < n; ++i) out[i] = e4m3_code_value(in[i]) * scale;
}

float abs_max_f32(const float* in, size_t n) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isnan(in[i])) amax = std::fmax(amax, std::fabs(in[i]));
  }
  return amax;
}

float abs_max_bf16(const uint16_t* in, size_t n) {
  float amax = 0.0f;
  for (size_t i = 0; i < n; ++i) {
    float x;
    bf16_to_f32(&in[i], &x, 1);
    amax = std::fmax(amax, abs_max_f32(&x, 1));
  }
  return amax;
}

void quantize_rows_e4m3_f32(const float* in, int64_t in_row_stride, size_t rows, size_t dim,
                            uint8_t* out, int64_t out_row_stride, float* scales,
                            int64_t scale_stride) {
  QuantizeRows(in, in_row_stride, rows, dim, out, out_row_stride, scales, scale_stride, abs_max_f32,
               f32_to_e4m3);
}

void quantize_rows_e4m3_bf16(const uint16_t* in, int64_t in_row_stride, size_t rows, size_t dim,
                             uint8_t* out, int64_t out_row_stride, float* scales,
                             int64_t scale_stride) {
  QuantizeRows(in, in_row_stride, rows, dim, out, out_row_stride, scales, scale_stride,
               abs_max_bf16, bf16_to_e4m3);
}

void quantize_groups_int8(const float* in, size_t n, size_t group, int8_t* q, float* scales,
                          int32_t* sums, float* values) {
  for (size_t g = 0; g * group < n; ++g) {
    const size_t begin = g * group, end = std::min(n, begin + group);
    const float amax = abs_max_f32(in + begin, end - begin);
    const float scale = amax > 0 && std::isfinite(amax) ? amax / 127.0f : 0.0f;
    const float inv = scale > 0 ? 127.0f / amax : 0.0f;
    int32_t sum = 0;
    for (size_t i = begin; i < end; ++i) {
      const float v = std::nearbyint(in[i] * inv);
      q[i] = static_cast<int8_t>(std::clamp(std::isnan(v) ? 0.0f : v, -127.0f, 127.0f));
      sum += q[i];
      if (values != nullptr) values[i] = static_cast<float>(q[i]) * scale;
    }
    scales[g] = scale;
    if (sums != nullptr) sums[g] = sum;
  }
}

}  // namespace kvrt::kernels::reference
