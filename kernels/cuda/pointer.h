// Where a pointer lives, as the CUDA runtime sees it: what attn_cuda checks a layout's pages
// against and what routes the NCCL communicator's buffers (device memory through NCCL, the rest
// through its inner group).
#pragma once

#include <cuda_runtime.h>

namespace kvrt::cuda {

// True for device and managed memory; false for host memory (pinned or not) and null.
inline bool is_device_memory(const void* p) {
  if (p == nullptr) return false;
  cudaPointerAttributes attributes{};
  if (cudaPointerGetAttributes(&attributes, p) != cudaSuccess) {
    (void)cudaGetLastError();  // older runtimes fail on plain host memory; not a sticky error
    return false;
  }
  return attributes.type == cudaMemoryTypeDevice || attributes.type == cudaMemoryTypeManaged;
}

}  // namespace kvrt::cuda
