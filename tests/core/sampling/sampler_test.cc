// The sampler's penalties, logit bias and min_tokens against their definitions worked by hand,
// its log-probabilities against a log-softmax in double precision (the distribution the token is
// sampled from, finite and <= 0, the top ones in order), and its draws against the exact
// distribution of each mode, defined by sorting (chi-square over many fixed-seed draws).
#include "core/sampling/sampler.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>
#include <string>
#include <vector>

namespace kvrt::sampling {
namespace {

SamplingParams greedy() { return SamplingParams{}; }

// A naive log-softmax of x / t at i.
double naive_logprob(const std::vector<float>& x, size_t i, double t = 1.0) {
  double max = -INFINITY;
  for (float v : x) max = std::max(max, v / t);
  double sum = 0;
  for (float v : x) sum += std::exp(v / t - max);
  return x[i] / t - max - std::log(sum);
}

TEST(Sampler, FrequencyAndPresencePenaltiesCountTheOutputSoFar) {
  const std::vector<float> logits = {0.0f, 2.0f, 1.5f, 1.0f};
  SamplingParams p = greedy();
  p.frequency_penalty = 0.3f;
  Sampler s(p);
  // 2.0, then 1.7 against 1.5, then 1.4 < 1.5.
  EXPECT_EQ(s.sample(logits), 1);
  EXPECT_EQ(s.sample(logits), 1);
  EXPECT_EQ(s.sample(logits), 2);
  SamplingParams q = greedy();
  q.presence_penalty = 0.6f;  // once: 2.0 - 0.6 = 1.4 < 1.5, however often it came
  Sampler t(q);
  EXPECT_EQ(t.sample(logits), 1);
  EXPECT_EQ(t.sample(logits), 2);
  EXPECT_EQ(t.sample(logits), 1);  // 1.4 beats 1.5 - 0.6 and 1.0
  EXPECT_EQ(t.sample(logits), 1);  // and stays 1.4: presence counts once
}

TEST(Sampler, RepetitionPenaltyDividesPositiveAndMultipliesNegativeLogitsOfSeenIds) {
  // Token 0 is in the prompt: 3.0 / 2 = 1.5 < 2.0. Token 2's -1 would become -2.
  const std::vector<float> logits = {3.0f, 2.0f, -1.0f};
  SamplingParams p = greedy();
  p.repetition_penalty = 2.0f;
  const int32_t prompt[] = {0, 0, 2};
  Sampler s(p, prompt);
  std::vector<float> reshaped = logits;
  EXPECT_EQ(s.sample_in_place(reshaped), 1);
  EXPECT_EQ(reshaped, (std::vector<float>{1.5f, 2.0f, -2.0f}));
  // Now 1 is in the output too: 1.0 < 1.5.
  EXPECT_EQ(s.sample(logits), 0);
}

TEST(Sampler, LogitBiasAndMinTokensReshapeTheLogits) {
  const std::vector<float> logits = {1.0f, 0.0f, 5.0f};
  SamplingParams p = greedy();
  p.logit_bias = {{1, 10.0f}};
  EXPECT_EQ(Sampler(p).sample(logits), 1);
  // Token 2 is the stop id: held back for the first two tokens.
  SamplingParams q = greedy();
  q.min_tokens = 2;
  const int32_t stop[] = {2};
  Sampler s(q, {}, stop);
  EXPECT_EQ(s.sample(logits), 0);
  EXPECT_EQ(s.sample(logits), 0);
  EXPECT_EQ(s.sample(logits), 2);
  // The const form leaves the caller's logits as they were.
  EXPECT_EQ(logits, (std::vector<float>{1.0f, 0.0f, 5.0f}));
}

TEST(Sampler, LogprobsAreTheLogSoftmaxOfWhatItSamplesFrom) {
  const std::vector<float> logits = {0.5f, 2.0f, -1.0f, 2.0f, 1.0f};
  SamplingParams p = greedy();
  p.logprobs = 3;
  Sampler s(p);
  ASSERT_EQ(s.sample(logits), 1);  // the first maximum
  ASSERT_TRUE(s.has_logprobs());
  const SampledLogprobs g = s.take_logprobs();
  EXPECT_FALSE(s.has_logprobs());
  EXPECT_EQ(g.chosen.id, 1);
  EXPECT_NEAR(g.chosen.logprob, naive_logprob(logits, 1), 1e-6);
  ASSERT_EQ(g.top.size(), 3u);
  // The likeliest first, ties by id.
  EXPECT_EQ(g.top[0].id, 1);
  EXPECT_EQ(g.top[1].id, 3);
  EXPECT_EQ(g.top[2].id, 4);
  for (const TokenLogprob& t : g.top) {
    EXPECT_NEAR(t.logprob, naive_logprob(logits, static_cast<size_t>(t.id)), 1e-6);
    EXPECT_LE(t.logprob, 0.0f);
  }
  // With a temperature: of the tempered logits; masked ids are finite, the lowest float.
  SamplingParams q;
  q.temperature = 0.5f;
  q.seed = 9;
  q.logprobs = 5;
  q.logit_bias = {{2, -std::numeric_limits<float>::infinity()}};
  Sampler t(q);
  const int32_t id = t.sample(logits);
  const SampledLogprobs w = t.take_logprobs();
  std::vector<float> masked = logits;
  masked[2] = -std::numeric_limits<float>::infinity();
  EXPECT_EQ(w.chosen.id, id);
  EXPECT_NEAR(w.chosen.logprob, naive_logprob(masked, static_cast<size_t>(id), 0.5), 1e-5);
  double mass = 0;
  for (const TokenLogprob& e : w.top) {
    EXPECT_TRUE(std::isfinite(e.logprob));
    EXPECT_LE(e.logprob, 0.0f);
    if (e.id != 2) mass += std::exp(static_cast<double>(e.logprob));
  }
  EXPECT_NEAR(mass, 1.0, 1e-5);
  EXPECT_EQ(w.top.back().id, 2);
  EXPECT_EQ(w.top.back().logprob, std::numeric_limits<float>::lowest());
}

TEST(Sampler, NothingIsReportedUnlessAsked) {
  const std::vector<float> logits = {0.5f, 2.0f};
  Sampler s(greedy());
  s.sample(logits);
  EXPECT_FALSE(s.has_logprobs());
}

// The distribution a sampled draw must follow, from the definitions by sorting, in double
// precision: top-k keeps the tokens at least as likely as the k-th (ties in), top-p among those
// the ones whose likelier tokens hold less than top_p of their mass, min-p those at least min_p
// times as likely as the likeliest; probabilities exp(logit / T) renormalised over what is kept.
std::vector<double> exact_distribution(const std::vector<float>& logits, const SamplingParams& p) {
  const size_t n = logits.size();
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return logits[a] > logits[b]; });
  const double max = logits[order[0]];
  const double kth = p.top_k > 0 && static_cast<size_t>(p.top_k) < n
                         ? logits[order[static_cast<size_t>(p.top_k) - 1]]
                         : -INFINITY;
  std::vector<double> w(n, 0.0);
  double mass = 0;
  for (size_t i = 0; i < n; ++i) {
    if (logits[i] >= kth) mass += w[i] = std::exp((logits[i] - max) / p.temperature);
  }
  std::vector<double> out(n, 0.0);
  double likelier = 0, kept = 0;
  for (size_t r = 0; r < n;) {
    // A run of ties shares its likelier mass.
    size_t end = r;
    double run = 0;
    while (end < n && logits[order[end]] == logits[order[r]]) run += w[order[end++]];
    for (size_t q = r; q < end; ++q) {
      const size_t i = order[q];
      if (w[i] > 0 && likelier < p.top_p * mass && w[i] >= p.min_p) kept += out[i] = w[i];
    }
    likelier += run;
    r = end;
  }
  for (double& x : out) x /= kept;
  return out;
}

