// CPU attention kernels: the inner loops of softmax(q K^T * scale) V over a tile of KV rows, for a
// group of query vectors that share those rows (the query heads of one KV head, GQA).
//
// A caller walks a sequence's KV in tiles of rows, and per tile and KV head calls
//   qk_dots        scores = Q K^T over the tile (dot products over head_dim),
//   online_softmax turns the scores into weights and updates each row's running max and sum,
//   pv_accumulate  acc = acc * rescale + weights V (axpys over head_dim),
// then divides acc by the running sum. Rows are passed as pointers, so a tile may span pages and
// the caller does the page-table arithmetic once per token. qk_dots_heads and
// pv_accumulate_heads do the same for all KV heads of a token-major tile at once (attn_cpu's
// decode path); online_softmax takes them one head's group at a time, or all heads at once when
// there are no per-token scales. For many query rows per tile (prefill), transpose_rows /
// qk_dots_transposed and decode_rows / pv_accumulate_tile decode the tile once and reuse it.
//
// Row elements are f32, bf16 (raw uint16_t bits) or OCP E4M3 codes, decoded to f32 in registers;
// scales are the caller's business (online_softmax takes per-token K and V scales). The functions
// in kvrt::kernels are Highway SIMD kernels with run-time dispatch; they sum in a different order
// than the scalar references in kvrt::kernels::reference (which exist to test them), so results
// agree to rounding, not bit for bit. Head dims must be multiples of kDimMultiple, which lets every
// target use whole vectors with no tails.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvrt::kernels {

enum class KvElem : uint8_t {
  kF32,   // float
  kBf16,  // uint16_t bf16 bit patterns
  kE4M3,  // uint8_t OCP E4M3 codes; the NaN codes 0x7F / 0xFF read as +-480 (not NaN)
};

// dim of qk_dots and pv_accumulate must be a multiple of this.
inline constexpr size_t kDimMultiple = 8;

// scores[g * score_stride + t] = sum_d q[g * q_stride + d] * row_t[d]   for g < num_q, t < n,
// with row_t the `dim` elements of `type` at rows[t]. Each row is read once for all num_q
// queries.
void qk_dots(KvElem type, const float* q, size_t q_stride, size_t num_q, const void* const* rows,
             size_t n, size_t dim, float* scores, size_t score_stride);

// One step of online softmax for num_q score rows of n entries (n may be 0). For row g, with
// x_t = s[t] * scale * (k_scales ? k_scales[t] : 1), M = running_max[g], S = running_sum[g]:
//   M' = max(M, max_t x_t);  rescale[g] = exp(M - M') (0 when M is -inf);
//   p_t = exp(x_t - M');     S' = S * rescale[g] + sum_t p_t;
//   s[t] = p_t * (v_scales ? v_scales[t] : 1)   (the weights pv_accumulate takes);
// then running_max[g] = M', running_sum[g] = S'. Start rows with M = -inf and S = 0.
void online_softmax(float* scores, size_t score_stride, size_t num_q, size_t n, float scale,
                    const float* k_scales, const float* v_scales, float* running_max,
                    float* running_sum, float* rescale);

// acc[g * acc_stride + d] = acc[g * acc_stride + d] * (rescale ? rescale[g] : 1)
//                           + sum_t w[g * w_stride + t] * row_t[d]
// for g < num_q, d < dim; each row is read once for all num_q accumulators. With n == 0 only the
// rescale applies.
void pv_accumulate(KvElem type, const float* w, size_t w_stride, size_t num_q,
                   const void* const* rows, size_t n, size_t dim, const float* rescale, float* acc,
                   size_t acc_stride);

