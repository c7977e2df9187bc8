// Matrix products with weights kept in a checkpoint's quantized formats, decoded inside the
// kernel: y[m][n] = x[m][k] * w[n][k]^T with x and y in f32 and w as
//   int4  4-bit codes u (0..15) in groups of `group` inputs along k, one scale s per output row
//         and group, and a zero point z per row and group (8 when symmetric): w = (u - z) * s.
//         compressed-tensors' pack-quantized weights (its signed codes q are u - 8).
//   fp8   OCP E4M3 codes with one f32 scale per block of block_n x block_k (DeepSeek-V3's
//         weight_scale_inv): w = e4m3(code) * s.
// At batch 1 a product reads each packed byte once, so it runs at the bandwidth of the packed
// bytes (a quarter and a half of bf16's); at larger batches each decoded group is reused by up
// to 8 rows of x held in registers, as the bf16 kernel's panels are (gemm.h).
//
// Packed layout, both formats: panels of 16 output rows (w's rows: y's columns), zero-padded
// past n; within a panel, for each group of k (`group` for int4, `block_k` for fp8, zero-padded
// past k), a header of the 16 rows' scales (and int4's zero points), then the codes:
//   int4: per 8 inputs, 64 bytes: the 32-bit lane c holds row c's 8 codes, byte b input 8t + b
//         in its low nibble and 8t + 4 + b in its high one (four consecutive inputs a lane once
//         masked, as AVX-512 VNNI's vpdpbusd and AVX2's vpmaddubsw take them). Header: 16
//         scales (bf16 when every scale is exactly a bf16, else f32), then with zero points 16
//         bytes of them.
//   fp8:  per 2 inputs, 32 bytes: the 16-bit lane c holds row c's code of input 2t in its low
//         byte and of 2t + 1 in its high byte. Header: 16 f32 scales, each times 256: a code
//         read as the high byte of an IEEE half (sign, then exponent and mantissa shifted one
//         place) is its E4M3 value / 256, subnormals included, which F16C converts exactly.
// Every instruction set reads the same layout; a run-time dispatch picks AVX-512 VNNI or AVX2's
// vpmaddubsw (int4 with int8 x), AVX-512 BF16's dot product (fp8 with bf16 x), AVX-512F,
// AVX2 + F16C or plain C++ (GemmIsa, gemm.h).
#pragma once

#include <cstddef>
#include <cstdint>

#include "kernels/cpu/gemm.h"

namespace kvrt::kernels {

// What the kernels multiply the weights by: x as it is (model.matmul_precision "highest"),
// rounded to bf16, or quantized to int8 per group of the weights' (symmetric, scale amax / 127,
// as llama.cpp's Q8_0 activations) -- the last lets int4 run on AVX-512 VNNI (64 exact products
// an instruction); every instruction set computes with the same values, in f32 where it has no
// VNNI.
enum class Activations { kF32, kBf16, kInt8 };

// What int4 products with Activations::kInt8 run on here: "avx512vnni", "avx2" (vpmaddubsw:
// integer products too) or "scalar" (f32 products of the same values).
const char* int4_int8_kernel();

struct Int4Format {
  size_t group = 32;        // inputs per scale: a multiple of 8
  bool bf16_scales = true;  // the header's scales as bf16 (each must be exactly one)
  bool zero_points = false; // false: symmetric (z = 8)
};
// Whether every scale is exactly a bf16 (its low 16 bits zero).
bool scales_are_bf16(const float* scales, size_t n);
size_t packed_int4_bytes(size_t n, size_t k, const Int4Format& f);
// codes[n][k] one code (0..15) per byte; scales[n][ceil(k / group)]; zeros likewise (only with
// f.zero_points, else null).
void pack_int4(const uint8_t* codes, const float* scales, const uint8_t* zeros, size_t n, size_t k,
               const Int4Format& f, uint8_t* packed);
// y[r * ldy + j] = sum_i x[r * ldx + i] * w[j][i] for r < m, j < n; the n outputs split over
// `threads` (OpenMP) in bands of whole panels, x taken as `activations` says. kInt8 runs as
// integers: VNNI for kAvx512 (and kAvx512Bf16, which means it here) where the CPU has it, else
// AVX2's vpmaddubsw.
void matmul_packed_int4(const float* x, size_t ldx, size_t m, size_t k, const uint8_t* packed,
                        size_t n, const Int4Format& f, float* y, size_t ldy, int threads,
                        GemmIsa isa = GemmIsa::kAuto,
                        Activations activations = Activations::kF32);

struct Fp8Format {
  size_t block_n = 128, block_k = 128;  // block_k a multiple of 4
};
size_t packed_fp8_bytes(size_t n, size_t k, const Fp8Format& f);
// codes[n][k] E4M3 bytes; scales[ceil(n / block_n)][ceil(k / block_k)].
void pack_fp8(const uint8_t* codes, const float* scales, size_t n, size_t k, const Fp8Format& f,
              uint8_t* packed);
// As matmul_packed_int4. kBf16 runs in the AVX-512 BF16 dot product for kAuto and kAvx512Bf16
// where the CPU has it (kAvx512 named keeps the f32 kernel); there a NaN code reads as a finite
// value (the loader refuses a checkpoint's NaN codes; quantize_fp8 makes one of a NaN weight only).
void matmul_packed_fp8(const float* x, size_t ldx, size_t m, size_t k, const uint8_t* packed,
                       size_t n, const Fp8Format& f, float* y, size_t ldy, int threads,
                       GemmIsa isa = GemmIsa::kAuto,
                       Activations activations = Activations::kF32);

// Online quantization of row-major f32 weights w[n][k] (model.quantization):
//   int4: per row and group, s = amax / 7.5 rounded up to a bf16 (the scale compressed-tensors'
//         symmetric int4 chooses, kept exact in the packed bf16 header), codes
//         u = clamp(nearest(w / s), -8, 7) + 8; a group of zeros gets s = 0.
//   fp8:  per block of f.block_n rows x f.block_k inputs, s = amax / 448 (at least FLT_MIN),
//         codes e4m3(w / s) (nearest even, saturating).
// codes[n][k] one per byte, scales as pack_int4 / pack_fp8 take them.
void quantize_int4(const float* w, size_t n, size_t k, size_t group, uint8_t* codes,
                   float* scales);
void quantize_fp8(const float* w, size_t n, size_t k, const Fp8Format& f, uint8_t* codes,
                  float* scales);

namespace reference {
// The weights dequantized first (w = (u - z) * s, e4m3(code) * s), then summed in double: what
// the packed products are tested against.
void matmul_int4(const float* x, size_t m, size_t k, const uint8_t* codes, const float* scales,
                 const uint8_t* zeros, size_t n, size_t group, float* y);
void matmul_fp8(const float* x, size_t m, size_t k, const uint8_t* codes, const float* scales,
                size_t n, const Fp8Format& f, float* y);
}  // namespace reference

}  // namespace kvrt::kernels
