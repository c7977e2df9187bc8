// The SIMD elementwise kernels against their scalar references (which compute in double).
#include "kernels/cpu/ops.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

namespace kvrt::kernels {
namespace {

std::vector<float> random_vector(size_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want, double rel,
                  const char* what) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], rel * (std::fabs(want[i]) + 1e-6)) << what << " at " << i;
  }
}

TEST(Ops, RmsNormMatchesReference) {
  for (size_t dim : {1u, 7u, 8u, 64u, 172u, 768u}) {
    const size_t rows = 5;
    std::vector<float> x = random_vector(rows * dim, 1, 3.0f), w = random_vector(dim, 2);
    std::vector<float> got(x.size()), want(x.size());
    rms_norm(x.data(), w.data(), got.data(), rows, dim, 1e-5f);
    reference::rms_norm(x.data(), w.data(), want.data(), rows, dim, 1e-5f);
    expect_close(got, want, 1e-5, "rms_norm");
    // In place gives the same.
    rms_norm(x.data(), w.data(), x.data(), rows, dim, 1e-5f);
    expect_close(x, want, 1e-5, "rms_norm in place");
  }
}

TEST(Ops, SiluMulMatchesReference) {
  for (size_t n : {1u, 9u, 172u, 2048u}) {
    std::vector<float> g = random_vector(n, 3, 4.0f), u = random_vector(n, 4);
    g[0] = -80.0f;  // exp overflow territory: silu -> -0
    std::vector<float> got(n), want(n);
    silu_mul(g.data(), u.data(), got.data(), n);
    reference::silu_mul(g.data(), u.data(), want.data(), n);
    expect_close(got, want, 1e-5, "silu_mul");
  }
}

TEST(Ops, RopeMatchesReferenceAndPreservesNorms) {
  const size_t tokens = 6, heads = 3, dim = 64, stride = heads * dim + 5;
  std::vector<int32_t> positions = {0, 1, 2, 17, 255, 4000};
  std::vector<float> cos(tokens * dim / 2), sin(tokens * dim / 2);
  rope_tables(positions.data(), tokens, dim, 10000.0f, cos.data(), sin.data());
  std::vector<float> x = random_vector(tokens * stride, 5), want = x;
  apply_rope(x.data(), tokens, heads, dim, stride, cos.data(), sin.data());
  reference::apply_rope(want.data(), tokens, heads, dim, stride, cos.data(), sin.data());
  expect_close(x, want, 1e-5, "apply_rope");
  // Position 0 is the identity; a rotation keeps each pair's length.
  std::vector<float> y = random_vector(stride, 6), y0 = y;
  apply_rope(y.data(), 1, heads, dim, stride, cos.data(), sin.data());
  for (size_t i = 0; i < heads * dim; ++i) EXPECT_FLOAT_EQ(y[i], y0[i]);
}

TEST(Ops, AddInplace) {
  std::vector<float> x = {1, 2, 3, 4, 5, 6, 7, 8, 9}, y = {9, 8, 7, 6, 5, 4, 3, 2, 1};
  add_inplace(x.data(), y.data(), x.size());
  for (float v : x) EXPECT_EQ(v, 10.0f);
}

}  // namespace
}  // namespace kvrt::kernels
