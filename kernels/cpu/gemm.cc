// bf16-weight matrix products (gemm.h). Each weight row is widened to f32 in registers and
// multiplied with up to four input rows at once, so it is read from memory once per four rows.
#include "kernels/cpu/gemm.h"

#include "kernels/cpu/unroll.h"

#undef HWY_TARGET_INCLUDE
#define HWY_TARGET_INCLUDE "kernels/cpu/gemm.cc"
#include "hwy/foreach_target.h"  // IWYU pragma: keep
#include "hwy/highway.h"

HWY_BEFORE_NAMESPACE();
namespace kvrt::kernels {
namespace HWY_NAMESPACE {
namespace {

namespace hn = hwy::HWY_NAMESPACE;
using DF = hn::ScalableTag<float>;
using DU = hn::RebindToUnsigned<DF>;
using D16 = hn::Rebind<uint16_t, DF>;

HWY_INLINE hn::Vec<DF> LoadBf16(const uint16_t* p) {
  return hn::BitCast(DF(), hn::ShiftLeft<16>(hn::PromoteTo(DU(), hn::LoadU(D16(), p))));
}

float Bf16ToFloat(uint16_t b) {
  const uint32_t bits = uint32_t{b} << 16;
  float f;
  __builtin_memcpy(&f, &bits, 4);
  return f;
}

// y[r][j] for rows r0 .. r0 + R (R <= 4) and one weight row j, read in address order, each
// row's sum kept in U interleaved parts: R * U independent FMA chains. The loops over the
// register arrays must be unrolled, or GCC keeps the accumulators in memory (2.7x slower with
// 3 or 4 rows).
template <size_t R, size_t U>
HWY_INLINE void Rows(const float* x, size_t k, const uint16_t* wj, float* y, size_t n, size_t j) {
  const DF df;
  const size_t lanes = hn::Lanes(df);
  hn::Vec<DF> acc[R][U];
  KVRT_UNROLL
  for (size_t r = 0; r < R; ++r) {
    KVRT_UNROLL
    for (size_t u = 0; u < U; ++u) acc[r][u] = hn::Zero(df);
  }
  size_t i = 0;
  for (; i + U * lanes <= k; i += U * lanes) {
    KVRT_UNROLL
    for (size_t u = 0; u < U; ++u) {
      const auto w = LoadBf16(wj + i + u * lanes);
      KVRT_UNROLL
      for (size_t r = 0; r < R; ++r) {
        acc[r][u] = hn::MulAdd(hn::LoadU(df, x + r * k + i + u * lanes), w, acc[r][u]);
      }
    }
  }
  for (; i + lanes <= k; i += lanes) {
    const auto w = LoadBf16(wj + i);
    KVRT_UNROLL
    for (size_t r = 0; r < R; ++r) {
      acc[r][0] = hn::MulAdd(hn::LoadU(df, x + r * k + i), w, acc[r][0]);
    }
  }
  KVRT_UNROLL
  for (size_t r = 0; r < R; ++r) {
    KVRT_UNROLL
    for (size_t u = 1; u < U; ++u) acc[r][0] = hn::Add(acc[r][0], acc[r][u]);
    float sum = hn::GetLane(hn::SumOfLanes(df, acc[r][0]));
    for (size_t t = i; t < k; ++t) sum += x[r * k + t] * Bf16ToFloat(wj[t]);
    y[r * n + j] = sum;
  }
}

}  // namespace

void MatmulBf16(const float* x, size_t m, size_t k, const uint16_t* w, size_t n, float* y,
                int threads) {
  // One or two rows sum in two parts each (2 or 4 chains; 8-18% faster at batch 1 in an
  // in-process comparison), three or four rows in one part each.
#pragma omp parallel for num_threads(threads) schedule(static) if (threads > 1 && n >= 64)
  for (size_t j = 0; j < n; ++j) {
    const uint16_t* wj = w + j * k;
    size_t r = 0;
    for (; r + 4 <= m; r += 4) Rows<4, 1>(x + r * k, k, wj, y + r * n, n, j);
    switch (m - r) {
      case 3:
        Rows<3, 1>(x + r * k, k, wj, y + r * n, n, j);
        break;
      case 2:
        Rows<2, 2>(x + r * k, k, wj, y + r * n, n, j);
        break;
      case 1:
        Rows<1, 2>(x + r * k, k, wj, y + r * n, n, j);
        break;
      default:
        break;
    }
  }
}

}  // namespace HWY_NAMESPACE
}  // namespace kvrt::kernels
HWY_AFTER_NAMESPACE();

#if HWY_ONCE
namespace kvrt::kernels {

HWY_EXPORT(MatmulBf16);

void matmul_bf16(const float* x, size_t m, size_t k, const uint16_t* w, size_t n, float* y,
                 int threads) {
  HWY_DYNAMIC_DISPATCH(MatmulBf16)(x, m, k, w, n, y, threads);
}

namespace reference {
void matmul_bf16(const float* x, size_t m, size_t k, const uint16_t* w, size_t n, float* y) {
  for (size_t r = 0; r < m; ++r) {
    for (size_t j = 0; j < n; ++j) {
      double sum = 0;
      for (size_t i = 0; i < k; ++i) {
        const uint32_t bits = uint32_t{w[j * k + i]} << 16;
        float wv;
        __builtin_memcpy(&wv, &bits, 4);
        sum += double{x[r * k + i]} * wv;
      }
      y[r * n + j] = static_cast<float>(sum);
    }
  }
}
}  // namespace reference

}  // namespace kvrt::kernels
#endif  // HWY_ONCE
