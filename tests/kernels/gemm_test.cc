// The bf16-weight product against its scalar reference (which sums in double), over the shapes
// decode and small prefill chunks take, with and without threads.
#include "kernels/cpu/gemm.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "kernels/cpu/convert.h"

namespace kvrt::kernels {
namespace {

TEST(GemmBf16, MatchesReference) {
  std::mt19937 rng(3);
  std::normal_distribution<float> normal;
  for (size_t m : {1u, 2u, 3u, 4u, 5u, 8u, 13u, 16u}) {
    for (size_t k : {8u, 13u, 64u, 768u}) {
      const size_t n = 71;
      std::vector<float> x(m * k), wf(n * k), got(m * n), want(m * n);
      for (float& v : x) v = normal(rng);
      for (float& v : wf) v = normal(rng) * 0.05f;
      std::vector<uint16_t> w(n * k);
      f32_to_bf16(wf.data(), w.data(), w.size());
      reference::matmul_bf16(x.data(), m, k, w.data(), n, want.data());
      for (int threads : {1, 2}) {
        matmul_bf16(x.data(), m, k, w.data(), n, got.data(), threads);
        for (size_t i = 0; i < got.size(); ++i) {
          // f32 accumulation of k products against a double sum.
          ASSERT_NEAR(got[i], want[i], 1e-5 * std::sqrt(static_cast<double>(k)) + 1e-6)
              << "m " << m << " k " << k << " threads " << threads << " at " << i;
        }
      }
    }
  }
}

}  // namespace
}  // namespace kvrt::kernels
