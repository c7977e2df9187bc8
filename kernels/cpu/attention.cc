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

#include "kernels/cpu/unroll.h"

// The micro-kernels keep small arrays of vectors in registers, which sizeless (scalable) vector
// types do not allow; those targets are not built here.
#ifndef HWY_DISABLED_TARGETS
#define HWY_DISABLED_TARGETS (HWY_SVE | HWY_SVE2 | HWY_SVE_256 | HWY_SVE2_128 | HWY_RVV)
#endif

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/attention.cc"
#include "hwy/cache_control.h"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"
// clang-format off: math-inl.h must follow highway.h
#include "hwy/contrib/math/math-inl.h"
// clang-format on

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

// E4M3 for the scores decodes to value * 2^-120 (see LoadKey); DotsBlock undoes it.
constexpr float kE4M3KeyUnit = 0x1p120f;

// Lanes dim[d .. d + N) of a K row for the scores: LoadRow's values, except that E4M3 takes a
// cheaper decode (4 instructions per 8 codes instead of 6, about 18% off the scores of
// Llama-3-8B's shape): the code sign-extended to 32 bits and shifted left by 20, masked to
// s.0000eeee.mmm0..., is an f32 whose exponent field is E4M3's, so its value is the code's times
// 2^(7 - 127) = 2^-120, subnormal codes included (they become f32 subnormals, summed exactly;
// an FPU set to treat denormal inputs as zero would read them as 0, a difference below
// 2^-6 of the row's scale). The sums use it when their weights allow (Pv); LoadValues keeps the
// f16 decode, because scaling a subnormal by 2^120 with a plain multiply measured up to 2.5x
// slower here, where multiply-adds with subnormal inputs were not.
template <KvElem kType>
HWY_INLINE VF LoadKey(DF df, const void* row, size_t d) {
  if constexpr (kType == KvElem::kE4M3) {
    const hn::Rebind<int8_t, DF> d8;
    const hn::RebindToSigned<DF> di;
    const auto codes = hn::PromoteTo(di, hn::LoadU(d8, static_cast<const int8_t*>(row) + d));
    return hn::BitCast(
        df, hn::And(hn::ShiftLeft<20>(codes), hn::Set(di, static_cast<int32_t>(0x87F00000u))));
  } else {
    return LoadRow<kType>(df, row, d);
  }
}

// The exact factor that turns products of decoded lanes back into values: LoadKey's (kKey) or
// LoadRow's decode.
template <KvElem kType, bool kKey>
constexpr float kUnit = kType != KvElem::kE4M3 ? 1.0f : kKey ? kE4M3KeyUnit : kE4M3Unit;

// Row pointer `row` moved `offset` bytes on: the same token's row of another head.
HWY_INLINE const void* At(const void* row, size_t offset) {
  return static_cast<const uint8_t*>(row) + offset;
}

// Lanes dim[d .. d + N) of a row as their values (E4M3 scaled back from LoadRow's value / 256).
template <KvElem kType>
HWY_INLINE VF LoadValues(DF df, const void* row, size_t d) {
  const VF v = LoadRow<kType>(df, row, d);
  return kType == KvElem::kE4M3 ? hn::Mul(v, hn::Set(df, kUnit<kType, false>)) : v;
}

#if HWY_TARGET != HWY_SCALAR
// The lane sums of four 8-lane vectors as the 4 lanes [sum a, sum b, sum c, sum e]: 11
// instructions, where four horizontal sums take about 20 and four scalar stores. A template on
// the tag, so only 8-lane targets compile it.
template <class D>
HWY_INLINE hn::Vec<hn::Half<D>> SumsOf4(D d, hn::Vec<D> a, hn::Vec<D> b, hn::Vec<D> c,
                                        hn::Vec<D> e) {
  const hn::Repartition<uint64_t, D> d64;
  const hn::Half<D> dh;
  // Per 128-bit block: [a0 + a2, b0 + b2, a1 + a3, b1 + b3], and likewise for c and e.
  const auto ab = hn::Add(hn::InterleaveLower(d, a, b), hn::InterleaveUpper(d, a, b));
  const auto ce = hn::Add(hn::InterleaveLower(d, c, e), hn::InterleaveUpper(d, c, e));
  // Per block: [a, b, c, e] over the block's lanes.
  const auto sums = hn::Add(
      hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, ab), hn::BitCast(d64, ce))),
      hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, ab), hn::BitCast(d64, ce))));
  return hn::Add(hn::LowerHalf(dh, sums), hn::UpperHalf(dh, sums));
}
#endif

