// The sampler's SIMD passes against their scalar references, at lengths around the vector
// widths and at a real vocabulary's (Qwen3's 151,936), with masked (-inf) entries and ties.
#include "kernels/cpu/sampling.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <random>
#include <vector>

namespace kvrt::kernels {
namespace {

constexpr float kInf = std::numeric_limits<float>::infinity();

std::vector<float> logits_row(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  // Some masked tokens, and a tie with the maximum late in the row.
  for (size_t i = 3; i < n; i += 11) x[i] = -kInf;
  if (n > 9) {
    const float m = *std::max_element(x.begin(), x.end());
    x[n - 2] = m;
  }
  return x;
}

const size_t kLengths[] = {1, 2, 7, 8, 15, 16, 17, 31, 33, 100, 513, 1000, 4099, 151936};

TEST(SamplingKernels, ArgmaxAndMaxAreTheFirstMaximum) {
  for (size_t n : kLengths) {
    const std::vector<float> x = logits_row(n, static_cast<uint32_t>(n));
    EXPECT_EQ(argmax(x.data(), n), reference::argmax(x.data(), n)) << n;
    EXPECT_EQ(max_value(x.data(), n), reference::max_value(x.data(), n)) << n;
  }
  EXPECT_EQ(max_value(nullptr, 0), -kInf);
}

TEST(SamplingKernels, ExpWeightsMatchTheScalarExpAndCutMaskedTokens) {
  for (size_t n : kLengths) {
    const std::vector<float> x = logits_row(n, static_cast<uint32_t>(n) + 1);
    const float m = reference::max_value(x.data(), n);
    for (float scale : {1.0f, 1.0f / 0.7f, 40.0f}) {
      for (float floor : {-kInf, 0.5f}) {
        std::vector<float> w(n), r(n);
        const float sum = exp_weights(x.data(), n, m, scale, floor, w.data());
        const float ref = reference::exp_weights(x.data(), n, m, scale, floor, r.data());
        for (size_t i = 0; i < n; ++i) {
          // The bound exp_weights promises: relative, growing with |t| (t's own rounding).
          const float t = r[i] > 0 ? std::abs((x[i] - m) * scale) : 0.0f;
          ASSERT_NEAR(w[i], r[i], (3e-7f + 1.2e-7f * t) * r[i] + 1e-37f) << n << " " << i;
          if (x[i] == -kInf || x[i] < floor) {
            ASSERT_EQ(w[i], 0.0f);
          }
        }
        EXPECT_NEAR(sum, ref, 1e-5f * ref) << n;
        EXPECT_NEAR(exp_sum(x.data(), n, m, scale), reference::exp_sum(x.data(), n, m, scale),
                    1e-5f * ref)
            << n;
      }
    }
  }
}

TEST(SamplingKernels, SumAboveFindAndPrefixSearchMatchTheScalarScan) {
  for (size_t n : kLengths) {
    const std::vector<float> x = logits_row(n, static_cast<uint32_t>(n) + 2);
    std::vector<float> w(n);
    const float total = reference::exp_weights(x.data(), n, reference::max_value(x.data(), n), 1.0f,
                                               -kInf, w.data());
    for (float above : {0.0f, 0.01f, 0.3f}) {
      const float ref = reference::sum_above(w.data(), n, above);
      EXPECT_NEAR(sum_above(w.data(), n, above), ref, 1e-5f * ref + 1e-30f) << n;
      // Targets well inside one token's weight land on the scalar search's token.
      for (double u : {0.0, 0.1, 0.37, 0.5, 0.93, 0.999}) {
        const float target = static_cast<float>(u) * ref;
        const size_t at = reference::prefix_search(w.data(), n, above, target);
        const size_t got = prefix_search(w.data(), n, above, target);
        if (got != at) {
          // Only where rounding moves a target across a boundary: the two then neighbour.
          ASSERT_LT(at, n);
          double before = 0;
          for (size_t i = 0; i < at; ++i) before += w[i] > above ? w[i] : 0.0f;
          ASSERT_LT(std::min(std::abs(before - target), std::abs(before + w[at] - target)),
                    1e-5 * total)
              << n << " " << u;
        }
      }
      EXPECT_EQ(prefix_search(w.data(), n, above, 2.0f * total), n);
    }
    for (float t : {-kInf, 0.0f, 3.0f, 8.0f, 1e9f}) {
      for (size_t from : {size_t{0}, n / 3, n - 1}) {
        EXPECT_EQ(find_at_least(x.data(), n, from, t),
                  reference::find_at_least(x.data(), n, from, t))
            << n << " " << t << " " << from;
      }
    }
  }
}

TEST(SamplingKernels, KthLargestIsTheSortedRowsKth) {
  std::vector<float> scratch;
  for (size_t n : kLengths) {
    const std::vector<float> x = logits_row(n, static_cast<uint32_t>(n) + 3);
    std::vector<float> sorted = x;
    std::sort(sorted.begin(), sorted.end(), std::greater<>());
    for (size_t k : {size_t{1}, size_t{2}, size_t{20}, size_t{50}, n / 2, n}) {
      if (k < 1 || k > n) continue;
      EXPECT_EQ(kth_largest(x.data(), n, k, &scratch), sorted[k - 1]) << n << " " << k;
    }
  }
}

}  // namespace
}  // namespace kvrt::kernels
