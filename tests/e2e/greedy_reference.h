// What the tests of checkpoints against scripts/reference_forward.py's float64 forward pass
// share: a prompt's reference greedy ids with each step's top-1 margin, and the check of kvrt's
// ids against them up to the reference's first near-tie -- through engines over weights loaded
// once per test binary (the matrix of stores, TP and page sizes), and through the runtime
// (build_runtime, which also loads the directory's tokenizer.json: once, as a big one takes
// seconds).
#pragma once

#include <gtest/gtest.h>
#include <stdlib.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include "core/exec/engine.h"
#include "core/exec/generate.h"
#include "core/model/architecture.h"
#include "core/model/model_config.h"
#include "core/plugin/registry.h"
#include "tests/e2e/model_run.h"

namespace kvrt::e2e {

struct GreedyReference {
  std::vector<int32_t> prompt;
  std::vector<int32_t> ids;     // the reference's greedy continuation
  std::vector<double> margins;  // per step: top-1 minus top-2 logit
};

// Under this margin kvrt's f32 (and bf16 KV) arithmetic may pick the runner-up; the ids from
// such a step on are not compared.
constexpr double kNearTie = 0.01;

// How many leading steps are compared: those before the first near-tie.
inline size_t compared_steps(const GreedyReference& r) {
  size_t n = 0;
  while (n < r.ids.size() && r.margins[n] >= kNearTie) ++n;
  return n;
}

// The smallest margin among the compared steps of all of `refs`.
inline double smallest_compared_margin(const std::vector<GreedyReference>& refs) {
  double least = 1e9;
  for (const GreedyReference& r : refs) {
    for (size_t i = 0; i < compared_steps(r); ++i) least = std::min(least, r.margins[i]);
  }
  return least;
}

// kvrt's greedy ids after each reference prompt, prefilled in chunks of 3 (so prefill also
// runs over earlier pages), equal the reference's compared steps.
inline void expect_reference_ids(exec::Engine& engine, const std::vector<GreedyReference>& refs) {
  for (const GreedyReference& r : refs) {
    SCOPED_TRACE("prompt of " + std::to_string(r.prompt.size()) + " ids");
    const size_t n = compared_steps(r);
    ASSERT_GT(n, 0u);
    exec::GenerateOptions options;
    options.max_new_tokens = static_cast<int32_t>(n);
    options.prefill_chunk = 3;
    Result<exec::Generation> out = exec::generate(engine, r.prompt, options);
    ASSERT_TRUE(out.ok()) << out.status().message();
    EXPECT_EQ(out->ids, std::vector<int32_t>(r.ids.begin(), r.ids.begin() + n));
  }
}

// The KV stores, TP sizes and page sizes a checkpoint is checked at, and the tests' names.
using StoreTpPage = std::tuple<std::string, int, int>;
inline auto stores_tp_pages() {
  return ::testing::Combine(::testing::Values("kv_bf16_paged", "kv_f32_paged"),
                            ::testing::Values(1, 2), ::testing::Values(1, 16));
}
inline std::string store_tp_page_name(const ::testing::TestParamInfo<StoreTpPage>& info) {
  return std::get<0>(info.param) + "_tp" + std::to_string(std::get<1>(info.param)) + "_page" +
         std::to_string(std::get<2>(info.param));
}

// A checkpoint directory's weights, loaded by its architecture family once for the test
// binary, and engines over them with real plugins; fails the test (null) on an error.
class CheckpointEngines {
 public:
  explicit CheckpointEngines(const std::string& dir) {
    setenv("KVRT_PLUGIN_PATH", KVRT_PLUGIN_DIR, 1);
    Result<model::ModelConfig> config = model::parse_hf_config(dir + "/config.json");
    EXPECT_TRUE(config.ok()) << config.status().message();
    if (!config.ok()) return;
    bf16_weights_ = config->torch_dtype == "bfloat16";  // as the runtime's dtype "auto"
    Result<const model::ArchitectureFamily*> family = model::find_architecture(*config);
    EXPECT_TRUE(family.ok()) << family.status().message();
    if (!family.ok()) return;
    Result<std::unique_ptr<model::LoadedWeights>> weights = (*family)->load(dir, 0, 1);
    EXPECT_TRUE(weights.ok()) << weights.status().message();
    if (weights.ok()) weights_ = std::move(*weights);
  }

  // An engine at `at` whose pool holds `tokens` tokens.
  std::unique_ptr<exec::Engine> engine(const StoreTpPage& at, int64_t tokens) {
    const auto& [store, tp, page_size] = at;
    if (weights_ == nullptr) return nullptr;
    exec::EngineOptions o;
    o.tp = tp;
    o.page_size = static_cast<uint32_t>(page_size);
    o.num_pages = static_cast<uint64_t>((tokens + page_size - 1) / page_size);
    o.bf16_weights = bf16_weights_;
    Result<const plugin::LoadedPlugin*> kv = registry_.load_kv_store(store);
    Result<const plugin::LoadedPlugin*> attention = registry_.load("attn_cpu");
    EXPECT_TRUE(kv.ok() && attention.ok());
    if (!kv.ok() || !attention.ok()) return nullptr;
    o.plugins.store = *kv;
    o.plugins.attention = *attention;
    Result<std::unique_ptr<exec::Engine>> e = exec::Engine::create(*weights_, o);
    EXPECT_TRUE(e.ok()) << e.status().message();
    return e.ok() ? std::move(*e) : nullptr;
  }

 private:
  plugin::Registry registry_;
  std::unique_ptr<model::LoadedWeights> weights_;
  bool bf16_weights_ = false;
};

// The longest reference sequence (prompt and compared steps), what a pool must hold.
// A suite over one checkpoint of ../shared/models (Checkpoint::kName) for every store, TP size
// and page size, its engines built once for the suite; each case skips when it is absent.
template <typename Checkpoint>
class CheckpointSuite : public ::testing::TestWithParam<StoreTpPage> {
 public:
  static std::string dir() { return shared_model_dir(Checkpoint::kName); }
  static bool present() { return std::filesystem::exists(dir() + "/model.safetensors"); }

 protected:
  static void SetUpTestSuite() {
    if (present()) engines_ = std::make_unique<CheckpointEngines>(dir());
  }
  static void TearDownTestSuite() { engines_.reset(); }
  void SetUp() override {
    if (!present()) GTEST_SKIP() << Checkpoint::kName << " not found at " << dir();
  }
  static inline std::unique_ptr<CheckpointEngines> engines_;
};

inline int64_t longest_sequence(const std::vector<GreedyReference>& refs) {
  size_t most = 0;
  for (const GreedyReference& r : refs) most = std::max(most, r.prompt.size() + compared_steps(r));
  return static_cast<int64_t>(most);
}

}  // namespace kvrt::e2e
