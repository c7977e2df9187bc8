// kvrt eval's metrics on distributions computed by hand.
#include "core/eval/metrics.h"

#include <gtest/gtest.h>

#include <cmath>
#include <vector>

namespace kvrt::eval {
namespace {

// Logits whose softmax is `p` (log p, up to a constant the softmax removes).
std::vector<float> logits_of(std::vector<double> p, float shift = 0) {
  std::vector<float> out;
  for (double x : p) out.push_back(static_cast<float>(std::log(x)) + shift);
  return out;
}

TEST(Metrics, LogSoftmaxOfEqualLogitsIsUniform) {
  std::vector<float> l = {3, 3, 3, 3};
  std::vector<double> out(4);
  log_softmax(l, out);
  for (double x : out) EXPECT_NEAR(x, -std::log(4.0), 1e-12);
}

TEST(Metrics, KlOfTwoKnownDistributions) {
  // KL((1/2, 1/2) || (1/4, 3/4)) = 1/2 ln 2 + 1/2 ln(2/3) = 0.14384103622589045.
  std::vector<double> p(2), q(2);
  log_softmax(logits_of({0.5, 0.5}), p);
  log_softmax(logits_of({0.25, 0.75}, 7.0f), q);  // shifted logits: the same distribution
  EXPECT_NEAR(kl_divergence(p, q), 0.5 * std::log(2.0) + 0.5 * std::log(2.0 / 3.0), 1e-7);
  EXPECT_NEAR(kl_divergence(p, q), 0.14384103622589045, 1e-7);
  // Not symmetric: KL(Q || P) = 1/4 ln(1/2) + 3/4 ln(3/2) = 0.13081203594113694.
  EXPECT_NEAR(kl_divergence(q, p), 0.13081203594113694, 1e-7);
  EXPECT_EQ(kl_divergence(p, p), 0.0);
}

TEST(Metrics, PerplexityOfAKnownSequence) {
  Accumulator uniform;
  for (int32_t next : {0, 3, 1, 2}) uniform.add_nll(std::vector<float>{1, 1, 1, 1}, next);
  EXPECT_NEAR(uniform.perplexity(), 4.0, 1e-9);  // a uniform guess over 4 tokens
  // The next tokens had probabilities 1/2 and 1/4: mean NLL (ln 2 + ln 4) / 2, perplexity
  // sqrt(2 * 4).
  Accumulator a;
  const std::vector<float> l = logits_of({0.5, 0.25, 0.125, 0.125});
  a.add_nll(l, 0);
  a.add_nll(l, 1);
  EXPECT_NEAR(a.mean_nll(), (std::log(2.0) + std::log(4.0)) / 2, 1e-7);
  EXPECT_NEAR(a.perplexity(), std::sqrt(8.0), 1e-6);
}

TEST(Metrics, AgainstItselfEverythingIsExact) {
  Accumulator a;
  const std::vector<float> l = {0.1f, 2.0f, -1.0f, 0.5f};
  for (int i = 0; i < 5; ++i) a.add(l, l, 1);
  EXPECT_EQ(a.kl().mean, 0.0);
  EXPECT_EQ(a.kl().max, 0.0);
  EXPECT_EQ(a.top1_agreement(), 1.0);
  EXPECT_EQ(a.mean_abs_logit_error(), 0.0);
  EXPECT_EQ(a.positions(), 5u);
}

TEST(Metrics, TopOneLogitErrorAndKlQuantiles) {
  Accumulator a;
  const std::vector<float> ref = {0, 1, 0, 0};
  a.add(std::vector<float>{0, 1, 0, 0}, ref, 1);    // the same
  a.add(std::vector<float>{0, 0, 2, 0}, ref, 1);    // another token first; |err| = (0 + 1 + 2 + 0) / 4
  a.add(std::vector<float>{0, 1.5, 0, 0}, ref, 1);  // the same first token, sharper
  EXPECT_NEAR(a.top1_agreement(), 2.0 / 3.0, 1e-12);
  EXPECT_NEAR(a.mean_abs_logit_error(), (0.0 + 3.0 + 0.5) / 12.0, 1e-7);
  // The KLs by the definition, softmax written out.
  auto kl_of = [](std::vector<double> p_logits, std::vector<double> q_logits) {
    double zp = 0, zq = 0;
    for (double x : p_logits) zp += std::exp(x);
    for (double x : q_logits) zq += std::exp(x);
    double kl = 0;
    for (size_t i = 0; i < p_logits.size(); ++i) {
      const double p = std::exp(p_logits[i]) / zp, q = std::exp(q_logits[i]) / zq;
      kl += p * std::log(p / q);
    }
    return kl;
  };
  const double second = kl_of({0, 1, 0, 0}, {0, 0, 2, 0});
  const double third = kl_of({0, 1, 0, 0}, {0, 1.5, 0, 0});
  ASSERT_GT(second, third);
  const Accumulator::Kl kl = a.kl();
  EXPECT_NEAR(kl.mean, (0 + second + third) / 3, 1e-7);
  EXPECT_NEAR(kl.median, third, 1e-7);
  EXPECT_NEAR(kl.max, second, 1e-7);
  EXPECT_NEAR(kl.p99, second, 1e-7);  // the nearest rank of 99% of 3 is the largest
}

TEST(Metrics, ArgmaxTakesTheFirstOfEquals) {
  EXPECT_EQ(argmax(std::vector<float>{1, 3, 3, 2}), 1);
  EXPECT_EQ(mean_abs_difference(std::vector<float>{1, 2}, std::vector<float>{2, 0}), 1.5);
}

}  // namespace
}  // namespace kvrt::eval
