// Rotary position embedding's frequencies as transformers computes them for the rope_scaling
// kvrt runs (model_config.cc refuses the others by name): the architectures' one source.
#pragma once

#include <cstdint>
#include <vector>

#include "core/model/model_config.h"

namespace kvrt::model {

// The rotary inverse frequencies of `dim` values ([dim / 2]) and the factor cos and sin are
// scaled by, in f32:
//  - default: 1 / theta^(2i / dim), factor 1;
//  - llama3 (config.llama3.factor > 0), as _compute_llama3_parameters: wavelengths beyond
//    original_max_position_embeddings / low_freq_factor divided by factor, those below
//    original / high_freq_factor kept, those between interpolated; factor 1;
//  - yarn (config.yarn.factor > 0), as _compute_yarn_parameters: interpolation by `factor`
//    blended into extrapolation over the beta_fast..beta_slow correction range of
//    original_max_position_embeddings (floored and ceiled unless truncate is false); the factor
//    is attention_factor where the config gives it, else mscale(factor, mscale) /
//    mscale(factor, mscale_all_dim) where both are set (DeepSeek-V3, Kimi: 1), else
//    mscale(factor) = 0.1 ln(factor) + 1 (Qwen's and Llama's YaRN).
void rope_frequencies(const ModelConfig& config, int64_t dim, std::vector<float>* inv_freq,
                      float* attention_factor);

// YaRN's mscale: 1 for a scale of at most 1, else 0.1 * mscale * ln(scale) + 1.
double yarn_mscale(double scale, double mscale);

}  // namespace kvrt::model
