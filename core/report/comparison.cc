// The figure list, the per-combination summaries and the comparison table on stdout.
#include <algorithm>
#include <cmath>
#include <cstdio>

#include "core/report/matrix_report.h"
#include "core/util/text.h"

namespace kvrt::report {
namespace {

using bench::BenchReport;

double ms(double s) { return s * 1e3; }

// The combination's values, one cell per axis ("base" without axes).
std::vector<std::string> axis_cells(const bench::MatrixResult& result,
                                    const CombinationSummary& s) {
  std::vector<std::string> cells;
  for (const auto& setting : s.combination->settings) cells.push_back(setting.second);
  if (result.axes.empty()) cells.push_back("base");
  return cells;
}

std::vector<std::string> axis_headings(const bench::MatrixResult& result) {
  std::vector<std::string> h;
  for (const bench::MatrixAxis& a : result.axes) h.push_back(a.key);
  if (result.axes.empty()) h.push_back("configuration");
  return h;
}

bool in_table(const FigureSpec& f) { return f.decimals != -1; }

}  // namespace

const std::vector<FigureSpec>& figures() {
  // decimals -1: in the JSON only.
  static const std::vector<FigureSpec> kFigures = {
      {"max_total_num_tokens", "max tokens", "tokens",
       [](const BenchReport& r) { return static_cast<double>(r.max_total_num_tokens); }, 0, false},
      {"server_gen_throughput", "gen tok/s", "tok/s",
       [](const BenchReport& r) { return r.server_gen_throughput; }, 1, false},
      {"client_effective_throughput", "eff tok/s/req", "tok/s per request",
       [](const BenchReport& r) { return r.client_effective_throughput; }, 2, false},
      {"ttft_p50_ms", "TTFT p50 ms", "ms", [](const BenchReport& r) { return ms(r.ttft_s.p50); },
       1, true},
      {"ttft_p99_ms", "TTFT p99 ms", "ms", [](const BenchReport& r) { return ms(r.ttft_s.p99); },
       1, true},
      {"itl_p50_ms", "ITL p50 ms", "ms", [](const BenchReport& r) { return ms(r.itl_s.p50); }, 2,
       true},
      {"itl_p99_ms", "ITL p99 ms", "ms", [](const BenchReport& r) { return ms(r.itl_s.p99); }, 2,
       true},
      {"mean_running", "running", "requests", [](const BenchReport& r) { return r.mean_running; },
       1, false},
      {"running_ceiling", "ceiling", "requests",
       [](const BenchReport& r) { return r.diagnosis.ceiling; }, 1, false},
      {"mean_token_usage", "usage", "share of the pool",
       [](const BenchReport& r) { return r.mean_token_usage; }, 2, false},
      {"mean_queue", "queue", "requests", [](const BenchReport& r) { return r.mean_queue; }, 1,
       true},
      {"retractions", "retractions", "requests",
       [](const BenchReport& r) { return static_cast<double>(r.retractions); }, 0, true},
      {"cached_tokens", "cached", "tokens",
       [](const BenchReport& r) { return static_cast<double>(r.cached_tokens); }, 0, false},
      {"tier_share", "tier %", "% of cached tokens",
       [](const BenchReport& r) {
         return r.cached_tokens == 0 ? 0.0
                                     : 100.0 * static_cast<double>(r.tier_loaded_tokens) /
                                           static_cast<double>(r.cached_tokens);
       },
       0, false},
      {"total_output_throughput", "out tok/s", "tok/s",
       [](const BenchReport& r) { return r.total_output_throughput; }, -1, false},
      {"ttft_mean_ms", "TTFT mean ms", "ms", [](const BenchReport& r) { return ms(r.ttft_s.mean); },
       -1, true},
      {"itl_mean_ms", "ITL mean ms", "ms", [](const BenchReport& r) { return ms(r.itl_s.mean); },
       -1, true},
      {"e2e_p50_s", "e2e p50 s", "s", [](const BenchReport& r) { return r.e2e_s.p50; }, -1, true},
      {"e2e_p99_s", "e2e p99 s", "s", [](const BenchReport& r) { return r.e2e_s.p99; }, -1, true},
      {"duration_s", "duration s", "s", [](const BenchReport& r) { return r.duration_s; }, -1,
       true},
      {"completed", "completed", "requests",
       [](const BenchReport& r) { return static_cast<double>(r.completed); }, -1, false},
      {"aborted", "aborted", "requests",
       [](const BenchReport& r) { return static_cast<double>(r.aborted); }, -1, true},
  };
  return kFigures;
}

const std::vector<FigureSpec>& accuracy_figures() {
  static const std::vector<FigureSpec> kAccuracy = {
      {"kl_mean", "KL mean", "nats",
       [](const BenchReport& r) { return r.accuracy.kl_mean; }, kScientific, true},
      {"kl_p99", "KL p99", "nats", [](const BenchReport& r) { return r.accuracy.kl_p99; },
       kScientific, true},
      {"top1_agreement", "top-1 %", "% of positions",
       [](const BenchReport& r) { return 100 * r.accuracy.top1_agreement; }, 2, false},
      {"perplexity_ratio", "ppl ratio", "over f32 KV's",
       [](const BenchReport& r) { return r.accuracy.perplexity_ratio; }, -1, true},
  };
  return kAccuracy;
}

std::vector<FigureSpec> figures_of(const bench::MatrixResult& result) {
  std::vector<FigureSpec> out = figures();
  if (result.eval_text.empty()) return out;
  // kvrt eval's figures against kv_f32_paged, before the JSON-only ones.
  const auto first_json_only = std::find_if(out.begin(), out.end(),
                                            [](const FigureSpec& f) { return f.decimals == -1; });
  out.insert(first_json_only, accuracy_figures().begin(), accuracy_figures().end());
  return out;
}

bool CombinationSummary::has(const FigureSpec& f) const {
  if (!ok()) return false;
  const std::vector<FigureSpec>& accuracy = accuracy_figures();
  const bool of_eval = std::any_of(accuracy.begin(), accuracy.end(), [&](const FigureSpec& a) {
    return std::string_view(a.key) == f.key;
  });
  return !of_eval || median_run->report.accuracy.measured;
}

std::string format_figure(const FigureSpec& f, double value) {
  if (f.decimals == kScientific) return util::scientific(value);
  return f.decimals < 0 ? "" : util::fixed(value, f.decimals);
}

double CombinationSummary::median(const char* key) const {
  auto it = figures.find(key);
  return it == figures.end() ? 0.0 : it->second.median;
}

std::vector<CombinationSummary> summarize(const bench::MatrixResult& result) {
  std::vector<CombinationSummary> out(result.combinations.size());
  for (size_t i = 0; i < out.size(); ++i) out[i].combination = &result.combinations[i];
  for (const bench::MatrixRun& run : result.runs) {
    CombinationSummary& s = out[run.combination];
    s.runs.push_back(&run);
    if (!run.status.ok()) {
      if (s.failed++ == 0) s.error = run.status.message();
    }
  }
  for (CombinationSummary& s : out) {
    std::vector<const bench::MatrixRun*> ok;
    for (const bench::MatrixRun* r : s.runs) {
      if (r->status.ok()) ok.push_back(r);
    }
    if (ok.empty()) continue;
    for (const FigureSpec& f : figures_of(result)) {
      std::vector<double> v;
      for (const bench::MatrixRun* r : ok) v.push_back(f.get(r->report));
      std::sort(v.begin(), v.end());
      const size_t n = v.size();
      Spread& spread = s.figures[f.key];
      spread.n = n;
      spread.min = v.front();
      spread.max = v.back();
      spread.median = n % 2 == 1 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
    }
    // The run at the median of generation throughput (the lower middle one for an even count).
    std::sort(ok.begin(), ok.end(), [](const bench::MatrixRun* a, const bench::MatrixRun* b) {
      return a->report.server_gen_throughput < b->report.server_gen_throughput;
    });
    s.median_run = ok[(ok.size() - 1) / 2];
  }
  return out;
}

std::string ratio_text(double value, double base) {
  if (!(base > 0) || !std::isfinite(value)) return "-";
  return util::fixed(value / base, 2) + "x";
}

std::string format_comparison(const bench::MatrixResult& result) {
  const std::vector<CombinationSummary> summaries = summarize(result);
  const size_t left = 1 + (result.axes.empty() ? 1 : result.axes.size());
  std::string out;
  const bench::WorkloadSpec& w = result.workload;
  out += "kvrt bench --matrix: " + std::to_string(result.combinations.size()) + " combination" +
         (result.combinations.size() == 1 ? "" : "s") + " x " + std::to_string(result.repeat) +
         " run" + (result.repeat == 1 ? "" : "s") + ", workload " + w.source + " (" +
         std::to_string(w.num_requests) + " requests, concurrency " +
         (w.concurrency > 0 ? std::to_string(w.concurrency) : "unlimited") + ", seed " +
         std::to_string(w.seed) + ")" +
         (result.config_path.empty() ? "" : ", config " + result.config_path) + "\n";
  if (!result.eval_text.empty()) {
    out += "KL, top-1: each combination's KV store against kv_f32_paged (kvrt eval) on " +
           result.eval_text + "\n";
  }
  if (result.repeat > 1) {
    out += "medians of " + std::to_string(result.repeat) +
           " interleaved runs; +- is half the range of generation throughput over its median\n";
  }
  out += "\n";

  // The figures.
  // "#", the axes, the table's figures: the start of both tables' heading rows.
  auto heading = [&] {
    std::vector<std::string> head = {"#"};
    for (const std::string& h : axis_headings(result)) head.push_back(h);
    for (const FigureSpec& f : figures_of(result)) {
      if (in_table(f)) head.push_back(f.heading);
    }
    return head;
  };
  // "#" and the combination's values: the start of its row.
  auto row_start = [&](size_t i) {
    std::vector<std::string> row = {std::to_string(i + 1)};
    for (const std::string& c : axis_cells(result, summaries[i])) row.push_back(c);
    return row;
  };
  std::vector<std::vector<std::string>> rows = {heading()};
  rows[0].push_back("verdict");
  for (size_t i = 0; i < summaries.size(); ++i) {
    const CombinationSummary& s = summaries[i];
    std::vector<std::string> row = row_start(i);
    for (const FigureSpec& f : figures_of(result)) {
      if (!in_table(f)) continue;
      if (!s.has(f)) {
        row.push_back("-");
        continue;
      }
      const Spread& sp = s.figures.at(f.key);
      std::string cell = format_figure(f, sp.median);
      if (result.repeat > 1 && std::string_view(f.key) == "server_gen_throughput" &&
          sp.median > 0) {
        cell += " +-" + util::fixed(50.0 * (sp.max - sp.min) / sp.median, 0) + "%";
      }
      row.push_back(cell);
    }
    std::string verdict =
        s.ok() ? std::string(metrics::kind_name(s.median_run->report.diagnosis.kind)) : "failed";
    if (s.failed > 0 && s.ok()) verdict += " (" + std::to_string(s.failed) + " runs failed)";
    row.push_back(verdict);
    rows.push_back(row);
  }
  out += util::render_columns(rows, left, true);

  // Ratios to the first row.
  if (summaries.size() > 1) {
    out += "\nratio to row 1\n";
    rows = {heading()};
    for (size_t i = 1; i < summaries.size(); ++i) {
      const CombinationSummary& s = summaries[i];
      std::vector<std::string> row = row_start(i);
      for (const FigureSpec& f : figures_of(result)) {
        if (!in_table(f)) continue;
        row.push_back(s.ok() && summaries[0].ok()
                          ? ratio_text(s.median(f.key), summaries[0].median(f.key))
                          : "-");
      }
      rows.push_back(row);
    }
    out += util::render_columns(rows, left, true);
  }

  out += "\n";
  for (size_t i = 0; i < summaries.size(); ++i) {
    const CombinationSummary& s = summaries[i];
    out += std::to_string(i + 1) + " " + s.combination->label() + ": ";
    if (!s.ok()) {
      out += "failed: " + s.error + "\n";
    } else if (s.median_run->report.diagnosis.line.empty()) {
      out += "no diagnosis\n";
    } else {
      out += s.median_run->report.diagnosis.line + "\n";
    }
    if (i < result.eval_errors.size() && !result.eval_errors[i].empty()) {
      out += "  accuracy not measured: " + result.eval_errors[i] + "\n";
    }
  }
  return out;
}

}  // namespace kvrt::report
