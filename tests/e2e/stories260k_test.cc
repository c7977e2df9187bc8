// The real model end to end: greedy decoding of "Once upon a time" with stories260k must give
// the reference ids, with every KV store, at TP 1, 2, 4 and 8 and page sizes 1, 16 and 64.
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "core/config/config.h"
#include "core/exec/generate.h"
#include "core/runtime/runtime.h"
#include "tests/e2e/model_run.h"
#include "tests/e2e/stories260k_reference.h"

namespace kvrt::exec {
namespace {

using stories260k::kExpected;
using stories260k::kPrompt;
using stories260k::model_dir;

Result<Generation> greedy(e2e::ModelRun& s, int n) { return e2e::greedy(s, kPrompt, n); }

// A runtime for stories260k.
struct ModelRun : e2e::ModelRun {
  ModelRun(const std::string& store, int tp, int page_size)
      : e2e::ModelRun(model_dir(), store, tp, page_size) {}
};

class Stories260k : public ::testing::TestWithParam<std::tuple<std::string, int, int>> {
 protected:
  void SetUp() override {
    if (!std::filesystem::exists(model_dir() + "/model.safetensors")) {
      GTEST_SKIP() << "stories260k not found at " << model_dir();
    }
  }
};

TEST_P(Stories260k, GreedyIdsMatchTheReference) {
  const auto& [store, tp, page_size] = GetParam();
  ModelRun s(store, tp, page_size);
  ASSERT_TRUE(s.runtime.ok()) << s.runtime.status().message();
  Result<Generation> out = greedy(s, static_cast<int>(kExpected.size()));
  ASSERT_TRUE(out.ok()) << out.status().message();
  EXPECT_EQ(out->ids, kExpected);
  EXPECT_EQ(s.runtime->tokenizer->decode(out->ids),
            ", there was a little girl named Lily. She loved to play outside in the park.");
}

INSTANTIATE_TEST_SUITE_P(StoresTpPages, Stories260k,
                         ::testing::Combine(::testing::Values("kv_bf16_paged", "kv_host_tiered"),
                                            ::testing::Values(1, 2, 4, 8),
                                            ::testing::Values(1, 16, 64)),
                         [](const auto& info) {
                           return std::get<0>(info.param) + "_tp" +
                                  std::to_string(std::get<1>(info.param)) + "_page" +
                                  std::to_string(std::get<2>(info.param));
                         });

// Decode context parallelism on GQA with fewer KV heads than ranks: at TP 8 each of stories260k's
// 4 KV heads is on 2 ranks; with tp.dcp_size 2 each pair keeps every other token of its head,
// attends its 2 query heads over them and merges: the TP 1 ids, on twice the tokens.
TEST(Stories260kDcp, Tp8Dcp2GivesTheReferenceIds) {
  if (!std::filesystem::exists(model_dir() + "/model.safetensors")) {
    GTEST_SKIP() << "stories260k not found at " << model_dir();
  }
  for (const char* store : {"kv_bf16_paged", "kv_fp8_e4m3"}) {
    for (int page_size : {1, 16}) {
      SCOPED_TRACE(std::string(store) + ", page " + std::to_string(page_size));
      // fp8 per token and head: each row's own scale, so the same bytes as at dcp 1 (a
      // per-tensor scale would be too, being fixed), and the ids need only match dcp 1's.
      e2e::ModelRun dcp1(model_dir(), store, 8, page_size);
      e2e::ModelRun dcp2(model_dir(), store, 8, page_size, {"tp.dcp_size=2"});
      ASSERT_TRUE(dcp1.runtime.ok()) << dcp1.runtime.status().message();
      ASSERT_TRUE(dcp2.runtime.ok()) << dcp2.runtime.status().message();
      EXPECT_EQ(dcp2.runtime->plan.max_total_num_tokens, 2 * dcp1.runtime->plan.max_total_num_tokens);
      Result<Generation> a = greedy(dcp1, static_cast<int>(kExpected.size()));
      Result<Generation> b = greedy(dcp2, static_cast<int>(kExpected.size()));
      ASSERT_TRUE(a.ok()) << a.status().message();
      ASSERT_TRUE(b.ok()) << b.status().message();
      EXPECT_EQ(b->ids, a->ids);
      if (std::string(store) == "kv_bf16_paged") {
        EXPECT_EQ(b->ids, kExpected);
      }
    }
  }
}

// Where tp.dcp_size has nothing to remove (TP 2: each rank holds 2 KV heads of its own), or splits
// the copies unevenly (TP 8: 2 copies of each head, dcp 4), it is refused at start, by name.
TEST(Stories260kDcp, RefusedWhereNoCopyIsRemoved) {
  if (!std::filesystem::exists(model_dir() + "/model.safetensors")) {
    GTEST_SKIP() << "stories260k not found at " << model_dir();
  }
  e2e::ModelRun none(model_dir(), "kv_bf16_paged", 2, 16, {"tp.dcp_size=2"});
  ASSERT_FALSE(none.runtime.ok());
  EXPECT_NE(none.runtime.status().message().find("tp.dcp_size 2: at tp.size 2 each rank holds KV "
                                                 "heads of its own"),
            std::string::npos)
      << none.runtime.status().message();
  e2e::ModelRun uneven(model_dir(), "kv_bf16_paged", 8, 16, {"tp.dcp_size=4"});
  ASSERT_FALSE(uneven.runtime.ok());
  EXPECT_NE(uneven.runtime.status().message().find("tp.dcp_size 4 must divide the ranks that hold "
                                                   "the same KV: each KV head: 2 copies"),
            std::string::npos)
      << uneven.runtime.status().message();
}

// fp8 changes the numbers, so it gets a tolerance instead of exact ids. Where it comes from:
// E4M3 keeps 3 mantissa bits, so each stored K or V element is within 2^-4 of its value
// (relative; per-token-head scales keep every element in the normal range of its row). An
// attention output is a convex combination of V rows, so it moves by about the same relative
// amount, plus what the perturbed scores move the weights; the rest of the network (RMSNorm,
// the MLP, the LM head) is not expanding at these scales. So the first-step logits, as a
// vector, should stay within 2^-4 of bf16's in relative L2 norm; bf16 itself is within 2^-8.
TEST(Stories260kFp8, FirstLogitsWithinTheFormatsToleranceAndIdsLogged) {
  if (!std::filesystem::exists(model_dir() + "/model.safetensors")) {
    GTEST_SKIP() << "stories260k not found at " << model_dir();
  }
  ModelRun bf16("kv_bf16_paged", 1, 16);
  ModelRun fp8("kv_fp8_e4m3", 1, 16);
  ASSERT_TRUE(bf16.runtime.ok()) << bf16.runtime.status().message();
  ASSERT_TRUE(fp8.runtime.ok()) << fp8.runtime.status().message();
  Result<Generation> a = greedy(bf16, 60), b = greedy(fp8, 60);
  ASSERT_TRUE(a.ok() && b.ok());
  const double relative = e2e::relative_l2(a->first_logits, b->first_logits);
  int same = 0;
  for (size_t i = 0; i < a->ids.size() && i < b->ids.size(); ++i) same += a->ids[i] == b->ids[i];
  RecordProperty("fp8_ids_matching_bf16_of_60", same);
  std::printf(
      "kv_fp8_e4m3: %d of the first 60 greedy ids match kv_bf16_paged's; first-step "
      "logits differ by %.5f (relative L2)\n",
      same, relative);
  EXPECT_LE(relative, std::ldexp(1.0, -4));
}

// A budget too small is refused from config.json alone, before any weights are read: here the
// directory has no weights at all, and the error is still the capacity shortfall.
TEST(Stories260kCapacity, RefusedBeforeTheWeightsAreRead) {
  if (!std::filesystem::exists(model_dir() + "/config.json")) {
    GTEST_SKIP() << model_dir() << " not found";
  }
  const std::filesystem::path dir =
      std::filesystem::temp_directory_path() / ("kvrt_config_only_" + std::to_string(getpid()));
  std::filesystem::create_directories(dir);
  std::filesystem::copy_file(model_dir() + "/config.json", dir / "config.json",
                             std::filesystem::copy_options::overwrite_existing);
  setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
  Result<config::Config> cfg = config::load_string(
      "", "<test>", {"model.path=\"" + dir.string() + "\"", "device.memory=\"512KiB\""});
  ASSERT_TRUE(cfg.ok()) << cfg.status().message();
  plugin::Registry registry;
  Result<runtime::Runtime> rt = runtime::build_runtime(*cfg, registry);
  std::filesystem::remove_all(dir);
  ASSERT_FALSE(rt.ok());
  EXPECT_NE(rt.status().message().find("short by"), std::string::npos) << rt.status().message();
}

}  // namespace
}  // namespace kvrt::exec
