#include "core/report/svg.h"

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvrt::report::svg {
namespace {

// Room around the plot area for the title, the tick labels and the axis labels.
constexpr double kLeft = 70, kRight = 18, kTop = 30, kBottom = 46;

std::string num(double v) {
  char text[32];
  std::snprintf(text, sizeof(text), "%.1f", v);
  return text;
}

// Where a value falls on an axis of `length` pixels, 0 at the axis's min.
double place(const Axis& axis, double v, double length) {
  double lo = axis.min, hi = axis.max;
  if (axis.log) {
    lo = std::log10(lo);
    hi = std::log10(hi);
    v = std::log10(std::max(v, axis.min));
  }
  const double t = hi > lo ? (v - lo) / (hi - lo) : 0.5;
  return std::clamp(t, 0.0, 1.0) * length;
}

// Ticks of a log axis: 1, 2 and 5 times each power of ten inside it (only the powers when the
// axis spans more than three decades).
std::vector<double> log_ticks(double low, double high) {
  std::vector<double> ticks;
  const bool sparse = std::log10(high / low) > 3;
  for (int e = static_cast<int>(std::floor(std::log10(low))); e <= std::ceil(std::log10(high));
       ++e) {
    for (double m : {1.0, 2.0, 5.0}) {
      if (sparse && m != 1.0) continue;
      const double v = m * std::pow(10.0, e);
      if (v >= low * 0.999 && v <= high * 1.001) ticks.push_back(v);
    }
  }
  return ticks;
}

struct Frame {
  const ChartOptions& chart;
  double plot_w, plot_h;
  double x(double v) const { return kLeft + place(chart.x, v, plot_w); }
  double y(double v) const { return kTop + plot_h - place(chart.y, v, plot_h); }
};

// The chart's opening tag, title, grid, ticks and axis labels; `x_ticks` false for a bar chart,
// whose x axis carries the bars' labels instead.
std::string open_chart(const Frame& f, bool x_ticks) {
  const ChartOptions& c = f.chart;
  std::string out = "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"" +
                    std::to_string(c.width) + "\" height=\"" + std::to_string(c.height) +
                    "\" viewBox=\"0 0 " + std::to_string(c.width) + " " +
                    std::to_string(c.height) + "\" role=\"img\" aria-label=\"" +
                    escape(c.title) + "\">\n";
  out += "<title>" + escape(c.title) + "</title>\n";
  out += "<text class=\"title\" x=\"" + num(kLeft) + "\" y=\"18\">" + escape(c.title) + "</text>\n";
  const std::vector<double> yt = c.y.log ? log_ticks(c.y.min, c.y.max) : nice_ticks(c.y.min, c.y.max, 5);
  for (double v : yt) {
    if (v < c.y.min - 1e-12 || v > c.y.max + 1e-12) continue;
    out += "<line class=\"grid\" x1=\"" + num(kLeft) + "\" x2=\"" + num(kLeft + f.plot_w) +
           "\" y1=\"" + num(f.y(v)) + "\" y2=\"" + num(f.y(v)) + "\"/>\n";
    out += "<text class=\"tick\" text-anchor=\"end\" x=\"" + num(kLeft - 6) + "\" y=\"" +
           num(f.y(v) + 4) + "\">" + tick_label(v) + "</text>\n";
  }
  if (x_ticks) {
    const std::vector<double> xt =
        c.x.log ? log_ticks(c.x.min, c.x.max) : nice_ticks(c.x.min, c.x.max, 8);
    for (double v : xt) {
      if (v < c.x.min - 1e-12 || v > c.x.max + 1e-12) continue;
      out += "<line class=\"grid\" x1=\"" + num(f.x(v)) + "\" x2=\"" + num(f.x(v)) + "\" y1=\"" +
             num(kTop) + "\" y2=\"" + num(kTop + f.plot_h) + "\"/>\n";
      out += "<text class=\"tick\" text-anchor=\"middle\" x=\"" + num(f.x(v)) + "\" y=\"" +
             num(kTop + f.plot_h + 16) + "\">" + tick_label(v) + "</text>\n";
    }
  }
  out += "<rect class=\"frame\" x=\"" + num(kLeft) + "\" y=\"" + num(kTop) + "\" width=\"" +
         num(f.plot_w) + "\" height=\"" + num(f.plot_h) + "\"/>\n";
  out += "<text class=\"axis\" text-anchor=\"middle\" x=\"" + num(kLeft + f.plot_w / 2) +
         "\" y=\"" + num(c.height - 6) + "\">" + escape(c.x.label) + "</text>\n";
  out += "<text class=\"axis\" text-anchor=\"middle\" transform=\"translate(14 " +
         num(kTop + f.plot_h / 2) + ") rotate(-90)\">" + escape(c.y.label) + "</text>\n";
  return out;
}

}  // namespace

std::string color(size_t i) {
  // Tableau 10.
  static const char* const kPalette[] = {"#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#b07aa1",
                                         "#76b7b2", "#edc948", "#ff9da7", "#9c755f", "#bab0ac"};
  return kPalette[i % (sizeof(kPalette) / sizeof(kPalette[0]))];
}

std::string escape(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\'': out += "&#39;"; break;
      default: out += c;
    }
  }
  return out;
}

