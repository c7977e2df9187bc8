// CPU conversion kernels between f32, bf16 and FP8 E4M3, plus per-row dynamic E4M3 quantization.
//
// Formats:
//   bf16 is passed as its raw uint16_t bit pattern (the upper half of an IEEE f32).
//   E4M3 is OCP FP8 E4M3: 1 sign, 4 exponent (bias 7), 3 mantissa bits; max finite 448; no
//   infinities; NaN only S.1111.111 (0x7F / 0xFF); subnormals are m * 2^-9.
//
// The functions in kvrt::kernels are Highway SIMD kernels with run-time dispatch to the best
// target the CPU supports. They accept any n and unaligned pointers, and are bit-identical to the
// scalar implementations in kvrt::kernels::reference, which exist to test them.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvrt::kernels {

// out[i] = in[i] rounded to bf16, nearest-even; NaN becomes a quiet NaN with the same sign.
void f32_to_bf16(const float* in, uint16_t* out, size_t n);
// out[i] = in[i] widened to f32 (exact).
void bf16_to_f32(const uint16_t* in, float* out, size_t n);
// out[i] = E4M3 code of in[i] * inv_scale (product rounded to f32 first), nearest-even;
// |values| beyond 448 (and +-inf) saturate to +-448; NaN gives 0x7F | sign; finite never gives NaN.
void f32_to_e4m3(const float* in, uint8_t* out, size_t n, float inv_scale);
// Same as f32_to_e4m3 on the f32 values of bf16 inputs.
void bf16_to_e4m3(const uint16_t* in, uint8_t* out, size_t n, float inv_scale);
// out[i] = value(in[i]) * scale, rounded to f32 (NaN codes give NaN).
void e4m3_to_f32(const uint8_t* in, float* out, size_t n, float scale);
// max |in[i]| over the non-NaN elements; 0 when n == 0 or every element is NaN.
float abs_max_f32(const float* in, size_t n);
// max |in[i]| over the non-NaN bf16 elements, as f32; 0 when n == 0 or every element is NaN.
float abs_max_bf16(const uint16_t* in, size_t n);

// Per-row dynamic quantization (the fp8 KV store's hot path). For each of `rows` rows of `dim`
// elements: amax = abs_max(row); scale = amax / 448, except 1 when amax == 0, FLT_MAX / 448 when
// amax is inf (so finite values still encode), and at least FLT_MIN (so 1 / scale stays finite);
// codes = f32_to_e4m3(row, 1.0f / scale); scales[r * scale_stride] = scale. The stored value of a
// code is e4m3 value * scale. Strides are in elements; row r starts at in + r * in_row_stride and
// out + r * out_row_stride.
void quantize_rows_e4m3_f32(const float* in, int64_t in_row_stride, size_t rows, size_t dim,
                            uint8_t* out, int64_t out_row_stride, float* scales,
                            int64_t scale_stride);
// Same as quantize_rows_e4m3_f32 for bf16 rows.
void quantize_rows_e4m3_bf16(const uint16_t* in, int64_t in_row_stride, size_t rows, size_t dim,
                             uint8_t* out, int64_t out_row_stride, float* scales,
                             int64_t scale_stride);

// Per-group int8 quantization (activations for the int4 x int8 products). For each group of
// `group` (>= 1) elements of in[0, n) (the last may be shorter): amax = abs_max(group); scales[g] =
// amax / 127, or 0 when amax is 0 or inf (or amax / 127 underflows); q[i] = nearest-even(in[i] *
// (127 / amax)) clamped to -127..127, 0 for NaN and for every element of a group scaled 0. Where
// not null, sums[g] = the group's sum of codes and values[i] = q[i] * scales[g] (what the codes
// stand for; values may be `in` itself).
void quantize_groups_int8(const float* in, size_t n, size_t group, int8_t* q, float* scales,
                          int32_t* sums, float* values);

// Name of the Highway target the dispatcher picked for this CPU, e.g. "AVX2".
const char* simd_target();

// Scalar reference implementations with the same contracts, written independently of the SIMD
// bit tricks (e.g. the E4M3 encoder is a brute-force nearest search). Slow; for tests.
namespace reference {

// Exact value of an E4M3 code; NaN for 0x7F and 0xFF.
float e4m3_code_value(uint8_t code);

// See kvrt::kernels::f32_to_bf16.
void f32_to_bf16(const float* in, uint16_t* out, size_t n);
// See kvrt::kernels::bf16_to_f32.
void bf16_to_f32(const uint16_t* in, float* out, size_t n);
// See kvrt::kernels::f32_to_e4m3.
void f32_to_e4m3(const float* in, uint8_t* out, size_t n, float inv_scale);
// See kvrt::kernels::bf16_to_e4m3.
void bf16_to_e4m3(const uint16_t* in, uint8_t* out, size_t n, float inv_scale);
// See kvrt::kernels::e4m3_to_f32.
void e4m3_to_f32(const uint8_t* in, float* out, size_t n, float scale);
// See kvrt::kernels::abs_max_f32.
float abs_max_f32(const float* in, size_t n);
// See kvrt::kernels::abs_max_bf16.
float abs_max_bf16(const uint16_t* in, size_t n);
// See kvrt::kernels::quantize_rows_e4m3_f32.
void quantize_rows_e4m3_f32(const float* in, int64_t in_row_stride, size_t rows, size_t dim,
                            uint8_t* out, int64_t out_row_stride, float* scales,
                            int64_t scale_stride);
// See kvrt::kernels::quantize_rows_e4m3_bf16.
void quantize_rows_e4m3_bf16(const uint16_t* in, int64_t in_row_stride, size_t rows, size_t dim,
                             uint8_t* out, int64_t out_row_stride, float* scales,
                             int64_t scale_stride);

// See kvrt::kernels::quantize_groups_int8.
void quantize_groups_int8(const float* in, size_t n, size_t group, int8_t* q, float* scales,
                          int32_t* sums, float* values);

}  // namespace reference
}  // namespace kvrt::kernels
