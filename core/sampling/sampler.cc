#include "core/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kernels/cpu/sampling.h"

namespace kvrt::sampling {

SampledLogprobs logprobs_of(std::span<const float> logits, int32_t id, int32_t k, float scale) {
  const auto n = static_cast<int32_t>(logits.size());
  // A positive scale keeps the order, so the maximum and the top entries are the logits' own.
  const float max = kernels::max_value(logits.data(), logits.size());
  const double smax = static_cast<double>(max) * scale;
  double sum = 0;
  if (std::isfinite(max)) sum = kernels::exp_sum(logits.data(), logits.size(), max, scale);
  const double lse = smax + std::log(sum);
  auto logprob = [&](int32_t i) {
    const double lp = static_cast<double>(logits[static_cast<size_t>(i)]) * scale - lse;
    // A masked token (-inf) gets the lowest finite value: the answer's JSON has no -inf.
    if (!std::isfinite(lp)) return std::numeric_limits<float>::lowest();
    return static_cast<float>(std::min(0.0, lp));
  };
  SampledLogprobs out;
  out.chosen = {id, logprob(id)};
  k = std::clamp(k, 0, n);
  if (k > 0) {
    // The k largest by selection: every entry at least the k-th largest, then those few sorted
    // (the likeliest first, ties by id) and cut to k.
    std::vector<float> scratch;
    const float kth =
        kernels::kth_largest(logits.data(), logits.size(), static_cast<size_t>(k), &scratch);
    std::vector<int32_t> top;
    for (size_t i = kernels::find_at_least(logits.data(), logits.size(), 0, kth); i < logits.size();
         i = kernels::find_at_least(logits.data(), logits.size(), i + 1, kth)) {
      top.push_back(static_cast<int32_t>(i));
    }
    std::sort(top.begin(), top.end(), [&](int32_t a, int32_t b) {
      const float x = logits[static_cast<size_t>(a)], y = logits[static_cast<size_t>(b)];
      return x > y || (x == y && a < b);
    });
    top.resize(static_cast<size_t>(k));
    out.top.reserve(static_cast<size_t>(k));
    for (int32_t id_i : top) out.top.push_back({id_i, logprob(id_i)});
  }
  return out;
}

Sampler::Sampler(const SamplingParams& params, std::span<const int32_t> prompt,
                 std::span<const int32_t> stop_ids)
    : params_(params), rng_(params.seed) {
  if (params_.repetition_penalty != 1.0f) {
    prompt_ids_.assign(prompt.begin(), prompt.end());
    std::sort(prompt_ids_.begin(), prompt_ids_.end());
    prompt_ids_.erase(std::unique(prompt_ids_.begin(), prompt_ids_.end()), prompt_ids_.end());
  }
  if (params_.min_tokens > 0) stop_ids_.assign(stop_ids.begin(), stop_ids.end());
  // Position 0 has nothing before it to be predicted from.
  next_prompt_ = std::max(params_.prompt_logprobs_from, 1);
}

void Sampler::add_prompt_logprob(int32_t position, std::span<const float> logits, int32_t id) {
  if (params_.prompt_logprobs_from < 0 || position != next_prompt_) return;
  prompt_logprobs_.push_back(logprobs_of(logits, id, std::max(params_.logprobs, 0)));
  ++next_prompt_;
}

std::vector<SampledLogprobs> Sampler::take_prompt_logprobs() {
  std::vector<SampledLogprobs> out;
  out.swap(prompt_logprobs_);
  return out;
}

double Sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // mt19937_64's output is specified
}

bool Sampler::counts_output() const {
  return params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f ||
         params_.repetition_penalty != 1.0f;
}

bool Sampler::reshapes() const {
  return counts_output() || !params_.logit_bias.empty() ||
         (params_.min_tokens > generated_ && !stop_ids_.empty());
}

void Sampler::reshape(std::span<float> logits) const {
  const auto n = static_cast<int32_t>(logits.size());
  auto at = [&](int32_t id) -> float* {
    return id >= 0 && id < n ? &logits[static_cast<size_t>(id)] : nullptr;
  };
  const float rep = params_.repetition_penalty;
  auto repeat = [rep](float* x) { *x = *x > 0 ? *x / rep : *x * rep; };
  if (rep != 1.0f) {
    // Once per id seen, in the prompt or the output.
    for (int32_t id : prompt_ids_) {
      if (float* x = at(id)) repeat(x);
    }
    for (const auto& [id, count] : counts_) {
      if (std::binary_search(prompt_ids_.begin(), prompt_ids_.end(), id)) continue;
      if (float* x = at(id)) repeat(x);
    }
  }
  if (params_.frequency_penalty != 0.0f || params_.presence_penalty != 0.0f) {
    for (const auto& [id, count] : counts_) {
      if (float* x = at(id)) {
        *x -= params_.frequency_penalty * static_cast<float>(count) + params_.presence_penalty;
      }
    }
  }
  for (const auto& [id, bias] : params_.logit_bias) {
    if (float* x = at(id)) *x += bias;
  }
  if (generated_ < params_.min_tokens) {
    for (int32_t id : stop_ids_) {
      if (float* x = at(id)) *x = -std::numeric_limits<float>::infinity();
    }
  }
}

