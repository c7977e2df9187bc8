// Highway SIMD conversion kernels. foreach_target.h re-includes this file once per target the build
// enables (HWY_TARGET_INCLUDE); the HWY_ONCE section at the end defines the public functions,
// which dispatch at run time to the best target the CPU supports.
//
// All kernels work on f32 lanes (bf16 and E4M3 are widened on load and narrowed on store) and use
// no per-element branches. Tails go through the same vector code on a zero-padded copy, so every
// element of any length is produced by identical arithmetic and matches the scalar reference.
#include "kernels/cpu/convert.h"

#include <algorithm>
#include <cfloat>
#include <cstring>

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/convert.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvrt::kernels {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;

using DF = hn::ScalableTag<float>;
using DI = hn::RebindToSigned<DF>;
using DU = hn::RebindToUnsigned<DF>;
using D16 = hn::Rebind<uint16_t, DF>;
using D8 = hn::Rebind<uint8_t, DF>;
using VF = hn::Vec<DF>;
using VI = hn::Vec<DI>;
using VU = hn::Vec<DU>;

constexpr size_t kMaxLanes = hn::MaxLanes(DF());

// f32 bit patterns used by the E4M3 encoder.
constexpr int32_t kF32AbsMask = 0x7FFFFFFF;
constexpr int32_t kF32Inf = 0x7F800000;
constexpr int32_t kF32E4M3Max = 0x43E00000;        // 448.0f
constexpr int32_t kF32E4M3MinNormal = 0x3C800000;  // 2^-6

HWY_INLINE VF LoadAsF32(DF df, const float* p) { return hn::LoadU(df, p); }

HWY_INLINE VF LoadAsF32(DF df, const uint16_t* p) {
  // bf16 is the upper half of an f32.
  const DU du;
  const D16 d16;
  return hn::BitCast(df, hn::ShiftLeft<16>(hn::PromoteTo(du, hn::LoadU(d16, p))));
}

// Runs body(in + i, out + i) for each whole vector, then once on zero-padded copies of the
// remaining n % N elements, so tails neither read nor write out of bounds.
template <typename TIn, typename TOut, class Body>
HWY_INLINE void ForEachVector(const TIn* in, TOut* out, size_t n, const Body& body) {
  const size_t lanes = hn::Lanes(DF());
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) body(in + i, out + i);
  if (i == n) return;
  TIn in_tail[kMaxLanes] = {};
  TOut out_tail[kMaxLanes] = {};
  std::memcpy(in_tail, in + i, (n - i) * sizeof(TIn));
  body(in_tail, out_tail);
  std::memcpy(out + i, out_tail, (n - i) * sizeof(TOut));
}

// One E4M3 code (0..255) per i32 lane: nearest-even, saturating at 448, NaN -> 0x7F | sign.
//
// Let a = min(|x|, 448) and E = max(floor(log2 a), -6) (-6: the E4M3 subnormals share the step of
// the smallest binade). E4M3 values in [2^E, 2^(E+1)) are multiples of 2^(E-3). Adding c =
// 2^(E+20), whose f32 ulp is 2^(E-3), makes the FPU round a to that step with
// round-to-nearest-even, and k = bits(a + c) - bits(c) counts the steps (0..16). The code is then
// (E + 6) * 8 + k: this is exponent:mantissa for normals, m for subnormals (E = -6), and k = 16
// carries into the next binade. Even k gives an even code, so ties go to the even code as required.
// With kHandleNaN false, NaN input gives an unspecified code: for rows known to hold none.
template <bool kHandleNaN = true>
HWY_INLINE VI EncodeE4M3(VF x) {
  const DF df;
  const DI di;
  const DU du;
  const VI bits = hn::BitCast(di, x);
  const VI abs_bits = hn::And(bits, hn::Set(di, kF32AbsMask));
  // Non-negative f32 bit patterns order like their values, so an integer min saturates every
  // magnitude above 448 (inf and NaN included) to 448 exactly.
  const VI a = hn::Min(abs_bits, hn::Set(di, kF32E4M3Max));
  const VI exponent = hn::Max(hn::And(a, hn::Set(di, kF32Inf)), hn::Set(di, kF32E4M3MinNormal));
  const VI c = hn::Add(exponent, hn::Set(di, 20 << 23));
  const VI steps = hn::Sub(hn::BitCast(di, hn::Add(hn::BitCast(df, a), hn::BitCast(df, c))), c);
  // (E + 6) * 8 = ((E + 147) << 3) - 1128, and bits(c) >> 20 = (E + 147) << 3.
  const VI code = hn::Add(steps, hn::Sub(hn::ShiftRight<20>(c), hn::Set(di, 1128)));
  // The sign goes to bit 7: bits ^ |bits| is the sign bit alone.
  const VI sign = hn::BitCast(di, hn::ShiftRight<24>(hn::BitCast(du, hn::Xor(bits, abs_bits))));
  if constexpr (!kHandleNaN) return hn::Or(code, sign);
  // NaN: 0x7E | 0x7F = 0x7F.
  const VI nan_bits =
      hn::And(hn::VecFromMask(di, hn::Gt(abs_bits, hn::Set(di, kF32Inf))), hn::Set(di, 0x7F));
  return hn::Or(code, hn::Or(nan_bits, sign));
}

