// Highway SIMD versions of the elementwise kernels in ops.h; foreach_target.h compiles this
// file once per target and the HWY_ONCE part dispatches at run time.
#include "kernels/cpu/ops.h"

#include <cmath>
#include <vector>

#include "kernels/shared/rope.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/ops.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// After highway.h, and kept apart so include sorting cannot move it: foreach_target.h
// re-includes this file per target and the math header must follow highway.h each time.
#include "hwy/contrib/math/math-inl.h"

HWY_BEFORE_NAMESPACE();
namespace kvrt::kernels {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;

}  // namespace

void RmsNorm(const float* x, const float* weight, float* out, size_t rows, size_t dim, float eps) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  for (size_t r = 0; r < rows; ++r) {
    const float* row = x + r * dim;
    float* dst = out + r * dim;
    auto acc = hn::Zero(df);
    size_t i = 0;
    for (; i + lanes <= dim; i += lanes) {
      const auto v = hn::LoadU(df, row + i);
      acc = hn::MulAdd(v, v, acc);
    }
    float sum = hn::GetLane(hn::SumOfLanes(df, acc));
    for (; i < dim; ++i) sum += row[i] * row[i];
    const float inv = 1.0f / std::sqrt(sum / static_cast<float>(dim) + eps);
    const auto vinv = hn::Set(df, inv);
    i = 0;
    for (; i + lanes <= dim; i += lanes) {
      hn::StoreU(hn::Mul(hn::Mul(hn::LoadU(df, row + i), vinv), hn::LoadU(df, weight + i)), df,
                 dst + i);
    }
    for (; i < dim; ++i) dst[i] = row[i] * inv * weight[i];
  }
}

void SiluMul(const float* gate, const float* up, float* out, size_t n) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto one = hn::Set(df, 1.0f);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const auto g = hn::LoadU(df, gate + i);
    const auto sigmoid = hn::Div(one, hn::Add(one, hn::Exp(df, hn::Neg(g))));
    hn::StoreU(hn::Mul(hn::Mul(g, sigmoid), hn::LoadU(df, up + i)), df, out + i);
  }
  for (; i < n; ++i) out[i] = gate[i] / (1.0f + std::exp(-gate[i])) * up[i];
}

void AddInplace(float* x, const float* y, size_t n) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    hn::StoreU(hn::Add(hn::LoadU(df, x + i), hn::LoadU(df, y + i)), df, x + i);
  }
  for (; i < n; ++i) x[i] += y[i];
}

void ApplyRope(float* x, size_t tokens, size_t heads, size_t head_dim, size_t row_stride,
               const float* cos, const float* sin) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const size_t half = head_dim / 2;
  for (size_t t = 0; t < tokens; ++t) {
    const float* c = cos + t * half;
    const float* s = sin + t * half;
    for (size_t h = 0; h < heads; ++h) {
      float* lo = x + t * row_stride + h * head_dim;
      float* hi = lo + half;
      size_t i = 0;
      for (; i + lanes <= half; i += lanes) {
        const auto a = hn::LoadU(df, lo + i), b = hn::LoadU(df, hi + i);
        const auto vc = hn::LoadU(df, c + i), vs = hn::LoadU(df, s + i);
        hn::StoreU(hn::Sub(hn::Mul(a, vc), hn::Mul(b, vs)), df, lo + i);
        hn::StoreU(hn::Add(hn::Mul(b, vc), hn::Mul(a, vs)), df, hi + i);
      }
      for (; i < half; ++i) {
        const float a = lo[i], b = hi[i];
        lo[i] = a * c[i] - b * s[i];
        hi[i] = b * c[i] + a * s[i];
      }
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvrt::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvrt::kernels {

HWY_EXPORT(RmsNorm);
HWY_EXPORT(SiluMul);
HWY_EXPORT(AddInplace);
HWY_EXPORT(ApplyRope);

void rms_norm(const float* x, const float* weight, float* out, size_t rows, size_t dim, float eps) {
  HWY_DYNAMIC_DISPATCH(RmsNorm)(x, weight, out, rows, dim, eps);
}
void silu_mul(const float* gate, const float* up, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(SiluMul)(gate, up, out, n);
}
void add_inplace(float* x, const float* y, size_t n) { HWY_DYNAMIC_DISPATCH(AddInplace)(x, y, n); }
void apply_rope(float* x, size_t tokens, size_t heads, size_t head_dim, size_t row_stride,
                const float* cos, const float* sin) {
  HWY_DYNAMIC_DISPATCH(ApplyRope)(x, tokens, heads, head_dim, row_stride, cos, sin);
}

void rope_tables(const int32_t* positions, size_t tokens, size_t head_dim, float theta, float* cos,
                 float* sin) {
  const size_t half = head_dim / 2;
  std::vector<float> inv_freq(half);
  for (size_t i = 0; i < half; ++i) {
    inv_freq[i] = shared::rope_inverse_frequency(static_cast<int64_t>(i),
                                                 static_cast<int64_t>(head_dim), theta);
  }
  rope_tables_from(positions, tokens, inv_freq.data(), half, 1.0f, cos, sin);
}

void rope_tables_from(const int32_t* positions, size_t tokens, const float* inv_freq, size_t half,
                      float scale, float* cos, float* sin) {
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t i = 0; i < half; ++i) {
      const float angle = static_cast<float>(positions[t]) * inv_freq[i];
      cos[t * half + i] = std::cos(angle) * scale;
      sin[t * half + i] = std::sin(angle) * scale;
    }
  }
}

namespace reference {

void rms_norm(const float* x, const float* weight, float* out, size_t rows, size_t dim, float eps) {
  for (size_t r = 0; r < rows; ++r) {
    double sum = 0;
    for (size_t i = 0; i < dim; ++i) sum += double{x[r * dim + i]} * x[r * dim + i];
    const double inv = 1.0 / std::sqrt(sum / static_cast<double>(dim) + eps);
    for (size_t i = 0; i < dim; ++i) {
      out[r * dim + i] = static_cast<float>(x[r * dim + i] * inv * weight[i]);
    }
  }
}

void silu_mul(const float* gate, const float* up, float* out, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

void apply_rope(float* x, size_t tokens, size_t heads, size_t head_dim, size_t row_stride,
                const float* cos, const float* sin) {
  const size_t half = head_dim / 2;
  for (size_t t = 0; t < tokens; ++t) {
    for (size_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      for (size_t i = 0; i < half; ++i) {
        const double a = v[i], b = v[i + half], c = cos[t * half + i], s = sin[t * half + i];
        v[i] = static_cast<float>(a * c - b * s);
        v[i + half] = static_cast<float>(b * c + a * s);
      }
    }
  }
}

}  // namespace reference
}  // namespace kvrt::kernels
#endif  // HWY_ONCE
