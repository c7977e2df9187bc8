#include "kernels/cuda/paged_attention.h"

#include "kernels/shared/fp8_e4m3.h"
#include "kernels/shared/paged_attention.h"

namespace kvrt::cuda {
namespace {

namespace shared = kvrt::kernels::shared;

constexpr int kWarp = 32;
constexpr int kPerLane = (kMaxHeadDim + kWarp - 1) / kWarp;  // head elements each lane holds

template <KvDtype T>
__device__ float element(const uint8_t* row, int32_t d) {
  if constexpr (T == KvDtype::kF32) {
    return reinterpret_cast<const float*>(row)[d];
  } else if constexpr (T == KvDtype::kBf16) {
    return __uint_as_float(static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(row)[d]) << 16);
  } else {
    return shared::e4m3_decode(row[d]);
  }
}

__device__ float warp_sum(float x) {
  for (int offset = kWarp / 2; offset > 0; offset /= 2) x += __shfl_xor_sync(0xFFFFFFFFu, x, offset);
  return x;
}

// The sequence holding query row `row`: the last b with qo_indptr[b] <= row.
__device__ int32_t sequence_of(const int32_t* qo_indptr, int32_t batch, int32_t row) {
  int32_t lo = 0, hi = batch - 1;
  while (lo < hi) {
    const int32_t mid = (lo + hi + 1) / 2;
    if (qo_indptr[mid] <= row) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

__device__ float scale_at(const float* scales, const PagedKv& kv, shared::PagePosition at,
                          int32_t head) {
  const auto* base = reinterpret_cast<const uint8_t*>(scales);
  return *reinterpret_cast<const float*>(
      base + shared::row_offset(at, kv.scale_page_stride, kv.scale_token_stride, head,
                                kv.scale_head_stride));
}

// How many of the global positions [0, n) a shard keeps (all of them unsharded).
__device__ int32_t shard_tokens_before(const DeviceBatch& b, int32_t n) {
  if (b.shard_count <= 1) return n;
  const int32_t cycle = b.shard_count * b.shard_interleave;
  const int32_t rest = n % cycle - b.shard_index * b.shard_interleave;
  return n / cycle * b.shard_interleave +
         (rest < 0 ? 0 : rest > b.shard_interleave ? b.shard_interleave : rest);
}

// A row and head done: its output (zeros where it saw no token) and its log-sum-exp.
__device__ void finish_row(const AttentionDims& dims, float* out, int64_t out_stride, float* lse,
                           int64_t lse_stride, int32_t row, int32_t head, int32_t lane,
                           const float* acc, float max, float sum) {
  float* o = out + row * out_stride + static_cast<int64_t>(head) * dims.v_dim;
  const float inv = sum > 0 ? 1.0f / sum : 0.0f;
  for (int j = 0; j < kPerLane; ++j) {
    const int32_t d = lane + j * kWarp;
    if (d < dims.v_dim) o[d] = acc[j] * inv;
  }
  if (lse != nullptr && lane == 0) {
    lse[row * lse_stride + head] = sum > 0 ? max + logf(sum) : -INFINITY;
  }
}

// Partial state of (row, head, split): running max, sum, then v_dim unnormalised outputs.
__device__ int64_t partial_offset(const AttentionDims& dims, int32_t max_splits, int32_t row,
                                  int32_t head, int32_t split) {
  const int64_t index = (static_cast<int64_t>(row) * dims.q_heads + head) * max_splits + split;
  return index * (2 + dims.v_dim);
}

// One warp per (query row, query head, split): an online softmax over the split's positions,
// lanes holding strided elements of q and of the output.
template <KvDtype T>
__global__ void attention_rows(DeviceBatch b, PagedKv kv, AttentionDims dims, const float* q,
                               int64_t q_stride, float* out, int64_t out_stride,
                               int32_t chunk_tokens, int32_t max_splits, float* partial,
                               float* lse, int64_t lse_stride) {
  const int32_t row = blockIdx.x, head = blockIdx.y, split = blockIdx.z, lane = threadIdx.x;
  const int32_t s = sequence_of(b.qo_indptr, b.batch_size, row);
  const int32_t q_len = b.qo_indptr[s + 1] - b.qo_indptr[s], i = row - b.qo_indptr[s];
  const int32_t page_begin = b.kv_page_indptr[s];
  const int32_t pages = b.kv_page_indptr[s + 1] - page_begin;
  const int32_t kv_len = pages == 0 ? 0 : (pages - 1) * b.page_size + b.kv_last_page_len[s];
  // The local positions the row sees: causal by its global position (in a shard, the shard's
  // tokens up to there).
  const int32_t whole = b.shard_count > 1 ? b.shard_kv_len[s] : kv_len;
  const int32_t visible = b.causal ? shard_tokens_before(b, whole - q_len + i + 1) : kv_len;
  // Chunks of whole pages; grown so that max_splits of them cover the row.
  int64_t chunk = shared::split_chunk(chunk_tokens, b.page_size);
  const int64_t needed =
      shared::split_chunk((static_cast<int64_t>(visible) + max_splits - 1) / max_splits, b.page_size);
  if (needed > chunk) chunk = needed;
  const int64_t splits = shared::split_count(visible, chunk);
  const int64_t begin = split * chunk;
  const int64_t end = begin + chunk < visible ? begin + chunk : visible;
  const int32_t kv_head = head / (dims.q_heads / dims.kv_heads);
  const int32_t* page_ids = b.kv_page_indices + page_begin;
  float qr[kPerLane], acc[kPerLane];
  for (int j = 0; j < kPerLane; ++j) {
    const int32_t d = lane + j * kWarp;
    qr[j] = d < dims.qk_dim ? q[row * q_stride + static_cast<int64_t>(head) * dims.qk_dim + d] : 0.0f;
    acc[j] = 0.0f;
  }
  float max = -INFINITY, sum = 0.0f;
  const auto* k_base = static_cast<const uint8_t*>(kv.k_base);
  const auto* v_base = static_cast<const uint8_t*>(kv.v_base);
  for (int64_t t = begin; split < splits && t < end; ++t) {
    const shared::PagePosition at = shared::locate(page_ids, b.page_size, t);
    const uint8_t* k_row =
        k_base + shared::row_offset(at, kv.k_page_stride, kv.k_token_stride, kv_head, kv.k_head_stride);
    const uint8_t* v_row =
        v_base + shared::row_offset(at, kv.v_page_stride, kv.v_token_stride, kv_head, kv.v_head_stride);
    float dot = 0.0f;
    for (int j = 0; j < kPerLane; ++j) {
      const int32_t d = lane + j * kWarp;
      if (d < dims.qk_dim) dot += qr[j] * element<T>(k_row, d);
    }
    dot = warp_sum(dot);
    float k_scale = kv.k_tensor_scale, v_scale = kv.v_tensor_scale;
    if (kv.scales == KvScales::kPerTokenHead) {
      k_scale = scale_at(kv.k_scales, kv, at, kv_head);
      v_scale = scale_at(kv.v_scales, kv, at, kv_head);
    } else if (kv.scales == KvScales::kNone) {
      k_scale = v_scale = 1.0f;
    }
    const float x = dot * k_scale * dims.softmax_scale;
    const float next = fmaxf(max, x);
    const float rescale = shared::merge_weight(max, next);
    const float p = expf(x - next);
    sum = sum * rescale + p;
    for (int j = 0; j < kPerLane; ++j) {
      const int32_t d = lane + j * kWarp;
      if (d < dims.v_dim) acc[j] = acc[j] * rescale + p * v_scale * element<T>(v_row, d);
    }
    max = next;
  }
  if (max_splits == 1) {
    finish_row(dims, out, out_stride, lse, lse_stride, row, head, lane, acc, max, sum);
    return;
  }
  float* st = partial + partial_offset(dims, max_splits, row, head, split);
  if (lane == 0) {
    st[0] = max;  // -inf for a split past the row's end
    st[1] = sum;
  }
  for (int j = 0; j < kPerLane; ++j) {
    const int32_t d = lane + j * kWarp;
    if (d < dims.v_dim) st[2 + d] = acc[j];
  }
}

// The flash-decoding merge of each (row, head)'s splits.
__global__ void merge_splits(AttentionDims dims, int32_t max_splits, const float* partial,
                             float* out, int64_t out_stride, float* lse, int64_t lse_stride) {
  const int32_t row = blockIdx.x, head = blockIdx.y, lane = threadIdx.x;
  float max = -INFINITY;
  for (int32_t s = 0; s < max_splits; ++s) {
    max = fmaxf(max, partial[partial_offset(dims, max_splits, row, head, s)]);
  }
  float sum = 0.0f;
  float acc[kPerLane] = {};
  for (int32_t s = 0; s < max_splits; ++s) {
    const float* st = partial + partial_offset(dims, max_splits, row, head, s);
    const float w = shared::merge_weight(st[0], max);
    if (w == 0.0f) continue;
    sum += w * st[1];
    for (int j = 0; j < kPerLane; ++j) {
      const int32_t d = lane + j * kWarp;
      if (d < dims.v_dim) acc[j] += w * st[2 + d];
    }
  }
  finish_row(dims, out, out_stride, lse, lse_stride, row, head, lane, acc, max, sum);
}

}  // namespace

size_t paged_attention_workspace(int32_t total_rows, const AttentionDims& dims,
                                 int32_t max_splits) {
  if (max_splits <= 1) return 0;
  return static_cast<size_t>(total_rows) * dims.q_heads * max_splits * (2 + dims.v_dim) *
         sizeof(float);
}

cudaError_t paged_attention(const DeviceBatch& batch, const PagedKv& kv, const AttentionDims& dims,
                            const float* q, int64_t q_row_stride, float* out,
                            int64_t out_row_stride, int32_t chunk_tokens, int32_t max_splits,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            float* lse, int64_t lse_row_stride) {
  if (batch.total_rows == 0) return cudaSuccess;
  if (batch.shard_count > 1 && (batch.shard_kv_len == nullptr || batch.shard_index < 0 ||
                                batch.shard_index >= batch.shard_count ||
                                batch.shard_interleave < 1)) {
    return cudaErrorInvalidValue;
  }
  const int64_t lse_stride = lse_row_stride != 0 ? lse_row_stride : dims.q_heads;
  if (dims.q_heads <= 0 || dims.kv_heads <= 0 || dims.q_heads % dims.kv_heads != 0 ||
      dims.qk_dim <= 0 || dims.qk_dim > kMaxHeadDim || dims.v_dim <= 0 ||
      dims.v_dim > kMaxHeadDim || batch.page_size <= 0 || chunk_tokens <= 0 || max_splits <= 0 ||
      workspace_bytes < paged_attention_workspace(batch.total_rows, dims, max_splits)) {
    return cudaErrorInvalidValue;
  }
  const dim3 grid(static_cast<unsigned>(batch.total_rows), static_cast<unsigned>(dims.q_heads),
                  static_cast<unsigned>(max_splits));
  auto* partial = static_cast<float*>(workspace);
  switch (kv.dtype) {
    case KvDtype::kF32:
      attention_rows<KvDtype::kF32><<<grid, kWarp, 0, stream>>>(
          batch, kv, dims, q, q_row_stride, out, out_row_stride, chunk_tokens, max_splits, partial,
          lse, lse_stride);
      break;
    case KvDtype::kBf16:
      attention_rows<KvDtype::kBf16><<<grid, kWarp, 0, stream>>>(
          batch, kv, dims, q, q_row_stride, out, out_row_stride, chunk_tokens, max_splits, partial,
          lse, lse_stride);
      break;
    case KvDtype::kE4M3:
      attention_rows<KvDtype::kE4M3><<<grid, kWarp, 0, stream>>>(
          batch, kv, dims, q, q_row_stride, out, out_row_stride, chunk_tokens, max_splits, partial,
          lse, lse_stride);
      break;
    default:
      return cudaErrorInvalidValue;
  }
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess || max_splits == 1) return e;
  merge_splits<<<dim3(static_cast<unsigned>(batch.total_rows), static_cast<unsigned>(dims.q_heads)),
                 kWarp, 0, stream>>>(dims, max_splits, partial, out, out_row_stride, lse,
                                     lse_stride);
  return cudaGetLastError();
}

}  // namespace kvrt::cuda