HWY_INLINE void StoreCodes(VI codes, uint8_t* p) {
  hn::StoreU(hn::U8FromU32(hn::BitCast(DU(), codes)), D8(), p);
}

// Four vectors of codes at once. On AVX2 two rounds of saturating packs narrow 32 lanes in
// three instructions plus one permute that undoes the packs' 128-bit interleave, instead of
// a shuffle, extract and OR per vector.
HWY_INLINE void StoreCodes4(VI a, VI b, VI c, VI d, uint8_t* p) {
#if HWY_TARGET == HWY_AVX2
  const __m256i ab = _mm256_packus_epi32(a.raw, b.raw);  // a0-3 b0-3 | a4-7 b4-7 (u16)
  const __m256i cd = _mm256_packus_epi32(c.raw, d.raw);
  const __m256i abcd = _mm256_packus_epi16(ab, cd);  // a0-3 b0-3 c0-3 d0-3 | a4-7 ... (u8)
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), _mm256_permutevar8x32_epi32(abcd, order));
#else
  const size_t lanes = hn::Lanes(DI());
  StoreCodes(a, p);
  StoreCodes(b, p + lanes);
  StoreCodes(c, p + 2 * lanes);
  StoreCodes(d, p + 3 * lanes);
#endif
}

// Exact f32 value of each E4M3 code (NaN for 0x7F / 0xFF).
HWY_INLINE VF DecodeE4M3(const uint8_t* p) {
  const DF df;
  const DI di;
  const DU du;
  const VU code = hn::PromoteTo(du, hn::LoadU(D8(), p));
  const VU sign = hn::ShiftLeft<24>(hn::And(code, hn::Set(du, 0x80)));
  const VI em = hn::BitCast(di, hn::And(code, hn::Set(du, 0x7F)));  // exponent:mantissa
  // Normal: the f32 with exponent e + 127 - 7 and mantissa m << 20.
  const VI normal = hn::Add(hn::ShiftLeft<20>(em), hn::Set(di, (127 - 7) << 23));
  // Subnormal: m * 2^-9, exact in f32.
  const VI subnormal = hn::BitCast(di, hn::Mul(hn::ConvertTo(df, em), hn::Set(df, 1.0f / 512)));
  VI value = hn::IfThenElse(hn::Lt(em, hn::Set(di, 8)), subnormal, normal);
  value = hn::IfThenElse(hn::Eq(em, hn::Set(di, 0x7F)), hn::Set(di, 0x7FC00000), value);
  return hn::BitCast(df, hn::Or(value, hn::BitCast(di, sign)));
}

// |x| as f32 bits plus 0x7FFFFF, an i32 that orders like |x| for non-NaN x (0 maps to 0x7FFFFF,
// inf to 0x7FFFFFFF) while every NaN wraps to a negative number, which a max starting from the
// encoding of 0 never picks. This ignores NaN without a compare and select.
constexpr int32_t kAbsMaxBias = 0x7FFFFF;

HWY_INLINE VI AbsMaxKey(VF x) {
  const DI di;
  return hn::Add(hn::And(hn::BitCast(di, x), hn::Set(di, kF32AbsMask)), hn::Set(di, kAbsMaxBias));
}

struct RowMax {
  float amax;  // max |x| over the non-NaN elements
  bool has_nan;
};

