// Picks the next token from logits: greedy, or temperature with top-k / top-p, seeded so a run
// is reproducible.
#pragma once

#include <cstdint>
#include <random>
#include <span>

namespace kvrt::exec {

struct SamplingParams {
  float temperature = 0.0f;  // 0: greedy
  int32_t top_k = 0;         // 0: all tokens
  float top_p = 1.0f;        // 1: no nucleus cut
  uint64_t seed = 0;
  float min_p = 0.0f;  // keep tokens at least min_p times as likely as the likeliest; 0: off
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  int32_t sample(std::span<const float> logits);

 private:
  double uniform();  // [0, 1), the same on every platform for a seed

  SamplingParams params_;
  std::mt19937_64 rng_;
};

}  // namespace kvrt::exec
