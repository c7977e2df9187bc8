// The CUDA backend: buffers and matrices in one GPU's memory, products through cuBLAS, the other
// ops through kernels/cuda/ops.h, all on one non-blocking stream. Results match the CPU
// backend's (cpu_backend.h) to within rounding: bit for bit where the CPU rounds in a fixed
// order, and products in f32 (with bf16 weights, the activations stay f32 as on the CPU).
//
// Device memory comes from the device's default stream-ordered pool (cudaMallocAsync) and goes
// back in stream order, so a buffer freed while queued ops still read it stays theirs until they
// are done (not shareable by CUDA IPC; peer access needs cudaMemPoolSetAccess).
//
// Everything is stream-ordered: ops return once queued, and only download() waits. Host arrays
// (ids, positions, rows, weights) are copied into a staging area the backend owns before the
// call returns, so the caller may reuse them at once. Failures of the CUDA runtime or cuBLAS
// after create() throw: std::bad_alloc when device memory runs out, else std::runtime_error
// naming the device and the op. Like every backend, one serves one rank and is used by that
// rank's thread; begin_step() makes its device current on the calling thread (create() does
// so on the creating one).
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <cstdint>
#include <memory>
#include <span>
#include <tuple>
#include <vector>

#include "core/backend/backend.h"
#include "core/util/status.h"

namespace kvrt::backend {

struct CudaMemoryLedger;  // the bytes a backend holds (cuda_backend.cc)

class CudaBackend : public Backend {
 public:
  // A backend on CUDA device `ordinal`, with its stream and cuBLAS handle. With bf16_weights
  // matrices are held in bf16 (rounded to nearest even, as the CPU's), halving their bytes.
  // Fails, naming the device, when there is no such device (or no usable CUDA at all) or when
  // the stream, cuBLAS or its workspace cannot be set up.
  static Result<std::unique_ptr<CudaBackend>> create(int ordinal, bool bf16_weights);
  // Waits for the stream's work, then frees the backend's own memory. Buffers and matrices it
  // made may outlive it: they are freed (and uncounted) when they go.
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  kvrt_device device() const override {
    return {sizeof(kvrt_device), KVRT_DEVICE_CUDA, ordinal_, 0};
  }
  // The cudaStream_t every op is queued on.
  comm::Stream stream() const override { return stream_; }
  void begin_step() override;
  void end_step() override;
  void bind_device() override { begin_step(); }

  // Device memory this backend holds now, in bytes: its buffers and matrices that are still
  // alive, its staging and scratch areas and cuBLAS's workspace (not the CUDA context, nor
  // what cuBLAS allocates for its handle). Any thread may read it.
  uint64_t device_bytes() const;

  Buffer allocate(size_t n) override;
  Buffer upload(std::span<const float> host) override;
  std::unique_ptr<Matrix> upload_matrix(std::vector<float> data, int64_t rows,
                                        int64_t cols) override;
  // Waits for the stream, so `host` holds every op's result queued before.
  void download(const float* device, size_t n, float* host) override;
  // An area of its own, so that the ops' staging in between does not overwrite the slots before
  // the layers' KV writes (queued later on the stream) read them.
  const int64_t* stage_slots(std::span<const int64_t> host) override;

  void fill_zero(float* x, size_t n) override;
  void embed(const Buffer& table, int64_t first_row, std::span<const int32_t> ids, int64_t width,
             float* out) override;
  void gather_rows(const float* src, std::span<const int64_t> rows, int64_t width,
                   float* out) override;
  void matmul(const float* x, int64_t m, const Matrix& w, float* y) override;
  void matmul_strided(const float* x, int64_t m, int64_t x_stride, const Matrix& w, float* y,
                      int64_t y_stride) override;
  void copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride, int64_t rows,
                 int64_t width) override;
  // Deterministic for repeated rows: each destination row adds its sources in order, no atomics.
  void scatter_add_rows(const float* src, std::span<const int64_t> rows,
                        std::span<const float> weights, int64_t width, float* dst) override;
  void add_bias(float* x, int64_t rows, int64_t row_stride, const Buffer& bias) override;
  void add(float* x, const float* y, size_t n) override;
  void rms_norm(const float* x, const Buffer& weight, float* out, int64_t rows, int64_t dim,
                float eps) override;
  void rms_norm_strided(const float* x, int64_t x_stride, const Buffer& weight, float* out,
                        int64_t out_stride, int64_t rows, int64_t dim, float eps) override;
  // out must not overlap x.
  void silu_mul(const float* x, int64_t rows, int64_t n, float* out) override;
  void rope_tables(std::span<const int32_t> positions, int64_t head_dim, float theta, float* cos,
                   float* sin) override;
  void apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride,
                  const float* cos, const float* sin) override;
  void rope_tables_from(std::span<const int32_t> positions, std::span<const float> inv_freq,
                        float scale, float* cos, float* sin) override;
  // head_dim <= 8192.
  void apply_rope_interleaved(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                              int64_t row_stride, const float* cos, const float* sin) override;

 private:
  // A device area that grows on demand and is reused; the old one is freed in stream order.
  struct Scratch {
    void* data = nullptr;
    size_t bytes = 0;
  };

  CudaBackend(int ordinal, bool bf16_weights);
  void* allocate_bytes(size_t bytes);
  void* reserve(Scratch* scratch, size_t bytes);
  void check(cudaError_t e, const char* op) const;
  void check(cublasStatus_t s, const char* op) const;
  // Copies the host arrays into the staging area in one transfer; their device addresses.
  template <class... T>
  std::tuple<const T*...> stage(std::span<const T>... host);
  void gemm_f32(const float* x, int64_t m, int64_t x_stride, const Matrix& w, float* y,
                int64_t y_stride);
  void gemm_bf16(const float* x, int64_t m, int64_t x_stride, const Matrix& w, float* y,
                 int64_t y_stride);

  int ordinal_;
  bool bf16_weights_;
  std::shared_ptr<CudaMemoryLedger> ledger_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  Scratch cublas_workspace_, staging_, slots_, split_, products_;
  std::vector<std::byte> staging_host_;
  std::vector<int64_t> scatter_order_, scatter_begin_, scatter_row_;  // kernels/cuda's groups
  std::vector<float> inv_freq_;  // plain RoPE's frequencies, computed as the CPU's
};

}  // namespace kvrt::backend