// kQ queries x kR rows of dot products, each K chunk decoded once for the kQ queries and each
// query chunk loaded once for the kR rows; kQ * kR independent FMA chains hide the latency.
template <KvElem kType, size_t kQ, size_t kR>
HWY_INLINE void DotsBlock(const float* q, size_t q_stride, const void* const* rows, size_t offset,
                          size_t dim, float* scores, size_t score_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  const void* row[kR];
  KVRT_UNROLL
  for (size_t r = 0; r < kR; ++r) row[r] = At(rows[r], offset);
  VF acc[kQ][kR];
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    KVRT_UNROLL
    for (size_t r = 0; r < kR; ++r) acc[g][r] = hn::Zero(df);
  }
  for (size_t d = 0; d < dim; d += lanes) {
    VF k[kR];
    KVRT_UNROLL
    for (size_t r = 0; r < kR; ++r) k[r] = LoadKey<kType>(df, row[r], d);
    KVRT_UNROLL
    for (size_t g = 0; g < kQ; ++g) {
      const VF qv = hn::LoadU(df, q + g * q_stride + d);
      KVRT_UNROLL
      for (size_t r = 0; r < kR; ++r) acc[g][r] = hn::MulAdd(qv, k[r], acc[g][r]);
    }
  }
  const float unit = kUnit<kType, true>;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (kR % 4 == 0 && hn::MaxLanes(DF()) == 8) {
    // Four rows' sums at a time, stored as one vector of 4 scores.
    const hn::Half<DF> dh;
    KVRT_UNROLL
    for (size_t g = 0; g < kQ; ++g) {
      KVRT_UNROLL
      for (size_t r = 0; r < kR; r += 4) {
        const auto sums = SumsOf4(df, acc[g][r], acc[g][r + 1], acc[g][r + 2], acc[g][r + 3]);
        hn::StoreU(hn::Mul(sums, hn::Set(dh, unit)), dh, scores + g * score_stride + r);
      }
    }
    return;
  } else if constexpr (kR == 2 && kQ % 2 == 0 && hn::MaxLanes(DF()) == 8) {
    // Two queries' two rows at a time: lanes [g r0, g r1, g+1 r0, g+1 r1], stored as two pairs.
    const hn::Half<DF> dh;
    const hn::Half<decltype(dh)> d2;
    KVRT_UNROLL
    for (size_t g = 0; g < kQ; g += 2) {
      const auto sums = hn::Mul(SumsOf4(df, acc[g][0], acc[g][1], acc[g + 1][0], acc[g + 1][1]),
                                hn::Set(dh, unit));
      hn::StoreU(hn::LowerHalf(d2, sums), d2, scores + g * score_stride);
      hn::StoreU(hn::UpperHalf(d2, sums), d2, scores + (g + 1) * score_stride);
    }
    return;
  }
#endif
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    KVRT_UNROLL
    for (size_t r = 0; r < kR; ++r) {
      scores[g * score_stride + r] = hn::GetLane(hn::SumOfLanes(df, acc[g][r])) * unit;
    }
  }
}

// Calls block.template operator()<kQ>(h, g) for every head h and every block of kQ of its
// group's queries starting at query g: blocks of kMax, then one of the 3, 2 or 1 left over (GQA
// 3, e.g. 12 query heads on 4 KV heads, takes one pass, not 2 + 1).
template <size_t kMax = 4, class Block>
HWY_INLINE void ForEachQueryBlock(size_t group, size_t num_heads, const Block& block) {
  static_assert(kMax >= 1 && kMax <= 4);
  for (size_t h = 0; h < num_heads; ++h) {
    size_t g = 0;
    for (; g + kMax <= group; g += kMax) block.template operator()<kMax>(h, g);
    const size_t left = group - g;
    if constexpr (kMax > 3) {
      if (left == 3) block.template operator()<3>(h, g);
    }
    if constexpr (kMax > 2) {
      if (left == 2) block.template operator()<2>(h, g);
    }
    if (left == 1) block.template operator()<1>(h, g);
  }
}

