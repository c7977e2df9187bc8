// Paged attention on the GPU over a KV store's pages as its kvrt_kv_layout publishes them (the
// bf16 and fp8 stores' formats), for attn_cuda: decode and causal prefill, GQA, head dims up to
// 576 (MLA's latent, V its first values), page sizes 1-128, long rows split over chunks of
// whole pages (flash-decoding) and merged. The page, split and merge arithmetic is
// kernels/shared/'s, as attn_cpu's. Nothing allocates; the launch is stream-ordered and
// graph-capturable (no host synchronisation).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace kvrt::cuda {

enum class KvDtype : int32_t { kF32 = 0, kBf16 = 1, kE4M3 = 2 };
enum class KvScales : int32_t { kNone = 0, kPerTensor = 1, kPerTokenHead = 2 };

// One layer's pages (device pointers, strides in bytes, as kvrt_kv_layout). With V in the K row
// (MLA) v_base is k_base and the strides are K's.
struct PagedKv {
  const void* k_base = nullptr;
  const void* v_base = nullptr;
  int64_t k_page_stride = 0, k_token_stride = 0, k_head_stride = 0;
  int64_t v_page_stride = 0, v_token_stride = 0, v_head_stride = 0;
  KvDtype dtype = KvDtype::kBf16;
  KvScales scales = KvScales::kNone;
  float k_tensor_scale = 1, v_tensor_scale = 1;          // kPerTensor
  const float* k_scales = nullptr;                       // kPerTokenHead (device)
  const float* v_scales = nullptr;
  int64_t scale_page_stride = 0, scale_token_stride = 0, scale_head_stride = 0;
};

struct AttentionDims {
  int32_t q_heads = 0, kv_heads = 0;  // q_heads % kv_heads == 0
  int32_t qk_dim = 0, v_dim = 0;      // <= kMaxHeadDim
  float softmax_scale = 1;
};
inline constexpr int32_t kMaxHeadDim = 576;

// The batch, CSR as kvrt_attention_batch, in device memory.
struct DeviceBatch {
  const int32_t* qo_indptr = nullptr;         // [batch + 1]
  const int32_t* kv_page_indptr = nullptr;    // [batch + 1]
  const int32_t* kv_page_indices = nullptr;   // [nnz]
  const int32_t* kv_last_page_len = nullptr;  // [batch]
  int32_t batch_size = 0;
  int32_t total_rows = 0;  // qo_indptr[batch]
  int32_t page_size = 0;
  bool causal = true;
  // (ABI 1.4) A context-parallel shard (kvrt_attention_shard): the pages hold the sequence's
  // tokens whose run of shard_interleave positions has index shard_index modulo shard_count;
  // shard_kv_len [batch] (device) is each sequence's length over all shards. count 1: whole.
  int32_t shard_count = 1, shard_index = 0, shard_interleave = 1;
  const int32_t* shard_kv_len = nullptr;
};

// Workspace bytes for `total_rows` query rows split into at most `max_splits` chunks.
size_t paged_attention_workspace(int32_t total_rows, const AttentionDims& dims, int32_t max_splits);

// out[row][head][v_dim] (f32, rows out_row_stride floats apart) = softmax(q K^T * scale) V for
// every query row of the batch (q rows q_row_stride floats apart). Rows over more than
// `chunk_tokens` positions are split into at most max_splits chunks of whole pages (the chunk
// grows to fit), each a block of its own, then merged. With `lse` (device, rows lse_row_stride
// floats apart) each row's log-sum-exp per head, max + log(sum) of its scores (-inf, and a zero
// output, for a row that sees no token: possible in a shard).
cudaError_t paged_attention(const DeviceBatch& batch, const PagedKv& kv, const AttentionDims& dims,
                            const float* q, int64_t q_row_stride, float* out,
                            int64_t out_row_stride, int32_t chunk_tokens, int32_t max_splits,
                            void* workspace, size_t workspace_bytes, cudaStream_t stream,
                            float* lse = nullptr, int64_t lse_row_stride = 0);

}  // namespace kvrt::cuda