template <typename TIn>
HWY_INLINE RowMax AbsMaxAndNaN(const TIn* in, size_t n) {
  const DF df;
  const DI di;
  const size_t lanes = hn::Lanes(df);
  // Two independent accumulators hide the latency of the max chain; the min of the keys is
  // negative exactly when some element is NaN.
  VI acc0 = hn::Set(di, kAbsMaxBias);
  VI acc1 = acc0;
  VI low = acc0;
  size_t i = 0;
  for (; i + 2 * lanes <= n; i += 2 * lanes) {
    const VI k0 = AbsMaxKey(LoadAsF32(df, in + i));
    const VI k1 = AbsMaxKey(LoadAsF32(df, in + i + lanes));
    acc0 = hn::Max(acc0, k0);
    acc1 = hn::Max(acc1, k1);
    low = hn::Min(low, hn::Min(k0, k1));
  }
  for (; i + lanes <= n; i += lanes) {
    const VI k = AbsMaxKey(LoadAsF32(df, in + i));
    acc0 = hn::Max(acc0, k);
    low = hn::Min(low, k);
  }
  if (i < n) {
    TIn tail[kMaxLanes] = {};  // zero padding cannot raise the max nor add a NaN
    std::memcpy(tail, in + i, (n - i) * sizeof(TIn));
    const VI k = AbsMaxKey(LoadAsF32(df, tail));
    acc1 = hn::Max(acc1, k);
    low = hn::Min(low, k);
  }
  const int32_t max_bits = hn::GetLane(hn::MaxOfLanes(di, hn::Max(acc0, acc1))) - kAbsMaxBias;
  float amax;
  std::memcpy(&amax, &max_bits, sizeof(amax));
  return {amax, hn::GetLane(hn::MinOfLanes(di, low)) < 0};
}

template <typename TIn>
HWY_INLINE float AbsMax(const TIn* in, size_t n) {
  return AbsMaxAndNaN(in, n).amax;
}

template <bool kHandleNaN = true, typename TIn>
HWY_INLINE void EncodeRow(const TIn* in, uint8_t* out, size_t n, float inv_scale) {
  const DF df;
  const VF vinv = hn::Set(df, inv_scale);
  const size_t lanes = hn::Lanes(df);
  auto encode = [&](const TIn* p)
                    HWY_ATTR { return EncodeE4M3<kHandleNaN>(hn::Mul(LoadAsF32(df, p), vinv)); };
  size_t i = 0;
  for (; i + 4 * lanes <= n; i += 4 * lanes) {
    const TIn* p = in + i;
    StoreCodes4(encode(p), encode(p + lanes), encode(p + 2 * lanes), encode(p + 3 * lanes),
                out + i);
  }
  ForEachVector(in + i, out + i, n - i,
                [&](const TIn* p, uint8_t* q) HWY_ATTR { StoreCodes(encode(p), q); });
}

// The row scale rule documented in convert.h.
float RowScale(float amax) {
  if (amax == 0.0f) return 1.0f;
  if (amax > FLT_MAX) return FLT_MAX / 448.0f;  // inf
  const float scale = amax / 448.0f;
  return scale < FLT_MIN ? FLT_MIN : scale;
}

template <typename TIn>
HWY_INLINE void QuantizeRows(const TIn* in, int64_t in_row_stride, size_t rows, size_t dim,
                             uint8_t* out, int64_t out_row_stride, float* scales,
                             int64_t scale_stride) {
  // Per row, the amax pass pulls the row into L1 and the encode pass re-reads it there. The amax
  // of row r + 1 is computed before row r is encoded, so that the latency of the reduction and of
  // the two divisions for row r overlaps with independent work.
  // A row without NaN (the usual case) takes the encoder without the NaN select.
  if (rows == 0) return;
  RowMax next = AbsMaxAndNaN(in, dim);
  for (size_t r = 0; r < rows; ++r) {
    const int64_t ri = static_cast<int64_t>(r);
    const RowMax row = next;
    const float scale = RowScale(row.amax);
    const float inv_scale = 1.0f / scale;
    if (r + 1 < rows) next = AbsMaxAndNaN(in + (ri + 1) * in_row_stride, dim);
    if (row.has_nan) {
      EncodeRow<true>(in + ri * in_row_stride, out + ri * out_row_stride, dim, inv_scale);
    } else {
      EncodeRow<false>(in + ri * in_row_stride, out + ri * out_row_stride, dim, inv_scale);
    }
    scales[ri * scale_stride] = scale;
  }
}

