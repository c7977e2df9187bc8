// Highway SIMD attention kernels (see attention.h). foreach_target.h re-includes this file once per
// target the build enables; the HWY_ONCE section at the end defines the public functions, which
// dispatch at run time to the best target the CPU supports.
//
// Every kernel works on at most 8 f32 lanes (CappedTag<float, 8>): head dims are multiples of 8,
// so no target ever needs a tail, and AVX-512 machines run the 256-bit code (the loops are bound
// by memory and decode, not by vector width).
#include "kernels/cpu/attention.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

// The micro-kernels keep small arrays of vectors in registers, which sizeless (scalable) vector
// types do not allow; those targets are not built here.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format off: math-inl.h must follow highway.h
#include "hwy/contrib/math/math-inl.h"
// clang-format on

// Loops over the micro-kernels' register blocks must be unrolled completely, or the arrays of
// accumulators live in memory instead of registers (GCC -O2 does not unroll them by itself).
#ifndef KVRT_UNROLL
#define KVRT_UNROLL _Pragma("GCC unroll 16")
#endif

HWY_BEFORE_NAMESPACE();
namespace kvrt::kernels {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::CappedTag<float, 8>;
using VF = hn::Vec<DF>;

// E4M3 rows decode to value / 256 (see LoadRow); the kernels undo it with this exact factor.
constexpr float kE4M3Unit = 256.0f;

// Lanes dim[d .. d + N) of a row, as f32.
template <KvElem kType>
HWY_INLINE VF LoadRow(DF df, const void* row, size_t d) {
  if constexpr (kType == KvElem::kF32) {
    return hn::LoadU(df, static_cast<const float*>(row) + d);
  } else if constexpr (kType == KvElem::kBf16) {
    // bf16 is the upper half of an f32.
    const hn::RebindToUnsigned<DF> du;
    const hn::Rebind<uint16_t, DF> d16;
    const auto bits = hn::LoadU(d16, static_cast<const uint16_t*>(row) + d);
    return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, bits)));
  } else {
    // E4M3 s.eeee.mmm placed in an f16 as s.0eeee.mmm0000000 is the same number times 2^-8 for
    // normal codes (f16 bias 15 vs 7) and for subnormal ones (f16 subnormals are m * 2^-24 and
    // E4M3's m * 2^-9 * 2^-8 = m * 2^-17 with the mantissa shifted by 7). The f16 conversion
    // (F16C on x86) then does the decode in one instruction, exactly, whatever the FPU's
    // denormal mode. Sign-extending the code puts the sign in bit 15; bit 14 is cleared.
    const hn::Rebind<int8_t, DF> d8;
    const hn::Rebind<int16_t, DF> d16;
    const hn::Rebind<hwy::float16_t, DF> dh;
    const auto codes = hn::PromoteTo(d16, hn::LoadU(d8, static_cast<const int8_t*>(row) + d));
    const auto bits =
        hn::And(hn::ShiftLeft<7>(codes), hn::Set(d16, static_cast<int16_t>(0xBF80 - 0x10000)));
    return hn::PromoteTo(df, hn::BitCast(dh, bits));
  }
}

// kQ queries x kR rows of dot products, each K chunk decoded once for the kQ queries and each
// query chunk loaded once for the kR rows; kQ * kR independent FMA chains hide the latency.
template <KvElem kType, size_t kQ, size_t kR>
HWY_INLINE void DotsBlock(const float* q, size_t q_stride, const void* const* rows, size_t dim,
                          float* scores, size_t score_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF acc[kQ][kR];
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    KVRT_UNROLL
    for (size_t r = 0; r < kR; ++r) acc[g][r] = hn::Zero(df);
  }
  for (size_t d = 0; d < dim; d += lanes) {
    VF k[kR];
    KVRT_UNROLL
    for (size_t r = 0; r < kR; ++r) k[r] = LoadRow<kType>(df, rows[r], d);
    KVRT_UNROLL
    for (size_t g = 0; g < kQ; ++g) {
      const VF qv = hn::LoadU(df, q + g * q_stride + d);
      KVRT_UNROLL
      for (size_t r = 0; r < kR; ++r) acc[g][r] = hn::MulAdd(qv, k[r], acc[g][r]);
    }
  }
  const float unit = kType == KvElem::kE4M3 ? kE4M3Unit : 1.0f;
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    KVRT_UNROLL
    for (size_t r = 0; r < kR; ++r) {
      scores[g * score_stride + r] = hn::GetLane(hn::SumOfLanes(df, acc[g][r])) * unit;
    }
  }
}

