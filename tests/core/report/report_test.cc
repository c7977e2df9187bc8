// The matrix report from hand-built results: medians and spreads, ratios, failed rows, and HTML
// that fetches nothing, runs nothing and escapes what users typed; the SVG helpers' ticks.
#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <regex>

#include "core/report/matrix_report.h"
#include "core/report/svg.h"

namespace kvrt::report {
namespace {

size_t count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST(Svg, TicksAreRoundValuesCoveringTheRange) {
  EXPECT_EQ(svg::nice_ticks(0, 9.5, 5), (std::vector<double>{0, 2, 4, 6, 8}));
  EXPECT_EQ(svg::nice_ticks(0, 150, 5), (std::vector<double>{0, 50, 100, 150}));
  const std::vector<double> t = svg::nice_ticks(0, 1, 5);
  ASSERT_EQ(t.size(), 6u);
  EXPECT_NEAR(t[3], 0.6, 1e-12);
  EXPECT_FALSE(svg::nice_ticks(13, 13, 5).empty());  // a flat series still gets an axis
}

TEST(Svg, TickLabelsAreShort) {
  EXPECT_EQ(svg::tick_label(1200), "1200");
  EXPECT_EQ(svg::tick_label(15000), "15k");
  EXPECT_EQ(svg::tick_label(2.5e6), "2.5M");
  EXPECT_EQ(svg::tick_label(0.1 + 0.2), "0.3");
  EXPECT_EQ(svg::tick_label(0), "0");
}

TEST(Svg, EscapesMarkup) {
  EXPECT_EQ(svg::escape(R"(<a href="x">&'</a>)"), "&lt;a href=&quot;x&quot;&gt;&amp;&#39;&lt;/a&gt;");
}

TEST(Svg, ChartsDrawTheirSeriesAndBars) {
  svg::ChartOptions c;
  c.title = "t";
  c.x = {"x (s)", 0, 10, false};
  c.y = {"y", 0, 1, false};
  const std::string lines =
      svg::line_chart(c, {{"a", "#111111", {{0, 0}, {5, 0.5}, {10, 2}}, false},
                          {"b", "#222222", {{0, 1}, {10, 1}}, true},
                          {"empty", "#333333", {}, false}});
  EXPECT_EQ(count(lines, "<polyline class=\"series\""), 1u);
  EXPECT_EQ(count(lines, "<polyline class=\"reference\""), 1u);
  EXPECT_NE(lines.find(">x (s)</text>"), std::string::npos);
  // y = 2 is clamped to the top of the plot (y pixel 30), not drawn outside it.
  EXPECT_NE(lines.find(",30.0\""), std::string::npos) << lines;
  const std::string bars = svg::bar_chart(
      c, {{"1", "#111111", 0.5, 0, 0, "0.50", false}, {"2", "#222222", 0, 0, 0, "failed", true}});
  EXPECT_EQ(count(bars, "<rect class=\"bar\""), 1u);
  EXPECT_EQ(count(bars, "<rect class=\"failed\""), 1u);
  EXPECT_NE(bars.find(">failed</text>"), std::string::npos);
}

TEST(Svg, LogAxesTickAtOneTwoFive) {
  svg::ChartOptions c;
  c.x = {"ms", 1, 100, true};
  c.y = {"share", 0, 1, false};
  const std::string chart = svg::line_chart(c, {{"a", "#111111", {{0.5, 0}, {50, 1}}, false}});
  for (const char* tick : {">1<", ">2<", ">5<", ">10<", ">20<", ">50<", ">100<"}) {
    EXPECT_NE(chart.find(tick), std::string::npos) << tick;
  }
}

// Two combinations x 3 runs; the second combination's second run failed.
bench::MatrixResult sample_result() {
  bench::MatrixResult r;
  r.kvrt_version = "0.1.0";
  r.started_at = "2026-12-01T00:00:00Z";
  r.machine = {"Test CPU", 2, uint64_t{24} << 30, "Linux"};
  r.workload.source = "w.toml";
  r.axes = {{"kv.store", {"kv_bf16_paged", "<fp8>"}}};
  r.combinations = {{0, {{"kv.store", "kv_bf16_paged"}}}, {1, {{"kv.store", "<fp8>"}}}};
  r.configs = {"[kv]\nstore = \"kv_bf16_paged\"\n", "[kv]\nstore = \"<fp8>\"\n"};
  r.repeat = 3;
  const double gen[2][3] = {{100, 110, 90}, {200, 0, 180}};
  for (size_t round = 0; round < 3; ++round) {
    for (size_t c = 0; c < 2; ++c) {
      bench::MatrixRun run;
      run.combination = c;
      run.repeat = static_cast<int>(round);
      run.position = r.runs.size();
      run.capacity_report = "capacity of store " + std::to_string(c);
      if (c == 1 && round == 1) {
        run.status = Status::InvalidArgument("every request was aborted (4): <why>");
      } else {
        run.report.server_gen_throughput = gen[c][round];
        run.report.max_total_num_tokens = c == 0 ? 1000 : 2000;
        run.report.ttft_s.p50 = 0.010 * static_cast<double>(c + 1);
        run.report.completed = 4;
        run.report.timeline = {{0.1, 2, 1, 0.5}, {0.2, 3, 0, 0.9}};
        for (int q = 0; q <= bench::kQuantileSteps; ++q) {
          run.report.ttft_quantiles_s.push_back(0.001 * (q + 1));
          run.report.itl_quantiles_s.push_back(0.0001 * (q + 1));
        }
        run.report.diagnosis.kind = metrics::Diagnosis::Kind::kKvBound;
        run.report.diagnosis.line = "Diagnosis: KV-bound. <evidence>";
      }
      r.runs.push_back(std::move(run));
    }
  }
  return r;
}

TEST(MatrixReport, SummariesAreMediansOverTheRunsThatSucceeded) {
  const bench::MatrixResult r = sample_result();
  const std::vector<CombinationSummary> s = summarize(r);
  ASSERT_EQ(s.size(), 2u);
  EXPECT_EQ(s[0].median("server_gen_throughput"), 100);
  EXPECT_EQ(s[0].figures.at("server_gen_throughput").min, 90);
  EXPECT_EQ(s[0].figures.at("server_gen_throughput").max, 110);
  EXPECT_EQ(s[0].median_run->report.server_gen_throughput, 100);
  EXPECT_EQ(s[1].failed, 1u);
  EXPECT_EQ(s[1].figures.at("server_gen_throughput").n, 2u);
  EXPECT_EQ(s[1].median("server_gen_throughput"), 190);  // the mean of the middle two
  EXPECT_EQ(s[1].median_run->report.server_gen_throughput, 180);  // the lower middle run
  EXPECT_EQ(ratio_text(190, 100), "1.90x");
  EXPECT_EQ(ratio_text(5, 0), "-");
}

TEST(MatrixReport, TableGivesRatiosSpreadAndDiagnoses) {
  const std::string table = format_comparison(sample_result());
  EXPECT_NE(table.find("2 combinations x 3 runs"), std::string::npos) << table;
  // gen tok/s: median 100, range 90..110 = +-10%.
  EXPECT_TRUE(std::regex_search(table, std::regex(R"(\n1 +kv_bf16_paged +1000 +100\.0 \+-10% )")))
      << table;
  EXPECT_TRUE(std::regex_search(table, std::regex(R"(\n2 +<fp8> +2\.00x +1\.90x )"))) << table;
  EXPECT_NE(table.find("KV-bound (1 runs failed)"), std::string::npos);
  EXPECT_NE(table.find("1 kv.store=kv_bf16_paged: Diagnosis: KV-bound. <evidence>"),
            std::string::npos);
}

TEST(MatrixReport, AFailedCombinationKeepsItsRowAndReason) {
  bench::MatrixResult r = sample_result();
  for (bench::MatrixRun& run : r.runs) {
    if (run.combination == 1) run.status = Status::InvalidArgument("no fit: <why>");
  }
  const std::string table = format_comparison(r);
  EXPECT_TRUE(std::regex_search(table, std::regex(R"(\n2 +<fp8> +- +- .* failed\n)"))) << table;
  EXPECT_NE(table.find("2 kv.store=<fp8>: failed: no fit: <why>"), std::string::npos);
  const std::string html = to_html(r);
  EXPECT_NE(html.find("failed: no fit: &lt;why&gt;"), std::string::npos);
  EXPECT_NE(html.find("<rect class=\"failed\""), std::string::npos);
  const nlohmann::json j = nlohmann::json::parse(to_json(r));
  EXPECT_FALSE(j["combinations"][1]["ok"].get<bool>());
  EXPECT_EQ(j["combinations"][1]["error"], "no fit: <why>");
  EXPECT_EQ(j["combinations"][1]["runs"].size(), 3u);
}

TEST(MatrixReport, HtmlIsSelfContainedAndEscaped) {
  const std::string html = to_html(sample_result());
  EXPECT_EQ(html.rfind("<!DOCTYPE html>", 0), 0u);
  EXPECT_NE(html.find("Content-Security-Policy\" content=\"default-src 'none'"), std::string::npos);
  for (const char* fetches : {"<script", "src=", "href=", "url(", "@import", "<link"}) {
    EXPECT_EQ(html.find(fetches), std::string::npos) << fetches;
  }
  // The only address is SVG's namespace, which is a name, not a fetch.
  EXPECT_EQ(count(html, "https:"), 0u);
  EXPECT_EQ(count(html, "http:"), count(html, "http://www.w3.org/2000/svg"));
  EXPECT_EQ(html.find("<fp8>"), std::string::npos) << "a user's value must be escaped";
  EXPECT_NE(html.find("&lt;fp8&gt;"), std::string::npos);
  // Two throughput bar charts, three timelines, two CDFs.
  EXPECT_EQ(count(html, "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\""), 7u);
  EXPECT_NE(html.find("Running requests"), std::string::npos);
  EXPECT_NE(html.find("time since the run started (s)"), std::string::npos);
  EXPECT_NE(html.find("TTFT (ms), log scale"), std::string::npos);
  EXPECT_NE(html.find("capacity of store 1"), std::string::npos);
  EXPECT_NE(html.find("Test CPU, 2 cores"), std::string::npos);
}

}  // namespace
}  // namespace kvrt::report
