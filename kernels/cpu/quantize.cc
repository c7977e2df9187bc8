// Weights quantized at load (model.quantization: int4 groups, fp8 blocks), and the
// dequantize-first references of the products that the packed kernels (quant_gemm.cc) are
// tested against.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "kernels/cpu/quant_gemm.h"
#include "kernels/shared/fp8_e4m3.h"

namespace kvrt::kernels {
namespace {
size_t ceil_div(size_t a, size_t b) { return (a + b - 1) / b; }
}  // namespace

void quantize_int4(const float* w, size_t n, size_t k, size_t group, uint8_t* codes,
                   float* scales) {
  const size_t groups = ceil_div(k, group);
  for (size_t j = 0; j < n; ++j) {
    for (size_t g = 0; g < groups; ++g) {
      const size_t begin = g * group, end = std::min(k, begin + group);
      float amax = 0;
      for (size_t i = begin; i < end; ++i) amax = std::max(amax, std::fabs(w[j * k + i]));
      float s = std::isfinite(amax) ? amax / 7.5f : FLT_MAX / 8;
      uint32_t bits;
      std::memcpy(&bits, &s, 4);
      // Up to a bf16 (so |w| / s <= 7.5: a weight is never more than half a step off).
      if ((bits & 0xFFFFu) != 0 && s < FLT_MAX / 8) bits = (bits | 0xFFFFu) + 1;
      std::memcpy(&s, &bits, 4);
      scales[j * groups + g] = s;
      for (size_t i = begin; i < end; ++i) {
        const float q = s > 0 ? std::nearbyint(w[j * k + i] / s) : 0.0f;
        codes[j * k + i] = static_cast<uint8_t>(std::clamp(q == q ? q : 0.0f, -8.0f, 7.0f) + 8);
      }
    }
  }
}

void quantize_fp8(const float* w, size_t n, size_t k, const Fp8Format& f, uint8_t* codes,
                  float* scales) {
  const size_t kb = ceil_div(k, f.block_k);
  for (size_t b = 0; b * f.block_n < n; ++b) {
    const size_t r0 = b * f.block_n, r1 = std::min(n, r0 + f.block_n);
    for (size_t g = 0; g < kb; ++g) {
      const size_t c0 = g * f.block_k, c1 = std::min(k, c0 + f.block_k);
      float amax = 0;
      for (size_t j = r0; j < r1; ++j)
        for (size_t i = c0; i < c1; ++i) amax = std::max(amax, std::fabs(w[j * k + i]));
      const float s = std::isfinite(amax) ? std::max(amax / 448.0f, FLT_MIN) : FLT_MAX / 448;
      scales[b * kb + g] = s;
      for (size_t j = r0; j < r1; ++j)
        for (size_t i = c0; i < c1; ++i) codes[j * k + i] = shared::e4m3_encode(w[j * k + i] / s);
    }
  }
}

namespace reference {
void matmul_int4(const float* x, size_t m, size_t k, const uint8_t* codes, const float* scales,
                 const uint8_t* zeros, size_t n, size_t group, float* y) {
  const size_t groups = ceil_div(k, group);
  for (size_t r = 0; r < m; ++r) {
    for (size_t j = 0; j < n; ++j) {
      double sum = 0;
      for (size_t i = 0; i < k; ++i) {
        const size_t g = j * groups + i / group;
        const float z = zeros != nullptr ? static_cast<float>(zeros[g]) : 8.0f;
        const float w = (static_cast<float>(codes[j * k + i] & 0xF) - z) * scales[g];
        sum += double{x[r * k + i]} * w;
      }
      y[r * n + j] = static_cast<float>(sum);
    }
  }
}

void matmul_fp8(const float* x, size_t m, size_t k, const uint8_t* codes, const float* scales,
                size_t n, const Fp8Format& f, float* y) {
  const size_t groups = ceil_div(k, f.block_k);
  for (size_t r = 0; r < m; ++r) {
    for (size_t j = 0; j < n; ++j) {
      double sum = 0;
      for (size_t i = 0; i < k; ++i) {
        const float w =
            shared::e4m3_decode(codes[j * k + i]) * scales[(j / f.block_n) * groups + i / f.block_k];
        sum += double{x[r * k + i]} * w;
      }
      y[r * n + j] = static_cast<float>(sum);
    }
  }
}
}  // namespace reference

}  // namespace kvrt::kernels
