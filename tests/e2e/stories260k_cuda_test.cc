// stories260k on a CUDA device (device.kind = "cuda", attn_cuda, the stores' device pools):
// greedy ids equal to the CPU path's with the same store, and the reference ids with the
// exact-enough stores; TP 2 over NCCL where two devices are present. Without a GPU the device
// tests skip, saying why; the refusal of a CUDA configuration runs everywhere.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>
#include <tuple>
#include <vector>

#include "core/eval/eval.h"
#include "tests/e2e/model_run.h"
#include "tests/e2e/stories260k_reference.h"
#include "tests/kernels/cuda/cuda_device.h"

namespace kvrt::exec {
namespace {

using stories260k::kExpected;
using stories260k::kPrompt;
using stories260k::model_dir;

const std::vector<std::string> kOnCuda = {"device.kind=\"cuda\"", "attention.backend=\"attn_cuda\"",
                                          "device.memory=\"1GiB\""};

std::vector<int32_t> greedy_ids(const std::string& store, int tp, int page_size, bool cuda) {
  Result<eval::StoreVariant> variant = eval::parse_store_variant(store);  // kvrt eval's syntax
  EXPECT_TRUE(variant.ok()) << variant.status().message();
  if (!variant.ok()) return {};
  std::vector<std::string> sets = variant->overrides;
  if (cuda) sets.insert(sets.end(), kOnCuda.begin(), kOnCuda.end());
  e2e::ModelRun run(model_dir(), variant->store, tp, page_size, sets);
  EXPECT_TRUE(run.runtime.ok()) << run.runtime.status().message();
  if (!run.runtime.ok()) return {};
  Result<Generation> out = e2e::greedy(run, kPrompt, static_cast<int>(kExpected.size()));
  EXPECT_TRUE(out.ok()) << out.status().message();
  return out.ok() ? out->ids : std::vector<int32_t>{};
}

class Stories260kCuda : public ::testing::TestWithParam<std::tuple<std::string, int>> {
 protected:
  void SetUp() override {
    REQUIRE_GPU();
    if (!std::filesystem::exists(model_dir() + "/model.safetensors")) {
      GTEST_SKIP() << "stories260k not found at " << model_dir();
    }
  }
};

TEST_P(Stories260kCuda, GreedyIdsEqualTheCpuPath) {
  const auto& [store, page_size] = GetParam();
  const std::vector<int32_t> cpu = greedy_ids(store, 1, page_size, false);
  const std::vector<int32_t> gpu = greedy_ids(store, 1, page_size, true);
  EXPECT_EQ(gpu, cpu) << store << ", page size " << page_size;
  // The stores that keep K/V to bf16 or better give the reference continuation itself.
  if (store.rfind("kv_fp8_e4m3", 0) != 0) {
    EXPECT_EQ(gpu, kExpected);
  }
}

INSTANTIATE_TEST_SUITE_P(
    StoresPages, Stories260kCuda,
    ::testing::Combine(::testing::Values("kv_bf16_paged", "kv_f32_paged", "kv_fp8_e4m3",
                                         "kv_fp8_e4m3:scale_mode=per_tensor", "kv_host_tiered"),
                       ::testing::Values(1, 16)),
    [](const auto& info) {
      std::string name = std::get<0>(info.param);
      for (char& c : name) {
        if (c == ':' || c == '=') c = '_';
      }
      return name + "_page" + std::to_string(std::get<1>(info.param));
    });

// TP 2 over NCCL, one device per rank: the TP-1 ids.
TEST(Stories260kCudaTp, TwoDevicesGiveTheTp1Ids) {
  REQUIRE_GPU();
  int devices = 0;
  CUDA_OK(cudaGetDeviceCount(&devices));
  if (devices < 2) GTEST_SKIP() << "TP 2 needs two CUDA devices, found " << devices;
  if (!std::filesystem::exists(model_dir() + "/model.safetensors")) {
    GTEST_SKIP() << "stories260k not found at " << model_dir();
  }
  EXPECT_EQ(greedy_ids("kv_bf16_paged", 2, 16, true), kExpected);
}

// Without a usable GPU a CUDA configuration is refused at start-up with the reason, never run
// on the CPU instead. (With one, it starts: the tests above.)
TEST(Stories260kCudaRefusal, NoDeviceIsRefusedByName) {
  if (::kvrt::cuda::no_cuda_device().empty()) GTEST_SKIP() << "a CUDA device is present";
  if (!std::filesystem::exists(model_dir() + "/model.safetensors")) {
    GTEST_SKIP() << "stories260k not found at " << model_dir();
  }
  e2e::ModelRun run(model_dir(), "kv_bf16_paged", 1, 16, kOnCuda);
  ASSERT_FALSE(run.runtime.ok());
  EXPECT_NE(run.runtime.status().message().find("device.kind = \"cuda\": no CUDA device"),
            std::string::npos)
      << run.runtime.status().message();
}

}  // namespace
}  // namespace kvrt::exec
