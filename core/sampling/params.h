// What a request asks of its sampler (SamplingParams: the request owns them, GenerateRequest
// carries them) and what the sampler reports of a token's log-probability.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace kvrt::sampling {

// Temperatures below this decode greedily (vLLM's and SGLang's sampling epsilon).
inline constexpr float kGreedyBelow = 1e-5f;

struct SamplingParams {
  float temperature = 0.0f;  // 0 (or under kGreedyBelow): greedy
  int32_t top_k = 0;         // 0: all tokens
  float top_p = 1.0f;        // 1: no nucleus cut
  uint64_t seed = 0;
  float min_p = 0.0f;  // keep tokens at least min_p times as likely as the likeliest; 0: off
  // OpenAI's and vLLM's penalties, over the request's own output tokens: a token's logit less
  // frequency_penalty times its count so far, and less presence_penalty once it appeared.
  float frequency_penalty = 0.0f;
  float presence_penalty = 0.0f;
  // transformers' (and SGLang's): a token in the prompt or the output so far has its logit
  // divided by this when positive, multiplied when negative; 1: off.
  float repetition_penalty = 1.0f;
  // Added to these ids' logits (OpenAI's logit_bias).
  std::vector<std::pair<int32_t, float>> logit_bias = {};
  // The stop ids (the sampler's constructor names them) cannot be sampled before this many
  // output tokens.
  int32_t min_tokens = 0;
  // Log-probabilities: -1 none; k >= 0 the chosen token's and the k likeliest tokens'.
  int32_t logprobs = -1;
  // The prompt's: -1 none; p >= 0 those of its tokens from position p on (position 0 has none),
  // with logprobs' k likeliest (0 when logprobs is -1). Of the model's raw logits (no penalty,
  // bias or temperature: nothing was sampled there).
  int32_t prompt_logprobs_from = -1;
};

struct TokenLogprob {
  int32_t id = 0;
  float logprob = 0.0f;  // natural log, finite and <= 0
};
// What sample() reports of one token when SamplingParams::logprobs >= 0.
struct SampledLogprobs {
  TokenLogprob chosen;
  std::vector<TokenLogprob> top;  // the likeliest first; ties by id
};

}  // namespace kvrt::sampling
