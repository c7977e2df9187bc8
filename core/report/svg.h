// Charts as inline SVG text, written by the project (no script, no font or file fetched): the
// bar, line and CDF charts of `kvrt bench --matrix --html-out`. Every chart has labelled axes
// with units and ticks at round values; colours come from one palette so a combination has the
// same colour in every chart and in the legend.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvrt::report::svg {

// The colour of series i (cycling through 10 colours that stay apart in print and for the
// common colour-vision deficiencies).
std::string color(size_t i);

// Text escaped for XML and HTML element content and attribute values.
std::string escape(std::string_view text);

// A number as a tick label: 1200 -> "1200", 0.25 -> "0.25", 15000 -> "15k", 2.5e6 -> "2.5M".
std::string tick_label(double value);

// Round tick values covering [low, high], about `target` of them (1, 2 or 5 times a power of
// ten apart). Low == high gives a range around the value.
std::vector<double> nice_ticks(double low, double high, int target);

struct Axis {
  std::string label;  // with its unit: "time since the run started (s)"
  double min = 0, max = 1;
  bool log = false;  // base 10; min must then be > 0
};

struct Series {
  std::string label;
  std::string color;
  std::vector<std::pair<double, double>> points;  // (x, y), x ascending
  bool dashed = false;                             // a reference line (a ceiling)
};

struct ChartOptions {
  std::string title;
  int width = 760, height = 250;
  Axis x, y;
};

// A polyline through each series' points (a CDF is drawn through its quantiles). Points
// outside the axes are clamped to them.
std::string line_chart(const ChartOptions& chart, const std::vector<Series>& series);

struct Bar {
  std::string label;  // under the bar
  std::string color;
  double value = 0;
  double low = 0, high = 0;  // a whisker from low to high when high > low (spread of repeats)
  std::string note;          // drawn above the bar ("1.88x"); for a failed bar, why
  bool failed = false;       // drawn as an outline with the note, no value
};

// Vertical bars from 0; the y axis from 0 to the largest value (or whisker).
std::string bar_chart(const ChartOptions& chart, const std::vector<Bar>& bars);

// A row of colour swatches with labels, as HTML (wraps with the page).
std::string legend(const std::vector<std::pair<std::string, std::string>>& label_and_color);

}  // namespace kvrt::report::svg
