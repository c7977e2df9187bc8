// The compute backend interface: where one rank's tensors live and the operations a layer's
// forward is written in. An architecture (core/model/architecture.h) composes these ops and
// never touches a BLAS, OpenMP or device memory itself, so a CUDA backend is an implementation
// of this interface, not a change to the models. The CPU backend is core/backend/cpu_backend.h.
//
// Buffers and matrices are the backend's (device memory on a GPU); pointers into them are only
// passed back to the backend, to the communicator and to the plugins. Host-side arrays (token
// ids, positions, row indices) are spans of host memory. One backend serves one rank and is
// used by that rank's thread only.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "core/comm/communicator.h"
#include "kernels/shared/fp8_e4m3.h"
#include "kvrt/abi.h"

namespace kvrt::backend {

// n floats in the backend's memory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(float* data, size_t size, void (*release)(float*, size_t))
      : data_(data), size_(size), release_(release) {}
  Buffer(Buffer&& o) noexcept { *this = std::move(o); }
  Buffer& operator=(Buffer&& o) noexcept {
    if (this != &o) {
      reset();
      data_ = o.data_;
      size_ = o.size_;
      release_ = o.release_;
      o.data_ = nullptr;
      o.size_ = 0;
    }
    return *this;
  }
  ~Buffer() { reset(); }
  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }

 private:
  void reset() {
    if (data_ != nullptr && release_ != nullptr) release_(data_, size_);
    data_ = nullptr;
    size_ = 0;
  }
  float* data_ = nullptr;
  size_t size_ = 0;
  void (*release_)(float*, size_t) = nullptr;
};

// A weight matrix [rows][cols] kept as a checkpoint stores it quantized: one code per weight and
// the scales of each row's groups of `group` inputs, so that a backend can hold the codes as they
// are (the CPU's packed kernels) instead of their f32 values.
struct QuantizedMatrix {
  enum class Kind { kNone, kInt4, kFp8 };
  Kind kind = Kind::kNone;
  int64_t rows = 0, cols = 0, group = 0;
  std::vector<uint8_t> codes;  // [rows][cols]: int4's unsigned codes (0..15), or E4M3 bytes
  std::vector<float> scales;   // [rows][groups()]
  std::vector<uint8_t> zeros;  // int4 with zero points: [rows][groups()]; empty: 8 (symmetric)
  bool empty() const { return kind == Kind::kNone; }
  int64_t groups() const { return group == 0 ? 0 : (cols + group - 1) / group; }
  // Each weight's (u - z) * s, or e4m3(code) * s: what the dense path would have loaded.
  std::vector<float> dequantized() const {
    std::vector<float> out(static_cast<size_t>(rows * cols));
    const int64_t n_groups = groups();
    for (int64_t r = 0; r < rows; ++r) {
      for (int64_t g = 0; g < n_groups; ++g) {
        const auto at = static_cast<size_t>(r * n_groups + g);
        const float s = scales[at];
        const float z = zeros.empty() ? 8.0f : static_cast<float>(zeros[at]);
        for (int64_t c = g * group; c < std::min(cols, (g + 1) * group); ++c) {
          const auto i = static_cast<size_t>(r * cols + c);
          out[i] = kind == Kind::kFp8 ? kernels::shared::e4m3_decode(codes[i]) * s
                                      : (static_cast<float>(codes[i]) - z) * s;
        }
      }
    }
    return out;
  }
  // Rows [begin, end) of this, and those of `other` after them (a fused projection's parts).
  void append_rows(const QuantizedMatrix& other, int64_t begin, int64_t end) {
    if (empty()) {
      kind = other.kind;
      cols = other.cols;
      group = other.group;
    }
    const auto g = static_cast<size_t>(groups());
    codes.insert(codes.end(), other.codes.begin() + begin * cols, other.codes.begin() + end * cols);
    scales.insert(scales.end(), other.scales.begin() + static_cast<int64_t>(g) * begin,
                  other.scales.begin() + static_cast<int64_t>(g) * end);
    if (!other.zeros.empty()) {
      zeros.insert(zeros.end(), other.zeros.begin() + static_cast<int64_t>(g) * begin,
                   other.zeros.begin() + static_cast<int64_t>(g) * end);
    }
    rows += end - begin;
  }
  // Columns [begin, end) (begin a multiple of the group: whole groups only).
  QuantizedMatrix columns(int64_t begin, int64_t end) const {
    QuantizedMatrix out;
    out.kind = kind;
    out.rows = rows;
    out.cols = end - begin;
    out.group = group;
    const int64_t g0 = begin / group, gn = out.groups(), g = groups();
    for (int64_t r = 0; r < rows; ++r) {
      out.codes.insert(out.codes.end(), codes.begin() + r * cols + begin,
                       codes.begin() + r * cols + end);
      out.scales.insert(out.scales.end(), scales.begin() + r * g + g0,
                        scales.begin() + r * g + g0 + gn);
      if (!zeros.empty()) {
        out.zeros.insert(out.zeros.end(), zeros.begin() + r * g + g0,
                         zeros.begin() + r * g + g0 + gn);
      }
    }
    return out;
  }
};

// A weight matrix [rows][cols] (Hugging Face's [out][in]) in the backend's memory and format.
class Matrix {
 public:
  virtual ~Matrix() = default;
  int64_t rows = 0, cols = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  virtual kvrt_device device() const = 0;
  // What the communicator and the attention plugin are given for this rank's work.
  virtual comm::Stream stream() const = 0;
  // Called on the rank's thread before each step's first op.
  virtual void begin_step() = 0;
  // Makes the backend's device the calling thread's (what a plugin allocates on that thread
  // lands there); nothing to do on the CPU.
  virtual void bind_device() {}
  // Called on the rank's thread after each step's last op: the step's work is complete when it
  // returns (a device backend waits for its stream), so what the next step does outside the
  // stream -- an attention plan's upload, a host tier's copy of the step's pages -- never races
  // it, on every rank, not only the one that downloads the logits. Throws on a device error.
  virtual void end_step() {}

