// Numbers and tables as the command line prints them (kvrt bench --matrix, kvrt eval).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace kvrt::util {

// "%.*f": fixed(3.14159, 2) == "3.14".
std::string fixed(double value, int decimals);
// "%.2e", with 0 as "0": scientific(0.000148) == "1.48e-04".
std::string scientific(double value);

// Rows of cells as text columns two spaces apart, each padded to its widest cell: the first
// `left_columns` aligned left, the rest right, except that `last_left` aligns the last column
// left too (a verdict after numbers). Trailing spaces are trimmed; every line ends in '\n'.
std::string render_columns(const std::vector<std::vector<std::string>>& rows, size_t left_columns,
                           bool last_left);

// A float as the double of its shortest decimal: 0.7f gives 0.7 (not 0.699999988079071), so
// JSON written from it reads as the user wrote it and parses back to the same float.
double shortest_decimal(float x);

}  // namespace kvrt::util