// Calls block.template operator()<kR>(t) for t = 0, kR, 2 kR, ... while kR tokens fit in n,
// then block.template operator()<1>(t) for each token left.
template <size_t kR, class Block>
HWY_INLINE void ForEachTokenBlock(size_t n, const Block& block) {
  size_t t = 0;
  for (; t + kR <= n; t += kR) block.template operator()<kR>(t);
  for (; t < n; ++t) block.template operator()<1>(t);
}

// Calls fn.template operator()<kType>() with `type` as the template argument.
template <class Fn>
HWY_INLINE void WithKvType(KvElem type, const Fn& fn) {
  switch (type) {
    case KvElem::kF32:
      return fn.template operator()<KvElem::kF32>();
    case KvElem::kBf16:
      return fn.template operator()<KvElem::kBf16>();
    case KvElem::kE4M3:
      return fn.template operator()<KvElem::kE4M3>();
  }
}

template <KvElem kType>
HWY_INLINE void Dots(const float* q, size_t q_stride, size_t group, size_t num_heads,
                     const void* const* rows, size_t head_stride, size_t n, size_t dim,
                     float* scores, size_t score_stride, const PrefetchRows* prefetch,
                     size_t num_prefetch) {
  // Blocks of kR tokens, each against every head's queries. Each head's first query block
  // prefetches that head's share of the lists' rows of those tokens, so the prefetches are
  // spread over the arithmetic instead of filling the miss buffers in bursts.
  auto in_blocks_of = [&]<size_t kR>() HWY_ATTR {
    ForEachTokenBlock<kR>(n, [&]<size_t kB>(size_t t) HWY_ATTR {
      ForEachQueryBlock(group, num_heads, [&]<size_t kQ>(size_t h, size_t g) HWY_ATTR {
        if (g == 0) {
          for (size_t l = 0; l < num_prefetch; ++l) {
            const size_t share = (prefetch[l].bytes + num_heads - 1) / num_heads;
            const size_t begin = h * share / 64 * 64;
            const size_t end = std::min(prefetch[l].bytes, (h + 1) * share);
            for (size_t u = t; u < t + kB; ++u) {
              const auto* row = static_cast<const uint8_t*>(prefetch[l].rows[u]);
              for (size_t b = begin; b < end; b += 64) hwy::Prefetch(row + b);
            }
          }
        }
        const size_t i = h * group + g;
        DotsBlock<kType, kQ, kB>(q + i * q_stride, q_stride, rows + t, h * head_stride, dim,
                                 scores + i * score_stride + t, score_stride);
      });
    });
  };
  // 8 to 12 accumulators per block: 3 queries x 4 tokens (GQA 3: 12 chains, each K chunk shared
  // by 3 queries; 5% to 10% faster than 3 x 2 in one in-process comparison, near this machine's
  // noise), 4 x 2, 2 x 4 or 1 x 8.
  if (group == 3 || group == 2) {
    in_blocks_of.template operator()<4>();
  } else if (group > 3) {
    in_blocks_of.template operator()<2>();
  } else {
    in_blocks_of.template operator()<8>();
  }
}

