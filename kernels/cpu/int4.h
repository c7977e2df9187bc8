// CPU kernels of the 4-bit KV format (plugins/kv_int4): symmetric int4 codes with one f32 scale
// per row, and the normalised block Walsh-Hadamard transform that spreads a row's outliers over
// its block before it is quantised.
//
// Codes: two's complement nibbles -7..7 (-8 is never written), two per byte, element 2i in the
// low nibble of byte i (KVRT_PACK_LOW_FIRST). Stored value = code * scale.
//
// Plain C++ written for the compiler's vectoriser (no run-time dispatch): the butterflies run
// over contiguous halves and decoding goes through a 256-entry table of byte -> two values.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvrt::kernels {

// Largest power of two that divides n and is at most `cap` (n > 0).
size_t hadamard_block_for(size_t n, size_t cap);

// x[0, n) <- H x block by block: each run of `block` elements (a power of two dividing n) is
// multiplied by the normalised Sylvester Hadamard matrix H / sqrt(block). H is symmetric and
// orthonormal, so the same call inverts it and the row's L2 norm is kept.
void hadamard_blocks(float* x, size_t n, size_t block);

// Quantises n (even) values: scale = amax / 7 (1 when the row is all zero, FLT_MAX / 7 when amax
// is infinite), codes = nearest(x / scale) clamped to -7..7, NaN as 0. Returns the scale.
float quantize_row_int4(const float* in, size_t n, uint8_t* codes);

// out[i] = code(i) * scale for n (even) values.
void dequantize_row_int4(const uint8_t* codes, size_t n, float scale, float* out);

namespace reference {
// x <- (H / sqrt(block)) x by the dense matrix, H[i][j] = (-1)^popcount(i & j); for tests.
void hadamard_blocks(float* x, size_t n, size_t block);
}  // namespace reference

}  // namespace kvrt::kernels