// The same two kernels over several KV heads at once, for layouts that keep a token's heads side
// by side (token-major pages): row t of head h is the `dim` elements at
// (const uint8_t*)rows[t] + h * head_stride, and query, score, weight and accumulator row
// h * group + g belongs to head h (group queries per head, num_heads * group rows in all).
// Rows are walked token by token, all heads of a token before the next token, so a tile is read
// in address order; calling the single-head kernels once per head would walk it head by head,
// in strides of a token's size, which the hardware prefetchers do not follow.
// pv_accumulate_heads keeps the accumulators in memory (they are too many for registers) and
// applies rescale (num_heads * group factors, or nullptr) first.
// qk_dots_heads can also prefetch rows into L1 as it goes, so that their loads overlap its
// arithmetic instead of stalling it: while scoring token t it prefetches the `bytes` at
// rows[t] of each of the num_prefetch lists (each with n entries). attn_cpu's decode passes the
// K rows a few positions ahead and the tile's V rows, which the sums read next; a burst of
// prefetches before a tile fills the miss buffers and stalls like the loads it replaces.
struct PrefetchRows {
  const void* const* rows;
  size_t bytes;
};
void qk_dots_heads(KvElem type, const float* q, size_t q_stride, size_t group, size_t num_heads,
                   const void* const* rows, size_t head_stride, size_t n, size_t dim, float* scores,
                   size_t score_stride, const PrefetchRows* prefetch = nullptr,
                   size_t num_prefetch = 0);
void pv_accumulate_heads(KvElem type, const float* w, size_t w_stride, size_t group,
                         size_t num_heads, const void* const* rows, size_t head_stride, size_t n,
                         size_t dim, const float* rescale, float* acc, size_t acc_stride);

// Scores for many query rows against one tile (prefill), as outer products: K is first
// decoded and transposed once per tile and head, then every query row's scores come out of
// broadcasts of its elements times whole vectors of tokens, with no horizontal sums.
//   transpose_rows:      kt[d * kt_stride + t] = row_t[d] (as f32) for t < n, d < dim, with
//                        row_t at (const uint8_t*)rows[t] + offset; entries t in [n, kt_stride)
//                        are set to 0. n <= kt_stride; kt_stride a multiple of kDimMultiple.
//   qk_dots_transposed:  scores[g * score_stride + t] = sum_d q[g * q_stride + d] *
//                        kt[d * kt_stride + t] for g < num_q, t < n (n <= kt_stride).
void transpose_rows(KvElem type, const void* const* rows, size_t offset, size_t n, size_t dim,
                    float* kt, size_t kt_stride);
void qk_dots_transposed(const float* q, size_t q_stride, size_t num_q, const float* kt,
                        size_t kt_stride, size_t n, size_t dim, float* scores, size_t score_stride);
// And their weighted sums: a tile's V rows decoded to f32 once (decode_rows: out[t * out_stride
// + d] = row_t[d], row_t at (const uint8_t*)rows[t] + offset), then
//   pv_accumulate_tile: acc[g * acc_stride + d] = acc[g * acc_stride + d] * (rescale ? rescale[g]
//                       : 1) + sum_t w[g * w_stride + t] * v[t * v_stride + d],
// with blocks of queries x head_dim held in registers over all n tokens.
void decode_rows(KvElem type, const void* const* rows, size_t offset, size_t n, size_t dim,
                 float* out, size_t out_stride);
void pv_accumulate_tile(const float* w, size_t w_stride, size_t num_q, const float* v,
                        size_t v_stride, size_t n, size_t dim, const float* rescale, float* acc,
                        size_t acc_stride);

// Name of the Highway target the dispatcher picked for these kernels, e.g. "AVX2".
const char* attention_simd_target();

// Scalar references with the same contracts, summing in double; for tests.
namespace reference {

// The f32 value of one row element, as the kernels read it.
float kv_element(KvElem type, const void* row, size_t index);

void qk_dots(KvElem type, const float* q, size_t q_stride, size_t num_q, const void* const* rows,
             size_t n, size_t dim, float* scores, size_t score_stride);
void online_softmax(float* scores, size_t score_stride, size_t num_q, size_t n, float scale,
                    const float* k_scales, const float* v_scales, float* running_max,
                    float* running_sum, float* rescale);
void pv_accumulate(KvElem type, const float* w, size_t w_stride, size_t num_q,
                   const void* const* rows, size_t n, size_t dim, const float* rescale, float* acc,
                   size_t acc_stride);
void qk_dots_heads(KvElem type, const float* q, size_t q_stride, size_t group, size_t num_heads,
                   const void* const* rows, size_t head_stride, size_t n, size_t dim, float* scores,
                   size_t score_stride);
void pv_accumulate_heads(KvElem type, const float* w, size_t w_stride, size_t group,
                         size_t num_heads, const void* const* rows, size_t head_stride, size_t n,
                         size_t dim, const float* rescale, float* acc, size_t acc_stride);

}  // namespace reference
}  // namespace kvrt::kernels