// Pearson's chi-square of `counts` against `expected` probabilities: tokens expected at least
// 5 times are a bin each, the rest one bin. Fails at once on a draw of a token of probability 0.
// The bound is far in the tail (about 6 standard deviations of the statistic past its mean), so
// fixed seeds pass a right sampler by a wide margin and fail a wrong distribution.
::testing::AssertionResult follows(const std::vector<int64_t>& counts,
                                   const std::vector<double>& expected) {
  int64_t draws = 0;
  for (int64_t c : counts) draws += c;
  double chi = 0, rest_expected = 0;
  int64_t rest_count = 0, bins = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    if (expected[i] == 0 && counts[i] > 0) {
      return ::testing::AssertionFailure()
             << "token " << i << " has probability 0 and was drawn " << counts[i] << " times";
    }
    const double e = expected[i] * static_cast<double>(draws);
    if (e >= 5) {
      chi += (static_cast<double>(counts[i]) - e) * (static_cast<double>(counts[i]) - e) / e;
      ++bins;
    } else {
      rest_expected += e;
      rest_count += counts[i];
    }
  }
  if (rest_expected > 0) {
    chi += (static_cast<double>(rest_count) - rest_expected) *
           (static_cast<double>(rest_count) - rest_expected) / std::max(rest_expected, 1.0);
    ++bins;
  }
  const double df = static_cast<double>(std::max<int64_t>(bins - 1, 1));
  const double bound = df + 6 * std::sqrt(2 * df) + 10;
  if (chi > bound) {
    return ::testing::AssertionFailure()
           << "chi-square " << chi << " over " << df << " degrees of freedom > " << bound;
  }
  return ::testing::AssertionSuccess() << "chi-square " << chi << " over " << df;
}

