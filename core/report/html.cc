// --html-out: one self-contained page. Its Content-Security-Policy allows nothing to be fetched
// and no script to run, so the file reads the same offline, attached to a ticket, years later.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/report/matrix_report.h"
#include "core/report/svg.h"
#include "core/util/text.h"

namespace kvrt::report {
namespace {

using svg::escape;
using util::fixed;


constexpr const char* kStyle = R"(
body { font-family: system-ui, -apple-system, "Segoe UI", Roboto, "DejaVu Sans", sans-serif;
       margin: 24px auto; max-width: 1180px; color: #1d1d1f; padding: 0 16px; }
h1 { font-size: 22px; margin-bottom: 4px; }
h2 { font-size: 17px; margin-top: 28px; border-bottom: 1px solid #ddd; padding-bottom: 4px; }
h3 { font-size: 15px; margin: 18px 0 6px; }
.meta { color: #555; font-size: 13px; margin: 2px 0; }
table.cmp { border-collapse: collapse; font-size: 13px; font-variant-numeric: tabular-nums; }
table.cmp th, table.cmp td { padding: 4px 7px; border-bottom: 1px solid #e4e4e4; }
table.cmp td { white-space: nowrap; }
table.cmp th { text-align: right; background: #f5f5f7; font-weight: 600; vertical-align: bottom; }
table.cmp td { text-align: right; vertical-align: top; }
table.cmp th.l, table.cmp td.l { text-align: left; }
table.cmp td .r { display: block; color: #777; font-size: 11px; }
table.cmp tr.failed td { color: #b3261e; }
.swatch { display: inline-block; width: 10px; height: 10px; margin-right: 6px; }
.charts { display: flex; flex-wrap: wrap; gap: 8px 24px; }
svg.chart { background: #fff; }
svg.chart text { font-family: inherit; }
svg.chart .title { font-size: 13px; font-weight: 600; fill: #1d1d1f; }
svg.chart .tick { font-size: 11px; fill: #555; }
svg.chart .axis { font-size: 12px; fill: #333; }
svg.chart .note { font-size: 11px; fill: #333; }
svg.chart .grid { stroke: #ececec; stroke-width: 1; }
svg.chart .frame { fill: none; stroke: #bbb; stroke-width: 1; }
svg.chart .series { stroke-width: 2; stroke-linejoin: round; }
svg.chart .reference { stroke-width: 1.5; stroke-dasharray: 6 4; }
svg.chart .whisker { stroke: #333; stroke-width: 1.5; fill: none; }
svg.chart .failed { fill: none; stroke: #b3261e; stroke-dasharray: 4 3; }
.legend { font-size: 13px; margin: 6px 0 2px; }
.legend .key { margin-right: 18px; white-space: nowrap; }
.legend svg { vertical-align: -1px; margin-right: 6px; }
pre { background: #f7f7f9; padding: 10px; font-size: 12px; overflow-x: auto; }
.diag { font-size: 13px; background: #fff8e6; border-left: 3px solid #edc948; padding: 6px 10px; }
.error { font-size: 13px; background: #fdecea; border-left: 3px solid #b3261e; padding: 6px 10px; }
)";

// What each chart draws per combination: its colour and its name.
struct Entry {
  const CombinationSummary* summary;
  std::string label;
  std::string color;
};

std::string legend(const std::vector<Entry>& entries) {
  std::vector<std::pair<std::string, std::string>> keys;
  for (const Entry& e : entries) keys.emplace_back(e.label, e.color);
  return svg::legend(keys);
}

std::string comparison_table(const bench::MatrixResult& result,
                             const std::vector<CombinationSummary>& summaries,
                             const std::vector<Entry>& entries) {
  std::string out = "<table class=\"cmp\">\n<tr><th class=\"l\">#</th>";
  for (const bench::MatrixAxis& a : result.axes) out += "<th class=\"l\">" + escape(a.key) + "</th>";
  if (result.axes.empty()) out += "<th class=\"l\">configuration</th>";
  const std::vector<FigureSpec> shown = figures_of(result);
  for (const FigureSpec& f : shown) {
    if (f.decimals != -1) out += "<th>" + escape(f.heading) + "</th>";
  }
  out += "<th class=\"l\">verdict</th></tr>\n";
  for (size_t i = 0; i < summaries.size(); ++i) {
    const CombinationSummary& s = summaries[i];
    out += std::string("<tr") + (s.ok() ? "" : " class=\"failed\"") + "><td class=\"l\">" +
           "<span class=\"swatch\" style=\"background:" + entries[i].color + "\"></span>" +
           std::to_string(i + 1) + "</td>";
    for (const auto& setting : s.combination->settings) {
      out += "<td class=\"l\">" + escape(setting.second) + "</td>";
    }
    if (result.axes.empty()) out += "<td class=\"l\">base</td>";
    for (const FigureSpec& f : shown) {
      if (f.decimals == -1) continue;
      if (!s.has(f)) {
        out += "<td>-</td>";
        continue;
      }
      const Spread& sp = s.figures.at(f.key);
      out += "<td>" + format_figure(f, sp.median);
      if (sp.n > 1 && sp.max > sp.min) {
        out += "<span class=\"r\">" + format_figure(f, sp.min) + " - " +
               format_figure(f, sp.max) + "</span>";
      }
      if (i > 0 && summaries[0].ok()) {
        out += "<span class=\"r\">" + ratio_text(sp.median, summaries[0].median(f.key)) + "</span>";
      }
      out += "</td>";
    }
    const std::string verdict =
        s.ok() ? std::string(metrics::kind_name(s.median_run->report.diagnosis.kind))
               : "failed: " + s.error;
    out += "<td class=\"l\">" + escape(verdict) + "</td></tr>\n";
  }
  return out + "</table>\n";
}

std::string throughput_bars(const std::vector<Entry>& entries, const char* key, const char* title,
                            const char* unit) {
  std::vector<svg::Bar> bars;
  double top = 0, base = 0;
  for (size_t i = 0; i < entries.size(); ++i) {
    const CombinationSummary& s = *entries[i].summary;
    svg::Bar b;
    b.label = std::to_string(i + 1);
    b.color = entries[i].color;
    if (!s.ok()) {
      b.failed = true;
      b.note = "failed";
    } else {
      const Spread& sp = s.figures.at(key);
      b.value = sp.median;
      if (sp.n > 1) {
        b.low = sp.min;
        b.high = sp.max;
      }
      if (i == 0) base = sp.median;
      b.note = fixed(sp.median, sp.median >= 100 ? 0 : 2) +
               (i > 0 ? " (" + ratio_text(sp.median, base) + ")" : "");
      top = std::max({top, sp.median, sp.max});
    }
    bars.push_back(b);
  }
  svg::ChartOptions chart;
  chart.title = title;
  chart.width = 560;
  chart.height = 260;
  chart.x.label = "combination (#, as in the table)";
  chart.y.label = unit;
  chart.y.min = 0;
  chart.y.max = top > 0 ? top * 1.15 : 1;
  return svg::bar_chart(chart, bars);
}

// One of running / queue / token usage over time, every combination's median run on one axis.
std::string timeline_chart(const std::vector<Entry>& entries, double duration, const char* title,
                           const char* y_label, double (*get)(const bench::TimelinePoint&),
                           bool with_ceiling, double y_fixed_max) {
  std::vector<svg::Series> series;
  double top = 0;
  for (const Entry& e : entries) {
    if (!e.summary->ok()) continue;
    const bench::BenchReport& r = e.summary->median_run->report;
    svg::Series s{e.label, e.color, {}, false};
    for (const bench::TimelinePoint& p : r.timeline) {
      s.points.emplace_back(p.t_s, get(p));
      top = std::max(top, get(p));
    }
    series.push_back(std::move(s));
    if (with_ceiling && r.diagnosis.ceiling > 0) {
      series.push_back({e.label + " ceiling", e.color, {{0, r.diagnosis.ceiling},
                                                        {r.duration_s, r.diagnosis.ceiling}},
                        true});
      top = std::max(top, r.diagnosis.ceiling);
    }
  }
  svg::ChartOptions chart;
  chart.title = title;
  chart.width = 1120;
  chart.height = 220;
  chart.x = {"time since the run started (s)", 0, duration > 0 ? duration : 1, false};
  chart.y = {y_label, 0, y_fixed_max > 0 ? y_fixed_max : (top > 0 ? top * 1.1 : 1), false};
  return svg::line_chart(chart, series);
}

// A CDF through each median run's quantiles; log x when the values span more than 20x.
std::string cdf_chart(const std::vector<Entry>& entries, const char* title, const char* x_label,
                      const std::vector<double> bench::BenchReport::*quantiles) {
  std::vector<svg::Series> series;
  double lo = 0, hi = 0;
  bool any = false;
  for (const Entry& e : entries) {
    if (!e.summary->ok()) continue;
    const std::vector<double>& q = e.summary->median_run->report.*quantiles;
    if (q.empty()) continue;
    svg::Series s{e.label, e.color, {}, false};
    for (size_t i = 0; i < q.size(); ++i) {
      const double ms = q[i] * 1e3;
      s.points.emplace_back(ms, static_cast<double>(i) / static_cast<double>(q.size() - 1));
      if (ms > 0) {
        lo = any ? std::min(lo, ms) : ms;
        hi = any ? std::max(hi, ms) : ms;
        any = true;
      }
    }
    series.push_back(std::move(s));
  }
  svg::ChartOptions chart;
  chart.title = title;
  chart.width = 560;
  chart.height = 280;
  chart.y = {"fraction at or below", 0, 1, false};
  if (!any) {
    chart.x = {x_label, 0, 1, false};
  } else if (hi / lo > 20) {
    chart.x = {std::string(x_label) + ", log scale", std::pow(10, std::floor(std::log10(lo))),
               std::pow(10, std::ceil(std::log10(hi))), true};
  } else {
    chart.x = {x_label, 0, hi * 1.05, false};
  }
  return svg::line_chart(chart, series);
}

}  // namespace

std::string to_html(const bench::MatrixResult& result) {
  const std::vector<CombinationSummary> summaries = summarize(result);
  std::vector<Entry> entries;
  for (size_t i = 0; i < summaries.size(); ++i) {
    entries.push_back({&summaries[i], std::to_string(i + 1) + " " + summaries[i].combination->label(),
                       svg::color(i)});
  }
  double duration = 0;
  for (const CombinationSummary& s : summaries) {
    if (s.ok()) duration = std::max(duration, s.median_run->report.duration_s);
  }
  const bench::WorkloadSpec& w = result.workload;
  const bench::MachineInfo& m = result.machine;

  std::string out =
      "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n"
      "<meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; "
      "style-src 'unsafe-inline'\">\n"
      "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n"
      "<title>kvrt bench matrix: " +
      escape(w.source) + "</title>\n<style>" + kStyle + "</style>\n</head>\n<body>\n";
  out += "<h1>kvrt bench --matrix</h1>\n";
  std::string axes;
  for (const bench::MatrixAxis& a : result.axes) {
    std::string values;
    for (const std::string& v : a.values) values += (values.empty() ? "" : ", ") + v;
    axes += (axes.empty() ? "" : "; ") + a.key + " = " + values;
  }
  out += "<p class=\"meta\">" + std::to_string(result.combinations.size()) + " combinations x " +
         std::to_string(result.repeat) + " run" + (result.repeat == 1 ? "" : "s") +
         (result.repeat > 1 ? " (interleaved; figures are medians, small lines the range)" : "") +
         (axes.empty() ? "" : ": " + escape(axes)) + "</p>\n";
  std::string overrides;
  for (const std::string& o : result.overrides) overrides += " --set " + o;
  out += "<p class=\"meta\">workload " + escape(w.source) + ": " + std::to_string(w.num_requests) +
         " requests, concurrency " +
         (w.concurrency > 0 ? std::to_string(w.concurrency) : "unlimited") + ", seed " +
         std::to_string(w.seed) +
         (w.trace.empty() ? ", input " + escape(w.input.describe()) + ", output " +
                                escape(w.output.describe())
                          : ", from a trace") +
         "; config " + escape(result.config_path.empty() ? "defaults" : result.config_path) +
         escape(overrides) + "</p>\n";
  out += "<p class=\"meta\">kvrt " + escape(result.kvrt_version) + ", " +
         escape(result.started_at) + ", " + escape(m.cpu_model) + ", " +
         std::to_string(m.cores) + " cores, " +
         fixed(static_cast<double>(m.memory_bytes) / (1 << 30), 1) + " GiB, " + escape(m.os) +
         "; the matrix took " + fixed(result.wall_s, 1) + " s</p>\n";

  out += "<h2>Comparison</h2>\n";
  out += "<p class=\"meta\">Small grey lines: the ratio to row 1";
  out += result.repeat > 1 ? ", and the range over the runs." : ".";
  out += " The ceiling is max_total_num_tokens over the mean length of a running request.</p>\n";
  out += comparison_table(result, summaries, entries);

  out += "<h2>Throughput</h2>\n<div class=\"charts\">\n";
  out += throughput_bars(entries, "server_gen_throughput", "Server generation throughput",
                         "generated tokens per second (tok/s)");
  out += throughput_bars(entries, "client_effective_throughput",
                         "Client effective throughput (output over latency, per request)",
                         "tok/s per request");
  out += "</div>\n";

  out += "<h2>Over time</h2>\n";
  out += "<p class=\"meta\">Means over 0.1 s intervals of each combination's median run; dashed: "
         "its running ceiling.</p>\n";
  out += legend(entries);
  out += timeline_chart(
      entries, duration, "Running requests", "requests",
      [](const bench::TimelinePoint& p) { return p.running; }, true, 0);
  out += timeline_chart(
      entries, duration, "Queued requests", "requests",
      [](const bench::TimelinePoint& p) { return p.queued; }, false, 0);
  out += timeline_chart(
      entries, duration, "KV token usage", "share of the pool",
      [](const bench::TimelinePoint& p) { return p.token_usage; }, false, 1.0);

  out += "<h2>Latency distributions</h2>\n" + legend(entries) + "<div class=\"charts\">\n";
  out += cdf_chart(entries, "Time to first token (CDF over requests)", "TTFT (ms)",
                   &bench::BenchReport::ttft_quantiles_s);
  out += cdf_chart(entries, "Inter-token latency (CDF over tokens)", "ITL (ms)",
                   &bench::BenchReport::itl_quantiles_s);
  out += "</div>\n";

  out += "<h2>Capacity and diagnosis</h2>\n";
  for (size_t i = 0; i < summaries.size(); ++i) {
    const CombinationSummary& s = summaries[i];
    out += "<h3><span class=\"swatch\" style=\"background:" + entries[i].color + "\"></span>" +
           escape(entries[i].label) + "</h3>\n";
    if (!s.ok()) {
      out += "<p class=\"error\">failed: " + escape(s.error) + "</p>\n";
      continue;
    }
    if (s.failed > 0) {
      out += "<p class=\"error\">" + std::to_string(s.failed) + " of " +
             std::to_string(s.runs.size()) + " runs failed: " + escape(s.error) + "</p>\n";
    }
    const bench::MatrixRun& run = *s.median_run;
    out += "<p class=\"diag\">" + escape(run.report.diagnosis.line) + "</p>\n";
    std::string plugins;
    for (const bench::PluginVersion& p : run.plugins) {
      plugins += (plugins.empty() ? "" : ", ") + p.name + " " + p.version + " (" + p.kind + ")";
    }
    out += "<p class=\"meta\">model " + escape(run.model) + "; plugins " + escape(plugins) +
           "</p>\n";
    out += "<pre>" + escape(run.capacity_report) + "</pre>\n";
  }
  out += "</body>\n</html>\n";
  return out;
}

}  // namespace kvrt::report
