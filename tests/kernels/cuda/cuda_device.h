// What the CUDA tests share: whether they can run ("" when a CUDA device is there, else why
// not; the tests skip with the reason), and their assertion on CUDA calls.
#pragma once

#include <cuda_runtime.h>

#include <string>

namespace kvrt::cuda {

inline std::string no_cuda_device() {
  int count = 0;
  const cudaError_t e = cudaGetDeviceCount(&count);
  if (e != cudaSuccess) return std::string("no CUDA device: ") + cudaGetErrorString(e);
  return count == 0 ? "no CUDA device" : "";
}

}  // namespace kvrt::cuda

// In a gtest body: skips the test, saying why, when there is no CUDA device.
#define REQUIRE_GPU()                                                        \
  if (const std::string why = ::kvrt::cuda::no_cuda_device(); !why.empty()) { \
    GTEST_SKIP() << why << " (this test runs on a GPU)";                     \
  }

// In a gtest body: a CUDA call that must succeed, the error named when it does not.
#define CUDA_OK(expr) ASSERT_EQ((expr), cudaSuccess) << cudaGetErrorString(cudaGetLastError())
