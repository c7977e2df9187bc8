// The bar of the progress lines kvrt bench and kvrt eval draw on a terminal: "[#####.......]".
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>

namespace kvrt::util {

// `width` cells, `done` / `total` of them filled (all when total is 0), in brackets.
inline std::string progress_bar(uint64_t done, uint64_t total, int width = 24) {
  const int filled =
      total == 0 ? width
                 : static_cast<int>(static_cast<double>(width) * static_cast<double>(done) /
                                    static_cast<double>(total));
  std::string bar(static_cast<size_t>(std::clamp(filled, 0, width)), '#');
  bar.resize(static_cast<size_t>(width), '.');
  return "[" + bar + "]";
}

}  // namespace kvrt::util