// One group of n (<= a few vectors' worth, any n) as int8 codes: Round is nearest-even, as
// std::nearbyint; NaN gives 0 (x * 0 with an infinite amax is NaN too).
HWY_INLINE int32_t QuantizeGroupInt8(const float* in, size_t n, float inv, float scale, int8_t* q,
                                     float* values) {
  const DF df;
  const DI di;
  const hn::Rebind<int8_t, DF> d8;
  const VF vinv = hn::Set(df, inv), vscale = hn::Set(df, scale);
  const VF hi = hn::Set(df, 127.0f), lo = hn::Set(df, -127.0f);
  VI sum = hn::Zero(di);
  auto one = [&](const float* p, int8_t* out, float* value) HWY_ATTR {
    const VF r = hn::Round(hn::Mul(hn::LoadU(df, p), vinv));
    const VF c = hn::Min(hn::Max(hn::IfThenZeroElse(hn::IsNaN(r), r), lo), hi);
    const VI code = hn::ConvertTo(di, c);
    sum = hn::Add(sum, code);
    hn::StoreU(hn::DemoteTo(d8, code), d8, out);
    // From the integer code, so that a code of 0 stands for +0 as in the reference (c may be -0).
    if (value != nullptr) hn::StoreU(hn::Mul(hn::ConvertTo(df, code), vscale), df, value);
  };
  const size_t lanes = hn::Lanes(df);
  size_t i = 0;
  for (; i + lanes <= n; i += lanes) one(in + i, q + i, values != nullptr ? values + i : nullptr);
  if (i < n) {
    float in_tail[kMaxLanes] = {}, value_tail[kMaxLanes];
    int8_t q_tail[kMaxLanes];
    std::memcpy(in_tail, in + i, (n - i) * sizeof(float));
    one(in_tail, q_tail, value_tail);
    std::memcpy(q + i, q_tail, n - i);
    if (values != nullptr) std::memcpy(values + i, value_tail, (n - i) * sizeof(float));
  }
  return hn::GetLane(hn::SumOfLanes(di, sum));
}

}  // namespace

// Per-target entry points, exported to the dispatch tables below.

void F32ToBf16(const float* in, uint16_t* out, size_t n) {
  const DF df;
  const DI di;
  const DU du;
  ForEachVector(in, out, n, [&](const float* p, uint16_t* q) HWY_ATTR {
    const VF x = hn::LoadU(df, p);
    const VU bits = hn::BitCast(du, x);
    // Round to nearest even on bit 16: add just under half a unit plus the kept LSB. Finite
    // values near FLT_MAX correctly carry into the exponent and become inf.
    const VU kept_lsb = hn::And(hn::ShiftRight<16>(bits), hn::Set(du, 1));
    const VU rounded = hn::ShiftRight<16>(hn::Add(bits, hn::Add(hn::Set(du, 0x7FFF), kept_lsb)));
    const VU quiet_nan = hn::Or(hn::ShiftRight<16>(bits), hn::Set(du, 0x40));
    const VU result = hn::IfThenElse(hn::RebindMask(du, hn::IsNaN(x)), quiet_nan, rounded);
    // Every lane is <= 0xFFFF, so the saturating i32 -> u16 demotion is exact.
    hn::StoreU(hn::DemoteTo(D16(), hn::BitCast(di, result)), D16(), q);
  });
}

void Bf16ToF32(const uint16_t* in, float* out, size_t n) {
  const DF df;
  ForEachVector(in, out, n,
                [&](const uint16_t* p, float* q) HWY_ATTR { hn::StoreU(LoadAsF32(df, p), df, q); });
}

void F32ToE4M3(const float* in, uint8_t* out, size_t n, float inv_scale) {
  EncodeRow(in, out, n, inv_scale);
}

void Bf16ToE4M3(const uint16_t* in, uint8_t* out, size_t n, float inv_scale) {
  EncodeRow(in, out, n, inv_scale);
}

void E4M3ToF32(const uint8_t* in, float* out, size_t n, float scale) {
  const DF df;
  const VF vscale = hn::Set(df, scale);
  ForEachVector(in, out, n, [&](const uint8_t* p, float* q) HWY_ATTR {
    hn::StoreU(hn::Mul(DecodeE4M3(p), vscale), df, q);
  });
}

float AbsMaxF32(const float* in, size_t n) { return AbsMax(in, n); }

float AbsMaxBf16(const uint16_t* in, size_t n) { return AbsMax(in, n); }

void QuantizeRowsF32(const float* in, int64_t in_row_stride, size_t rows, size_t dim, uint8_t* out,
                     int64_t out_row_stride, float* scales, int64_t scale_stride) {
  QuantizeRows(in, in_row_stride, rows, dim, out, out_row_stride, scales, scale_stride);
}

