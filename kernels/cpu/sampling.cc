// Highway SIMD versions of the sampler's passes in sampling.h; foreach_target.h compiles this
// file once per target and the HWY_ONCE part dispatches at run time.
#include "kernels/cpu/sampling.h"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <queue>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/sampling.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

// Weights below e^-87 of the likeliest token's (under FLT_MIN, far below what a sum of at least
// 1 can hold) are zero: a masked token (-inf) then weighs exactly nothing.
#ifndef KVRT_SAMPLING_CUT
#define KVRT_SAMPLING_CUT
namespace kvrt::kernels::detail {
inline constexpr float kExpCut = -87.0f;
// Entries per block of prefix_search: its block sums are vectorised, the one block where the
// target falls is scanned one entry at a time.
inline constexpr size_t kSearchBlock = 512;
}  // namespace kvrt::kernels::detail
#endif

HWY_BEFORE_NAMESPACE();
namespace kvrt::kernels {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using V = hn::Vec<DF>;

// e^t for t in [kExpCut, 0] (a weight against the row's maximum), as 2^(t log2 e): 2^n for the
// nearest integer n, times 2^f (|f| <= 1/2) by a degree-6 polynomial (Cephes' exp2f
// coefficients, relative error under 2e-7). Half the work of a general exp (hwy's), which must
// reduce an argument of any size accurately; here t itself came from a float product, so
// folding log2 e into it costs no more accuracy than t already lost. `y` = t * log2 e.
HWY_INLINE V Exp2Weight(DF df, V y) {
  const hn::RebindToSigned<DF> di;
  const V n = hn::Round(y);
  const V f = hn::Sub(y, n);
  V p = hn::Set(df, 1.535336188319500e-4f);
  p = hn::MulAdd(p, f, hn::Set(df, 1.339887440266574e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 9.618437357674640e-3f));
  p = hn::MulAdd(p, f, hn::Set(df, 5.550332471162809e-2f));
  p = hn::MulAdd(p, f, hn::Set(df, 2.402264791363012e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 6.931472028550421e-1f));
  p = hn::MulAdd(p, f, hn::Set(df, 1.0f));
  // 2^n as a float's exponent bits: n >= -126 here (t >= kExpCut), so the result is normal.
  const auto bits = hn::ShiftLeft<23>(hn::Add(hn::ConvertTo(di, n), hn::Set(di, 127)));
  return hn::Mul(p, hn::BitCast(df, bits));
}

constexpr float kLog2e = 1.4426950408889634f;

}  // namespace

float MaxValue(const float* x, size_t n) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  auto m0 = hn::Set(df, -std::numeric_limits<float>::infinity()), m1 = m0;
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    m0 = hn::Max(m0, hn::LoadU(df, x + i));
    m1 = hn::Max(m1, hn::LoadU(df, x + i + lanes));
  }
  for (; i + lanes <= n; i += lanes) m0 = hn::Max(m0, hn::LoadU(df, x + i));
  float m = hn::GetLane(hn::MaxOfLanes(df, hn::Max(m0, m1)));
  for (; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

size_t Argmax(const float* x, size_t n) {
  if (n == 0) return 0;
  const float m = MaxValue(x, n);
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto vm = hn::Set(df, m);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) {
    const intptr_t at = hn::FindFirstTrue(df, hn::Eq(hn::LoadU(df, x + i), vm));
    if (at >= 0) return i + static_cast<size_t>(at);
  }
  for (; i < n; ++i) {
    if (x[i] == m) return i;
  }
  return 0;  // NaN everywhere: the first, as max_element answers
}

