// Megatron-style tensor parallelism's arithmetic, shared by the architectures: near-equal
// splits of a dimension over TP ranks, and the slicing of a matrix into a rank's rows or
// columns. Dimensions that do not divide (an intermediate size of
// 172 at TP 8) get uneven shards.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "core/util/range.h"

namespace kvrt::parallel {

// Near-equal splits of a dimension over TP ranks (core/util/range.h).
using util::Range;
using util::split;

// Taking a rank's shard out of a row-major matrix with `cols` columns ([out][in], as
// checkpoints store it): rows [begin, end) appended to `out`, or columns [begin, end) of every
// row.
inline void append_rows(const std::vector<float>& m, int64_t cols, Range rows,
                        std::vector<float>* out) {
  out->insert(out->end(), m.begin() + rows.begin * cols, m.begin() + rows.end * cols);
}
inline std::vector<float> rows_of(const std::vector<float>& m, int64_t cols, Range rows) {
  std::vector<float> out;
  append_rows(m, cols, rows, &out);
  return out;
}
inline std::vector<float> columns_of(const std::vector<float>& m, int64_t cols, Range keep) {
  const int64_t rows = cols == 0 ? 0 : static_cast<int64_t>(m.size()) / cols;
  std::vector<float> out;
  out.reserve(rows * keep.size());
  for (int64_t r = 0; r < rows; ++r) {
    out.insert(out.end(), m.begin() + r * cols + keep.begin, m.begin() + r * cols + keep.end);
  }
  return out;
}

}  // namespace kvrt::parallel
