#include "kernels/cuda/ops.h"
#include "kernels/shared/fp8_e4m3.h"

namespace kvrt::cuda {
namespace {

namespace shared = kvrt::kernels::shared;

constexpr int kWarp = 32;
constexpr int kThreads = 256;
// Grid-stride loops cover the rest; more blocks than this only add scheduling.
constexpr int64_t kMaxBlocks = 1 << 16;

unsigned blocks_for(int64_t n) {
  const int64_t blocks = (n + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks);
}

__device__ int64_t first_element() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ int64_t grid_stride() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

__device__ float widen_bf16(uint16_t b) { return shared::bits_float(uint32_t{b} << 16); }

__global__ void embed_rows(const float* table, int64_t table_rows, int64_t first_row,
                           const int32_t* ids, int64_t width, float* out, int64_t n) {
  for (int64_t e = first_element(); e < n; e += grid_stride()) {
    const int64_t row = ids[e / width] - first_row;
    out[e] = row >= 0 && row < table_rows ? table[row * width + e % width] : 0.0f;
  }
}

__global__ void gather(const float* src, const int64_t* rows, int64_t width, float* out,
                       int64_t n) {
  for (int64_t e = first_element(); e < n; e += grid_stride()) {
    out[e] = src[rows[e / width] * width + e % width];
  }
}

__global__ void copy_strided(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                             int64_t width, int64_t n) {
  for (int64_t e = first_element(); e < n; e += grid_stride()) {
    const int64_t row = e / width, column = e % width;
    dst[row * dst_stride + column] = src[row * src_stride + column];
  }
}

// Block x is a group (one destination row), block y a band of its columns; each thread adds its
// column's sources in increasing i, unfused, as the CPU's `d[j] += w * s[j]` rounds.
__global__ void scatter_add_groups(const float* src, const float* weights, ScatterGroups groups,
                                   int64_t width, float* dst) {
  const int64_t column = static_cast<int64_t>(blockIdx.y) * blockDim.x + threadIdx.x;
  if (column >= width) return;
  const int64_t g = blockIdx.x;
  float* d = dst + groups.group_row[g] * width + column;
  float sum = *d;
  for (int64_t p = groups.begin[g]; p < groups.begin[g + 1]; ++p) {
    const int64_t i = groups.order[p];
    sum = __fadd_rn(sum, __fmul_rn(weights[i], src[i * width + column]));
  }
  *d = sum;
}

__global__ void add_bias_rows(float* x, int64_t row_stride, const float* bias, int64_t width,
                              int64_t n) {
  for (int64_t e = first_element(); e < n; e += grid_stride()) {
    x[e / width * row_stride + e % width] += bias[e % width];
  }
}

__global__ void add_elements(float* x, const float* y, int64_t n) {
  for (int64_t e = first_element(); e < n; e += grid_stride()) x[e] += y[e];
}

// The block's threads' values summed; every thread gets the total.
__device__ float block_sum(float value) {
  __shared__ float warp_sums[kThreads / kWarp];
  for (int offset = kWarp / 2; offset > 0; offset /= 2) {
    value += __shfl_xor_sync(0xFFFFFFFFu, value, offset);
  }
  const int warp = static_cast<int>(threadIdx.x) / kWarp;
  const int warps = static_cast<int>(blockDim.x) / kWarp;
  if (threadIdx.x % kWarp == 0) warp_sums[warp] = value;
  __syncthreads();
  float total = 0.0f;
  for (int w = 0; w < warps; ++w) total += warp_sums[w];
  return total;
}

// One block per row: the sum of squares first, so that out may be x.
__global__ void rms_norm_rows(const float* x, int64_t x_stride, const float* weight, float* out,
                              int64_t out_stride, int64_t dim, float eps) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * x_stride;
  float* dst = out + static_cast<int64_t>(blockIdx.x) * out_stride;
  float sum = 0.0f;
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) sum = fmaf(row[i], row[i], sum);
  sum = block_sum(sum);
  const float inv = 1.0f / sqrtf(sum / static_cast<float>(dim) + eps);
  for (int64_t i = threadIdx.x; i < dim; i += blockDim.x) {
    dst[i] = __fmul_rn(__fmul_rn(row[i], inv), weight[i]);
  }
}

__global__ void silu_mul_rows(const float* x, int64_t half, float* out, int64_t n) {
  for (int64_t e = first_element(); e < n; e += grid_stride()) {
    const int64_t row = e / half, i = e % half;
    const float gate = x[row * 2 * half + i], up = x[row * 2 * half + half + i];
    out[e] = gate / (1.0f + expf(-gate)) * up;
  }
}

