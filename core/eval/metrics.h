// What a KV format does to a model's next-token distributions, measured against a reference
// (the same model with exact f32 KV): per position the KL divergence of the reference's
// distribution from the format's, whether the two agree on the likeliest token, how far the
// logits moved, and the negative log-likelihood of the token that actually came next.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace kvrt::eval {

// log softmax of `logits` into `out` (same size), in double for the sums.
void log_softmax(std::span<const float> logits, std::span<double> out);

// KL(P || Q) = sum_i p_i (log p_i - log q_i), from log-probabilities; 0 when P == Q, and
// never negative (rounding below 0 is clamped).
double kl_divergence(std::span<const double> log_p, std::span<const double> log_q);

// The index of the largest value (the first of equals).
int32_t argmax(std::span<const float> v);

// Mean of |a_i - b_i|.
double mean_abs_difference(std::span<const float> a, std::span<const float> b);

// Accumulates one store's figures over positions.
class Accumulator {
 public:
  // One position: the store's and the reference's logits, and the token that came next.
  void add(std::span<const float> logits, std::span<const float> reference, int32_t next);
  // Only the store's own likelihood (the reference itself).
  void add_nll(std::span<const float> logits, int32_t next);

  uint64_t positions() const { return nll_.size(); }
  double perplexity() const;  // exp(mean NLL)
  double mean_nll() const;
  // KL of the reference's distribution from this store's, over positions (empty for the
  // reference itself): mean, median, 99th percentile, max.
  struct Kl {
    double mean = 0, median = 0, p99 = 0, max = 0;
  };
  Kl kl() const;
  double top1_agreement() const;  // share of positions whose likeliest token is the reference's
  double mean_abs_logit_error() const;

 private:
  std::vector<double> nll_, kl_;
  uint64_t top1_same_ = 0, compared_ = 0;
  double abs_error_sum_ = 0;
  uint64_t abs_error_count_ = 0;
  std::vector<double> scratch_p_, scratch_q_;
};

}  // namespace kvrt::eval