// All n rows for kQ queries: blocks of kR rows, then single rows.
template <KvElem kType, size_t kQ, size_t kR>
HWY_INLINE void DotsRows(const float* q, size_t q_stride, const void* const* rows, size_t n,
                         size_t dim, float* scores, size_t score_stride) {
  size_t t = 0;
  for (; t + kR <= n; t += kR) {
    DotsBlock<kType, kQ, kR>(q, q_stride, rows + t, dim, scores + t, score_stride);
  }
  for (; t < n; ++t) DotsBlock<kType, kQ, 1>(q, q_stride, rows + t, dim, scores + t, score_stride);
}

template <KvElem kType>
HWY_INLINE void Dots(const float* q, size_t q_stride, size_t num_q, const void* const* rows,
                     size_t n, size_t dim, float* scores, size_t score_stride) {
  // Queries in blocks of 4, 2, 1 with 8 accumulators per block where the rows allow.
  size_t g = 0;
  for (; g + 4 <= num_q; g += 4) {
    DotsRows<kType, 4, 2>(q + g * q_stride, q_stride, rows, n, dim, scores + g * score_stride,
                          score_stride);
  }
  // Three left (GQA 3, e.g. 12 query heads on 4 KV heads): one pass over the rows, not 2 + 1.
  if (g + 3 == num_q) {
    DotsRows<kType, 3, 2>(q + g * q_stride, q_stride, rows, n, dim, scores + g * score_stride,
                          score_stride);
    return;
  }
  if (g + 2 <= num_q) {
    DotsRows<kType, 2, 4>(q + g * q_stride, q_stride, rows, n, dim, scores + g * score_stride,
                          score_stride);
    g += 2;
  }
  if (g < num_q) {
    DotsRows<kType, 1, 8>(q + g * q_stride, q_stride, rows, n, dim, scores + g * score_stride,
                          score_stride);
  }
}

// kQ accumulators x kD chunks of head_dim starting at d0, over all n rows: each row chunk is
// decoded once for the kQ accumulators, which stay in registers for the whole tile.
template <KvElem kType, size_t kQ, size_t kD>
HWY_INLINE void PvBlock(const float* w, size_t w_stride, const void* const* rows, size_t n,
                        size_t d0, const float* rescale, float* acc, size_t acc_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  // E4M3 rows load as value / 256: accumulate in that unit and convert back on the way out
  // (powers of two, so exact).
  const float unit = kType == KvElem::kE4M3 ? kE4M3Unit : 1.0f;
  VF a[kQ][kD];
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    const VF in_scale = hn::Set(df, (rescale != nullptr ? rescale[g] : 1.0f) / unit);
    KVRT_UNROLL
    for (size_t j = 0; j < kD; ++j) {
      a[g][j] = hn::Mul(hn::LoadU(df, acc + g * acc_stride + d0 + j * lanes), in_scale);
    }
  }
  for (size_t t = 0; t < n; ++t) {
    VF v[kD];
    KVRT_UNROLL
    for (size_t j = 0; j < kD; ++j) v[j] = LoadRow<kType>(df, rows[t], d0 + j * lanes);
    KVRT_UNROLL
    for (size_t g = 0; g < kQ; ++g) {
      const VF wv = hn::Set(df, w[g * w_stride + t]);
      KVRT_UNROLL
      for (size_t j = 0; j < kD; ++j) a[g][j] = hn::MulAdd(wv, v[j], a[g][j]);
    }
  }
  const VF out_scale = hn::Set(df, unit);
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    KVRT_UNROLL
    for (size_t j = 0; j < kD; ++j) {
      hn::StoreU(hn::Mul(a[g][j], out_scale), df, acc + g * acc_stride + d0 + j * lanes);
    }
  }
}

