// The scenario kvrt exists for (issue 4): long outputs from 150 concurrent clients on a small
// device budget, run through the real scheduler, engine and KV store plugins (synth-bench).
// Counts only, nothing timed:
//  - in the saturated phase the mean running count is within 15% of the predicted ceiling,
//    max_total_num_tokens / mean live length;
//  - kv_fp8_e4m3 raises it at least 1.8x over kv_bf16_paged on the same budget;
//  - kv_host_tiered leaves it unchanged (within 5%) but, on a multi-turn shared-prefix
//    workload, serves at least 2x the cached tokens of its inner store alone;
//  - on synth-mla (issue 16: MLA latents), running follows the latent pool's ceiling and fp8
//    about doubles it.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/bench/bench.h"
#include "core/config/config.h"
#include "core/runtime/runtime.h"

namespace kvrt {
namespace {

std::string source_path(const std::string& relative) {
  const char* root = std::getenv("KVRT_SOURCE_DIR");
  return std::string(root ? root : ".") + "/" + relative;
}

bench::BenchReport run(const std::string& store, const std::string& workload_file,
                       const std::string& config_file = "configs/kv-bound.toml",
                       std::vector<std::string> sets = {}) {
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  spdlog::set_level(spdlog::level::err);  // one line per retraction is for operators, not here
  sets.push_back("kv.store=" + store);
  Result<config::Config> cfg = config::load_file(source_path(config_file), sets);
  EXPECT_TRUE(cfg.ok()) << cfg.status().message();
  plugin::Registry registry;
  registry.set_config_source(
      [&](const std::string& name) { return cfg->plugin_table("kv", name); });
  Result<runtime::Runtime> rt = runtime::build_runtime(*cfg, registry);
  EXPECT_TRUE(rt.ok()) << rt.status().message();
  Result<bench::WorkloadSpec> w = bench::load_workload_toml(source_path(workload_file));
  EXPECT_TRUE(w.ok()) << w.status().message();
  bench::BenchOptions options;
  options.log = false;
  Result<bench::BenchReport> report =
      bench::run_bench(*rt, *cfg, *w, runtime::store_ceilings(registry, *rt), options);
  EXPECT_TRUE(report.ok()) << report.status().message();
  std::printf("%s", bench::format_report(*report).c_str());
  return *report;
}

TEST(KvBoundScenario, RunningFollowsTheCeilingAndTheStoreFormat) {
  bench::BenchReport bf16 = run("kv_bf16_paged", "bench/workloads/kv-bound.toml");
  bench::BenchReport fp8 = run("kv_fp8_e4m3", "bench/workloads/kv-bound.toml");
  bench::BenchReport tiered = run("kv_host_tiered", "bench/workloads/kv-bound.toml");
  for (const bench::BenchReport* r : {&bf16, &fp8, &tiered}) {
    SCOPED_TRACE(r->store);
    EXPECT_EQ(r->completed, r->requests);
    EXPECT_EQ(r->aborted, 0u);
    ASSERT_GT(r->saturated_steps, 100u) << "the workload never saturated the pool";
    EXPECT_NEAR(r->saturated_running / r->saturated_ceiling, 1.0, 0.15)
        << "running " << r->saturated_running << ", ceiling " << r->saturated_ceiling;
    EXPECT_EQ(r->diagnosis.kind, metrics::Diagnosis::Kind::kKvBound) << r->diagnosis.line;
  }
  EXPECT_GE(fp8.saturated_running, 1.8 * bf16.saturated_running);
  EXPECT_NEAR(tiered.saturated_running / bf16.saturated_running, 1.0, 0.05);
}

// The same on an MLA model (synth-mla: one 576-wide latent per token and layer, whole on the
// rank): the ceiling is the latent pool over the mean live length, and fp8's latent (one byte
// per value plus one scale per token) about doubles it. The answers are short (2 cores run
// synth-mla's 64 experts), so the admission's reservation for the running requests' remaining
// tokens weighs more than with issue 4's long answers: running sits ~14% under the ceiling.
TEST(KvBoundScenario, MlaLatentsFollowTheCeilingAndFp8DoublesIt) {
  const std::string workload = "bench/workloads/kv-bound-mla.toml";
  const std::string config = "configs/kv-bound-mla.toml";
  bench::BenchReport bf16 = run("kv_bf16_paged", workload, config);
  bench::BenchReport fp8 = run("kv_fp8_e4m3", workload, config);
  for (const bench::BenchReport* r : {&bf16, &fp8}) {
    SCOPED_TRACE(r->store);
    EXPECT_EQ(r->completed, r->requests);
    EXPECT_EQ(r->aborted, 0u);
    ASSERT_GT(r->saturated_steps, 100u) << "the workload never saturated the pool";
    EXPECT_NEAR(r->saturated_running / r->saturated_ceiling, 1.0, 0.2)
        << "running " << r->saturated_running << ", ceiling " << r->saturated_ceiling;
    EXPECT_EQ(r->diagnosis.kind, metrics::Diagnosis::Kind::kKvBound) << r->diagnosis.line;
  }
  // The capacity report's prediction: bytes per token 4 x 576 x 2 against 4 x (576 + 4).
  EXPECT_NEAR(static_cast<double>(fp8.max_total_num_tokens) / bf16.max_total_num_tokens, 1.99,
              0.02);
  EXPECT_GE(fp8.saturated_running, 1.8 * bf16.saturated_running);
}

TEST(KvBoundScenario, AHostTierServesMoreCachedTokensOnMultiTurn) {
  bench::BenchReport inner = run("kv_bf16_paged", "bench/workloads/multi-turn.toml");
  bench::BenchReport tiered = run("kv_host_tiered", "bench/workloads/multi-turn.toml");
  EXPECT_EQ(inner.completed, inner.requests);
  EXPECT_EQ(tiered.completed, tiered.requests);
  EXPECT_GT(tiered.tier_loaded_tokens, 0u);
  // The report reads the tier's own account (tier_info): it saved pages and gave some back.
  EXPECT_FALSE(inner.host_tier);
  ASSERT_TRUE(tiered.host_tier);
  EXPECT_GT(tiered.tier.saved_pages, 0u);
  EXPECT_GT(tiered.tier.loaded_pages, 0u);
  EXPECT_LE(tiered.tier.used_pages, tiered.tier.capacity_pages);
  EXPECT_GE(tiered.cached_tokens, 2 * inner.cached_tokens)
      << "tiered " << tiered.cached_tokens << ", inner alone " << inner.cached_tokens;
}

// Decode context parallelism on the MLA scenario at TP 2 (issue 45): at dcp 1 the latent's two
// copies fill the pool and the diagnosis names tp.dcp_size=2 as a lever; at dcp 2 each token's
// latent is on one rank, the pool holds twice the tokens and the mean running count rises at
// least 1.5x (doubling the memory instead gives about 1.8x).
TEST(KvBoundScenario, MlaContextParallelismDoublesThePool) {
  const std::string workload = "bench/workloads/kv-bound-mla.toml";
  const std::string config = "configs/kv-bound-mla.toml";
  const std::vector<std::string> tp2 = {"tp.size=2", "device.memory=\"219.7MB\""};
  std::vector<std::string> dcp2 = tp2;
  dcp2.push_back("tp.dcp_size=2");
  bench::BenchReport one = run("kv_bf16_paged", workload, config, tp2);
  bench::BenchReport two = run("kv_bf16_paged", workload, config, dcp2);
  for (const bench::BenchReport* r : {&one, &two}) {
    EXPECT_EQ(r->completed, r->requests);
    EXPECT_EQ(r->aborted, 0u);
  }
  EXPECT_EQ(one.diagnosis.kind, metrics::Diagnosis::Kind::kKvBound) << one.diagnosis.line;
  EXPECT_NE(one.diagnosis.line.find("tp.dcp_size=2 -> ceiling"), std::string::npos)
      << one.diagnosis.line;
  EXPECT_EQ(two.max_total_num_tokens, 2 * one.max_total_num_tokens);
  EXPECT_GE(two.mean_running, 1.5 * one.mean_running);
}

}  // namespace
}  // namespace kvrt
