#include "core/model/rope.h"

#include <algorithm>
#include <cmath>
#include <numbers>

#include "kernels/shared/rope.h"

namespace kvrt::model {

double yarn_mscale(double scale, double mscale) {
  return scale <= 1 ? 1.0 : 0.1 * mscale * std::log(scale) + 1.0;
}

namespace {

void scale_llama3(const ModelConfig::Llama3Rope& l, std::vector<float>& inv_freq) {
  const double original = static_cast<double>(l.original_max_position_embeddings);
  const double low_wavelen = original / l.low_freq_factor;
  const double high_wavelen = original / l.high_freq_factor;
  for (float& f : inv_freq) {
    const double wavelen = 2 * std::numbers::pi / f;
    if (wavelen > low_wavelen) {
      f = static_cast<float>(f / l.factor);
    } else if (wavelen >= high_wavelen) {
      const double smooth =
          (original / wavelen - l.low_freq_factor) / (l.high_freq_factor - l.low_freq_factor);
      f = static_cast<float>((1 - smooth) * f / l.factor + smooth * f);
    }
  }
}

float scale_yarn(const ModelConfig& c, int64_t dim, std::vector<float>& inv_freq) {
  const ModelConfig::Yarn& y = c.yarn;
  auto correction_dim = [&](double rotations) {
    return static_cast<double>(dim) *
           std::log(static_cast<double>(y.original_max_position_embeddings) /
                    (rotations * 2 * std::numbers::pi)) /
           (2 * std::log(c.rope_theta));
  };
  double low = correction_dim(y.beta_fast), high = correction_dim(y.beta_slow);
  if (y.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, static_cast<double>(dim - 1));
  if (low == high) high += 0.001;
  for (size_t i = 0; i < inv_freq.size(); ++i) {
    const float extrapolation = inv_freq[i];
    const float interpolation = extrapolation / static_cast<float>(y.factor);
    const float ramp =
        std::clamp(static_cast<float>((static_cast<double>(i) - low) / (high - low)), 0.0f, 1.0f);
    const float keep = 1.0f - ramp;  // the share of extrapolation
    inv_freq[i] = interpolation * (1 - keep) + extrapolation * keep;
  }
  if (y.attention_factor > 0) return static_cast<float>(y.attention_factor);
  if (y.mscale > 0 && y.mscale_all_dim > 0) {
    return static_cast<float>(yarn_mscale(y.factor, y.mscale) /
                              yarn_mscale(y.factor, y.mscale_all_dim));
  }
  return static_cast<float>(yarn_mscale(y.factor, 1.0));
}

}  // namespace

void rope_frequencies(const ModelConfig& c, int64_t dim, std::vector<float>* inv_freq,
                      float* attention_factor) {
  inv_freq->resize(static_cast<size_t>(dim / 2));
  for (size_t i = 0; i < inv_freq->size(); ++i) {
    (*inv_freq)[i] = kernels::shared::rope_inverse_frequency(static_cast<int64_t>(i), dim,
                                                             static_cast<float>(c.rope_theta));
  }
  *attention_factor = 1;
  if (c.yarn.factor > 0) {
    *attention_factor = scale_yarn(c, dim, *inv_freq);
  } else if (c.llama3.factor > 0) {
    scale_llama3(c.llama3, *inv_freq);
  }
}

}  // namespace kvrt::model
