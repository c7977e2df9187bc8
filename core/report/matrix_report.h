// What `kvrt bench --matrix` writes: the comparison table on stdout, every figure of every run
// as JSON (--json-out), and one self-contained HTML page with inline SVG charts (--html-out).
// All three read the same figure list, so a column of the table, a key of the JSON and a chart
// agree on a figure's name and unit.
#pragma once

#include <map>
#include <string>
#include <vector>

#include "core/bench/matrix.h"

namespace kvrt::report {

// One figure of a run.
struct FigureSpec {
  const char* key;      // JSON key: "server_gen_throughput"
  const char* heading;  // table column: "gen tok/s"
  const char* unit;     // "tok/s"
  double (*get)(const bench::BenchReport&);
  int decimals;       // in the table; -1: in the JSON only; kScientific: as 1.23e-04
  bool lower_better;  // latencies, retractions
};
inline constexpr int kScientific = -2;
// Every figure of a run, in table order.
const std::vector<FigureSpec>& figures();
// kvrt eval's figures against kv_f32_paged (report.accuracy), measured only with --eval-text.
const std::vector<FigureSpec>& accuracy_figures();
// figures() and, when the matrix was evaluated (--eval-text), accuracy_figures().
std::vector<FigureSpec> figures_of(const bench::MatrixResult& result);
// A value as the table shows the figure ("" for a JSON-only figure).
std::string format_figure(const FigureSpec& f, double value);

// A figure over the succeeded runs of a combination.
struct Spread {
  double median = 0, min = 0, max = 0;
  size_t n = 0;
};

struct CombinationSummary {
  const bench::Combination* combination = nullptr;
  std::vector<const bench::MatrixRun*> runs;  // in run order
  size_t failed = 0;
  std::string error;  // the first failed run's reason
  // The succeeded run whose generation throughput is the median: its timeline, distributions,
  // capacity report and diagnosis stand for the combination. Null when every run failed.
  const bench::MatrixRun* median_run = nullptr;
  std::map<std::string, Spread> figures;  // by FigureSpec::key
  bool ok() const { return median_run != nullptr; }
  // Whether `f` has a value: a run succeeded and, for an accuracy figure, it was evaluated.
  bool has(const FigureSpec& f) const;
  double median(const char* key) const;
};

std::vector<CombinationSummary> summarize(const bench::MatrixResult& result);

// "1.88x", or "-" when the base is 0 or missing.
std::string ratio_text(double value, double base);

// The comparison table (one row per combination, then each figure's ratio to the first row),
// then each combination's diagnosis.
std::string format_comparison(const bench::MatrixResult& result);

// Everything: the machine, kvrt's version, the workload, the axes, each combination's effective
// configuration and plugin versions, every run's figures and series, and each combination's
// medians and spreads.
std::string to_json(const bench::MatrixResult& result);

// One HTML file with no script and nothing fetched: the comparison table, throughput bars,
// running / queue / token usage over time, TTFT and ITL CDFs, each combination's capacity report
// and diagnosis.
std::string to_html(const bench::MatrixResult& result);

}  // namespace kvrt::report
