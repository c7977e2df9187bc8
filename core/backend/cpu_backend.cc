#include "core/backend/cpu_backend.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/gemm.h"
#include "kernels/cpu/ops.h"

namespace kvrt::backend {
namespace {

// A weight matrix held in f32, or in bf16 (half the bytes to stream per step) packed into the
// product's panels (kernels/cpu/gemm.h) once, here, instead of widened per step.
struct CpuMatrix : Matrix {
  std::vector<float> f32;
  bool bf16 = false;
  std::vector<uint16_t> packed;
  // A quantized projection (model.quantization): its packed codes and scales, in one format.
  CpuQuantization::Format quantized = CpuQuantization::Format::kNone;
  std::vector<uint8_t> qpacked;
  kernels::Int4Format int4;
  kernels::Fp8Format fp8;
};

void release(float* data, size_t) { std::free(data); }

}  // namespace

double CpuQuantization::bytes_per_weight() const {
  if (format == Format::kInt4) return 0.5 + 2.0 / static_cast<double>(group);
  if (format == Format::kFp8) return 1.0 + 4.0 / static_cast<double>(fp8.block_k);
  return 0;
}

kernels::Activations CpuQuantization::activations_for(Format held, const std::string& precision) {
  if (held == Format::kInt4 &&
      (precision == "medium" ||
       (precision == "auto" && std::string(kernels::int4_int8_kernel()) != "scalar"))) {
    return kernels::Activations::kInt8;
  }
  // fp8 as bf16 weights: where the CPU has the bf16 dot product, "auto" rounds x to bf16 and
  // the codes meet it there (1.5x the f32 kernel at 8 and 64 rows).
  if (held == Format::kFp8 &&
      (precision == "medium" ||
       (precision == "auto" && kernels::gemm_isa_supported(kernels::GemmIsa::kAvx512Bf16)))) {
    return kernels::Activations::kBf16;
  }
  return kernels::Activations::kF32;
}

CpuBackend::CpuBackend(bool bf16_weights, int threads, bool bf16_activations,
                       CpuQuantization quantization)
    : bf16_weights_(bf16_weights),
      threads_(std::max(1, threads)),
      bf16_activations_(bf16_activations),
      quantization_(quantization) {}

// This rank's share of the cores, for what runs on OpenMP in this thread (the products, and the
// attention plugin's work items).
void CpuBackend::begin_step() { omp_set_num_threads(threads_); }

Buffer CpuBackend::allocate(size_t n) {
  auto* data = static_cast<float*>(std::calloc(std::max<size_t>(n, 1), sizeof(float)));
  if (data == nullptr) throw std::bad_alloc();
  return Buffer(data, n, release);
}

Buffer CpuBackend::upload(std::span<const float> host) {
  Buffer b = allocate(host.size());
  if (!host.empty()) std::memcpy(b.data(), host.data(), host.size_bytes());
  return b;
}

std::unique_ptr<Matrix> CpuBackend::upload_matrix(std::vector<float> data, int64_t rows,
                                                  int64_t cols) {
  auto m = std::make_unique<CpuMatrix>();
  m->rows = rows;
  m->cols = cols;
  if (bf16_weights_) {
    m->bf16 = true;
    m->packed.resize(kernels::packed_bf16_size(rows, cols));
    kernels::pack_bf16_from_f32(data.data(), rows, cols, m->packed.data());
  } else {
    m->f32 = std::move(data);
  }
  return m;
}

void CpuBackend::download(const float* device, size_t n, float* host) {
  if (n > 0) std::memcpy(host, device, n * sizeof(float));
}

void CpuBackend::fill_zero(float* x, size_t n) { std::fill(x, x + n, 0.0f); }

void CpuBackend::embed(const Buffer& table, int64_t first_row, std::span<const int32_t> ids,
                       int64_t width, float* out) {
  const int64_t rows = static_cast<int64_t>(table.size()) / std::max<int64_t>(1, width);
  for (size_t t = 0; t < ids.size(); ++t) {
    float* row = out + static_cast<int64_t>(t) * width;
    const int64_t r = ids[t] - first_row;
    if (r >= 0 && r < rows) {
      std::memcpy(row, table.data() + r * width, width * sizeof(float));
    } else {
      std::fill(row, row + width, 0.0f);
    }
  }
}

void CpuBackend::gather_rows(const float* src, std::span<const int64_t> rows, int64_t width,
                             float* out) {
  for (size_t i = 0; i < rows.size(); ++i) {
    std::memcpy(out + static_cast<int64_t>(i) * width, src + rows[i] * width,
                width * sizeof(float));
  }
}

// bf16 weights: the packed product at every m. Against what this did before above 16 rows (the
// weights widened to f32 per step, then OpenBLAS's sgemm, one band per thread: gemm_bench's
// widened_sgemm), on the AVX2 class with 2 threads and weights from memory: 1.6-1.7x the
// GFLOP/s at m = 16, 1.2-1.3x at 64, 1.1-1.5x at 512, without an f32 copy of every matrix.
// f32 weights: the BLAS.
std::unique_ptr<Matrix> CpuBackend::upload_projection(std::vector<float> data, int64_t rows,
                                                      int64_t cols) {
  using Format = CpuQuantization::Format;
  if (quantization_.format == Format::kNone) return upload_matrix(std::move(data), rows, cols);
  auto m = std::make_unique<CpuMatrix>();
  m->rows = rows;
  m->cols = cols;
  m->quantized = quantization_.format;
  const size_t n = static_cast<size_t>(rows), k = static_cast<size_t>(cols);
  std::vector<uint8_t> codes(n * k);
  if (quantization_.format == Format::kInt4) {
    m->int4 = kernels::Int4Format{quantization_.group, /*bf16_scales=*/true, false};
    std::vector<float> scales(n * ((k + m->int4.group - 1) / m->int4.group));
    kernels::quantize_int4(data.data(), n, k, m->int4.group, codes.data(), scales.data());
    m->qpacked.resize(kernels::packed_int4_bytes(n, k, m->int4));
    kernels::pack_int4(codes.data(), scales.data(), nullptr, n, k, m->int4, m->qpacked.data());
  } else {
    m->fp8 = quantization_.fp8;
    const kernels::Fp8Format& f = m->fp8;
    std::vector<float> scales(((n + f.block_n - 1) / f.block_n) *
                              ((k + f.block_k - 1) / f.block_k));
    kernels::quantize_fp8(data.data(), n, k, f, codes.data(), scales.data());
    m->qpacked.resize(kernels::packed_fp8_bytes(n, k, f));
    kernels::pack_fp8(codes.data(), scales.data(), n, k, f, m->qpacked.data());
  }
  return m;
}

std::unique_ptr<Matrix> CpuBackend::upload_quantized(const QuantizedMatrix& q) {
  using Kind = QuantizedMatrix::Kind;
  const bool packable = (q.kind == Kind::kInt4 && q.group % 8 == 0) ||
                        (q.kind == Kind::kFp8 && q.group % 4 == 0);
  if (!packable || q.group <= 0) return Backend::upload_quantized(q);
  auto m = std::make_unique<CpuMatrix>();
  m->rows = q.rows;
  m->cols = q.cols;
  const size_t n = static_cast<size_t>(q.rows), k = static_cast<size_t>(q.cols);
  if (q.kind == Kind::kInt4) {
    m->quantized = CpuQuantization::Format::kInt4;
    m->int4 = kernels::Int4Format{static_cast<size_t>(q.group),
                                  kernels::scales_are_bf16(q.scales.data(), q.scales.size()),
                                  !q.zeros.empty()};
    m->qpacked.resize(kernels::packed_int4_bytes(n, k, m->int4));
    kernels::pack_int4(q.codes.data(), q.scales.data(), q.zeros.empty() ? nullptr : q.zeros.data(),
                       n, k, m->int4, m->qpacked.data());
  } else {
    m->quantized = CpuQuantization::Format::kFp8;
    m->fp8 = kernels::Fp8Format{1, static_cast<size_t>(q.group)};
    m->qpacked.resize(kernels::packed_fp8_bytes(n, k, m->fp8));
    kernels::pack_fp8(q.codes.data(), q.scales.data(), n, k, m->fp8, m->qpacked.data());
  }
  return m;
}

void CpuBackend::matmul(const float* x, int64_t m, const Matrix& matrix, float* y) {
  matmul_strided(x, m, matrix.cols, matrix, y, matrix.rows);
}

void CpuBackend::matmul_strided(const float* x, int64_t m, int64_t x_stride, const Matrix& matrix,
                                float* y, int64_t y_stride) {
  const auto& w = static_cast<const CpuMatrix&>(matrix);
  const int64_t n = w.rows, k = w.cols;
  if (w.quantized == CpuQuantization::Format::kInt4) {
    kernels::matmul_packed_int4(x, x_stride, m, k, w.qpacked.data(), n, w.int4, y, y_stride,
                                threads_, kernels::GemmIsa::kAuto, quantization_.activations);
    return;
  }
  if (w.quantized == CpuQuantization::Format::kFp8) {
    kernels::matmul_packed_fp8(x, x_stride, m, k, w.qpacked.data(), n, w.fp8, y, y_stride,
                               threads_, kernels::GemmIsa::kAuto, quantization_.activations);
    return;
  }
  if (w.bf16) {
    kernels::matmul_packed_bf16(x, x_stride, m, k, w.packed.data(), n, y, y_stride, threads_,
                                kernels::GemmIsa::kAuto, bf16_activations_);
    return;
  }
  if (m <= 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) std::fill(y + i * y_stride, y + i * y_stride + n, 0.0f);
    return;
  }
  // The BLAS runs single-threaded (see Engine::create); the rank's OpenMP threads each take a
  // band of output columns, so BLAS threads never spin against OpenMP's on the same cores.
  const int threads = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(threads_, n / 64)));
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const int64_t parts = omp_get_num_threads(), t = omp_get_thread_num();
    const int64_t band = (n + parts - 1) / parts;
    const int64_t begin = std::min(n, t * band), end = std::min(n, begin + band);
    if (begin < end) {
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, static_cast<int>(m),
                  static_cast<int>(end - begin), static_cast<int>(k), 1.0f, x,
                  static_cast<int>(x_stride), w.f32.data() + begin * k, static_cast<int>(k), 0.0f,
                  y + begin, static_cast<int>(y_stride));
    }
  }
}

