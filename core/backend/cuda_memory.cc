#include "core/backend/cuda_memory.h"

#include <cuda_runtime.h>

namespace kvrt::backend {
namespace {

std::string describe(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + " (" + cudaGetErrorString(e) + ")";
}

}  // namespace

Status CudaMemory::allocate(kvrt_memory_kind kind, uint64_t bytes, void** out) {
  const uint64_t size = bytes == 0 ? 1 : bytes;  // a distinct address even for nothing
  const cudaError_t e = kind == KVRT_MEMORY_PINNED_HOST
                            ? cudaHostAlloc(out, size, cudaHostAllocPortable)
                            : cudaMalloc(out, size);
  if (e != cudaSuccess) {
    (void)cudaGetLastError();  // an allocation failure is not sticky; clear it
    int device = -1;
    (void)cudaGetDevice(&device);
    return Status::NoMemory(
        std::string(kind == KVRT_MEMORY_PINNED_HOST ? "cudaHostAlloc" : "cudaMalloc") + " of " +
        std::to_string(bytes) + " bytes on CUDA device " + std::to_string(device) +
        " failed: " + describe(e));
  }
  return Status::Ok();
}

void CudaMemory::release(kvrt_memory_kind kind, void* ptr) {
  if (kind == KVRT_MEMORY_PINNED_HOST) {
    (void)cudaFreeHost(ptr);
  } else {
    (void)cudaFree(ptr);
  }
}

Status CudaMemory::copy(void* dst, const void* src, uint64_t bytes, void* stream) {
  // Without a stream the copy must be complete when this returns: cudaMemcpy from pageable
  // memory may return before its DMA lands, and the compute streams (non-blocking) would not
  // wait for the legacy stream it ran on. So: queue it there and wait for it.
  cudaError_t e;
  if (stream == nullptr) {
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, cudaStreamLegacy);
    if (e == cudaSuccess) e = cudaStreamSynchronize(cudaStreamLegacy);
  } else {
    e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream));
  }
  if (e != cudaSuccess) {
    return Status::Internal("cudaMemcpy" + std::string(stream == nullptr ? "" : "Async") + " of " +
                            std::to_string(bytes) + " bytes failed: " + describe(e));
  }
  return Status::Ok();
}

Result<CudaDeviceInfo> cuda_device_info(int ordinal) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
    (void)cudaGetLastError();
    return Status::Unsupported("device.kind = \"cuda\": no CUDA device can be used: " +
                               describe(e));
  }
  if (count == 0)
    return Status::Unsupported("device.kind = \"cuda\": no CUDA device on this machine");
  if (ordinal < 0 || ordinal >= count) {
    return Status::Unsupported("device.ordinal = " + std::to_string(ordinal) +
                               ": this machine has " + std::to_string(count) + " CUDA device(s)");
  }
  CudaDeviceInfo info;
  cudaDeviceProp prop{};
  size_t free_bytes = 0, total_bytes = 0;
  cudaError_t e = cudaSetDevice(ordinal);
  if (e == cudaSuccess) e = cudaGetDeviceProperties(&prop, ordinal);
  if (e == cudaSuccess) e = cudaMemGetInfo(&free_bytes, &total_bytes);
  if (e != cudaSuccess) {
    return Status::Unsupported("CUDA device " + std::to_string(ordinal) + ": " + describe(e));
  }
  info.name = prop.name;
  info.free_bytes = free_bytes;
  info.total_bytes = total_bytes;
  return info;
}

Result<int> cuda_device_for_rank(int first, int rank) {
  int count = 0;
  if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess || count == 0) {
    (void)cudaGetLastError();
    return Status::Unsupported("TP rank " + std::to_string(rank) + ": no CUDA device" +
                               (e != cudaSuccess ? ": " + describe(e) : std::string()));
  }
  return (first + rank) % count;
}

}  // namespace kvrt::backend
