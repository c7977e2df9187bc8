// Device write paths of the paged KV stores: a step's new K or V rows (f32, in device memory)
// stored into their slots' pages, as kv_f32_paged, kv_bf16_paged and kv_fp8_e4m3 lay them out
// (kvrt_kv_layout's strides), with the CPU stores' exact encodings (kernels/shared/): bf16
// rounded to nearest even; E4M3 quantized on write with one scale per token and head (the
// row's abs-max / 448, computed on the device) or one scale for the tensor, saturating at 448.
// Host-callable launchers, stream-ordered; nothing allocates.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace kvrt::cuda {

// One of K or V of one layer, as the store's kvrt_kv_layout publishes it (device pointers,
// strides in bytes).
struct KvWriteTarget {
  void* base = nullptr;
  int64_t page_stride = 0, token_stride = 0, head_stride = 0;
  // E4M3 per token and head: where each row's scale goes; nullptr for one scale per tensor.
  float* scales = nullptr;
  int64_t scale_page_stride = 0, scale_token_stride = 0, scale_head_stride = 0;
  float tensor_scale = 1.0f;  // E4M3 per tensor: the stored value is code * tensor_scale
};

// Rows: token t's head h is `dim` floats at in + t * in_token_stride + h * dim, for `tokens`
// tokens (slots[t], device memory: page * page_size + offset) and `heads` heads.
cudaError_t write_f32(const float* in, int64_t in_token_stride, int32_t tokens, int32_t heads,
                      int32_t dim, const int64_t* slots, int32_t page_size,
                      const KvWriteTarget& target, cudaStream_t stream);
cudaError_t write_bf16(const float* in, int64_t in_token_stride, int32_t tokens, int32_t heads,
                       int32_t dim, const int64_t* slots, int32_t page_size,
                       const KvWriteTarget& target, cudaStream_t stream);
cudaError_t write_e4m3(const float* in, int64_t in_token_stride, int32_t tokens, int32_t heads,
                       int32_t dim, const int64_t* slots, int32_t page_size,
                       const KvWriteTarget& target, cudaStream_t stream);

}  // namespace kvrt::cuda
