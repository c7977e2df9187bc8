// Matrix products with bf16 weights: y[m][n] = x[m][k] * w[n][k]^T with x and y in f32 and w in
// bf16 (raw bits), Hugging Face's [out][in] layout. Reading half the bytes of f32 weights is
// what decode at small batch needs, since it streams every weight once per step.
//
// The weights are packed once, at load, into panels of 16 output columns: panel p holds
// columns 16p .. 16p + 15, and within it each pair of k (2q, 2q + 1) is one 64-byte group of 16
// columns x 2 values, column-major within the group:
//   packed[p * 16 * kp + q * 32 + c * 2 + e] = w[16p + c][2q + e]
// with kp = k rounded up to even and zeros past n and k. One 32-bit lane of a group holds a
// column's two consecutive weights: the f32 of the even one is the lane shifted left by 16, of
// the odd one the lane with its low half cleared, so AVX2 and AVX-512 widen a group in two
// instructions, and the AVX-512 BF16 dot product (vdpbf16ps) takes the group as it is. Every
// instruction set reads the same layout, and no product widens the whole matrix per step.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvrt::kernels {

// What the packed product runs on. kAuto: gemm_best_isa(false), from cpuid at run time.
enum class GemmIsa {
  kAuto,
  kScalar,     // plain C++ (any CPU)
  kAvx2,       // AVX2 + FMA: bf16 widened in registers, f32 FMA
  kAvx512,     // AVX-512F: the same, 16 lanes
  kAvx512Bf16  // AVX-512 BF16: x rounded to bf16 per product, vdpbf16ps (f32 sums)
};

// Whether this CPU (and its OS) can run `isa`; kAuto and kScalar always can.
bool gemm_isa_supported(GemmIsa isa);
// The best instruction set this CPU has: AVX-512F, then AVX2, then scalar, and before them the
// bf16 dot product only if allow_bf16_dot. That one rounds x to bf16 per product, so kAuto
// takes it only for products asked to round x (bf16_x: model.matmul_precision "medium", which
// "auto" is on a CPU with the dot product; docs/performance.md gives its accuracy cost).
GemmIsa gemm_best_isa(bool allow_bf16_dot);
// "avx512bf16", "avx512f", "avx2" or "scalar".
const char* gemm_isa_name(GemmIsa isa);

// Elements (uint16_t) of the packed form of an n x k matrix.
size_t packed_bf16_size(size_t n, size_t k);
// Packs row-major bf16 weights w[n][k] (row stride k) into `packed` (packed_bf16_size elements).
void pack_bf16(const uint16_t* w, size_t n, size_t k, uint16_t* packed);
// Packs row-major f32 weights, each rounded to bf16 (nearest even), as f32_to_bf16.
void pack_bf16_from_f32(const float* w, size_t n, size_t k, uint16_t* packed);

// y[r * ldy + j] = sum_i x[r * ldx + i] * w[j][i] for r < m, j < n, from packed weights. The
// n outputs are split over `threads` threads (OpenMP), in bands of whole panels.
// With bf16_x, each x value is first rounded to bf16 (nearest even), as the bf16 dot product
// does (kAvx512Bf16 always rounds): kAuto then takes gemm_best_isa(true), and the instruction
// sets without the dot product multiply the rounded values in f32, which gives the dot
// product's values up to the order of the sums, on any CPU.
void matmul_packed_bf16(const float* x, size_t ldx, size_t m, size_t k, const uint16_t* packed,
                        size_t n, float* y, size_t ldy, int threads, GemmIsa isa = GemmIsa::kAuto,
                        bool bf16_x = false);

namespace reference {
// Row-major bf16 weights, summed in double: what the packed product is tested against.
void matmul_bf16(const float* x, size_t m, size_t k, const uint16_t* w, size_t n, float* y);
}  // namespace reference

}  // namespace kvrt::kernels
