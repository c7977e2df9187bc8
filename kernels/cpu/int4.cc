#include "kernels/cpu/int4.h"

#include <array>
#include <bit>
#include <cfloat>
#include <cmath>
#include <vector>

namespace kvrt::kernels {
namespace {

// Byte -> its two values (low nibble first), as signed codes.
struct Pair {
  float lo, hi;
};
constexpr std::array<Pair, 256> make_table() {
  std::array<Pair, 256> t{};
  for (int b = 0; b < 256; ++b) {
    const int lo = b & 0xF, hi = b >> 4;
    t[b] = {static_cast<float>(lo >= 8 ? lo - 16 : lo), static_cast<float>(hi >= 8 ? hi - 16 : hi)};
  }
  return t;
}
constexpr std::array<Pair, 256> kTable = make_table();

int code_of(float x, float inv_scale) {
  float q = x * inv_scale;
  if (!(q == q)) return 0;  // NaN
  q = q > 7.0f ? 7.0f : (q < -7.0f ? -7.0f : q);
  return static_cast<int>(std::nearbyint(q));
}

// The first three stages (pairs, quads, octets) of one 8-element run, held in registers.
inline void hadamard8(float* v) {
  const float a0 = v[0] + v[1], a1 = v[0] - v[1], a2 = v[2] + v[3], a3 = v[2] - v[3];
  const float a4 = v[4] + v[5], a5 = v[4] - v[5], a6 = v[6] + v[7], a7 = v[6] - v[7];
  const float b0 = a0 + a2, b1 = a1 + a3, b2 = a0 - a2, b3 = a1 - a3;
  const float b4 = a4 + a6, b5 = a5 + a7, b6 = a4 - a6, b7 = a5 - a7;
  v[0] = b0 + b4, v[1] = b1 + b5, v[2] = b2 + b6, v[3] = b3 + b7;
  v[4] = b0 - b4, v[5] = b1 - b5, v[6] = b2 - b6, v[7] = b3 - b7;
}

}  // namespace

size_t hadamard_block_for(size_t n, size_t cap) {
  size_t block = n & (~n + 1);  // lowest set bit: the largest power of two dividing n
  while (block > cap) block /= 2;
  return block;
}

void hadamard_blocks(float* x, size_t n, size_t block) {
  if (block < 2) return;
  const float norm = 1.0f / std::sqrt(static_cast<float>(block));
  for (size_t b = 0; b < n; b += block) {
    float* v = x + b;
    size_t half = 1;
    if (block >= 8) {  // stages 1-3 eight elements at a time, then whole contiguous halves
      for (size_t i = 0; i < block; i += 8) hadamard8(v + i);
      half = 8;
    }
    for (; half < block; half *= 2) {
      for (size_t i = 0; i < block; i += 2 * half) {
        float* lo = v + i;
        float* hi = v + i + half;
        for (size_t j = 0; j < half; ++j) {
          const float a = lo[j], c = hi[j];
          lo[j] = a + c;
          hi[j] = a - c;
        }
      }
    }
    for (size_t j = 0; j < block; ++j) v[j] *= norm;
  }
}

float quantize_row_int4(const float* in, size_t n, uint8_t* codes) {
  float amax = 0;
  for (size_t i = 0; i < n; ++i) amax = std::fmax(amax, std::fabs(in[i]));  // fmax skips NaN
  const float scale = amax == 0 ? 1.0f : std::isinf(amax) ? FLT_MAX / 7 : amax / 7;
  const float inv = 1.0f / scale;
  for (size_t i = 0; i < n; i += 2) {
    const int lo = code_of(in[i], inv), hi = code_of(in[i + 1], inv);
    codes[i / 2] = static_cast<uint8_t>((lo & 0xF) | ((hi & 0xF) << 4));
  }
  return scale;
}

void dequantize_row_int4(const uint8_t* codes, size_t n, float scale, float* out) {
  for (size_t i = 0; i < n / 2; ++i) {
    const Pair p = kTable[codes[i]];
    out[2 * i] = p.lo * scale;
    out[2 * i + 1] = p.hi * scale;
  }
}

namespace reference {
void hadamard_blocks(float* x, size_t n, size_t block) {
  std::vector<double> out(block);
  for (size_t b = 0; b < n; b += block) {
    for (size_t i = 0; i < block; ++i) {
      double sum = 0;
      for (size_t j = 0; j < block; ++j) {
        sum += (std::popcount(i & j) % 2 ? -1.0 : 1.0) * x[b + j];
      }
      out[i] = sum / std::sqrt(static_cast<double>(block));
    }
    for (size_t i = 0; i < block; ++i) x[b + i] = static_cast<float>(out[i]);
  }
}
}  // namespace reference

}  // namespace kvrt::kernels
