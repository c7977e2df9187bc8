// Elementwise kernels of the transformer forward pass (Highway SIMD with run-time dispatch) and
// their scalar references (namespace reference), which tests compare them with.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvrt::kernels {

// out[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for `rows` rows of `dim` (may alias x).
void rms_norm(const float* x, const float* weight, float* out, size_t rows, size_t dim, float eps);

// out = silu(gate) * up = gate / (1 + exp(-gate)) * up, elementwise (out may alias either).
void silu_mul(const float* gate, const float* up, float* out, size_t n);

// x += y, elementwise.
void add_inplace(float* x, const float* y, size_t n);

// Rotate-half RoPE (Llama, Qwen2) in place on `tokens` rows, each holding `heads` heads of
// `head_dim` at `row_stride` floats apart: for i < head_dim / 2,
//   x[i]        = x[i] * cos[i] - x[i + half] * sin[i]
//   x[i + half] = x[i + half] * cos[i] + x[i] * sin[i]
// with cos/sin the token's rows of the tables below ([tokens][half]).
void apply_rope(float* x, size_t tokens, size_t heads, size_t head_dim, size_t row_stride,
                const float* cos, const float* sin);

// The tables, computed as Hugging Face does in float32: inv_freq[i] = 1 / theta^(2i / head_dim)
// (shared::rope_inverse_frequency), angle = position * inv_freq[i].
void rope_tables(const int32_t* positions, size_t tokens, size_t head_dim, float theta, float* cos,
                 float* sin);
// The same from given inverse frequencies ([half], e.g. YaRN's), cos and sin times `scale`.
void rope_tables_from(const int32_t* positions, size_t tokens, const float* inv_freq, size_t half,
                      float scale, float* cos, float* sin);

namespace reference {
void rms_norm(const float* x, const float* weight, float* out, size_t rows, size_t dim, float eps);
void silu_mul(const float* gate, const float* up, float* out, size_t n);
void apply_rope(float* x, size_t tokens, size_t heads, size_t head_dim, size_t row_stride,
                const float* cos, const float* sin);
}  // namespace reference

}  // namespace kvrt::kernels