float ExpWeights(const float* x, size_t n, float shift, float scale, float floor, float* w) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto vshift = hn::Set(df, shift), vfloor = hn::Set(df, floor);
  const auto vscale = hn::Set(df, scale * kLog2e);
  const auto cut = hn::Set(df, detail::kExpCut * kLog2e);
  auto sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  auto weigh = [&](size_t at) {
    const auto v = hn::LoadU(df, x + at);
    const auto y = hn::Mul(hn::Sub(v, vshift), vscale);
    const auto keep = hn::And(hn::Ge(v, vfloor), hn::Ge(y, cut));
    // Of a clamped argument: the lanes cut away never see -inf.
    const auto e = hn::IfThenElseZero(keep, Exp2Weight(df, hn::Max(y, cut)));
    hn::StoreU(e, df, w + at);
    return e;
  };
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    sum0 = hn::Add(sum0, weigh(i));
    sum1 = hn::Add(sum1, weigh(i + lanes));
  }
  for (; i + lanes <= n; i += lanes) sum0 = hn::Add(sum0, weigh(i));
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
  for (; i < n; ++i) {
    const float t = (x[i] - shift) * scale;
    w[i] = x[i] >= floor && t >= detail::kExpCut ? std::exp(t) : 0.0f;
    sum += w[i];
  }
  return sum;
}

float ExpSum(const float* x, size_t n, float shift, float scale) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto vshift = hn::Set(df, shift), vscale = hn::Set(df, scale * kLog2e);
  const auto cut = hn::Set(df, detail::kExpCut * kLog2e);
  auto sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  auto weigh = [&](size_t at) {
    const auto y = hn::Mul(hn::Sub(hn::LoadU(df, x + at), vshift), vscale);
    return hn::IfThenElseZero(hn::Ge(y, cut), Exp2Weight(df, hn::Max(y, cut)));
  };
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    sum0 = hn::Add(sum0, weigh(i));
    sum1 = hn::Add(sum1, weigh(i + lanes));
  }
  for (; i + lanes <= n; i += lanes) sum0 = hn::Add(sum0, weigh(i));
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
  for (; i < n; ++i) {
    const float t = (x[i] - shift) * scale;
    if (t >= detail::kExpCut) sum += std::exp(t);
  }
  return sum;
}

float SumAbove(const float* w, size_t n, float above) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto va = hn::Set(df, above);
  auto sum0 = hn::Zero(df), sum1 = hn::Zero(df);
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const auto a = hn::LoadU(df, w + i), b = hn::LoadU(df, w + i + lanes);
    sum0 = hn::Add(sum0, hn::IfThenElseZero(hn::Gt(a, va), a));
    sum1 = hn::Add(sum1, hn::IfThenElseZero(hn::Gt(b, va), b));
  }
  for (; i + lanes <= n; i += lanes) {
    const auto a = hn::LoadU(df, w + i);
    sum0 = hn::Add(sum0, hn::IfThenElseZero(hn::Gt(a, va), a));
  }
  float sum = hn::GetLane(hn::SumOfLanes(df, hn::Add(sum0, sum1)));
  for (; i < n; ++i) {
    if (w[i] > above) sum += w[i];
  }
  return sum;
}

size_t FindAtLeast(const float* x, size_t n, size_t from, float at_least) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const auto va = hn::Set(df, at_least);
  size_t i = from;
  for (; i + lanes <= n; i += lanes) {
    const intptr_t at = hn::FindFirstTrue(df, hn::Ge(hn::LoadU(df, x + i), va));
    if (at >= 0) return i + static_cast<size_t>(at);
  }
  for (; i < n; ++i) {
    if (x[i] >= at_least) return i;
  }
  return n;
}

size_t PrefixSearch(const float* w, size_t n, float above, float target) {
  float run = 0;
  for (size_t begin = 0; begin < n; begin += detail::kSearchBlock) {
    const size_t end = std::min(n, begin + detail::kSearchBlock);
    const float block = SumAbove(w + begin, end - begin, above);
    if (run + block <= target) {
      run += block;
      continue;
    }
    // The target is in this block (up to rounding: a miss goes on to the next block).
    for (size_t i = begin; i < end; ++i) {
      if (!(w[i] > above)) continue;
      run += w[i];
      if (run > target) return i;
    }
  }
  return n;
}

// NOLINTNEXTLINE(google-readability-namespace-comments)
}  // namespace HWY_NAMESPACE
}  // namespace kvrt::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvrt::kernels {