// acc rows g < kQ += sum over kT tokens of w[g * w_stride + t] * row_t (row_t = rows[t] +
// offset): the kQ x kT weights stay in registers, each token chunk is decoded once for the kQ
// rows, and each accumulator chunk is loaded and stored once per kT tokens.
// kKey: E4M3 rows decode with LoadKey (value * 2^-120), else with LoadRow.
template <KvElem kType, bool kKey, size_t kQ, size_t kT>
HWY_INLINE void PvTokens(const float* w, size_t w_stride, const void* const* rows, size_t offset,
                         size_t dim, float* acc, size_t acc_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  // E4M3 rows load as value / 256 (or 2^-120): weights times the inverse give the same products
  // (powers of two).
  const float unit = kUnit<kType, kKey>;
  VF wv[kQ][kT];
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    KVRT_UNROLL
    for (size_t t = 0; t < kT; ++t) wv[g][t] = hn::Set(df, w[g * w_stride + t] * unit);
  }
  const void* row[kT];
  KVRT_UNROLL
  for (size_t t = 0; t < kT; ++t) row[t] = At(rows[t], offset);
  for (size_t d = 0; d < dim; d += lanes) {
    VF v[kT];
    KVRT_UNROLL
    for (size_t t = 0; t < kT; ++t) {
      v[t] = kKey ? LoadKey<kType>(df, row[t], d) : LoadRow<kType>(df, row[t], d);
    }
    KVRT_UNROLL
    for (size_t g = 0; g < kQ; ++g) {
      float* a = acc + g * acc_stride + d;
      VF x = hn::LoadU(df, a);
      KVRT_UNROLL
      for (size_t t = 0; t < kT; ++t) x = hn::MulAdd(wv[g][t], v[t], x);
      hn::StoreU(x, df, a);
    }
  }
}

// The largest |w[g * w_stride + t]| for g < rows, t < n. A NaN weight may be passed over; it
// makes the sums NaN whichever way they are computed.
HWY_INLINE float MaxAbs(const float* w, size_t w_stride, size_t rows, size_t n) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF vmax = hn::Zero(df);
  float max = 0.0f;
  for (size_t g = 0; g < rows; ++g) {
    const float* row = w + g * w_stride;
    size_t t = 0;
    for (; t + lanes <= n; t += lanes) vmax = hn::Max(vmax, hn::Abs(hn::LoadU(df, row + t)));
    for (; t < n; ++t) max = std::max(max, std::fabs(row[t]));
  }
  return std::max(max, hn::GetLane(hn::MaxOfLanes(df, vmax)));
}

template <KvElem kType>
HWY_INLINE void Pv(const float* w, size_t w_stride, size_t group, size_t num_heads,
                   const void* const* rows, size_t head_stride, size_t n, size_t dim,
                   const float* rescale, float* acc, size_t acc_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  if (rescale != nullptr) {
    for (size_t i = 0; i < group * num_heads; ++i) {
      // Once a row's max settles (most tiles of a long decode) its factor is exactly 1.
      if (rescale[i] == 1.0f) continue;
      const VF factor = hn::Set(df, rescale[i]);
      float* a = acc + i * acc_stride;
      for (size_t d = 0; d < dim; d += lanes)
        hn::StoreU(hn::Mul(hn::LoadU(df, a + d), factor), df, a + d);
    }
  }
  // Blocks of kT tokens into every head's accumulators.
  auto in_blocks_of = [&]<size_t kT, bool kKey>() HWY_ATTR {
    ForEachTokenBlock<kT>(n, [&]<size_t kB>(size_t t) HWY_ATTR {
      ForEachQueryBlock(group, num_heads, [&]<size_t kQ>(size_t h, size_t g) HWY_ATTR {
        const size_t i = h * group + g;
        PvTokens<kType, kKey, kQ, kB>(w + i * w_stride + t, w_stride, rows + t, h * head_stride,
                                      dim, acc + i * acc_stride, acc_stride);
      });
    });
  };
  // Up to 8 weights in registers: 4 (or 3) rows x 2 tokens, or 2 (1) rows x 4 tokens.
  auto with_tokens = [&]<bool kKey>() HWY_ATTR {
    if (group >= 3) {
      in_blocks_of.template operator()<2, kKey>();
    } else {
      in_blocks_of.template operator()<4, kKey>();
    }
  };
  // E4M3 takes LoadKey's cheaper decode when the weights times its 2^120 stay finite (below 2^8:
  // softmax weights are at most 1 times a per-token V scale). Its subnormal codes then enter
  // multiply-adds as f32 subnormals, which measured no slower; plain multiplies of them did.
  if (kType == KvElem::kE4M3 && MaxAbs(w, w_stride, group * num_heads, n) < 256.0f) {
    with_tokens.template operator()<true>();
  } else {
    with_tokens.template operator()<false>();
  }
}

