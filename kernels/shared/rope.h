// RoPE's frequencies as transformers computes them in float32: inv_freq[i] = 1 / theta^(2i /
// dim) for i < dim / 2. kernels::rope_tables and DeepSeek-V3's YaRN (which blends these) share
// this, and a CUDA RoPE kernel would too.
#pragma once

#include <cmath>
#include <cstdint>

#include "kernels/shared/host_device.h"

namespace kvrt::kernels::shared {

KVRT_HD float rope_inverse_frequency(int64_t i, int64_t dim, float theta) {
  return 1.0f / powf(theta, static_cast<float>(2 * i) / static_cast<float>(dim));
}

}  // namespace kvrt::kernels::shared