void CpuBackend::copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                           int64_t rows, int64_t width) {
  if (width <= 0) return;
  for (int64_t r = 0; r < rows; ++r) {
    std::memcpy(dst + r * dst_stride, src + r * src_stride, width * sizeof(float));
  }
}

void CpuBackend::scatter_add_rows(const float* src, std::span<const int64_t> rows,
                                  std::span<const float> weights, int64_t width, float* dst) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const float* s = src + static_cast<int64_t>(i) * width;
    float* d = dst + rows[i] * width;
    const float w = weights[i];
    for (int64_t j = 0; j < width; ++j) d[j] += w * s[j];
  }
}

void CpuBackend::add_bias(float* x, int64_t rows, int64_t row_stride, const Buffer& bias) {
  for (int64_t r = 0; r < rows; ++r)
    kernels::add_inplace(x + r * row_stride, bias.data(), bias.size());
}

void CpuBackend::add(float* x, const float* y, size_t n) { kernels::add_inplace(x, y, n); }

void CpuBackend::rms_norm(const float* x, const Buffer& weight, float* out, int64_t rows,
                          int64_t dim, float eps) {
  kernels::rms_norm(x, weight.data(), out, rows, dim, eps);
}

void CpuBackend::rms_norm_strided(const float* x, int64_t x_stride, const Buffer& weight,
                                  float* out, int64_t out_stride, int64_t rows, int64_t dim,
                                  float eps) {
  for (int64_t r = 0; r < rows; ++r) {
    kernels::rms_norm(x + r * x_stride, weight.data(), out + r * out_stride, 1, dim, eps);
  }
}