// All of head_dim for kQ accumulators: blocks of kD chunks, then single chunks.
template <KvElem kType, size_t kQ, size_t kD>
HWY_INLINE void PvChunks(const float* w, size_t w_stride, const void* const* rows, size_t n,
                         size_t dim, const float* rescale, float* acc, size_t acc_stride) {
  const size_t lanes = hn::Lanes(DF());
  size_t d = 0;
  for (; d + kD * lanes <= dim; d += kD * lanes) {
    PvBlock<kType, kQ, kD>(w, w_stride, rows, n, d, rescale, acc, acc_stride);
  }
  for (; d < dim; d += lanes) {
    PvBlock<kType, kQ, 1>(w, w_stride, rows, n, d, rescale, acc, acc_stride);
  }
}

template <KvElem kType>
HWY_INLINE void Pv(const float* w, size_t w_stride, size_t num_q, const void* const* rows, size_t n,
                   size_t dim, const float* rescale, float* acc, size_t acc_stride) {
  // Accumulators in blocks of 8, 4, 2, 1 queries, with up to 8 vectors live per block.
  auto offset = [&](size_t g) { return rescale != nullptr ? rescale + g : nullptr; };
  size_t g = 0;
  for (; g + 8 <= num_q; g += 8) {
    PvChunks<kType, 8, 1>(w + g * w_stride, w_stride, rows, n, dim, offset(g), acc + g * acc_stride,
                          acc_stride);
  }
  if (g + 4 <= num_q) {
    PvChunks<kType, 4, 2>(w + g * w_stride, w_stride, rows, n, dim, offset(g), acc + g * acc_stride,
                          acc_stride);
    g += 4;
  }
  if (g + 3 == num_q) {
    PvChunks<kType, 3, 2>(w + g * w_stride, w_stride, rows, n, dim, offset(g), acc + g * acc_stride,
                          acc_stride);
    return;
  }
  if (g + 2 <= num_q) {
    PvChunks<kType, 2, 4>(w + g * w_stride, w_stride, rows, n, dim, offset(g), acc + g * acc_stride,
                          acc_stride);
    g += 2;
  }
  if (g < num_q) {
    PvChunks<kType, 1, 4>(w + g * w_stride, w_stride, rows, n, dim, offset(g), acc + g * acc_stride,
                          acc_stride);
  }
}

}  // namespace

void QkDots(KvElem type, const float* q, size_t q_stride, size_t num_q, const void* const* rows,
            size_t n, size_t dim, float* scores, size_t score_stride) {
  switch (type) {
    case KvElem::kF32:
      return Dots<KvElem::kF32>(q, q_stride, num_q, rows, n, dim, scores, score_stride);
    case KvElem::kBf16:
      return Dots<KvElem::kBf16>(q, q_stride, num_q, rows, n, dim, scores, score_stride);
    case KvElem::kE4M3:
      return Dots<KvElem::kE4M3>(q, q_stride, num_q, rows, n, dim, scores, score_stride);
  }
}

void PvAccumulate(KvElem type, const float* w, size_t w_stride, size_t num_q,
                  const void* const* rows, size_t n, size_t dim, const float* rescale, float* acc,
                  size_t acc_stride) {
  switch (type) {
    case KvElem::kF32:
      return Pv<KvElem::kF32>(w, w_stride, num_q, rows, n, dim, rescale, acc, acc_stride);
    case KvElem::kBf16:
      return Pv<KvElem::kBf16>(w, w_stride, num_q, rows, n, dim, rescale, acc, acc_stride);
    case KvElem::kE4M3:
      return Pv<KvElem::kE4M3>(w, w_stride, num_q, rows, n, dim, rescale, acc, acc_stride);
  }
}

