// OCP FP8 E4M3 encode / decode, the per-row dynamic scale and bf16 rounding, as
// kernels/cpu/convert.h defines them (1 sign, 4 exponent bits of bias 7, 3 mantissa bits; max finite 448; no infinities; NaN
// only S.1111.111; subnormals m * 2^-9), one value at a time: what a CUDA quantize-on-write
// kernel computes per element. Bit-identical to kvrt::kernels::f32_to_e4m3 / e4m3_to_f32 /
// quantize_rows_e4m3_f32 / f32_to_bf16 (tests/kernels/shared_math_test.cc checks it).
#pragma once

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstring>

#include "kernels/shared/host_device.h"

namespace kvrt::kernels::shared {

inline constexpr float kE4M3Max = 448.0f;

KVRT_HD uint32_t float_bits(float x) {
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
}

KVRT_HD float bits_float(uint32_t b) {
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
}

// The E4M3 code of x, nearest-even; |x| >= 448 (and +-inf) saturate to +-448; NaN gives 0x7F |
// sign; a finite x never gives NaN.
KVRT_HD uint8_t e4m3_encode(float x) {
  const uint32_t bits = float_bits(x);
  const uint8_t sign = static_cast<uint8_t>((bits >> 24) & 0x80);
  const uint32_t magnitude = bits & 0x7FFFFFFFu;
  if (magnitude > 0x7F800000u) return static_cast<uint8_t>(0x7F | sign);  // NaN
  const float a = bits_float(magnitude);
  if (a >= kE4M3Max) return static_cast<uint8_t>(0x7E | sign);
  if (a < 0.015625f) {
    // Below the smallest normal (2^-6): multiples of 2^-9. a * 2^9 is exact; rintf rounds to
    // nearest even; 8 is the smallest normal's code, 0x08.
    return static_cast<uint8_t>(static_cast<uint32_t>(rintf(a * 512.0f)) | sign);
  }
  // Normal: keep 3 of the 23 mantissa bits, nearest-even; a carry moves to the next exponent.
  int32_t exponent = static_cast<int32_t>(magnitude >> 23) - 127;
  uint32_t mantissa = (magnitude >> 20) & 7u;
  const uint32_t rest = magnitude & 0xFFFFFu;
  if (rest > 0x80000u || (rest == 0x80000u && (mantissa & 1u) != 0)) {
    if (++mantissa == 8) {
      mantissa = 0;
      ++exponent;
    }
  }
  const uint32_t code = (static_cast<uint32_t>(exponent + 7) << 3) | mantissa;
  return static_cast<uint8_t>((code > 0x7Eu ? 0x7Eu : code) | sign);
}

// The value of an E4M3 code (NaN for 0x7F and 0xFF).
KVRT_HD float e4m3_decode(uint8_t code) {
  const uint32_t sign = static_cast<uint32_t>(code & 0x80) << 24;
  const uint32_t exponent = (code >> 3) & 0xFu, mantissa = code & 7u;
  if (exponent == 0xF && mantissa == 7) return bits_float(sign | 0x7FC00000u);
  if (exponent == 0) {
    const float v = static_cast<float>(mantissa) * 0.001953125f;  // m * 2^-9, exact
    return sign != 0 ? -v : v;
  }
  return bits_float(sign | ((exponent - 7 + 127) << 23) | (mantissa << 20));
}

// The scale of a row whose largest |value| is amax (quantize_rows_e4m3_f32's rule): amax / 448,
// except 1 when amax is 0, FLT_MAX / 448 when it is inf (so finite values still encode), and at
// least FLT_MIN (so 1 / scale stays finite). A value x is stored as e4m3_encode(x * (1 /
// scale)).
KVRT_HD float e4m3_row_scale(float amax) {
  if (amax == 0.0f) return 1.0f;
  if (amax > FLT_MAX) return FLT_MAX / kE4M3Max;
  const float s = amax / kE4M3Max;
  return s < FLT_MIN ? FLT_MIN : s;
}

// bf16 (the upper half of an f32) of x, nearest-even; NaN stays a quiet NaN of its sign, as
// kvrt::kernels::f32_to_bf16 rounds (the bf16 store's encoding).
KVRT_HD uint16_t bf16_round(float x) {
  const uint32_t bits = float_bits(x);
  if ((bits & 0x7FFFFFFFu) > 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  const uint32_t rounded = bits + 0x7FFFu + ((bits >> 16) & 1u);
  return static_cast<uint16_t>(rounded >> 16);
}

}  // namespace kvrt::kernels::shared
