// Scalar references of the attention kernels (attention.h): plain loops summing in double, sharing
// nothing with the SIMD code but the contract, so agreement between the two is evidence that both
// are right.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/attention.h"

namespace kvrt::kernels {
namespace reference {

float kv_element(KvElem type, const void* row, size_t index) {
  switch (type) {
    case KvElem::kF32:
      return static_cast<const float*>(row)[index];
    case KvElem::kBf16: {
      const uint32_t bits = uint32_t{static_cast<const uint16_t*>(row)[index]} << 16;
      float f;
      std::memcpy(&f, &bits, sizeof(f));
      return f;
    }
    case KvElem::kE4M3: {
      // From the fields: subnormal m * 2^-9, normal 2^(e - 7) * (1 + m / 8); the NaN codes are
      // not special (they read as +-480, as the kernels' contract says).
      const uint8_t code = static_cast<const uint8_t*>(row)[index];
      const int e = (code >> 3) & 0xF, m = code & 7;
      const float v = e == 0 ? std::ldexp(static_cast<float>(m), -9)
                             : std::ldexp(static_cast<float>(8 + m), e - 10);
      return (code & 0x80) ? -v : v;
    }
  }
  return 0.0f;
}

void qk_dots(KvElem type, const float* q, size_t q_stride, size_t num_q, const void* const* rows,
             size_t n, size_t dim, float* scores, size_t score_stride) {
  for (size_t g = 0; g < num_q; ++g) {
    for (size_t t = 0; t < n; ++t) {
      double sum = 0;
      for (size_t d = 0; d < dim; ++d) {
        sum += double{q[g * q_stride + d]} * kv_element(type, rows[t], d);
      }
      scores[g * score_stride + t] = static_cast<float>(sum);
    }
  }
}

void online_softmax(float* scores, size_t score_stride, size_t num_q, size_t n, float scale,
                    const float* k_scales, const float* v_scales, float* running_max,
                    float* running_sum, float* rescale) {
  for (size_t g = 0; g < num_q; ++g) {
    float* s = scores + g * score_stride;
    if (n == 0) {
      rescale[g] = 1.0f;
      continue;
    }
    double new_max = running_max[g];
    for (size_t t = 0; t < n; ++t) {
      const double x = double{s[t]} * scale * (k_scales ? k_scales[t] : 1.0f);
      new_max = std::max(new_max, x);
    }
    const double factor = std::isinf(running_max[g]) && running_max[g] < 0
                              ? 0.0
                              : std::exp(double{running_max[g]} - new_max);
    double sum = 0;
    for (size_t t = 0; t < n; ++t) {
      const double x = double{s[t]} * scale * (k_scales ? k_scales[t] : 1.0f);
      const double p = std::exp(x - new_max);
      sum += p;
      s[t] = static_cast<float>(p * (v_scales ? v_scales[t] : 1.0f));
    }
    running_sum[g] = static_cast<float>(running_sum[g] * factor + sum);
    running_max[g] = static_cast<float>(new_max);
    rescale[g] = static_cast<float>(factor);
  }
}

void pv_accumulate(KvElem type, const float* w, size_t w_stride, size_t num_q,
                   const void* const* rows, size_t n, size_t dim, const float* rescale, float* acc,
                   size_t acc_stride) {
  for (size_t g = 0; g < num_q; ++g) {
    for (size_t d = 0; d < dim; ++d) {
      double sum = double{acc[g * acc_stride + d]} * (rescale ? rescale[g] : 1.0f);
      for (size_t t = 0; t < n; ++t) {
        sum += double{w[g * w_stride + t]} * kv_element(type, rows[t], d);
      }
      acc[g * acc_stride + d] = static_cast<float>(sum);
    }
  }
}

// The multi-head kernels as the single-head references applied head by head.
namespace {
std::vector<const void*> head_rows(const void* const* rows, size_t n, size_t offset) {
  std::vector<const void*> out(n);
  for (size_t t = 0; t < n; ++t) out[t] = static_cast<const uint8_t*>(rows[t]) + offset;
  return out;
}
}  // namespace

void qk_dots_heads(KvElem type, const float* q, size_t q_stride, size_t group, size_t num_heads,
                   const void* const* rows, size_t head_stride, size_t n, size_t dim, float* scores,
                   size_t score_stride) {
  for (size_t h = 0; h < num_heads; ++h) {
    const std::vector<const void*> r = head_rows(rows, n, h * head_stride);
    reference::qk_dots(type, q + h * group * q_stride, q_stride, group, r.data(), n, dim,
                       scores + h * group * score_stride, score_stride);
  }
}

void pv_accumulate_heads(KvElem type, const float* w, size_t w_stride, size_t group,
                         size_t num_heads, const void* const* rows, size_t head_stride, size_t n,
                         size_t dim, const float* rescale, float* acc, size_t acc_stride) {
  for (size_t h = 0; h < num_heads; ++h) {
    const std::vector<const void*> r = head_rows(rows, n, h * head_stride);
    reference::pv_accumulate(type, w + h * group * w_stride, w_stride, group, r.data(), n, dim,
                             rescale != nullptr ? rescale + h * group : nullptr,
                             acc + h * group * acc_stride, acc_stride);
  }
}

}  // namespace reference
}  // namespace kvrt::kernels
