// What `kvrt bench --matrix` runs, before anything runs: the --matrix arguments parsed, their
// cartesian product, and the order of the runs. Pure functions of the arguments (fuzzed with
// the workload parsers); matrix.h checks and runs the combinations.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "core/util/status.h"

namespace kvrt::bench {

// One --matrix argument: a configuration key (as --set names it) and the values it takes.
struct MatrixAxis {
  std::string key;
  std::vector<std::string> values;  // as --set reads them: TOML, or else a bare string
};

// "KEY=V1,V2,...". A comma inside quotes or brackets belongs to its value
// (kv.x.list=["a","b"],["c"]). An empty key or value, or a value given twice, is an error
// naming the argument.
Result<MatrixAxis> parse_matrix_axis(std::string_view arg);

// One point of the product: a value for every axis, in axis order.
struct Combination {
  size_t index = 0;  // 0-based, in product order (the last axis varies fastest)
  std::vector<std::pair<std::string, std::string>> settings;  // (key, value)
  std::string label() const;                   // "kv.store=kv_fp8_e4m3 tp.size=2"; "base"
  std::vector<std::string> overrides() const;  // "key=value" strings for config::load
};

// The most combinations x repeats one matrix may run.
inline constexpr size_t kMaxMatrixRuns = 512;

// The cartesian product of `axes` in order; no axes give the one base combination. A key given
// twice is an error naming it.
Result<std::vector<Combination>> expand_matrix(const std::vector<MatrixAxis>& axes);

// Which combination runs when: `repeat` rounds over `combinations`, round r starting at
// combination r mod n, so that over n rounds each combination runs once at every place of a
// round and slow drift of the machine does not favour the one that always runs first.
struct RunSlot {
  size_t combination = 0;
  int repeat = 0;  // 0-based round
};
std::vector<RunSlot> run_order(size_t combinations, int repeat);

}  // namespace kvrt::bench
