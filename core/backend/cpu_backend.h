// The CPU backend: buffers in host memory, products of bf16 weights through the packed kernel
// (kernels/cpu/gemm.h) and of f32 weights through the BLAS, elementwise ops through kernels/cpu
// (Highway, run-time dispatch), and each rank's share of the cores through OpenMP.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/backend/backend.h"
#include "kernels/cpu/quant_gemm.h"

namespace kvrt::backend {

// model.quantization on the CPU: projections quantized at load and kept packed
// (kernels/cpu/quant_gemm.h), and what their products multiply them by.
struct CpuQuantization {
  enum class Format { kNone, kInt4, kFp8 };
  Format format = Format::kNone;
  kernels::Activations activations = kernels::Activations::kF32;
  size_t group = 32;  // int4: inputs per scale
  // fp8: one scale per output row and 128 inputs, so a TP shard's rows quantize as TP 1's.
  kernels::Fp8Format fp8{1, 128};

  // The bytes a weight quantized at load takes packed, codes and scales (int4: a bf16 scale a
  // group; fp8: an f32 one a block row): exact when a projection's inputs are whole groups.
  double bytes_per_weight() const;
  // What model.matmul_precision ("auto", "medium", "highest") gives the products of weights held
  // packed as `held`: int8 for int4 under "medium", and under "auto" where the CPU multiplies
  // them as integers; bf16 for fp8 under "medium", and under "auto" where the CPU has the AVX-512
  // BF16 dot product (as for bf16 weights); f32 otherwise.
  static kernels::Activations activations_for(Format held, const std::string& precision);
};

class CpuBackend : public Backend {
 public:
  // With bf16_weights matrices are held in bf16 (rounded to nearest even), halving the bytes a
  // decode step streams; `threads` is how many threads this rank's ops may use. With
  // bf16_activations their products round x to bf16 first (kernels::matmul_packed_bf16's bf16_x:
  // the bf16 dot product where the CPU has it).
  // With `quantization`, upload_projection quantizes (the others are held as above).
  CpuBackend(bool bf16_weights, int threads, bool bf16_activations = false,
             CpuQuantization quantization = {});

  kvrt_device device() const override { return {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0}; }
  comm::Stream stream() const override { return nullptr; }
  void begin_step() override;

  Buffer allocate(size_t n) override;
  Buffer upload(std::span<const float> host) override;
  std::unique_ptr<Matrix> upload_matrix(std::vector<float> data, int64_t rows,
                                        int64_t cols) override;
  std::unique_ptr<Matrix> upload_projection(std::vector<float> data, int64_t rows,
                                            int64_t cols) override;
  // Packed as stored (quant_gemm.h): int4 with groups a multiple of 8, fp8 with groups a
  // multiple of 4; others by their values.
  std::unique_ptr<Matrix> upload_quantized(const QuantizedMatrix& m) override;
  void download(const float* device, size_t n, float* host) override;

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
  void scatter_add_rows(const float* src, std::span<const int64_t> rows,
                        std::span<const float> weights, int64_t width, float* dst) override;
  void add_bias(float* x, int64_t rows, int64_t row_stride, const Buffer& bias) override;
  void add(float* x, const float* y, size_t n) override;
  void rms_norm(const float* x, const Buffer& weight, float* out, int64_t rows, int64_t dim,
                float eps) override;
  void rms_norm_strided(const float* x, int64_t x_stride, const Buffer& weight, float* out,
                        int64_t out_stride, int64_t rows, int64_t dim, float eps) override;
  void silu_mul(const float* x, int64_t rows, int64_t n, float* out) override;
  void rope_tables(std::span<const int32_t> positions, int64_t head_dim, float theta, float* cos,
                   float* sin) override;
  void apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim, int64_t row_stride,
                  const float* cos, const float* sin) override;
  void rope_tables_from(std::span<const int32_t> positions, std::span<const float> inv_freq,
                        float scale, float* cos, float* sin) override;
  void apply_rope_interleaved(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                              int64_t row_stride, const float* cos, const float* sin) override;

 private:
  bool bf16_weights_;
  int threads_;
  bool bf16_activations_;
  CpuQuantization quantization_;
  std::vector<float> rope_pair_;  // one head's values while interleaved RoPE rotates it
};

}  // namespace kvrt::backend
