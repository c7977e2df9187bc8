#include "core/bench/matrix_plan.h"

#include <set>

namespace kvrt::bench {
namespace {

std::string_view trim(std::string_view s) {
  const size_t b = s.find_first_not_of(" \t");
  if (b == std::string_view::npos) return {};
  return s.substr(b, s.find_last_not_of(" \t") - b + 1);
}

}  // namespace

Result<MatrixAxis> parse_matrix_axis(std::string_view arg) {
  const std::string where = "--matrix " + std::string(arg);
  const size_t eq = arg.find('=');
  if (eq == std::string_view::npos) {
    return Status::InvalidArgument(where + ": expected KEY=V1,V2,... (e.g. kv.store=a,b)");
  }
  MatrixAxis axis;
  axis.key = std::string(trim(arg.substr(0, eq)));
  if (axis.key.empty()) return Status::InvalidArgument(where + ": the key is empty");
  // Split at commas outside quotes and brackets.
  std::string_view rest = arg.substr(eq + 1);
  int depth = 0;
  char quote = 0;
  size_t from = 0;
  for (size_t i = 0; i <= rest.size(); ++i) {
    const char c = i < rest.size() ? rest[i] : ',';
    if (quote != 0) {
      if (c == quote) quote = 0;
      continue;
    }
    if (c == '"' || c == '\'') {
      quote = c;
    } else if (c == '[' || c == '{') {
      ++depth;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    } else if (c == ',' && depth == 0) {
      const std::string value(trim(rest.substr(from, i - from)));
      if (value.empty()) {
        return Status::InvalidArgument(where + ": value " + std::to_string(axis.values.size() + 1) +
                                       " is empty");
      }
      for (const std::string& v : axis.values) {
        if (v == value) return Status::InvalidArgument(where + ": " + value + " is given twice");
      }
      axis.values.push_back(value);
      from = i + 1;
    }
  }
  if (quote != 0 || depth != 0) {
    return Status::InvalidArgument(where + ": a quote or bracket is not closed");
  }
  return axis;
}

std::string Combination::label() const {
  if (settings.empty()) return "base";
  std::string out;
  for (const auto& [key, value] : settings) out += (out.empty() ? "" : " ") + key + "=" + value;
  return out;
}

std::vector<std::string> Combination::overrides() const {
  std::vector<std::string> out;
  for (const auto& [key, value] : settings) out.push_back(key + "=" + value);
  return out;
}

Result<std::vector<Combination>> expand_matrix(const std::vector<MatrixAxis>& axes) {
  std::set<std::string> keys;
  size_t total = 1;
  for (const MatrixAxis& axis : axes) {
    if (!keys.insert(axis.key).second) {
      return Status::InvalidArgument("--matrix " + axis.key +
                                     ": the key is given twice; list all its values in one "
                                     "--matrix " + axis.key + "=V1,V2,...");
    }
    if (axis.values.empty()) {
      return Status::InvalidArgument("--matrix " + axis.key + ": no values");
    }
    total *= axis.values.size();
    if (total > kMaxMatrixRuns) {
      return Status::InvalidArgument("--matrix: more than " + std::to_string(kMaxMatrixRuns) +
                                     " combinations");
    }
  }
  std::vector<Combination> out(total);
  for (size_t i = 0; i < total; ++i) {
    out[i].index = i;
    // Mixed radix, the last axis the fastest digit.
    size_t rest = i;
    std::vector<std::pair<std::string, std::string>> settings(axes.size());
    for (size_t a = axes.size(); a-- > 0;) {
      settings[a] = {axes[a].key, axes[a].values[rest % axes[a].values.size()]};
      rest /= axes[a].values.size();
    }
    out[i].settings = std::move(settings);
  }
  return out;
}

std::vector<RunSlot> run_order(size_t combinations, int repeat) {
  std::vector<RunSlot> order;
  for (int r = 0; r < repeat; ++r) {
    for (size_t i = 0; i < combinations; ++i) {
      order.push_back({(static_cast<size_t>(r) + i) % combinations, r});
    }
  }
  return order;
}

}  // namespace kvrt::bench
