// The CUDA backend's elementwise and row kernels (core/backend/cuda_backend.h), with the CPU
// backend's semantics (core/backend/cpu_backend.cc, kernels/cpu/ops.h). Where the CPU rounds in a
// fixed order (row copies, scatter-add, RoPE application, bf16 rounding) these round the same
// way, unfused, so the results are bit-identical; reductions (rms_norm) and transcendental
// functions (silu, the RoPE tables' cos and sin) agree to within their rounding.
//
// Host-callable launchers, stream-ordered: every pointer is device memory, nothing allocates or
// synchronises, and the error is the launch's (cudaGetLastError). Strides count floats. Empty
// work (no rows, zero width) launches nothing and succeeds.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvrt::cuda {

// x[0..n) = 0.
cudaError_t fill_zero(float* x, size_t n, cudaStream_t stream);

// out[t] = table[ids[t] - first_row] when that is one of the table's `table_rows` rows, else
// zeros (vocab-parallel embedding), for `tokens` rows of `width`.
cudaError_t embed(const float* table, int64_t table_rows, int64_t first_row, const int32_t* ids,
                  int64_t tokens, int64_t width, float* out, cudaStream_t stream);

// out[i] = src[rows[i]] for `count` rows of `width`.
cudaError_t gather_rows(const float* src, const int64_t* rows, int64_t count, int64_t width,
                        float* out, cudaStream_t stream);

// dst row r (dst_stride apart) = src row r (src_stride apart), `width` floats of `rows` rows.
// The ranges must not overlap.
cudaError_t copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                      int64_t rows, int64_t width, cudaStream_t stream);

// dst[rows[i]] += weights[i] * src[i] for i in order, as the CPU's loop adds them, with the
// i grouped by destination row so that a row repeated in `rows` needs no atomics: group g
// adds sources order[begin[g]] .. order[begin[g + 1] - 1] (increasing i) into dst row
// group_row[g]. Deterministic and bit-identical to the CPU for the same rows.
struct ScatterGroups {
  const int64_t* order = nullptr;      // [count] source rows, grouped, increasing within a group
  const int64_t* begin = nullptr;      // [groups + 1] offsets into order
  const int64_t* group_row = nullptr;  // [groups] destination row
  int64_t groups = 0;
};
cudaError_t scatter_add_rows(const float* src, const float* weights, const ScatterGroups& groups,
                             int64_t width, float* dst, cudaStream_t stream);

// x[r][0..width) += bias for `rows` rows row_stride apart.
cudaError_t add_bias(float* x, int64_t rows, int64_t row_stride, const float* bias, int64_t width,
                     cudaStream_t stream);

// x += y, elementwise.
cudaError_t add(float* x, const float* y, size_t n, cudaStream_t stream);

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight over the first `dim` floats of `rows` rows
// (x_stride and out_stride apart; out may be x). f32 sums, one block per row.
cudaError_t rms_norm(const float* x, int64_t x_stride, const float* weight, float* out,
                     int64_t out_stride, int64_t rows, int64_t dim, float eps, cudaStream_t stream);

// out[r] = silu(x[r][0..n)) * x[r][n..2n) for `rows` rows of 2n; out must not overlap x.
cudaError_t silu_mul(const float* x, int64_t rows, int64_t n, float* out, cudaStream_t stream);

// cos / sin [tokens][half] of angle positions[t] * inv_freq[i] (f32 product, as the CPU), each
// times `scale`. The frequencies come from the caller so that they are the CPU's bits: plain
// RoPE computes them on the host with kernels/shared/rope.h, as kernels::rope_tables does, since
// a frequency one ulp off moves the angle at position 10^5 by a hundredth of a radian.
cudaError_t rope_tables(const int32_t* positions, int64_t tokens, const float* inv_freq,
                        int64_t half, float scale, float* cos, float* sin, cudaStream_t stream);

// Rotate-half RoPE in place, as kernels::apply_rope: `heads` heads of `head_dim` per row, rows
// row_stride apart; cos / sin are [tokens][head_dim / 2].
cudaError_t apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                       int64_t row_stride, const float* cos, const float* sin, cudaStream_t stream);

// Interleaved-pair RoPE in place, written de-interleaved, as the CPU backend's
// apply_rope_interleaved (DeepSeek-V3's rope_interleave); head_dim <= 8192.
cudaError_t apply_rope_interleaved(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                                   int64_t row_stride, const float* cos, const float* sin,
                                   cudaStream_t stream);

// out[i] = bf16 bits of in[i], nearest-even (kernels/shared's bf16_round, the CPU's rounding).
cudaError_t f32_to_bf16(const float* in, uint16_t* out, size_t n, cudaStream_t stream);

// Products of f32 activations with bf16 weights on bf16 tensor cores, to f32 accuracy: each x
// splits into three bf16 terms of 8 significant bits each, x = hi + mid + lo exactly (unless
// |x| < 2^-110, where the last term underflows), whose products with a bf16 weight are exact
// in f32. `split` writes the terms of `rows` rows of
// `cols` (x_stride apart) as [3][rows][cols] (hi, mid, lo); `combine` sums the three products
// [3][rows][cols] into y (rows y_stride apart), smallest first.
cudaError_t split_bf16x3(const float* x, int64_t rows, int64_t cols, int64_t x_stride,
                         uint16_t* split, cudaStream_t stream);
cudaError_t combine_bf16x3(const float* products, int64_t rows, int64_t cols, float* y,
                           int64_t y_stride, cudaStream_t stream);

}  // namespace kvrt::cuda