void OnlineSoftmax(float* scores, size_t score_stride, size_t num_q, size_t n, float scale,
                   const float* k_scales, const float* v_scales, float* running_max,
                   float* running_sum, float* rescale) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  constexpr size_t kMaxLanes = hn::MaxLanes(DF());
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (n == 0) {
    std::fill(rescale, rescale + num_q, 1.0f);
    return;
  }
  const VF neg_inf = hn::Set(df, kNegInf);
  const VF vscale = hn::Set(df, scale);
  // The tail (n % lanes entries) goes through the same vector code on zero-padded copies; its
  // padding lanes are forced to -inf, whose weight exp(-inf) is 0.
  const size_t whole = n - n % lanes;
  const size_t tail = n - whole;
  const auto tail_mask = hn::FirstN(df, tail);
  float pad_ks[kMaxLanes] = {}, pad_vs[kMaxLanes] = {};
  if (tail != 0) {
    if (k_scales != nullptr) std::memcpy(pad_ks, k_scales + whole, tail * sizeof(float));
    if (v_scales != nullptr) std::memcpy(pad_vs, v_scales + whole, tail * sizeof(float));
  }
  // x = s * scale * k_scale for the lanes at s (and at ks, the matching K scales).
  auto scaled = [&](const float* s, const float* ks) HWY_ATTR {
    const VF x = hn::Mul(hn::LoadU(df, s), vscale);
    return k_scales != nullptr ? hn::Mul(x, hn::LoadU(df, ks)) : x;
  };
  for (size_t g = 0; g < num_q; ++g) {
    float* s = scores + g * score_stride;
    float pad_s[kMaxLanes] = {};
    if (tail != 0) std::memcpy(pad_s, s + whole, tail * sizeof(float));
    // Pass 1: x stored back over s, and the row max.
    VF vmax = neg_inf;
    for (size_t t = 0; t < whole; t += lanes) {
      const VF x = scaled(s + t, k_scales != nullptr ? k_scales + t : nullptr);
      hn::StoreU(x, df, s + t);
      vmax = hn::Max(vmax, x);
    }
    VF x_tail = neg_inf;
    if (tail != 0) {
      x_tail = hn::IfThenElse(tail_mask, scaled(pad_s, pad_ks), neg_inf);
      vmax = hn::Max(vmax, x_tail);
    }
    const float old_max = running_max[g];
    const float new_max = std::max(old_max, hn::GetLane(hn::MaxOfLanes(df, vmax)));
    // Once the max settles (most tiles of a long decode) the factor is exactly 1: skip exp.
    const float factor = old_max == kNegInf   ? 0.0f
                         : old_max == new_max ? 1.0f
                                              : std::exp(old_max - new_max);
    // Pass 2: p = exp(x - max), summed, stored as p * v_scale.
    const VF vnew_max = hn::Set(df, new_max);
    VF vsum = hn::Zero(df);
    auto weigh = [&](VF x, const float* vs, float* out) HWY_ATTR {
      const VF p = hn::Exp(df, hn::Sub(x, vnew_max));
      vsum = hn::Add(vsum, p);
      hn::StoreU(v_scales != nullptr ? hn::Mul(p, hn::LoadU(df, vs)) : p, df, out);
    };
    for (size_t t = 0; t < whole; t += lanes) {
      weigh(hn::LoadU(df, s + t), v_scales != nullptr ? v_scales + t : nullptr, s + t);
    }
    if (tail != 0) {
      weigh(x_tail, pad_vs, pad_s);
      std::memcpy(s + whole, pad_s, tail * sizeof(float));
    }
    running_sum[g] = running_sum[g] * factor + hn::GetLane(hn::SumOfLanes(df, vsum));
    running_max[g] = new_max;
    rescale[g] = factor;
  }
}

const char* AttentionTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace kvrt::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvrt::kernels {

HWY_EXPORT(QkDots);
HWY_EXPORT(PvAccumulate);
HWY_EXPORT(OnlineSoftmax);
HWY_EXPORT(AttentionTargetName);

void qk_dots(KvElem type, const float* q, size_t q_stride, size_t num_q, const void* const* rows,
             size_t n, size_t dim, float* scores, size_t score_stride) {
  HWY_DYNAMIC_DISPATCH(QkDots)(type, q, q_stride, num_q, rows, n, dim, scores, score_stride);
}

void online_softmax(float* scores, size_t score_stride, size_t num_q, size_t n, float scale,
                    const float* k_scales, const float* v_scales, float* running_max,
                    float* running_sum, float* rescale) {
  HWY_DYNAMIC_DISPATCH(OnlineSoftmax)
  (scores, score_stride, num_q, n, scale, k_scales, v_scales, running_max, running_sum, rescale);
}

void pv_accumulate(KvElem type, const float* w, size_t w_stride, size_t num_q,
                   const void* const* rows, size_t n, size_t dim, const float* rescale, float* acc,
                   size_t acc_stride) {
  HWY_DYNAMIC_DISPATCH(PvAccumulate)
  (type, w, w_stride, num_q, rows, n, dim, rescale, acc, acc_stride);
}

const char* attention_simd_target() { return HWY_DYNAMIC_DISPATCH(AttentionTargetName)(); }
}  // namespace kvrt::kernels
#endif  // HWY_ONCE
