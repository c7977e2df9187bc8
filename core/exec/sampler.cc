#include "core/exec/sampler.h"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

namespace kvrt::exec {

double Sampler::uniform() {
  return static_cast<double>(rng_() >> 11) * 0x1.0p-53;  // mt19937_64's output is specified
}

int32_t Sampler::sample(std::span<const float> logits) {
  const int32_t n = static_cast<int32_t>(logits.size());
  // Greedy: the first maximum, as argmax does.
  if (params_.temperature <= 0.0f) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  const int32_t k = params_.top_k > 0 ? std::min(params_.top_k, n) : n;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  order.resize(k);
  std::vector<double> probs(k);
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
}

}  // namespace kvrt::exec
