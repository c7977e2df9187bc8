// Matrix products with bf16 weights, for decode: y[m][n] = x[m][k] * w[n][k]^T with x and y in
// f32 and w in bf16 (raw bits), Hugging Face's [out][in] layout. Reading half the bytes of f32
// weights is what decode at small batch needs, since it streams every weight once per step.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvrt::kernels {

// Highway SIMD, run-time dispatch; the n outputs are split over `threads` threads (OpenMP).
void matmul_bf16(const float* x, size_t m, size_t k, const uint16_t* w, size_t n, float* y,
                 int threads);

namespace reference {
void matmul_bf16(const float* x, size_t m, size_t k, const uint16_t* w, size_t n, float* y);
}  // namespace reference

}  // namespace kvrt::kernels