std::vector<float> gaussian_logits(size_t n, float sigma, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(n);
  for (float& v : x) v = normal(rng);
  x[n / 2] = x[n / 3];  // a tie
  return x;
}

std::vector<int64_t> draw_counts(const std::vector<float>& logits, const SamplingParams& p,
                                 int draws) {
  std::vector<int64_t> counts(logits.size(), 0);
  Sampler s(p);
  for (int i = 0; i < draws; ++i) ++counts[static_cast<size_t>(s.sample(logits))];
  return counts;
}

SamplingParams sampled(float temperature, int32_t top_k, float top_p, float min_p) {
  SamplingParams p;
  p.temperature = temperature;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.seed = 12345;
  return p;
}

TEST(SamplerDistribution, EachModeDrawsTheExactDistribution) {
  const std::vector<float> logits = gaussian_logits(1000, 2.0f, 7);
  const struct {
    std::string name;
    SamplingParams params;
  } modes[] = {
      {"temperature", sampled(0.8f, 0, 1.0f, 0.0f)},
      {"top_k", sampled(1.0f, 40, 1.0f, 0.0f)},
      {"top_p", sampled(0.7f, 0, 0.9f, 0.0f)},
      {"min_p", sampled(1.0f, 0, 1.0f, 0.05f)},
      {"top_k + top_p + min_p", sampled(1.3f, 200, 0.8f, 0.01f)},
      {"hot top_p", sampled(5.0f, 0, 0.95f, 0.0f)},
  };
  for (const auto& mode : modes) {
    SamplingParams p = mode.params;
    EXPECT_TRUE(follows(draw_counts(logits, p, 20000), exact_distribution(logits, p))) << mode.name;
    // Log-probabilities asked for draw from the same distribution.
    p.logprobs = 2;
    p.seed = 99;
    EXPECT_TRUE(follows(draw_counts(logits, p, 5000), exact_distribution(logits, p)))
        << mode.name << " with logprobs";
  }
}

TEST(SamplerDistribution, PenaltiesAndBiasDrawFromTheReshapedLogits) {
  // The first draw of a fresh sampler per seed: its logits reshaped by the prompt's repetition
  // penalty and the bias alone (nothing generated yet).
  const std::vector<float> logits = gaussian_logits(300, 1.5f, 8);
  SamplingParams p = sampled(0.9f, 0, 0.95f, 0.0f);
  p.repetition_penalty = 1.5f;
  p.frequency_penalty = 0.5f;
  p.logit_bias = {{7, 4.0f}, {8, -100.0f}};
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 7, 7};
  std::vector<float> reshaped = logits;
  Sampler(p, prompt).sample_in_place(reshaped);  // reshapes, then draws once
  std::vector<int64_t> counts(logits.size(), 0);
  for (uint64_t seed = 0; seed < 10000; ++seed) {
    p.seed = seed;
    ++counts[static_cast<size_t>(Sampler(p, prompt).sample(logits))];
  }
  EXPECT_TRUE(follows(counts, exact_distribution(reshaped, p)));
}