// acc[g][j] += coef[g * coef_stride + i] * src[i * src_stride + j * lanes ..] for i < steps: the
// inner loop of both tile kernels, with kJ vectors of src loaded once per step for the kQ rows
// and each coefficient broadcast once.
template <size_t kQ, size_t kJ>
HWY_INLINE void OuterProducts(const float* coef, size_t coef_stride, const float* src,
                              size_t src_stride, size_t steps, VF (&acc)[kQ][kJ]) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  for (size_t i = 0; i < steps; ++i) {
    VF x[kJ];
    KVRT_UNROLL
    for (size_t j = 0; j < kJ; ++j) x[j] = hn::LoadU(df, src + i * src_stride + j * lanes);
    KVRT_UNROLL
    for (size_t g = 0; g < kQ; ++g) {
      const VF c = hn::Set(df, coef[g * coef_stride + i]);
      KVRT_UNROLL
      for (size_t j = 0; j < kJ; ++j) acc[g][j] = hn::MulAdd(c, x[j], acc[g][j]);
    }
  }
}

// kQ queries x kV vectors of tokens, from a transposed tile: per element of head_dim, kV
// token vectors loaded once for the kQ queries and each query element broadcast once.
template <size_t kQ, size_t kV>
HWY_INLINE void TransposedBlock(const float* q, size_t q_stride, const float* kt, size_t kt_stride,
                                size_t n, size_t dim, float* scores, size_t score_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF acc[kQ][kV];
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    KVRT_UNROLL
    for (size_t v = 0; v < kV; ++v) acc[g][v] = hn::Zero(df);
  }
  OuterProducts<kQ, kV>(q, q_stride, kt, kt_stride, dim, acc);
  // Whole vectors where they fit before n, the last part through a buffer.
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    KVRT_UNROLL
    for (size_t v = 0; v < kV; ++v) {
      float* out = scores + g * score_stride + v * lanes;
      if ((v + 1) * lanes <= n) {
        hn::StoreU(acc[g][v], df, out);
      } else if (v * lanes < n) {
        HWY_ALIGN float part[hn::MaxLanes(DF())];
        hn::Store(acc[g][v], df, part);
        std::memcpy(out, part, (n - v * lanes) * sizeof(float));
      }
    }
  }
}

// Token vectors in groups of up to 4, queries in blocks of 3, 2, 1: at most 12 accumulators.
template <size_t kV>
HWY_INLINE void TransposedVectors(const float* q, size_t q_stride, size_t num_q, const float* kt,
                                  size_t kt_stride, size_t n, size_t dim, float* scores,
                                  size_t score_stride) {
  ForEachQueryBlock<3>(num_q, 1, [&]<size_t kQ>(size_t, size_t g) HWY_ATTR {
    TransposedBlock<kQ, kV>(q + g * q_stride, q_stride, kt, kt_stride, n, dim,
                            scores + g * score_stride, score_stride);
  });
}

