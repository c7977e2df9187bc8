// The progress lines kvrt bench and kvrt eval draw on a terminal: the bar ("[#####.......]")
// and a line redrawn in place on stderr.
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
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

// One line on stderr, redrawn in place at most every 100 ms and cleared at the end; does nothing
// when disabled (stderr is not a terminal).
class ProgressLine {
 public:
  explicit ProgressLine(bool enabled) : enabled_(enabled) {}
  // Whether a draw is due: enabled, and `force` or 100 ms since the last draw.
  bool due(bool force) const {
    return enabled_ && (force || std::chrono::steady_clock::now() - drawn_ >=
                                     std::chrono::milliseconds(100));
  }
  void draw(const std::string& text) {
    drawn_ = std::chrono::steady_clock::now();
    std::fprintf(stderr, "\r\033[K%s", text.c_str());
    std::fflush(stderr);
  }
  void clear() {
    if (!enabled_) return;
    std::fprintf(stderr, "\r\033[K");
    std::fflush(stderr);
  }

 private:
  bool enabled_;
  std::chrono::steady_clock::time_point drawn_{};
};

}  // namespace kvrt::util
