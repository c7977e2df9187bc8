// `kvrt bench --matrix` arguments, one per line of the input, then their product and run order
// (at most a few thousand runs, as run_matrix allows).
#include <cstdint>
#include <string>
#include <vector>

#include "core/bench/matrix_plan.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  std::vector<kvrt::bench::MatrixAxis> axes;
  size_t from = 0;
  while (from <= text.size()) {
    size_t end = text.find('\n', from);
    if (end == std::string::npos) end = text.size();
    kvrt::Result<kvrt::bench::MatrixAxis> axis =
        kvrt::bench::parse_matrix_axis(std::string_view(text).substr(from, end - from));
    if (axis.ok()) axes.push_back(*axis);
    from = end + 1;
  }
  kvrt::Result<std::vector<kvrt::bench::Combination>> c = kvrt::bench::expand_matrix(axes);
  if (!c.ok()) return 0;
  for (const kvrt::bench::Combination& x : *c) (void)x.label();
  (void)kvrt::bench::run_order(c->size(), 3);
  return 0;
}