void QuantizeRowsBf16(const uint16_t* in, int64_t in_row_stride, size_t rows, size_t dim,
                      uint8_t* out, int64_t out_row_stride, float* scales, int64_t scale_stride) {
  QuantizeRows(in, in_row_stride, rows, dim, out, out_row_stride, scales, scale_stride);
}

void QuantizeGroupsInt8(const float* in, size_t n, size_t group, int8_t* q, float* scales,
                        int32_t* sums, float* values) {
  for (size_t g = 0, begin = 0; begin < n; ++g, begin += group) {
    const size_t len = std::min(group, n - begin);
    const float amax = AbsMax(in + begin, len);
    const float scale = amax > 0.0f && amax <= FLT_MAX ? amax / 127.0f : 0.0f;
    // Scale 0 (amax 0, inf, or so small that amax / 127 underflows): every code 0.
    const int32_t sum =
        QuantizeGroupInt8(in + begin, len, scale > 0.0f ? 127.0f / amax : 0.0f, scale, q + begin,
                          values != nullptr ? values + begin : nullptr);
    scales[g] = scale;
    if (sums != nullptr) sums[g] = sum;
  }
}

const char* SimdTargetName() { return hwy::TargetName(HWY_TARGET); }

}  // namespace HWY_NAMESPACE
}  // namespace kvrt::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvrt::kernels {

HWY_EXPORT(F32ToBf16);
HWY_EXPORT(Bf16ToF32);
HWY_EXPORT(F32ToE4M3);
HWY_EXPORT(Bf16ToE4M3);
HWY_EXPORT(E4M3ToF32);
HWY_EXPORT(AbsMaxF32);
HWY_EXPORT(AbsMaxBf16);
HWY_EXPORT(QuantizeRowsF32);
HWY_EXPORT(QuantizeRowsBf16);
HWY_EXPORT(QuantizeGroupsInt8);
HWY_EXPORT(SimdTargetName);

void f32_to_bf16(const float* in, uint16_t* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(F32ToBf16)(in, out, n);
}

void bf16_to_f32(const uint16_t* in, float* out, size_t n) {
  HWY_DYNAMIC_DISPATCH(Bf16ToF32)(in, out, n);
}

void f32_to_e4m3(const float* in, uint8_t* out, size_t n, float inv_scale) {
  HWY_DYNAMIC_DISPATCH(F32ToE4M3)(in, out, n, inv_scale);
}

void bf16_to_e4m3(const uint16_t* in, uint8_t* out, size_t n, float inv_scale) {
  HWY_DYNAMIC_DISPATCH(Bf16ToE4M3)(in, out, n, inv_scale);
}

void e4m3_to_f32(const uint8_t* in, float* out, size_t n, float scale) {
  HWY_DYNAMIC_DISPATCH(E4M3ToF32)(in, out, n, scale);
}

float abs_max_f32(const float* in, size_t n) { return HWY_DYNAMIC_DISPATCH(AbsMaxF32)(in, n); }

float abs_max_bf16(const uint16_t* in, size_t n) { return HWY_DYNAMIC_DISPATCH(AbsMaxBf16)(in, n); }

void quantize_rows_e4m3_f32(const float* in, int64_t in_row_stride, size_t rows, size_t dim,
                            uint8_t* out, int64_t out_row_stride, float* scales,
                            int64_t scale_stride) {
  const auto quantize = HWY_DYNAMIC_DISPATCH(QuantizeRowsF32);
  quantize(in, in_row_stride, rows, dim, out, out_row_stride, scales, scale_stride);
}

void quantize_rows_e4m3_bf16(const uint16_t* in, int64_t in_row_stride, size_t rows, size_t dim,
                             uint8_t* out, int64_t out_row_stride, float* scales,
                             int64_t scale_stride) {
  const auto quantize = HWY_DYNAMIC_DISPATCH(QuantizeRowsBf16);
  quantize(in, in_row_stride, rows, dim, out, out_row_stride, scales, scale_stride);
}

void quantize_groups_int8(const float* in, size_t n, size_t group, int8_t* q, float* scales,
                          int32_t* sums, float* values) {
  HWY_DYNAMIC_DISPATCH(QuantizeGroupsInt8)(in, n, group, q, scales, sums, values);
}

const char* simd_target() { return HWY_DYNAMIC_DISPATCH(SimdTargetName)(); }

}  // namespace kvrt::kernels
#endif  // HWY_ONCE