#if HWY_TARGET != HWY_SCALAR
// The 8 x 8 transpose of r[0..8): out[j] lane i = r[i] lane j, in three rounds of interleaves
// (32-bit, 64-bit, 128-bit halves). A template on the tag, so only 8-lane targets compile it.
template <class D>
HWY_INLINE void Transpose8x8(D d, hn::Vec<D>* r) {
  const hn::Repartition<uint64_t, D> d64;
  hn::Vec<D> t[8], u[8];
  for (size_t i = 0; i < 8; i += 2) {
    t[i] = hn::InterleaveLower(d, r[i], r[i + 1]);      // per block: r_i0 r_i+1,0 r_i1 r_i+1,1
    t[i + 1] = hn::InterleaveUpper(d, r[i], r[i + 1]);  // per block: lanes 2 and 3 likewise
  }
  auto lo64 = [&](hn::Vec<D> a, hn::Vec<D> b) HWY_ATTR {
    return hn::BitCast(d, hn::InterleaveLower(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  auto hi64 = [&](hn::Vec<D> a, hn::Vec<D> b) HWY_ATTR {
    return hn::BitCast(d, hn::InterleaveUpper(d64, hn::BitCast(d64, a), hn::BitCast(d64, b)));
  };
  for (size_t i = 0; i < 8; i += 4) {  // rows i .. i + 3, per block: column 0/4, 1/5, 2/6, 3/7
    u[i] = lo64(t[i], t[i + 2]);
    u[i + 1] = hi64(t[i], t[i + 2]);
    u[i + 2] = lo64(t[i + 1], t[i + 3]);
    u[i + 3] = hi64(t[i + 1], t[i + 3]);
  }
  for (size_t j = 0; j < 4; ++j) {  // rows 0-3 in the lower block, rows 4-7 in the upper
    r[j] = hn::ConcatLowerLower(d, u[4 + j], u[j]);
    r[j + 4] = hn::ConcatUpperUpper(d, u[4 + j], u[j]);
  }
}
#endif

template <KvElem kType>
HWY_INLINE void Transpose(const void* const* rows, size_t offset, size_t n, size_t dim, float* kt,
                          size_t kt_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  size_t t0 = 0;
#if HWY_TARGET != HWY_SCALAR
  if constexpr (hn::MaxLanes(DF()) == 8) {
    // Blocks of 8 tokens x 8 elements, missing tokens as zeros.
    for (; t0 < n; t0 += 8) {
      const size_t tokens = std::min<size_t>(8, n - t0);
      for (size_t d = 0; d < dim; d += 8) {
        VF r[8];
        for (size_t i = 0; i < 8; ++i) {
          r[i] = i < tokens ? LoadValues<kType>(df, At(rows[t0 + i], offset), d) : hn::Zero(df);
        }
        Transpose8x8(df, r);
        for (size_t j = 0; j < 8; ++j) hn::StoreU(r[j], df, kt + (d + j) * kt_stride + t0);
      }
    }
  }
#endif
  HWY_ALIGN float chunk[hn::MaxLanes(DF())];
  for (size_t t = t0; t < n; ++t) {  // other vector widths: element by element
    const void* row = At(rows[t], offset);
    for (size_t d = 0; d < dim; d += lanes) {
      hn::Store(LoadValues<kType>(df, row, d), df, chunk);
      for (size_t i = 0; i < lanes; ++i) kt[(d + i) * kt_stride + t] = chunk[i];
    }
  }
  const size_t filled = std::max(t0, n);
  for (size_t d = 0; d < dim; ++d) {
    std::fill(kt + d * kt_stride + filled, kt + (d + 1) * kt_stride, 0.0f);
  }
}

template <KvElem kType>
HWY_INLINE void Decode(const void* const* rows, size_t offset, size_t n, size_t dim, float* out,
                       size_t out_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  for (size_t t = 0; t < n; ++t) {
    const void* row = At(rows[t], offset);
    for (size_t d = 0; d < dim; d += lanes) {
      hn::StoreU(LoadValues<kType>(df, row, d), df, out + t * out_stride + d);
    }
  }
}

// kQ accumulator rows x kD vectors of head_dim from d0, in registers over all n tokens: per
// token, kD vectors of V loaded once for the kQ rows and kQ weights broadcast once.
template <size_t kQ, size_t kD>
HWY_INLINE void TileBlock(const float* w, size_t w_stride, const float* v, size_t v_stride,
                          size_t n, size_t d0, const float* rescale, float* acc,
                          size_t acc_stride) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  VF a[kQ][kD];
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    const VF factor = hn::Set(df, rescale != nullptr ? rescale[g] : 1.0f);
    KVRT_UNROLL
    for (size_t j = 0; j < kD; ++j) {
      a[g][j] = hn::Mul(hn::LoadU(df, acc + g * acc_stride + d0 + j * lanes), factor);
    }
  }
  OuterProducts<kQ, kD>(w, w_stride, v + d0, v_stride, n, a);
  KVRT_UNROLL
  for (size_t g = 0; g < kQ; ++g) {
    KVRT_UNROLL
    for (size_t j = 0; j < kD; ++j) hn::StoreU(a[g][j], df, acc + g * acc_stride + d0 + j * lanes);
  }
}

// All of head_dim for kQ rows: blocks of kD vectors, then single vectors.
template <size_t kQ, size_t kD>
HWY_INLINE void TileRows(const float* w, size_t w_stride, const float* v, size_t v_stride, size_t n,
                         size_t dim, const float* rescale, float* acc, size_t acc_stride) {
  const size_t lanes = hn::Lanes(DF());
  size_t d = 0;
  for (; d + kD * lanes <= dim; d += kD * lanes) {
    TileBlock<kQ, kD>(w, w_stride, v, v_stride, n, d, rescale, acc, acc_stride);
  }
  for (; d < dim; d += lanes)
    TileBlock<kQ, 1>(w, w_stride, v, v_stride, n, d, rescale, acc, acc_stride);
}

}  // namespace

