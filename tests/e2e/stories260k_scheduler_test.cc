// The scheduler over the real model: many greedy requests for "Once upon a time" and its
// continuations, batched together on a KV pool too small for all of them, so they share cached
// prefixes, wait, get retracted and recomputed (and, with kv_host_tiered, come back from the
// host tier). Every request must still produce exactly the reference ids, as it does alone.
#include <gtest/gtest.h>
#include <spdlog/spdlog.h>

#include <cstdlib>
#include <filesystem>
#include <tuple>

#include "core/config/config.h"
#include "core/runtime/runtime.h"
#include "core/sched/scheduler.h"
#include "core/serve/serving_core.h"
#include "tests/e2e/stories260k_continuations.h"

namespace kvrt {
namespace {

using stories260k::model_dir;

class Stories260kScheduler : public ::testing::TestWithParam<std::tuple<std::string, int>> {};

TEST_P(Stories260kScheduler, EveryRequestGetsTheReferenceIds) {
  if (!std::filesystem::exists(model_dir() + "/model.safetensors")) {
    GTEST_SKIP() << model_dir() << " not found";
  }
  const auto& [store, tp] = GetParam();
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  spdlog::set_level(spdlog::level::err);
  // The f32 weights (split over the ranks, the norms whole on each), the reserve, and a pool of
  // about 16 4-token pages.
  const std::string memory = tp == 1 ? "1200KiB" : "592KiB";
  Result<config::Config> cfg = config::load_string(
      "", "<test>",
      {"model.path=\"" + model_dir() + "\"", "device.memory=\"" + memory + "\"",
       "tp.size=" + std::to_string(tp), "scheduler.page_size=4", "kv.store=" + store,
       "scheduler.chunked_prefill_size=8", "scheduler.new_token_ratio=0.2",
       "scheduler.min_new_token_ratio=0.05", "scheduler.new_token_ratio_decay=0.05"});
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  plugin::Registry registry;
  registry.set_config_source(
      [&](const std::string& name) { return cfg->plugin_table("kv", name); });
  Result<runtime::Runtime> rt = runtime::build_runtime(*cfg, registry);
  ASSERT_TRUE(rt.ok()) << rt.status().message();

  constexpr int kRequests = 24;
  serve::ServingOptions serving = runtime::serving_options(*cfg, *rt, {});
  sched::SchedulerOptions& options = serving.scheduler;
  options.check_invariants = true;
  // Every request fits alone, but not all at once.
  ASSERT_LT(options.num_pages * options.page_size, uint64_t{kRequests} * 32 / 3);
  ASSERT_EQ(rt->engine->has_tier(), store == "kv_host_tiered");
  serve::ServingCore core(serving, rt->engine.get());
  int steps = 0;
  stories260k::expect_continuations(stories260k::run_continuations(core, kRequests, &steps),
                                    kRequests);
  stories260k::expect_pool_shared(core, store + " TP " + std::to_string(tp), options.num_pages,
                                  steps);
}

INSTANTIATE_TEST_SUITE_P(Stores, Stories260kScheduler,
                         ::testing::Combine(::testing::Values("kv_bf16_paged", "kv_host_tiered"),
                                            ::testing::Values(1, 2)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_tp" +
                                  std::to_string(std::get<1>(info.param));
                         });

}  // namespace
}  // namespace kvrt
