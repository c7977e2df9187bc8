// What the shipped paged stores do differently when their pool is on a CUDA device: the pages
// are device memory (the host's accounted alloc gives it), new rows are stored by the kernels of
// kernels/cuda/kv_write.h on the write's stream, and gather() and the per-tensor scales go
// through the host's copy. The stores are built with this only where the CUDA toolkit is
// (KVRT_PLUGIN_CUDA); elsewhere a CUDA geometry is refused by name.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "kvrt/plugin.hpp"

#ifdef KVRT_PLUGIN_CUDA
#include "kernels/cuda/kv_write.h"
#endif

namespace kvrt::plugins::device {

inline bool on_cuda(const kvrt_kv_geometry& g) { return g.device.kind == KVRT_DEVICE_CUDA; }

// Refuses a device this build cannot serve.
inline void check_served(const kvrt_kv_geometry& g) {
  if (g.device.kind == KVRT_DEVICE_CPU) return;
#ifdef KVRT_PLUGIN_CUDA
  if (on_cuda(g)) return;
#else
  if (on_cuda(g)) {
    sdk::fail(KVRT_ERR_UNSUPPORTED,
              "this build has no CUDA support (built without the CUDA toolkit: KVRT_CUDA off)");
  }
#endif
  sdk::fail(KVRT_ERR_UNSUPPORTED, "device kind " + std::to_string(g.device.kind) + " not served");
}

// The format a device write stores.
enum class Format { kF32, kBf16, kE4M3 };

// One part (K or V) of one layer's pages as the kernels write it: the layout's pointers and
// strides; `scales` per token and head (E4M3 dynamic), or nullptr with `tensor_scale`.
struct Part {
  void* base = nullptr;
  int64_t page_stride = 0, token_stride = 0, head_stride = 0;
  float* scales = nullptr;
  int64_t scale_page_stride = 0, scale_token_stride = 0, scale_head_stride = 0;
  float tensor_scale = 1.0f;
};

// Stores `w`'s rows of one part (src, stride in elements, `dim` per head) in device pages.
// The rows must be f32 in device memory and the slots the host's device copy (ABI 1.2).
inline void write(const kvrt_kv_write& w, const kvrt_kv_geometry& g, Format format, const void* src,
                  int64_t stride, uint32_t dim, const Part& part) {
#ifdef KVRT_PLUGIN_CUDA
  if (w.dtype != KVRT_DTYPE_F32) {
    sdk::fail(KVRT_ERR_UNSUPPORTED, std::string("a store on a CUDA device takes f32 rows, not ") +
                                        sdk::dtype_name(w.dtype));
  }
  if (w.device_slots == nullptr) {
    sdk::fail(KVRT_ERR_INVALID_ARGUMENT,
              "a store on a CUDA device needs the write's device_slots (ABI 1.2 host)");
  }
  const int32_t heads = static_cast<int32_t>(g.num_kv_heads);
  if (stride == 0) stride = int64_t{heads} * dim;
  cuda::KvWriteTarget t;
  t.base = part.base;
  t.page_stride = part.page_stride;
  t.token_stride = part.token_stride;
  t.head_stride = part.head_stride;
  t.scales = part.scales;
  t.scale_page_stride = part.scale_page_stride;
  t.scale_token_stride = part.scale_token_stride;
  t.scale_head_stride = part.scale_head_stride;
  t.tensor_scale = part.tensor_scale;
  auto* write_rows = format == Format::kF32    ? cuda::write_f32
                     : format == Format::kBf16 ? cuda::write_bf16
                                               : cuda::write_e4m3;
  const cudaError_t e =
      write_rows(static_cast<const float*>(src), stride, static_cast<int32_t>(w.num_tokens), heads,
                 static_cast<int32_t>(dim), w.device_slots, static_cast<int32_t>(g.page_size), t,
                 static_cast<cudaStream_t>(w.stream));
  if (e != cudaSuccess) {
    sdk::fail(KVRT_ERR_INTERNAL, std::string("device KV write: ") + cudaGetErrorString(e));
  }
#else
  (void)w, (void)g, (void)format, (void)src, (void)stride, (void)dim, (void)part;
  sdk::fail(KVRT_ERR_UNSUPPORTED, "this build has no CUDA support");
#endif
}

// The rows of `n` slots, `row_bytes` each at base + slot * row_bytes in device memory, copied
// to the host one after another (gather()'s slow path: one copy per slot).
inline std::vector<uint8_t> rows_to_host(const kvrt_host_api* host, const uint8_t* base,
                                         uint64_t row_bytes, uint32_t n, const int64_t* slots) {
  std::vector<uint8_t> rows(uint64_t{n} * row_bytes);
  for (uint32_t i = 0; i < n; ++i) {
    if (kvrt_status s = host->copy(host, rows.data() + i * row_bytes, KVRT_MEMORY_HOST,
                                   base + slots[i] * row_bytes, KVRT_MEMORY_DEVICE, row_bytes);
        s != KVRT_OK) {
      sdk::fail(s, "copying KV rows from the device");
    }
  }
  return rows;
}

// Host bytes into device memory (the per-tensor scales a store publishes).
inline void to_device(const kvrt_host_api* host, void* dst, const void* src, uint64_t bytes) {
  if (kvrt_status s = host->copy(host, dst, KVRT_MEMORY_DEVICE, src, KVRT_MEMORY_HOST, bytes);
      s != KVRT_OK) {
    sdk::fail(s, "copying to the device");
  }
}

// A stream of the store's own for copies between the device and pinned host memory, so they
// overlap the compute stream's work; nullptr (every copy synchronous) on the CPU.
class CopyStream {
 public:
  CopyStream() = default;
  explicit CopyStream(const kvrt_kv_geometry& g) {
#ifdef KVRT_PLUGIN_CUDA
    if (!on_cuda(g)) return;
    cudaStream_t s = nullptr;
    if (cudaError_t e = cudaSetDevice(g.device.ordinal); e != cudaSuccess) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, std::string("CUDA device ") +
                                          std::to_string(g.device.ordinal) + ": " +
                                          cudaGetErrorString(e));
    }
    if (cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking); e != cudaSuccess) {
      sdk::fail(KVRT_ERR_INTERNAL, std::string("creating a copy stream: ") + cudaGetErrorString(e));
    }
    stream_ = s;
    ordinal_ = g.device.ordinal;
#else
    (void)g;
#endif
  }
  CopyStream(const CopyStream&) = delete;
  CopyStream& operator=(const CopyStream&) = delete;
  ~CopyStream() {
#ifdef KVRT_PLUGIN_CUDA
    if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
#endif
  }
  void* get() const { return stream_; }
  int32_t device_ordinal() const { return ordinal_; }
  // Makes the stream's device current on the calling thread (a copy thread of the store's own
  // starts on device 0, and a stream is usable only on its device's thread context).
  void bind_thread() const {
#ifdef KVRT_PLUGIN_CUDA
    if (stream_ != nullptr) (void)cudaSetDevice(ordinal_);
#endif
  }
  // Waits for every copy queued on the stream; false when one failed.
  bool wait() const {
#ifdef KVRT_PLUGIN_CUDA
    if (stream_ != nullptr) {
      return cudaStreamSynchronize(static_cast<cudaStream_t>(stream_)) == cudaSuccess;
    }
#endif
    return true;
  }

 private:
  void* stream_ = nullptr;
  int32_t ordinal_ = 0;
};

}  // namespace kvrt::plugins::device