HWY_EXPORT(MaxValue);
HWY_EXPORT(Argmax);
HWY_EXPORT(ExpWeights);
HWY_EXPORT(ExpSum);
HWY_EXPORT(SumAbove);
HWY_EXPORT(FindAtLeast);
HWY_EXPORT(PrefixSearch);

size_t argmax(const float* x, size_t n) { return HWY_DYNAMIC_DISPATCH(Argmax)(x, n); }
float max_value(const float* x, size_t n) { return HWY_DYNAMIC_DISPATCH(MaxValue)(x, n); }
float exp_weights(const float* x, size_t n, float shift, float scale, float floor, float* w) {
  return HWY_DYNAMIC_DISPATCH(ExpWeights)(x, n, shift, scale, floor, w);
}
float exp_sum(const float* x, size_t n, float shift, float scale) {
  return HWY_DYNAMIC_DISPATCH(ExpSum)(x, n, shift, scale);
}
float sum_above(const float* w, size_t n, float above) {
  return HWY_DYNAMIC_DISPATCH(SumAbove)(w, n, above);
}
size_t find_at_least(const float* x, size_t n, size_t from, float at_least) {
  return HWY_DYNAMIC_DISPATCH(FindAtLeast)(x, n, from, at_least);
}
size_t prefix_search(const float* w, size_t n, float above, float target) {
  return HWY_DYNAMIC_DISPATCH(PrefixSearch)(w, n, above, target);
}

float kth_largest(const float* x, size_t n, size_t k, std::vector<float>* scratch) {
  // A heap of the k largest so far; the scan only stops at entries above its smallest, about
  // k * ln(n / k) times in a row of random order.
  if (k <= 1024 && k * 16 <= n) {
    std::priority_queue<float, std::vector<float>, std::greater<>> heap;
    for (size_t i = 0; i < k; ++i) heap.push(x[i]);
    size_t i = k;
    while (true) {
      i = find_at_least(x, n, i,
                        std::nextafter(heap.top(), std::numeric_limits<float>::infinity()));
      if (i >= n) break;
      heap.pop();
      heap.push(x[i]);
      ++i;
    }
    return heap.top();
  }
  scratch->assign(x, x + n);
  auto kth = scratch->begin() + static_cast<std::ptrdiff_t>(k - 1);
  std::nth_element(scratch->begin(), kth, scratch->end(), std::greater<>());
  return *kth;
}

namespace reference {

size_t argmax(const float* x, size_t n) {
  return n == 0 ? 0 : static_cast<size_t>(std::max_element(x, x + n) - x);
}

float max_value(const float* x, size_t n) {
  float m = -std::numeric_limits<float>::infinity();
  for (size_t i = 0; i < n; ++i) m = std::max(m, x[i]);
  return m;
}

float exp_weights(const float* x, size_t n, float shift, float scale, float floor, float* w) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float t = (x[i] - shift) * scale;
    w[i] = x[i] >= floor && t >= detail::kExpCut ? std::exp(t) : 0.0f;
    sum += w[i];
  }
  return static_cast<float>(sum);
}

float exp_sum(const float* x, size_t n, float shift, float scale) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const float t = (x[i] - shift) * scale;
    if (t >= detail::kExpCut) sum += std::exp(t);
  }
  return static_cast<float>(sum);
}

float sum_above(const float* w, size_t n, float above) {
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    if (w[i] > above) sum += w[i];
  }
  return static_cast<float>(sum);
}

size_t find_at_least(const float* x, size_t n, size_t from, float at_least) {
  for (size_t i = from; i < n; ++i) {
    if (x[i] >= at_least) return i;
  }
  return n;
}

size_t prefix_search(const float* w, size_t n, float above, float target) {
  double run = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!(w[i] > above)) continue;
    run += w[i];
    if (run > target) return i;
  }
  return n;
}

}  // namespace reference
}  // namespace kvrt::kernels
#endif  // HWY_ONCE
