// Picks the next token from logits: greedy, or temperature with top-k / top-p / min-p, seeded so
// a run is reproducible; before it, the request's penalties, logit bias and min_tokens reshape
// the logits, and when asked it reports the chosen token's log-probability and the likeliest
// alternatives.
//
// Which tokens a sampled draw keeps: top-k those at least as likely as the k-th likeliest (ties
// with it included), top-p among those the ones whose likelier tokens hold less than top_p of
// their mass (the smallest nucleus that reaches top_p, ties included), min-p those at least
// min_p times as likely as the likeliest; the token is drawn from what all three keep, in
// proportion to exp(logit / temperature). Nothing is sorted: each draw makes a few vectorised
// passes over the logits (kernels/cpu/sampling.h), a top-p draw by rejection. A seed gives the
// same tokens for the same logits on the same CPU class (its sums are rounded in SIMD lanes).
//
// Which distribution the log-probabilities are of: the log-softmax, over the whole vocabulary,
// of the logits the token is sampled from -- after the penalties, the logit bias and the
// min_tokens mask, divided by the temperature when it samples (greedy: the untempered logits),
// before the top-k, top-p and min-p cuts.
#pragma once

#include <cstdint>
#include <deque>
#include <random>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "core/sampling/params.h"

namespace kvrt::sampling {

// The log-softmax of `logits` times `scale` (1 / temperature) over the whole vocabulary at
// `id`, and the k largest entries. Infinite logits (-inf: masked tokens) count as probability 0.
SampledLogprobs logprobs_of(std::span<const float> logits, int32_t id, int32_t k,
                            float scale = 1.0f);

class Sampler {
 public:
  // `prompt`: the ids repetition_penalty also covers; `stop_ids`: the ids min_tokens holds
  // back. Neither is kept unless those parameters are on.
  explicit Sampler(const SamplingParams& params, std::span<const int32_t> prompt = {},
                   std::span<const int32_t> stop_ids = {});
  // The next token of the request. sample_in_place reshapes `logits` in place (penalties, bias,
  // mask) when the parameters ask for it; sample copies them first when they do.
  int32_t sample_in_place(std::span<float> logits);
  int32_t sample(std::span<const float> logits);

  // The log-probabilities of each token sampled and not yet taken, oldest first (logprobs >= 0).
  bool has_logprobs() const { return !logprobs_.empty(); }
  SampledLogprobs take_logprobs();

  // The prompt's log-probabilities, as the engine step that computed each position's logits
  // reports them (prompt_logprobs_from >= 0): `position`'s token under the logits before it.
  // Each position once, in order (a recomputed prefill adds nothing new).
  void add_prompt_logprob(int32_t position, std::span<const float> logits, int32_t id);
  // The next prompt position whose log-probability is wanted; past the prompt once all are in.
  int32_t next_prompt_position() const { return next_prompt_; }
  std::vector<SampledLogprobs> take_prompt_logprobs();

  const SamplingParams& params() const { return params_; }

 private:
  bool reshapes() const;
  bool counts_output() const;  // a penalty reads the output's counts
  void reshape(std::span<float> logits) const;
  int32_t choose(std::span<const float> logits);
  int32_t draw(std::span<const float> logits);  // temperature >= kGreedyBelow
  // The index of the token drawn from x[0..n) (top-p, min-p), `max` the likeliest's logit.
  size_t draw_among(const float* x, size_t n, float max);
  double uniform();  // [0, 1), the same on every platform for a seed

  SamplingParams params_;
  std::mt19937_64 rng_;
  std::unordered_map<int32_t, int32_t> counts_;  // output ids so far (penalties on)
  std::vector<int32_t> prompt_ids_;              // distinct (repetition_penalty on)
  std::vector<int32_t> stop_ids_;                // min_tokens on
  int32_t generated_ = 0;
  std::vector<float> scratch_;         // the const form's copy
  std::vector<float> weights_;         // draw_among()'s exp((logit - max) / temperature)
  std::vector<float> select_scratch_;  // top-k's selection over a large k
  std::vector<int32_t> kept_ids_;      // top-k's tokens, in vocabulary order
  std::vector<float> kept_logits_;
  std::deque<SampledLogprobs> logprobs_;
  int32_t next_prompt_ = 0;
  std::vector<SampledLogprobs> prompt_logprobs_;
};

}  // namespace kvrt::sampling
