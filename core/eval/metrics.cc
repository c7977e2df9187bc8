#include "core/eval/metrics.h"

#include <algorithm>
#include <cmath>

namespace kvrt::eval {

void log_softmax(std::span<const float> logits, std::span<double> out) {
  double max = -INFINITY;
  for (float x : logits) max = std::max(max, static_cast<double>(x));
  double sum = 0;
  for (float x : logits) sum += std::exp(static_cast<double>(x) - max);
  const double log_sum = max + std::log(sum);
  for (size_t i = 0; i < logits.size(); ++i) out[i] = static_cast<double>(logits[i]) - log_sum;
}

double kl_divergence(std::span<const double> log_p, std::span<const double> log_q) {
  double kl = 0;
  for (size_t i = 0; i < log_p.size(); ++i) {
    const double p = std::exp(log_p[i]);
    if (p > 0) kl += p * (log_p[i] - log_q[i]);
  }
  return std::max(kl, 0.0);
}

int32_t argmax(std::span<const float> v) {
  return static_cast<int32_t>(std::max_element(v.begin(), v.end()) - v.begin());
}

double mean_abs_difference(std::span<const float> a, std::span<const float> b) {
  double sum = 0;
  for (size_t i = 0; i < a.size(); ++i) sum += std::fabs(static_cast<double>(a[i]) - b[i]);
  return a.empty() ? 0 : sum / static_cast<double>(a.size());
}

void Accumulator::add(std::span<const float> logits, std::span<const float> reference,
                      int32_t next) {
  scratch_p_.resize(reference.size());
  scratch_q_.resize(logits.size());
  log_softmax(reference, scratch_p_);
  log_softmax(logits, scratch_q_);
  nll_.push_back(-scratch_q_[static_cast<size_t>(next)]);
  kl_.push_back(kl_divergence(scratch_p_, scratch_q_));
  top1_same_ += argmax(logits) == argmax(reference) ? 1 : 0;
  ++compared_;
  abs_error_sum_ += mean_abs_difference(logits, reference) * static_cast<double>(logits.size());
  abs_error_count_ += logits.size();
}

void Accumulator::add_nll(std::span<const float> logits, int32_t next) {
  scratch_q_.resize(logits.size());
  log_softmax(logits, scratch_q_);
  nll_.push_back(-scratch_q_[static_cast<size_t>(next)]);
}

double Accumulator::mean_nll() const {
  double sum = 0;
  for (double x : nll_) sum += x;
  return nll_.empty() ? 0 : sum / static_cast<double>(nll_.size());
}

double Accumulator::perplexity() const { return std::exp(mean_nll()); }

Accumulator::Kl Accumulator::kl() const {
  Kl out;
  if (kl_.empty()) return out;
  std::vector<double> v = kl_;
  std::sort(v.begin(), v.end());
  double sum = 0;
  for (double x : v) sum += x;
  const size_t n = v.size();
  out.mean = sum / static_cast<double>(n);
  out.median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  out.p99 = v[std::min(n - 1, static_cast<size_t>(0.99 * static_cast<double>(n - 1) + 0.5))];
  out.max = v.back();
  return out;
}

double Accumulator::top1_agreement() const {
  return compared_ == 0 ? 1.0 : static_cast<double>(top1_same_) / static_cast<double>(compared_);
}

double Accumulator::mean_abs_logit_error() const {
  return abs_error_count_ == 0 ? 0 : abs_error_sum_ / static_cast<double>(abs_error_count_);
}

}  // namespace kvrt::eval