// cos and sin in double, then rounded: within an ulp of the CPU's cosf / sinf at any angle.
__global__ void rope_table_entries(const int32_t* positions, const float* inv_freq, int64_t half,
                                   float scale, float* cos_table, float* sin_table, int64_t n) {
  for (int64_t e = first_element(); e < n; e += grid_stride()) {
    const float angle = __fmul_rn(static_cast<float>(positions[e / half]), inv_freq[e % half]);
    double s, c;
    sincos(static_cast<double>(angle), &s, &c);
    cos_table[e] = __fmul_rn(static_cast<float>(c), scale);
    sin_table[e] = __fmul_rn(static_cast<float>(s), scale);
  }
}

// Unfused products, as kernels::apply_rope (built without FMA contraction) rounds them.
__device__ void rotate(float a, float b, float c, float s, float* first, float* second) {
  *first = __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, s));
  *second = __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, s));
}

__global__ void rope_rotate_half(float* x, int64_t heads, int64_t head_dim, int64_t row_stride,
                                 const float* cos_table, const float* sin_table, int64_t n) {
  const int64_t half = head_dim / 2;
  for (int64_t e = first_element(); e < n; e += grid_stride()) {
    const int64_t token = e / (heads * half), head = e / half % heads, i = e % half;
    float* lo = x + token * row_stride + head * head_dim;
    const int64_t angle = token * half + i;
    rotate(lo[i], lo[i + half], cos_table[angle], sin_table[angle], &lo[i], &lo[i + half]);
  }
}

// One block per (token, head): the head is read whole into shared memory before any of it is
// overwritten, since pair i lands at i and i + half.
__global__ void rope_interleaved_heads(float* x, int64_t heads, int64_t head_dim,
                                       int64_t row_stride, const float* cos_table,
                                       const float* sin_table) {
  extern __shared__ float pairs[];
  const int64_t token = blockIdx.x / heads, head = blockIdx.x % heads;
  const int64_t half = head_dim / 2;
  float* v = x + token * row_stride + head * head_dim;
  for (int64_t d = threadIdx.x; d < 2 * half; d += blockDim.x) pairs[d] = v[d];
  __syncthreads();
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    rotate(pairs[2 * i], pairs[2 * i + 1], cos_table[token * half + i], sin_table[token * half + i],
           &v[i], &v[i + half]);
  }
}

__global__ void to_bf16(const float* in, uint16_t* out, int64_t n) {
  for (int64_t e = first_element(); e < n; e += grid_stride()) out[e] = shared::bf16_round(in[e]);
}

// Each residual is exact in f32 (a value minus its own rounding); an x that is not finite or
// rounds to infinity is all in hi.
__global__ void split_terms(const float* x, int64_t cols, int64_t x_stride, uint16_t* split,
                            int64_t n) {
  for (int64_t e = first_element(); e < n; e += grid_stride()) {
    const float value = x[e / cols * x_stride + e % cols];
    const uint16_t hi = shared::bf16_round(value);
    uint16_t mid = 0, lo = 0;
    if (isfinite(widen_bf16(hi))) {
      const float rest = __fsub_rn(value, widen_bf16(hi));
      mid = shared::bf16_round(rest);
      lo = shared::bf16_round(__fsub_rn(rest, widen_bf16(mid)));
    }
    split[e] = hi;
    split[n + e] = mid;
    split[2 * n + e] = lo;
  }
}

__global__ void combine_terms(const float* products, int64_t cols, float* y, int64_t y_stride,
                              int64_t n) {
  for (int64_t e = first_element(); e < n; e += grid_stride()) {
    y[e / cols * y_stride + e % cols] =
        __fadd_rn(__fadd_rn(products[2 * n + e], products[n + e]), products[e]);
  }
}

}  // namespace

cudaError_t fill_zero(float* x, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  return cudaMemsetAsync(x, 0, n * sizeof(float), stream);
}

cudaError_t embed(const float* table, int64_t table_rows, int64_t first_row, const int32_t* ids,
                  int64_t tokens, int64_t width, float* out, cudaStream_t stream) {
  const int64_t n = tokens * width;
  if (tokens <= 0 || width <= 0) return cudaSuccess;
  embed_rows<<<blocks_for(n), kThreads, 0, stream>>>(table, table_rows, first_row, ids, width, out,
                                                     n);
  return cudaGetLastError();
}

cudaError_t gather_rows(const float* src, const int64_t* rows, int64_t count, int64_t width,
                        float* out, cudaStream_t stream) {
  if (count <= 0 || width <= 0) return cudaSuccess;
  const int64_t n = count * width;
  gather<<<blocks_for(n), kThreads, 0, stream>>>(src, rows, width, out, n);
  return cudaGetLastError();
}

cudaError_t copy_rows(const float* src, int64_t src_stride, float* dst, int64_t dst_stride,
                      int64_t rows, int64_t width, cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return cudaSuccess;
  const int64_t n = rows * width;
  copy_strided<<<blocks_for(n), kThreads, 0, stream>>>(src, src_stride, dst, dst_stride, width, n);
  return cudaGetLastError();
}

