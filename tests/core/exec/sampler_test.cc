// The sampler's penalties, logit bias and min_tokens against their definitions worked by hand,
// and its log-probabilities against a log-softmax in double precision: the distribution the
// token is sampled from, finite and <= 0, the top ones in order.
#include "core/exec/sampler.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

namespace kvrt::exec {
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

}  // namespace
}  // namespace kvrt::exec
