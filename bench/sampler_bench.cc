// One sequence's draw over a real vocabulary (Qwen3's 151,936 logits, Llama-3's 128,256), per
// sampling mode, against the reads it cannot do without: `read` is one vectorised pass over the
// row (its maximum: the floor of any sampler), `sorted` is kvrt's sampler before this one (a
// partial sort of every index by logit, then the nucleus in probability order), kept here as the
// before in the same run. Logits are seeded Gaussians (sigma 1: as flat as seeded random weights
// make them, where top_p 0.95 keeps most of the vocabulary), or peaked (sigma 4).
//   ./build/bin/sampler_bench --benchmark_counters_tabular=true
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "core/sampling/sampler.h"
#include "kernels/cpu/sampling.h"

namespace {

using kvrt::sampling::Sampler;
using kvrt::sampling::SamplingParams;

std::vector<float> logits_row(size_t vocab, float sigma) {
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, sigma);
  std::vector<float> x(vocab);
  for (float& v : x) v = normal(rng);
  return x;
}

struct Mode {
  const char* name;
  float temperature;
  int32_t top_k;
  float top_p;
  float min_p;
};
constexpr Mode kModes[] = {
    {"greedy", 0.0f, 0, 1.0f, 0.0f},     {"temperature", 0.7f, 0, 1.0f, 0.0f},
    {"top_k50", 1.0f, 50, 1.0f, 0.0f},   {"top_p0.95", 0.7f, 0, 0.95f, 0.0f},
    {"min_p0.05", 1.0f, 0, 1.0f, 0.05f}, {"top_k50_top_p0.9", 0.8f, 50, 0.9f, 0.0f},
};

SamplingParams params_of(const Mode& m) {
  SamplingParams p;
  p.temperature = m.temperature;
  p.top_k = m.top_k;
  p.top_p = m.top_p;
  p.min_p = m.min_p;
  p.seed = 1;
  return p;
}

void BM_Sampler(benchmark::State& state, Mode mode, size_t vocab, float sigma) {
  const std::vector<float> logits = logits_row(vocab, sigma);
  Sampler s(params_of(mode));
  for (auto _ : state) benchmark::DoNotOptimize(s.sample(logits));
  state.counters["rows_per_s"] =
      benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

// kvrt's sampler before: every index partially sorted by logit (k = n without top_k), the
// probabilities of the first k, the nucleus as a prefix in that order, one uniform.
int32_t sorted_draw(const std::vector<float>& logits, const Mode& m, std::mt19937_64& rng) {
  const auto n = static_cast<int32_t>(logits.size());
  if (m.temperature <= 0) {
    return static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
  }
  std::vector<int32_t> order(static_cast<size_t>(n));
  std::iota(order.begin(), order.end(), 0);
  const int32_t k = m.top_k > 0 ? std::min(m.top_k, n) : n;
  std::partial_sort(order.begin(), order.begin() + k, order.end(),
                    [&](int32_t a, int32_t b) { return logits[a] > logits[b]; });
  std::vector<double> probs(static_cast<size_t>(k));
  double sum = 0;
  for (int32_t i = 0; i < k; ++i) {
    probs[i] = std::exp((logits[order[i]] - logits[order[0]]) / m.temperature);
    sum += probs[i];
  }
  int32_t keep = k;
  if (m.top_p < 1.0f) {
    double mass = 0;
    for (int32_t i = 0; i < k; ++i) {
      mass += probs[i] / sum;
      if (mass >= m.top_p) {
        keep = i + 1;
        break;
      }
    }
  }
  if (m.min_p > 0.0f) {
    int32_t likely = 1;
    while (likely < keep && probs[likely] >= static_cast<double>(m.min_p)) ++likely;
    keep = likely;
  }
  double kept = 0;
  for (int32_t i = 0; i < keep; ++i) kept += probs[i];
  double u = static_cast<double>(rng() >> 11) * 0x1.0p-53 * kept;
  for (int32_t i = 0; i < keep; ++i) {
    u -= probs[i];
    if (u < 0) return order[i];
  }
  return order[keep - 1];
}

void BM_Sorted(benchmark::State& state, Mode mode, size_t vocab, float sigma) {
  const std::vector<float> logits = logits_row(vocab, sigma);
  std::mt19937_64 rng(1);
  for (auto _ : state) benchmark::DoNotOptimize(sorted_draw(logits, mode, rng));
  state.counters["rows_per_s"] =
      benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

// One read of the row: no sampler can do with less.
void BM_Read(benchmark::State& state, size_t vocab) {
  const std::vector<float> logits = logits_row(vocab, 1.0f);
  for (auto _ : state) benchmark::DoNotOptimize(kvrt::kernels::max_value(logits.data(), vocab));
  state.counters["rows_per_s"] =
      benchmark::Counter(1, benchmark::Counter::kIsIterationInvariantRate);
}

}  // namespace

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  for (size_t vocab : {size_t{151936}, size_t{128256}}) {
    const std::string v = "/vocab:" + std::to_string(vocab);
    benchmark::RegisterBenchmark(("read" + v).c_str(), BM_Read, vocab);
    for (float sigma : {1.0f, 4.0f}) {
      const std::string shape = sigma == 1.0f ? "/flat" : "/peaked";
      for (const Mode& m : kModes) {
        benchmark::RegisterBenchmark((std::string("kvrt/") + m.name + shape + v).c_str(),
                                     BM_Sampler, m, vocab, sigma);
        benchmark::RegisterBenchmark((std::string("sorted/") + m.name + shape + v).c_str(),
                                     BM_Sorted, m, vocab, sigma);
      }
    }
  }
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