  // ---- memory -------------------------------------------------------------------------------
  // A buffer of n floats, zeroed.
  virtual Buffer allocate(size_t n) = 0;
  // `buffer` holds at least n floats afterwards (contents unspecified when it grew).
  void reserve(Buffer* buffer, size_t n) {
    if (buffer->size() < n) *buffer = allocate(n);
  }
  // Host floats copied into a new buffer (norm weights, biases, embedding rows).
  virtual Buffer upload(std::span<const float> host) = 0;
  // Takes `data` [rows][cols] (f32, row-major) into the backend's matrix format.
  virtual std::unique_ptr<Matrix> upload_matrix(std::vector<float> data, int64_t rows,
                                                int64_t cols) = 0;
  // The same for a projection's weight (a linear layer's, core/parallel/linear.h: what
  // model.quantization quantizes at load; embeddings, norms, the LM head and MLA's absorbed
  // matrices go through upload_matrix). By default as upload_matrix.
  virtual std::unique_ptr<Matrix> upload_projection(std::vector<float> data, int64_t rows,
                                                    int64_t cols) {
    return upload_matrix(std::move(data), rows, cols);
  }
  // A projection a checkpoint stores quantized, as stored. By default its values, as
  // upload_projection takes them; the CPU backend keeps the codes packed.
  virtual std::unique_ptr<Matrix> upload_quantized(const QuantizedMatrix& m) {
    return upload_projection(m.dequantized(), m.rows, m.cols);
  }
  virtual void download(const float* device, size_t n, float* host) = 0;
  // The step's KV slots where the KV store's device write path reads them (ABI 1.2's
  // device_slots): copied into backend memory that stays valid until the next call. The CPU
  // has no copy to make: nullptr, and the store reads the host slots.
  virtual const int64_t* stage_slots(std::span<const int64_t> host) {
    (void)host;
    return nullptr;
  }

  // ---- ops ----------------------------------------------------------------------------------
  virtual void fill_zero(float* x, size_t n) = 0;
  // out[t] = table[ids[t] - first_row] for the ids in [first_row, first_row + table rows), 0
  // elsewhere (vocab-parallel embedding: each rank fills its rows). Rows of `width`.
  virtual void embed(const Buffer& table, int64_t first_row, std::span<const int32_t> ids,
                     int64_t width, float* out) = 0;
  // out[i] = src[rows[i]], rows of `width`.
  virtual void gather_rows(const float* src, std::span<const int64_t> rows, int64_t width,
                           float* out) = 0;
  // y[m][w.rows] = x[m][w.cols] * w^T.
  virtual void matmul(const float* x, int64_t m, const Matrix& w, float* y) = 0;
  // The same with x's rows x_stride floats apart and y's y_stride apart (one head's slice of
  // a wider row: MLA's per-head products).
  virtual void matmul_strided(const float* x, int64_t m, int64_t x_stride, const Matrix& w,
                              float* y, int64_t y_stride) = 0;
  // dst row i (dst_stride apart) = src row i (src_stride apart), `width` floats, `rows` rows.
  virtual void copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                         int64_t rows, int64_t width) = 0;
  // dst[rows[i]] += weights[i] * src[i] for rows of `width` (a mixture of experts' combine;
  // rows and weights are host arrays).
  virtual void scatter_add_rows(const float* src, std::span<const int64_t> rows,
                                std::span<const float> weights, int64_t width, float* dst) = 0;
  // x[r] += bias for each of `rows` rows of bias.size() floats at `row_stride` apart.
  virtual void add_bias(float* x, int64_t rows, int64_t row_stride, const Buffer& bias) = 0;
  virtual void add(float* x, const float* y, size_t n) = 0;
  virtual void rms_norm(const float* x, const Buffer& weight, float* out, int64_t rows, int64_t dim,
                        float eps) = 0;
  // The same over the first `dim` floats of rows x_stride (in) and out_stride (out) apart.
  virtual void rms_norm_strided(const float* x, int64_t x_stride, const Buffer& weight, float* out,
                                int64_t out_stride, int64_t rows, int64_t dim, float eps) = 0;
  // out[r] = silu(x[r][0..n)) * x[r][n..2n) for `rows` rows of 2n.
  virtual void silu_mul(const float* x, int64_t rows, int64_t n, float* out) = 0;
  // Rotate-half RoPE tables for host `positions` ([tokens][head_dim / 2] each) and their
  // application in place to `heads` heads of `head_dim` per row, rows `row_stride` apart.
  virtual void rope_tables(std::span<const int32_t> positions, int64_t head_dim, float theta,
                           float* cos, float* sin) = 0;
  virtual void apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                          int64_t row_stride, const float* cos, const float* sin) = 0;
  // Tables from explicit inverse frequencies ([head_dim / 2], host; YaRN's), cos and sin
  // multiplied by `scale` (YaRN's attention factor).
  virtual void rope_tables_from(std::span<const int32_t> positions, std::span<const float> inv_freq,
                                float scale, float* cos, float* sin) = 0;
  // RoPE on interleaved pairs (x[2i], x[2i+1]) with angle i, each head's result written
  // de-interleaved (the rotated firsts, then the seconds), as transformers' DeepSeek-V3
  // applies it with rope_interleave. q and k get the same order, so q.k is interleaved RoPE's.
  virtual void apply_rope_interleaved(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                                      int64_t row_stride, const float* cos, const float* sin) = 0;
};

}  // namespace kvrt::backend