void QkDots(KvElem type, const float* q, size_t q_stride, size_t group, size_t num_heads,
            const void* const* rows, size_t head_stride, size_t n, size_t dim, float* scores,
            size_t score_stride, const PrefetchRows* prefetch, size_t num_prefetch) {
  WithKvType(type, [&]<KvElem kType>() HWY_ATTR {
    Dots<kType>(q, q_stride, group, num_heads, rows, head_stride, n, dim, scores, score_stride,
                prefetch, num_prefetch);
  });
}

void PvAccumulate(KvElem type, const float* w, size_t w_stride, size_t group, size_t num_heads,
                  const void* const* rows, size_t head_stride, size_t n, size_t dim,
                  const float* rescale, float* acc, size_t acc_stride) {
  WithKvType(type, [&]<KvElem kType>() HWY_ATTR {
    Pv<kType>(w, w_stride, group, num_heads, rows, head_stride, n, dim, rescale, acc, acc_stride);
  });
}

void TransposeRows(KvElem type, const void* const* rows, size_t offset, size_t n, size_t dim,
                   float* kt, size_t kt_stride) {
  WithKvType(type, [&]<KvElem kType>()
                       HWY_ATTR { Transpose<kType>(rows, offset, n, dim, kt, kt_stride); });
}

void QkDotsTransposed(const float* q, size_t q_stride, size_t num_q, const float* kt,
                      size_t kt_stride, size_t n, size_t dim, float* scores, size_t score_stride) {
  const size_t lanes = hn::Lanes(DF());
  for (size_t v0 = 0; v0 * lanes < n; v0 += 4) {
    const size_t vectors = std::min<size_t>(4, (n - v0 * lanes + lanes - 1) / lanes);
    const float* k = kt + v0 * lanes;
    float* s = scores + v0 * lanes;
    const size_t left = n - v0 * lanes;
    switch (vectors) {
      case 4:
        TransposedVectors<4>(q, q_stride, num_q, k, kt_stride, left, dim, s, score_stride);
        break;
      case 3:
        TransposedVectors<3>(q, q_stride, num_q, k, kt_stride, left, dim, s, score_stride);
        break;
      case 2:
        TransposedVectors<2>(q, q_stride, num_q, k, kt_stride, left, dim, s, score_stride);
        break;
      default:
        TransposedVectors<1>(q, q_stride, num_q, k, kt_stride, left, dim, s, score_stride);
        break;
    }
  }
}

void DecodeRows(KvElem type, const void* const* rows, size_t offset, size_t n, size_t dim,
                float* out, size_t out_stride) {
  WithKvType(
      type, [&]<KvElem kType>() HWY_ATTR { Decode<kType>(rows, offset, n, dim, out, out_stride); });
}

