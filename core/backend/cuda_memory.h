// The CUDA side of the plugins' host services (plugin::DeviceMemory): device memory from
// cudaMalloc on the calling thread's current device (the rank's: its backend made it current),
// pinned host memory from cudaHostAlloc, copies with cudaMemcpy(Async) in either direction
// (unified addressing tells the runtime where each pointer lives). And what the capacity plan
// asks of a device before anything is allocated: cudaMemGetInfo.
#pragma once

#include <cstdint>
#include <string>

#include "core/plugin/host.h"
#include "core/util/status.h"

namespace kvrt::backend {

class CudaMemory : public plugin::DeviceMemory {
 public:
  Status allocate(kvrt_memory_kind kind, uint64_t bytes, void** out) override;
  void release(kvrt_memory_kind kind, void* ptr) override;
  Status copy(void* dst, const void* src, uint64_t bytes, void* stream) override;
};

// A device's memory as the runtime sees it now (DESIGN.md's capacity rule reads `free`).
struct CudaDeviceInfo {
  std::string name;
  uint64_t free_bytes = 0, total_bytes = 0;
};
// Makes `ordinal` the calling thread's device and reads its memory; an error naming the device
// when there is none (no GPU, no driver, an ordinal past the last device).
Result<CudaDeviceInfo> cuda_device_info(int ordinal);

// The device TP rank `rank` runs on: `first` + rank, round-robin over this machine's devices
// (one process per rank under mpirun shares a host's devices that way).
Result<int> cuda_device_for_rank(int first, int rank);

}  // namespace kvrt::backend