TEST(SamplerDistribution, AWrongDistributionFailsTheTest) {
  // The check has the power to tell: top_p 0.9's draws are not top_p 0.95's distribution, nor
  // temperature 0.8's those of 0.9.
  const std::vector<float> logits = gaussian_logits(1000, 2.0f, 7);
  const SamplingParams p = sampled(0.7f, 0, 0.9f, 0.0f);
  EXPECT_FALSE(follows(draw_counts(logits, p, 20000),
                       exact_distribution(logits, sampled(0.7f, 0, 0.95f, 0.0f))));
  const SamplingParams t = sampled(0.8f, 0, 1.0f, 0.0f);
  EXPECT_FALSE(follows(draw_counts(logits, t, 20000),
                       exact_distribution(logits, sampled(0.9f, 0, 1.0f, 0.0f))));
}

TEST(SamplerDistribution, ARealVocabularyWithAWideNucleus) {
  // Qwen3's 151,936 tokens with logits as flat as seeded random weights give: top_p 0.95 keeps
  // most of the vocabulary. Ten bins of equal expected mass in probability order.
  const std::vector<float> logits = gaussian_logits(151936, 0.5f, 9);
  const SamplingParams p = sampled(0.7f, 0, 0.95f, 0.0f);
  const std::vector<double> exact = exact_distribution(logits, p);
  std::vector<size_t> order(exact.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return exact[a] > exact[b]; });
  std::vector<int> bin(exact.size(), -1);
  double cumulative = 0;
  for (size_t i : order) {
    if (exact[i] == 0) break;
    bin[i] = std::min(9, static_cast<int>(cumulative * 10));
    cumulative += exact[i];
  }
  std::vector<double> expected(10, 0.0);
  for (size_t i = 0; i < exact.size(); ++i) {
    if (bin[i] >= 0) expected[static_cast<size_t>(bin[i])] += exact[i];
  }
  std::vector<int64_t> counts(10, 0);
  Sampler s(p);
  for (int i = 0; i < 3000; ++i) {
    const int b = bin[static_cast<size_t>(s.sample(logits))];
    ASSERT_GE(b, 0) << "a token outside the nucleus";
    ++counts[static_cast<size_t>(b)];
  }
  EXPECT_TRUE(follows(counts, expected));
}

TEST(SamplerDistribution, ATemperatureUnderTheEpsilonIsGreedy) {
  // 1e-45 is a denormal whose reciprocal overflows; 1e-6 is under vLLM's and SGLang's epsilon.
  const std::vector<float> logits = gaussian_logits(1000, 1.0f, 11);
  const auto argmax = std::max_element(logits.begin(), logits.end()) - logits.begin();
  for (float t : {1e-45f, 1e-6f}) {
    SamplingParams p = sampled(t, 0, 0.9f, 0.0f);
    p.logprobs = 1;
    Sampler s(p);
    EXPECT_EQ(s.sample(logits), argmax) << t;
    const SampledLogprobs lp = s.take_logprobs();
    EXPECT_TRUE(std::isfinite(lp.chosen.logprob)) << t;
  }
}

TEST(SamplerDistribution, ASeedReproducesItsDrawsAndSeedsDiffer) {
  const std::vector<float> logits = gaussian_logits(151936, 1.0f, 10);
  const SamplingParams p = sampled(1.0f, 50, 0.95f, 0.0f);
  auto run = [&](uint64_t seed) {
    SamplingParams q = p;
    q.seed = seed;
    Sampler s(q);
    std::vector<int32_t> ids;
    for (int i = 0; i < 20; ++i) ids.push_back(s.sample(logits));
    return ids;
  };
  EXPECT_EQ(run(1), run(1));
  EXPECT_NE(run(1), run(2));
}

}  // namespace
}  // namespace kvrt::sampling