void CpuBackend::silu_mul(const float* x, int64_t rows, int64_t n, float* out) {
  for (int64_t r = 0; r < rows; ++r) {
    kernels::silu_mul(x + r * 2 * n, x + r * 2 * n + n, out + r * n, n);
  }
}

void CpuBackend::rope_tables(std::span<const int32_t> positions, int64_t head_dim, float theta,
                             float* cos, float* sin) {
  kernels::rope_tables(positions.data(), positions.size(), head_dim, theta, cos, sin);
}

void CpuBackend::apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                            int64_t row_stride, const float* cos, const float* sin) {
  kernels::apply_rope(x, tokens, heads, head_dim, row_stride, cos, sin);
}

void CpuBackend::rope_tables_from(std::span<const int32_t> positions,
                                  std::span<const float> inv_freq, float scale, float* cos,
                                  float* sin) {
  kernels::rope_tables_from(positions.data(), positions.size(), inv_freq.data(), inv_freq.size(),
                            scale, cos, sin);
}

void CpuBackend::apply_rope_interleaved(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                                        int64_t row_stride, const float* cos, const float* sin) {
  const int64_t half = head_dim / 2;
  std::vector<float>& pair = rope_pair_;
  pair.resize(static_cast<size_t>(head_dim));
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t h = 0; h < heads; ++h) {
      float* v = x + t * row_stride + h * head_dim;
      std::copy_n(v, head_dim, pair.data());
      for (int64_t i = 0; i < half; ++i) {
        const float a = pair[2 * i], b = pair[2 * i + 1];
        const float c = cos[t * half + i], s = sin[t * half + i];
        v[i] = a * c - b * s;
        v[i + half] = b * c + a * s;
      }
    }
  }
}

}  // namespace kvrt::backend
