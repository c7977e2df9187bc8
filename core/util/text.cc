#include "core/util/text.h"

#include <algorithm>
#include <charconv>
#include <cstdint>
#include <cstdio>

namespace kvrt::util {

std::string fixed(double value, int decimals) {
  char text[48];
  std::snprintf(text, sizeof(text), "%.*f", decimals, value);
  return text;
}

std::string scientific(double value) {
  char text[48];
  std::snprintf(text, sizeof(text), value == 0 ? "%.0f" : "%.2e", value);
  return text;
}

std::string render_columns(const std::vector<std::vector<std::string>>& rows, size_t left_columns,
                           bool last_left) {
  std::vector<size_t> width;
  for (const auto& row : rows) {
    width.resize(std::max(width.size(), row.size()), 0);
    for (size_t c = 0; c < row.size(); ++c) width[c] = std::max(width[c], row[c].size());
  }
  std::string out;
  for (const auto& row : rows) {
    std::string line;
    for (size_t c = 0; c < row.size(); ++c) {
      const std::string pad(width[c] - row[c].size(), ' ');
      const bool last = c + 1 == row.size();
      line += c < left_columns || (last && last_left) ? row[c] + pad : pad + row[c];
      if (!last) line += "  ";
    }
    while (!line.empty() && line.back() == ' ') line.pop_back();
    out += line + "\n";
  }
  return out;
}

double shortest_decimal(float x) {
  char digits[32];
  const auto end = std::to_chars(digits, digits + sizeof digits, x).ptr;
  double value = 0;
  std::from_chars(digits, end, value);
  return value;
}

}  // namespace kvrt::util