void PvAccumulateTile(const float* w, size_t w_stride, size_t num_q, const float* v,
                      size_t v_stride, size_t n, size_t dim, const float* rescale, float* acc,
                      size_t acc_stride) {
  // At most 12 accumulators and 16 registers in all: 4 rows x 3 vectors, 3 x 3, 2 x 4, 1 x 6.
  ForEachQueryBlock(num_q, 1, [&]<size_t kQ>(size_t, size_t g) HWY_ATTR {
    constexpr size_t kD = kQ >= 3 ? 3 : kQ == 2 ? 4 : 6;
    TileRows<kQ, kD>(w + g * w_stride, w_stride, v, v_stride, n, dim,
                     rescale != nullptr ? rescale + g : nullptr, acc + g * acc_stride, acc_stride);
  });
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
HWY_EXPORT(TransposeRows);
HWY_EXPORT(QkDotsTransposed);
HWY_EXPORT(DecodeRows);
HWY_EXPORT(PvAccumulateTile);
HWY_EXPORT(AttentionTargetName);

void qk_dots_heads(KvElem type, const float* q, size_t q_stride, size_t group, size_t num_heads,
                   const void* const* rows, size_t head_stride, size_t n, size_t dim, float* scores,
                   size_t score_stride, const PrefetchRows* prefetch, size_t num_prefetch) {
  HWY_DYNAMIC_DISPATCH(QkDots)
  (type, q, q_stride, group, num_heads, rows, head_stride, n, dim, scores, score_stride, prefetch,
   num_prefetch);
}

void qk_dots(KvElem type, const float* q, size_t q_stride, size_t num_q, const void* const* rows,
             size_t n, size_t dim, float* scores, size_t score_stride) {
  qk_dots_heads(type, q, q_stride, num_q, 1, rows, 0, n, dim, scores, score_stride);
}

void online_softmax(float* scores, size_t score_stride, size_t num_q, size_t n, float scale,
                    const float* k_scales, const float* v_scales, float* running_max,
                    float* running_sum, float* rescale) {
  HWY_DYNAMIC_DISPATCH(OnlineSoftmax)
  (scores, score_stride, num_q, n, scale, k_scales, v_scales, running_max, running_sum, rescale);
}

void pv_accumulate_heads(KvElem type, const float* w, size_t w_stride, size_t group,
                         size_t num_heads, const void* const* rows, size_t head_stride, size_t n,
                         size_t dim, const float* rescale, float* acc, size_t acc_stride) {
  HWY_DYNAMIC_DISPATCH(PvAccumulate)
  (type, w, w_stride, group, num_heads, rows, head_stride, n, dim, rescale, acc, acc_stride);
}

void pv_accumulate(KvElem type, const float* w, size_t w_stride, size_t num_q,
                   const void* const* rows, size_t n, size_t dim, const float* rescale, float* acc,
                   size_t acc_stride) {
  pv_accumulate_heads(type, w, w_stride, num_q, 1, rows, 0, n, dim, rescale, acc, acc_stride);
}

void transpose_rows(KvElem type, const void* const* rows, size_t offset, size_t n, size_t dim,
                    float* kt, size_t kt_stride) {
  HWY_DYNAMIC_DISPATCH(TransposeRows)(type, rows, offset, n, dim, kt, kt_stride);
}

void qk_dots_transposed(const float* q, size_t q_stride, size_t num_q, const float* kt,
                        size_t kt_stride, size_t n, size_t dim, float* scores,
                        size_t score_stride) {
  HWY_DYNAMIC_DISPATCH(QkDotsTransposed)
  (q, q_stride, num_q, kt, kt_stride, n, dim, scores, score_stride);
}

void decode_rows(KvElem type, const void* const* rows, size_t offset, size_t n, size_t dim,
                 float* out, size_t out_stride) {
  HWY_DYNAMIC_DISPATCH(DecodeRows)(type, rows, offset, n, dim, out, out_stride);
}

void pv_accumulate_tile(const float* w, size_t w_stride, size_t num_q, const float* v,
                        size_t v_stride, size_t n, size_t dim, const float* rescale, float* acc,
                        size_t acc_stride) {
  HWY_DYNAMIC_DISPATCH(PvAccumulateTile)
  (w, w_stride, num_q, v, v_stride, n, dim, rescale, acc, acc_stride);
}

const char* attention_simd_target() { return HWY_DYNAMIC_DISPATCH(AttentionTargetName)(); }
}  // namespace kvrt::kernels
#endif  // HWY_ONCE
