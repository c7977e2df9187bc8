#include "core/parallel/context_parallel.h"

#include <algorithm>
#include <cmath>
#include <limits>

namespace kvrt::parallel {

void merge_partials(const ContextParallel& cp, const float* gathered, size_t stride, int64_t rows,
                    int group_heads, int heads, int dim, float* out, int64_t out_row_stride) {
  const size_t outputs = static_cast<size_t>(rows) * group_heads * dim;
  for (int64_t r = 0; r < rows; ++r) {
    for (int h = 0; h < heads; ++h) {
      const int g = cp.index * heads + h;  // the head among the group's
      const size_t lse_at = outputs + static_cast<size_t>(r) * group_heads + g;
      const size_t out_at = (static_cast<size_t>(r) * group_heads + g) * dim;
      float max = -std::numeric_limits<float>::infinity();
      for (int m = 0; m < cp.size; ++m) {
        max = std::max(max, gathered[(cp.first + m) * stride + lse_at]);
      }
      float* o = out + r * out_row_stride + static_cast<int64_t>(h) * dim;
      std::fill(o, o + dim, 0.0f);
      if (max == -std::numeric_limits<float>::infinity()) continue;  // no rank saw a token
      float sum = 0;
      for (int m = 0; m < cp.size; ++m) {
        const float* part = gathered + (cp.first + m) * stride;
        const float w = std::exp(part[lse_at] - max);  // 0 for a rank that saw nothing
        if (w == 0.0f) continue;
        sum += w;
        for (int d = 0; d < dim; ++d) o[d] += w * part[out_at + d];
      }
      for (int d = 0; d < dim; ++d) o[d] /= sum;
    }
  }
}

}  // namespace kvrt::parallel