int32_t Sampler::sample(std::span<const float> logits) {
  if (!reshapes()) return choose(logits);
  scratch_.assign(logits.begin(), logits.end());
  return sample_in_place(std::span<float>(scratch_));
}

int32_t Sampler::sample_in_place(std::span<float> logits) {
  if (reshapes()) reshape(logits);
  return choose(logits);
}

SampledLogprobs Sampler::take_logprobs() {
  SampledLogprobs front = std::move(logprobs_.front());
  logprobs_.pop_front();
  return front;
}

int32_t Sampler::choose(std::span<const float> logits) {
  // A temperature under vLLM's and SGLang's epsilon is greedy, as theirs is (its reciprocal
  // would overflow the weights of a denormal one).
  const bool sampled = params_.temperature >= kGreedyBelow;
  const int32_t token = sampled
                            ? draw(logits)
                            // Greedy: the first maximum, as argmax does.
                            : static_cast<int32_t>(kernels::argmax(logits.data(), logits.size()));
  if (params_.logprobs >= 0) {
    const float scale = sampled ? 1.0f / params_.temperature : 1.0f;
    logprobs_.push_back(logprobs_of(logits, token, params_.logprobs, scale));
  }
  ++generated_;
  if (counts_output()) ++counts_[token];
  return token;
}

int32_t Sampler::draw(std::span<const float> logits) {
  const float* x = logits.data();
  const size_t n = logits.size();
  const float max = kernels::max_value(x, n);
  if (!std::isfinite(max)) return static_cast<int32_t>(kernels::argmax(x, n));
  if (params_.top_k <= 0 || static_cast<size_t>(params_.top_k) >= n) {
    return static_cast<int32_t>(draw_among(x, n, max));
  }
  // Top-k: the tokens at least as likely as the k-th (ties with it stay in), gathered in
  // vocabulary order; the draw runs over those few alone.
  const float floor =
      kernels::kth_largest(x, n, static_cast<size_t>(params_.top_k), &select_scratch_);
  kept_ids_.clear();
  kept_logits_.clear();
  for (size_t i = kernels::find_at_least(x, n, 0, floor); i < n;
       i = kernels::find_at_least(x, n, i + 1, floor)) {
    kept_ids_.push_back(static_cast<int32_t>(i));
    kept_logits_.push_back(x[i]);
  }
  return kept_ids_[draw_among(kept_logits_.data(), kept_logits_.size(), max)];
}

size_t Sampler::draw_among(const float* x, size_t n, float max) {
  // Each token's weight relative to the likeliest (whose weight is 1), and their mass: the set
  // top-p's fraction is of.
  weights_.resize(n);
  float* w = weights_.data();
  const float mass = kernels::exp_weights(x, n, max, 1.0f / params_.temperature,
                                          -std::numeric_limits<float>::infinity(), w);
  // Min-p: the tokens weighing at least min_p. Draws are from the weights above `above`.
  float above = 0.0f;
  float drawn = mass;
  if (params_.min_p > 0.0f) {
    above = std::nextafter(params_.min_p, 0.0f);
    drawn = kernels::sum_above(w, n, above);
  }
  while (true) {
    // Inverse CDF in vocabulary order over the weights above `above`.
    size_t j = kernels::prefix_search(w, n, above, static_cast<float>(uniform()) * drawn);
    if (j >= n) {  // the target past a sum rounded otherwise: the last such token
      j = n - 1;
      while (j > 0 && !(w[j] > above)) --j;
    }
    if (params_.top_p >= 1.0f) return j;
    // Top-p without a sort (FlashInfer's rejection sampling): j is in the nucleus when the
    // tokens likelier than it hold less than top_p of the mass. If not, no token as likely as j
    // or less is, so draw again from the likelier ones: what is finally drawn is distributed
    // as the nucleus, renormalised. The likeliest token (weight 1) always passes.
    const float likelier = kernels::sum_above(w, n, w[j]);
    if (likelier < params_.top_p * mass) return j;
    above = w[j];
    drawn = likelier;
  }
}

}  // namespace kvrt::sampling
