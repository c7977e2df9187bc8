// A half-open range of indices and near-equal splits of one over parts: a dimension over TP
// ranks (core/parallel/shard.h), a buffer over the ranks of a reduce-scatter (core/comm/).
#pragma once

#include <algorithm>
#include <cstdint>

namespace kvrt::util {

struct Range {
  int64_t begin = 0;
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};

// Part `index` of `parts` near-equal parts of [0, total): the first total % parts get one more.
inline Range split(int64_t total, int parts, int index) {
  const int64_t base = total / parts, extra = total % parts;
  const int64_t begin = index * base + std::min<int64_t>(index, extra);
  return {begin, begin + base + (index < extra ? 1 : 0)};
}

}  // namespace kvrt::util
