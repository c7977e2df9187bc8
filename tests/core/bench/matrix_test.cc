// kvrt bench --matrix: parsing, the product and its order, validation before anything runs, and
// a real run through the runtime (synth-bench) whose JSON holds every figure of every run.
#include "core/bench/matrix.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <map>
#include <set>

#include "core/report/matrix_report.h"

namespace kvrt::bench {
namespace {

MatrixAxis axis(const std::string& arg) {
  Result<MatrixAxis> a = parse_matrix_axis(arg);
  EXPECT_TRUE(a.ok()) << a.status().message();
  return a.ok() ? *a : MatrixAxis{};
}

std::string error_of(const std::string& arg) {
  Result<MatrixAxis> a = parse_matrix_axis(arg);
  return a.ok() ? "accepted" : a.status().message();
}

TEST(MatrixAxis, SplitsValuesAtTopLevelCommas) {
  MatrixAxis a = axis("kv.store=kv_bf16_paged, kv_fp8_e4m3,kv_host_tiered");
  EXPECT_EQ(a.key, "kv.store");
  EXPECT_EQ(a.values, (std::vector<std::string>{"kv_bf16_paged", "kv_fp8_e4m3", "kv_host_tiered"}));
  // Commas inside quotes and brackets belong to the value.
  a = axis(R"(plugins.path=["a","b"],["c"],"x,y")");
  EXPECT_EQ(a.values, (std::vector<std::string>{R"(["a","b"])", R"(["c"])", R"("x,y")"}));
  EXPECT_EQ(axis("device.memory=13MiB").values, std::vector<std::string>{"13MiB"});
}

TEST(MatrixAxis, RefusesWhatIsNotKeyEqualsValues) {
  EXPECT_EQ(error_of("kv.store"), "--matrix kv.store: expected KEY=V1,V2,... (e.g. kv.store=a,b)");
  EXPECT_EQ(error_of("=a,b"), "--matrix =a,b: the key is empty");
  EXPECT_EQ(error_of("tp.size=1,,2"), "--matrix tp.size=1,,2: value 2 is empty");
  EXPECT_EQ(error_of("tp.size="), "--matrix tp.size=: value 1 is empty");
  EXPECT_EQ(error_of("tp.size=1,2,1"), "--matrix tp.size=1,2,1: 1 is given twice");
  EXPECT_EQ(error_of(R"(kv.store="a,b)"), R"(--matrix kv.store="a,b: a quote or bracket is not closed)");
  EXPECT_EQ(error_of("plugins.path=[\"a\""), "--matrix plugins.path=[\"a\": a quote or bracket is not closed");
}

TEST(MatrixExpand, IsTheProductWithTheLastAxisFastest) {
  Result<std::vector<Combination>> c =
      expand_matrix({axis("kv.store=a,b"), axis("tp.size=1,2,4")});
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->size(), 6u);
  std::vector<std::string> labels;
  for (const Combination& x : *c) labels.push_back(x.label());
  EXPECT_EQ(labels, (std::vector<std::string>{"kv.store=a tp.size=1", "kv.store=a tp.size=2",
                                              "kv.store=a tp.size=4", "kv.store=b tp.size=1",
                                              "kv.store=b tp.size=2", "kv.store=b tp.size=4"}));
  EXPECT_EQ((*c)[4].index, 4u);
  EXPECT_EQ((*c)[4].overrides(), (std::vector<std::string>{"kv.store=b", "tp.size=2"}));
}

TEST(MatrixExpand, NoAxesIsTheBaseAlone) {
  Result<std::vector<Combination>> c = expand_matrix({});
  ASSERT_TRUE(c.ok());
  ASSERT_EQ(c->size(), 1u);
  EXPECT_EQ((*c)[0].label(), "base");
  EXPECT_TRUE((*c)[0].overrides().empty());
}

TEST(MatrixExpand, RefusesARepeatedKeyAndAnOversizedProduct) {
  Result<std::vector<Combination>> c = expand_matrix({axis("tp.size=1"), axis("tp.size=2")});
  ASSERT_FALSE(c.ok());
  EXPECT_NE(c.status().message().find("--matrix tp.size: the key is given twice"),
            std::string::npos);
  std::string many;
  for (int i = 0; i < 30; ++i) many += (i ? "," : "") + std::to_string(i);
  c = expand_matrix({axis("a.x=" + many), axis("b.y=" + many)});
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().message(), "--matrix: more than 512 combinations");
}

TEST(MatrixOrder, OneRoundIsTheProductOrder) {
  std::vector<RunSlot> order = run_order(3, 1);
  ASSERT_EQ(order.size(), 3u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(order[i].combination, i);
    EXPECT_EQ(order[i].repeat, 0);
  }
}

TEST(MatrixOrder, RoundsRotateSoEachCombinationTakesEveryPlace) {
  const size_t n = 4;
  std::vector<RunSlot> order = run_order(n, 4);
  ASSERT_EQ(order.size(), 16u);
  std::map<size_t, std::set<size_t>> places;  // combination -> its places within a round
  std::map<size_t, int> runs;
  for (size_t i = 0; i < order.size(); ++i) {
    EXPECT_EQ(order[i].repeat, static_cast<int>(i / n));
    places[order[i].combination].insert(i % n);
    ++runs[order[i].combination];
  }
  for (size_t c = 0; c < n; ++c) {
    EXPECT_EQ(runs[c], 4) << c;
    EXPECT_EQ(places[c].size(), n) << "combination " << c << " always runs at the same place";
  }
  EXPECT_EQ(order[4].combination, 1u);  // round 2 starts at combination 2
}

// The source tree's file, for the tests run by ctest from the build folder.
std::string source_path(const std::string& relative) {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  return std::string(root ? root : ".") + "/" + relative;
}

MatrixOptions options_for(std::vector<std::string> axes) {
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  MatrixOptions o;
  o.config_path = source_path("configs/kv-bound.toml");
  for (const std::string& a : axes) o.axes.push_back(axis(a));
  return o;
}

Status validation(std::vector<std::string> axes) {
  MatrixOptions o = options_for(std::move(axes));
  Result<std::vector<Combination>> c = expand_matrix(o.axes);
  EXPECT_TRUE(c.ok());
  return validate_matrix(o, *c);
}

TEST(MatrixValidate, NamesTheSettingAtFault) {
  EXPECT_TRUE(validation({"kv.store=kv_bf16_paged,kv_fp8_e4m3", "tp.size=1,2"}).ok());
  Status s = validation({"kv.store=kv_bf16_paged,kv_fp8_e4m3", "tp.size=1,9"});
  EXPECT_EQ(s.message(), "--matrix tp.size=9: tp.size: expected an integer between 1 and 8, found 9");
  s = validation({"kv.store=kv_bf16_paged,kv_missing"});
  EXPECT_EQ(s.message().rfind("--matrix kv.store=kv_missing: ", 0), 0u) << s.message();
  EXPECT_NE(s.message().find("plugin 'kv_missing' not found"), std::string::npos);
  // synth-bench has 2 KV heads: 3 ranks cannot split them (build_runtime's own check).
  s = validation({"tp.size=1,3"});
  EXPECT_EQ(s.message(), "--matrix tp.size=3: tp.size: 2 KV heads cannot be split over 3 TP "
                         "ranks (need one to divide the other)");
  s = validation({"scheduler.page_size=16,48"});
  EXPECT_EQ(s.message(),
            "--matrix scheduler.page_size=48: scheduler.page_size: expected a power of two "
            "between 1 and 1024, found 48");
}

TEST(MatrixValidate, NamesACombinationThatFailsOnlyAsAWhole) {
  // 3.5 MiB holds 16-token pages but not one 1024-token page.
  Status s = validation({"device.memory=13MiB,3.5MiB", "scheduler.page_size=16,1024"});
  EXPECT_EQ(s.message().rfind("--matrix combination 4 of 4 (device.memory=3.5MiB "
                              "scheduler.page_size=1024): the configuration does not fit",
                              0),
            0u)
      << s.message();
}

TEST(MatrixRun, AFailedCombinationIsRecordedAndTheOthersRun) {
  spdlog::set_level(spdlog::level::err);
  MatrixOptions o = options_for({"kv.store=kv_bf16_paged,kv_fp8_e4m3", "device.memory=13MiB,3MiB"});
  o.repeat = 2;
  // bf16 on 3 MiB holds 128 tokens, fewer than one request needs; fp8 holds 256.
  Result<WorkloadSpec> w = load_workload_toml(source_path("tests/cli/tight-pool.toml"));
  ASSERT_TRUE(w.ok());
  Result<MatrixResult> r = run_matrix(o, *w);
  ASSERT_TRUE(r.ok()) << r.status().message();
  ASSERT_EQ(r->runs.size(), 8u);
  for (const MatrixRun& run : r->runs) {
    SCOPED_TRACE(r->combinations[run.combination].label());
    if (run.combination == 1) {
      EXPECT_FALSE(run.status.ok());
      EXPECT_NE(run.status.message().find("every request of the workload was aborted (6)"), std::string::npos);
    } else {
      EXPECT_TRUE(run.status.ok()) << run.status.message();
      EXPECT_EQ(run.report.completed, 6u);
      EXPECT_EQ(run.report.generated_tokens, 48u);
      EXPECT_EQ(run.report.ttft_quantiles_s.size(), 101u);
      EXPECT_FALSE(run.report.timeline.empty());
      EXPECT_FALSE(run.plugins.empty());
    }
  }
  const std::vector<report::CombinationSummary> s = report::summarize(*r);
  ASSERT_EQ(s.size(), 4u);
  EXPECT_FALSE(s[1].ok());
  EXPECT_EQ(s[1].failed, 2u);
  EXPECT_EQ(s[3].median("max_total_num_tokens"), 256);
  EXPECT_EQ(s[2].median("max_total_num_tokens"), 2 * s[0].median("max_total_num_tokens") - 1088);

  // The JSON: parseable, and every figure of every run with the context to compare it later.
  const nlohmann::json j = nlohmann::json::parse(report::to_json(*r));
  for (const char* key : {"kvrt_version", "started_at", "machine", "workload", "axes", "repeat",
                          "run_order", "figure_units", "combinations"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_GT(j["machine"]["cores"].get<int>(), 0);
  EXPECT_FALSE(j["machine"]["cpu_model"].get<std::string>().empty());
  EXPECT_EQ(j["run_order"].size(), 8u);
  ASSERT_EQ(j["combinations"].size(), 4u);
  for (const nlohmann::json& c : j["combinations"]) {
    SCOPED_TRACE(c["label"].get<std::string>());
    EXPECT_EQ(c["runs"].size(), 2u);
    EXPECT_NE(c["config"].get<std::string>().find("[kv]"), std::string::npos);
    EXPECT_TRUE(c["settings"].contains("kv.store"));
    if (!c["ok"].get<bool>()) {
      EXPECT_EQ(c["verdict"], "failed");
      EXPECT_NE(c["error"].get<std::string>().find("aborted"), std::string::npos);
      continue;
    }
    bool has_store = false;
    for (const nlohmann::json& p : c["plugins"]) {
      EXPECT_FALSE(p["version"].get<std::string>().empty());
      has_store |= p["kind"] == "kv_store";
    }
    EXPECT_TRUE(has_store);
    EXPECT_NE(c["capacity_report"].get<std::string>().find("max_total_num_tokens"),
              std::string::npos);
    for (const report::FigureSpec& f : report::figures()) {
      EXPECT_TRUE(c["summary"].contains(f.key)) << f.key;
      for (const nlohmann::json& run : c["runs"]) {
        EXPECT_TRUE(run["report"]["figures"].contains(f.key)) << f.key;
      }
    }
    const nlohmann::json& first = c["runs"][0]["report"];
    EXPECT_EQ(first["ttft_quantiles_s"].size(), 101u);
    EXPECT_FALSE(first["timeline"].empty());
    EXPECT_EQ(first["tokens"]["generated"], 48);
    EXPECT_FALSE(first["diagnosis"]["line"].get<std::string>().empty());
  }
  EXPECT_DOUBLE_EQ(j["combinations"][2]["ratio_to_first"]["max_total_num_tokens"].get<double>(),
                   s[2].median("max_total_num_tokens") / s[0].median("max_total_num_tokens"));
}

}  // namespace
}  // namespace kvrt::bench