cudaError_t scatter_add_rows(const float* src, const float* weights, const ScatterGroups& groups,
                             int64_t width, float* dst, cudaStream_t stream) {
  if (groups.groups <= 0 || width <= 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(groups.groups),
                  static_cast<unsigned>((width + kThreads - 1) / kThreads));
  scatter_add_groups<<<grid, kThreads, 0, stream>>>(src, weights, groups, width, dst);
  return cudaGetLastError();
}

cudaError_t add_bias(float* x, int64_t rows, int64_t row_stride, const float* bias, int64_t width,
                     cudaStream_t stream) {
  if (rows <= 0 || width <= 0) return cudaSuccess;
  const int64_t n = rows * width;
  add_bias_rows<<<blocks_for(n), kThreads, 0, stream>>>(x, row_stride, bias, width, n);
  return cudaGetLastError();
}

cudaError_t add(float* x, const float* y, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const auto elements = static_cast<int64_t>(n);
  add_elements<<<blocks_for(elements), kThreads, 0, stream>>>(x, y, elements);
  return cudaGetLastError();
}

cudaError_t rms_norm(const float* x, int64_t x_stride, const float* weight, float* out,
                     int64_t out_stride, int64_t rows, int64_t dim, float eps,
                     cudaStream_t stream) {
  if (rows <= 0 || dim <= 0) return cudaSuccess;
  // Narrower blocks for narrow rows (a latent of 512 needs no 256 threads), whole warps always.
  const int threads =
      dim >= kThreads ? kThreads : static_cast<int>((dim + kWarp - 1) / kWarp * kWarp);
  rms_norm_rows<<<static_cast<unsigned>(rows), threads, 0, stream>>>(x, x_stride, weight, out,
                                                                     out_stride, dim, eps);
  return cudaGetLastError();
}

cudaError_t silu_mul(const float* x, int64_t rows, int64_t n, float* out, cudaStream_t stream) {
  if (rows <= 0 || n <= 0) return cudaSuccess;
  const int64_t elements = rows * n;
  silu_mul_rows<<<blocks_for(elements), kThreads, 0, stream>>>(x, n, out, elements);
  return cudaGetLastError();
}

cudaError_t rope_tables(const int32_t* positions, int64_t tokens, const float* inv_freq,
                        int64_t half, float scale, float* cos, float* sin, cudaStream_t stream) {
  if (tokens <= 0 || half <= 0) return cudaSuccess;
  const int64_t n = tokens * half;
  rope_table_entries<<<blocks_for(n), kThreads, 0, stream>>>(positions, inv_freq, half, scale, cos,
                                                             sin, n);
  return cudaGetLastError();
}

cudaError_t apply_rope(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                       int64_t row_stride, const float* cos, const float* sin,
                       cudaStream_t stream) {
  if (tokens <= 0 || heads <= 0 || head_dim < 2) return cudaSuccess;
  const int64_t n = tokens * heads * (head_dim / 2);
  rope_rotate_half<<<blocks_for(n), kThreads, 0, stream>>>(x, heads, head_dim, row_stride, cos, sin,
                                                           n);
  return cudaGetLastError();
}

cudaError_t apply_rope_interleaved(float* x, int64_t tokens, int64_t heads, int64_t head_dim,
                                   int64_t row_stride, const float* cos, const float* sin,
                                   cudaStream_t stream) {
  if (tokens <= 0 || heads <= 0 || head_dim < 2) return cudaSuccess;
  constexpr int64_t kMaxHeadDim = 8192;  // its floats fill 32 KiB of shared memory
  if (head_dim > kMaxHeadDim) return cudaErrorInvalidValue;
  const int64_t half = head_dim / 2;
  const int threads =
      half >= kThreads ? kThreads : static_cast<int>((half + kWarp - 1) / kWarp * kWarp);
  rope_interleaved_heads<<<static_cast<unsigned>(tokens * heads), threads,
                           static_cast<size_t>(head_dim) * sizeof(float), stream>>>(
      x, heads, head_dim, row_stride, cos, sin);
  return cudaGetLastError();
}

cudaError_t f32_to_bf16(const float* in, uint16_t* out, size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  const auto elements = static_cast<int64_t>(n);
  to_bf16<<<blocks_for(elements), kThreads, 0, stream>>>(in, out, elements);
  return cudaGetLastError();
}

cudaError_t split_bf16x3(const float* x, int64_t rows, int64_t cols, int64_t x_stride,
                         uint16_t* split, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t n = rows * cols;
  split_terms<<<blocks_for(n), kThreads, 0, stream>>>(x, cols, x_stride, split, n);
  return cudaGetLastError();
}

cudaError_t combine_bf16x3(const float* products, int64_t rows, int64_t cols, float* y,
                           int64_t y_stride, cudaStream_t stream) {
  if (rows <= 0 || cols <= 0) return cudaSuccess;
  const int64_t n = rows * cols;
  combine_terms<<<blocks_for(n), kThreads, 0, stream>>>(products, cols, y, y_stride, n);
  return cudaGetLastError();
}

}  // namespace kvrt::cuda
