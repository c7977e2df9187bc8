#include "kernels/cuda/kv_write.h"

#include "kernels/shared/fp8_e4m3.h"
#include "kernels/shared/paged_attention.h"

namespace kvrt::cuda {
namespace {

namespace shared = kvrt::kernels::shared;

constexpr int kWarp = 32;

// The (token, head) row this thread's warp writes (one warp per row; lanes stride over its
// elements), or false past the last row.
struct WarpRow {
  int32_t token, head, lane;
  shared::PagePosition at;  // the token's slot in the pages
  const float* src;
  uint8_t* dst;
};
__device__ bool warp_row(const float* in, int64_t in_token_stride, int32_t tokens, int32_t heads,
                         int32_t dim, const int64_t* slots, int32_t page_size,
                         const KvWriteTarget& target, WarpRow* r) {
  const int64_t row = (static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x) / kWarp;
  if (row >= static_cast<int64_t>(tokens) * heads) return false;
  r->lane = static_cast<int32_t>(threadIdx.x % kWarp);
  r->token = static_cast<int32_t>(row / heads);
  r->head = static_cast<int32_t>(row % heads);
  r->at = shared::position_of_slot(slots[r->token], page_size);
  r->src = in + r->token * in_token_stride + static_cast<int64_t>(r->head) * dim;
  r->dst = static_cast<uint8_t*>(target.base) +
           shared::row_offset(r->at, target.page_stride, target.token_stride, r->head,
                              target.head_stride);
  return true;
}

__global__ void bf16_rows(const float* in, int64_t in_token_stride, int32_t tokens,
                          int32_t heads, int32_t dim, const int64_t* slots, int32_t page_size,
                          KvWriteTarget target) {
  WarpRow r;
  if (!warp_row(in, in_token_stride, tokens, heads, dim, slots, page_size, target, &r)) return;
  auto* dst = reinterpret_cast<uint16_t*>(r.dst);
  for (int32_t d = r.lane; d < dim; d += kWarp) dst[d] = shared::bf16_round(r.src[d]);
}

__global__ void f32_rows(const float* in, int64_t in_token_stride, int32_t tokens, int32_t heads,
                         int32_t dim, const int64_t* slots, int32_t page_size,
                         KvWriteTarget target) {
  WarpRow r;
  if (!warp_row(in, in_token_stride, tokens, heads, dim, slots, page_size, target, &r)) return;
  auto* dst = reinterpret_cast<float*>(r.dst);
  for (int32_t d = r.lane; d < dim; d += kWarp) dst[d] = r.src[d];
}

// As bf16_rows; with per-token-head scales the warp first reduces the row's abs-max (NaN
// ignored, as the CPU kernel's abs_max does), then every lane encodes x * (1 / scale).
__global__ void e4m3_rows(const float* in, int64_t in_token_stride, int32_t tokens,
                          int32_t heads, int32_t dim, const int64_t* slots, int32_t page_size,
                          KvWriteTarget target) {
  WarpRow r;
  if (!warp_row(in, in_token_stride, tokens, heads, dim, slots, page_size, target, &r)) return;
  const int32_t lane = r.lane;
  const float* src = r.src;
  uint8_t* dst = r.dst;
  float inv = 1.0f / target.tensor_scale;
  if (target.scales != nullptr) {
    float amax = 0.0f;
    for (int32_t d = lane; d < dim; d += kWarp) {
      const float a = fabsf(src[d]);
      if (a > amax) amax = a;  // false for NaN
    }
    for (int offset = kWarp / 2; offset > 0; offset /= 2) {
      amax = fmaxf(amax, __shfl_xor_sync(0xFFFFFFFFu, amax, offset));
    }
    const float scale = shared::e4m3_row_scale(amax);
    inv = 1.0f / scale;
    if (lane == 0) {
      auto* s = reinterpret_cast<uint8_t*>(target.scales) +
                shared::row_offset(r.at, target.scale_page_stride, target.scale_token_stride,
                                   r.head, target.scale_head_stride);
      *reinterpret_cast<float*>(s) = scale;
    }
  }
  for (int32_t d = lane; d < dim; d += kWarp) dst[d] = shared::e4m3_encode(src[d] * inv);
}

template <typename Kernel>
cudaError_t launch(Kernel kernel, const float* in, int64_t in_token_stride, int32_t tokens,
                   int32_t heads, int32_t dim, const int64_t* slots, int32_t page_size,
                   const KvWriteTarget& target, cudaStream_t stream) {
  if (tokens <= 0 || heads <= 0 || dim <= 0) return cudaSuccess;
  if (page_size <= 0 || in == nullptr || slots == nullptr || target.base == nullptr) {
    return cudaErrorInvalidValue;
  }
  constexpr int kThreads = 256;  // 8 rows per block
  const int64_t rows = static_cast<int64_t>(tokens) * heads;
  const auto blocks = static_cast<unsigned>((rows * kWarp + kThreads - 1) / kThreads);
  kernel<<<blocks, kThreads, 0, stream>>>(in, in_token_stride, tokens, heads, dim, slots,
                                          page_size, target);
  return cudaGetLastError();
}

}  // namespace

cudaError_t write_f32(const float* in, int64_t in_token_stride, int32_t tokens, int32_t heads,
                      int32_t dim, const int64_t* slots, int32_t page_size,
                      const KvWriteTarget& target, cudaStream_t stream) {
  return launch(f32_rows, in, in_token_stride, tokens, heads, dim, slots, page_size, target,
                stream);
}

cudaError_t write_bf16(const float* in, int64_t in_token_stride, int32_t tokens, int32_t heads,
                       int32_t dim, const int64_t* slots, int32_t page_size,
                       const KvWriteTarget& target, cudaStream_t stream) {
  return launch(bf16_rows, in, in_token_stride, tokens, heads, dim, slots, page_size, target,
                stream);
}

cudaError_t write_e4m3(const float* in, int64_t in_token_stride, int32_t tokens, int32_t heads,
                       int32_t dim, const int64_t* slots, int32_t page_size,
                       const KvWriteTarget& target, cudaStream_t stream) {
  return launch(e4m3_rows, in, in_token_stride, tokens, heads, dim, slots, page_size, target,
                stream);
}

}  // namespace kvrt::cuda
