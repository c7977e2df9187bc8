// Megatron-style tensor parallelism's arithmetic, shared by the architectures: near-equal
// splits of a dimension over TP ranks. Dimensions that do not divide (an intermediate size of
// 172 at TP 8) get uneven shards.
#pragma once

#include <algorithm>
#include <cstdint>

namespace kvrt::model {

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

}  // namespace kvrt::model