std::string tick_label(double value) {
  const double a = std::fabs(value);
  char text[32];
  if (a >= 1e6) {
    std::snprintf(text, sizeof(text), "%gM", value / 1e6);
  } else if (a >= 1e4) {
    std::snprintf(text, sizeof(text), "%gk", value / 1e3);
  } else {
    // Round away the binary noise of tick arithmetic (0.30000000000000004).
    std::snprintf(text, sizeof(text), "%.6g", std::round(value * 1e6) / 1e6);
  }
  return text;
}

std::vector<double> nice_ticks(double low, double high, int target) {
  if (!(high > low)) {
    const double pad = low == 0 ? 1 : std::fabs(low) * 0.5;
    low -= pad;
    high += pad;
  }
  const double raw = (high - low) / std::max(target, 1);
  const double power = std::pow(10.0, std::floor(std::log10(raw)));
  double step = power;
  for (double m : {1.0, 2.0, 5.0, 10.0}) {
    step = m * power;
    if (step >= raw) break;
  }
  std::vector<double> ticks;
  for (double v = std::ceil(low / step - 1e-9) * step; v <= high + step * 1e-9; v += step) {
    ticks.push_back(std::fabs(v) < step * 1e-9 ? 0.0 : v);
  }
  return ticks;
}

std::string line_chart(const ChartOptions& chart, const std::vector<Series>& series) {
  const Frame f{chart, chart.width - kLeft - kRight, chart.height - kTop - kBottom};
  std::string out = open_chart(f, true);
  for (const Series& s : series) {
    if (s.points.empty()) continue;
    std::string points;
    for (const auto& [x, y] : s.points) {
      points += (points.empty() ? "" : " ") + num(f.x(x)) + "," + num(f.y(y));
    }
    out += std::string("<polyline class=\"") + (s.dashed ? "reference" : "series") +
           "\" fill=\"none\" stroke=\"" + s.color + "\" points=\"" +
           points + "\"><title>" + escape(s.label) + "</title></polyline>\n";
  }
  return out + "</svg>\n";
}

std::string bar_chart(const ChartOptions& chart, const std::vector<Bar>& bars) {
  const Frame f{chart, chart.width - kLeft - kRight, chart.height - kTop - kBottom};
  std::string out = open_chart(f, false);
  const double slot = bars.empty() ? f.plot_w : f.plot_w / static_cast<double>(bars.size());
  const double width = std::min(slot * 0.6, 90.0);
  for (size_t i = 0; i < bars.size(); ++i) {
    const Bar& b = bars[i];
    const double cx = kLeft + slot * (static_cast<double>(i) + 0.5);
    const double base = f.y(0);
    if (b.failed) {
      out += "<rect class=\"failed\" x=\"" + num(cx - width / 2) + "\" y=\"" + num(kTop) +
             "\" width=\"" + num(width) + "\" height=\"" + num(base - kTop) + "\"/>\n";
    } else {
      const double top = f.y(b.value);
      out += "<rect class=\"bar\" fill=\"" + b.color + "\" x=\"" + num(cx - width / 2) + "\" y=\"" +
             num(top) + "\" width=\"" + num(width) + "\" height=\"" + num(base - top) +
             "\"><title>" + escape(b.label) + ": " + tick_label(b.value) + "</title></rect>\n";
      if (b.high > b.low) {
        const double lo = f.y(b.low), hi = f.y(b.high);
        out += "<path class=\"whisker\" d=\"M" + num(cx) + " " + num(lo) + "V" + num(hi) + "M" +
               num(cx - 6) + " " + num(lo) + "H" + num(cx + 6) + "M" + num(cx - 6) + " " +
               num(hi) + "H" + num(cx + 6) + "\"/>\n";
      }
    }
    const double note_y = b.failed ? kTop + 16 : std::max(f.y(std::max(b.value, b.high)) - 5, 12.0);
    if (!b.note.empty()) {
      out += "<text class=\"note\" text-anchor=\"middle\" x=\"" + num(cx) + "\" y=\"" +
             num(note_y) + "\">" + escape(b.note) + "</text>\n";
    }
    out += "<text class=\"tick\" text-anchor=\"middle\" x=\"" + num(cx) + "\" y=\"" +
           num(kTop + f.plot_h + 16) + "\">" + escape(b.label) + "</text>\n";
  }
  return out + "</svg>\n";
}

std::string legend(const std::vector<std::pair<std::string, std::string>>& label_and_color) {
  std::string out = "<div class=\"legend\">";
  for (const auto& [label, c] : label_and_color) {
    out += "<span class=\"key\"><svg xmlns=\"http://www.w3.org/2000/svg\" width=\"22\" "
           "height=\"10\"><rect width=\"22\" height=\"10\" fill=\"" +
           c + "\"/></svg>" + escape(label) + "</span>";
  }
  return out + "</div>\n";
}

}  // namespace kvrt::report::svg
