#include "core/exec/sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

namespace kvrt::exec {

SampledLogprobs logprobs_of(std::span<const float> logits, int32_t id, int32_t k, float scale) {
  const auto n = static_cast<int32_t>(logits.size());
  // A positive scale keeps the order, so the maximum and the top entries are the logits' own.
  float max = -std::numeric_limits<float>::infinity();
  for (float x : logits) max = std::max(max, x);
  const double smax = static_cast<double>(max) * scale;
  double sum = 0;
  if (std::isfinite(max)) {
    for (float x : logits) sum += std::exp(static_cast<double>(x) * scale - smax);
  }
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
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    std::partial_sort(order.begin(), order.begin() + k, order.end(), [&](int32_t a, int32_t b) {
      const float x = logits[static_cast<size_t>(a)], y = logits[static_cast<size_t>(b)];
      return x > y || (x == y && a < b);
    });
    out.top.reserve(static_cast<size_t>(k));
    for (int32_t i = 0; i < k; ++i) {
      const int32_t id_i = order[static_cast<size_t>(i)];
      out.top.push_back({id_i, logprob(id_i)});
    }
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
  const int32_t token = [&] {
    const auto n = static_cast<int32_t>(logits.size());
    // Greedy: the first maximum, as argmax does.
    if (params_.temperature <= 0.0f) {
      return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) -
                                  logits.begin());
    }
    std::vector<int32_t> order(static_cast<size_t>(n));
    std::iota(order.begin(), order.end(), 0);
    const int32_t k = params_.top_k > 0 ? std::min(params_.top_k, n) : n;
    std::partial_sort(order.begin(), order.begin() + k, order.end(),
                      [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
    order.resize(static_cast<size_t>(k));
    std::vector<double> probs(static_cast<size_t>(k));
    double sum = 0;
    for (int32_t i = 0; i < k; ++i) {
      probs[i] = std::exp((logits[order[i]] - logits[order[0]]) / params_.temperature);
      sum += probs[i];
    }
    // Nucleus: the smallest prefix (in probability order) whose mass reaches top_p.
    int32_t keep = k;
    if (params_.top_p < 1.0f) {
      double mass = 0;
      for (int32_t i = 0; i < k; ++i) {
        mass += probs[i] / sum;
        if (mass >= params_.top_p) {
          keep = i + 1;
          break;
        }
      }
    }
    // Min-p: only tokens at least min_p times as likely as the first (probs[0] is 1).
    if (params_.min_p > 0.0f) {
      int32_t likely = 1;
      while (likely < keep && probs[likely] >= static_cast<double>(params_.min_p)) ++likely;
      keep = likely;
    }
    double kept = 0;
    for (int32_t i = 0; i < keep; ++i) kept += probs[i];
    double u = uniform() * kept;
    for (int32_t i = 0; i < keep; ++i) {
      u -= probs[i];
      if (u < 0) return order[i];
    }
    return order[keep - 1];
  }();
  if (params_.logprobs >= 0) {
    const float scale = params_.temperature > 0.0f ? 1.0f / params_.temperature : 1.0f;
    logprobs_.push_back(logprobs_of(logits, token, params_.logprobs, scale));
  }
  ++generated_;
  if (counts_output()) ++counts_[token];
  return token;
}

}  // namespace kvrt::exec
