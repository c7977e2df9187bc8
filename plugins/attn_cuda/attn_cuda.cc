// attn_cuda: paged attention on a CUDA device over the pages a KV store publishes in device
// memory (kernels/cuda/paged_attention.h).
//
// Reads f32, bf16 and FP8 E4M3 pages with no scale, a per-tensor scale or per-token-head scales
// (the shipped stores' formats), GQA, head dims up to 576 (an MLA latent, V its first v_width
// values), page sizes 1-128. Any other layout is declined in supports() with the reason; the
// core then refuses the pairing (a store's gather() gives host memory, which a GPU kernel
// cannot read at speed, so there is no slow path here).
//
// plan() is FlashInfer's: it runs on the host between steps, checks the batch, packs its CSR
// into the caller's (host) workspace and copies it to this handle's device buffer, growing that
// buffer (through the host's accounted alloc) when a batch needs more. run() only launches on
// the caller's stream: it never allocates or synchronises, so a CUDA graph can capture it.
// Rows over more than decode_chunk_tokens positions are split into chunks of whole pages
// (flash-decoding), at most max_splits of them, and merged.
// Context parallelism (ABI 1.4): plan_sharded() plans a shard of each sequence (its whole
// lengths go to the device with the page tables) and run_lse() also writes each row's
// log-sum-exp per head, into device memory beside `out`.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>

#include "kernels/cuda/paged_attention.h"
#include "kernels/cuda/pointer.h"
#include "kernels/shared/paged_attention.h"
#include "kvrt/plugin.hpp"

namespace kvrt::plugins {
namespace {

constexpr uint32_t kQDtypes = KVRT_DTYPE_BIT(KVRT_DTYPE_F32);
constexpr uint32_t kMaxPageSize = 128;
constexpr int64_t kDefaultChunkTokens = 256;
constexpr int64_t kDefaultMaxSplits = 64;
constexpr uint64_t kAlign = 256;  // cudaMalloc's alignment, kept for each part of the buffer
// The most the splits' partial states may take (each row's max, sum and output per split).
constexpr int64_t kMaxPartialBytes = int64_t{256} << 20;

uint64_t align_up(uint64_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

std::string cuda_error(cudaError_t e) {
  return std::string(cudaGetErrorName(e)) + ": " + cudaGetErrorString(e);
}

// The batch's CSR, packed: qo_indptr [b + 1], kv_page_indptr [b + 1], kv_last_page_len [b],
// a shard's whole lengths [b], kv_page_indices [nnz], each part starting on kAlign.
struct Packed {
  uint64_t qo = 0, kv_indptr = 0, last_len = 0, kv_len = 0, indices = 0, bytes = 0;
  static Packed of(uint32_t batch, int64_t nnz) {
    Packed p;
    p.kv_indptr = p.qo + align_up(4 * (uint64_t{batch} + 1));
    p.last_len = p.kv_indptr + align_up(4 * (uint64_t{batch} + 1));
    p.kv_len = p.last_len + align_up(4 * uint64_t{batch});
    p.indices = p.kv_len + align_up(4 * uint64_t{batch});
    p.bytes = p.indices + align_up(4 * static_cast<uint64_t>(nnz));
    return p;
  }
};

class CudaAttention : public sdk::AttentionBase {
 public:
  CudaAttention(const kvrt_host_api* host, const kvrt_attention_params& p, sdk::ConfigView config)
      : AttentionBase(host, p) {
    if (p.device.kind != KVRT_DEVICE_CUDA) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, "attn_cuda serves CUDA devices only");
    }
    check_device(p.device.ordinal);
    if (p.num_q_heads == 0 || p.num_kv_heads == 0 || p.num_q_heads % p.num_kv_heads != 0) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "num_q_heads " + std::to_string(p.num_q_heads) +
                                               " must be a positive multiple of num_kv_heads " +
                                               std::to_string(p.num_kv_heads));
    }
    v_dim_ = p.v_head_dim == 0 ? p.qk_head_dim : p.v_head_dim;
    check_dim("qk_head_dim", p.qk_head_dim);
    check_dim("v_head_dim", v_dim_);
    if (!std::isfinite(p.softmax_scale)) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "softmax_scale is not finite");
    }
    chunk_tokens_ = config.integer("decode_chunk_tokens", kDefaultChunkTokens);
    if (chunk_tokens_ < 1 || chunk_tokens_ > (int64_t{1} << 30)) {
      sdk::fail(KVRT_ERR_CONFIG,
                "decode_chunk_tokens: expected 1 .. 2^30, found " + std::to_string(chunk_tokens_));
    }
    max_splits_ = config.integer("max_splits", kDefaultMaxSplits);
    if (max_splits_ < 1 || max_splits_ > 65535) {  // the grid's z dimension
      sdk::fail(KVRT_ERR_CONFIG,
                "max_splits: expected 1 .. 65535, found " + std::to_string(max_splits_));
    }
    dims_.q_heads = static_cast<int32_t>(p.num_q_heads);
    dims_.kv_heads = static_cast<int32_t>(p.num_kv_heads);
    dims_.qk_dim = static_cast<int32_t>(p.qk_head_dim);
    dims_.v_dim = static_cast<int32_t>(v_dim_);
    dims_.softmax_scale = p.softmax_scale;
  }

  ~CudaAttention() override { release(); }

  void supports(const kvrt_kv_layout& l) const {
    if (std::string why = unreadable(l); !why.empty()) sdk::fail(KVRT_ERR_UNSUPPORTED, why);
  }

  uint64_t workspace_size(const kvrt_attention_batch& batch) const {
    return Packed::of(batch.batch_size, nnz(batch)).bytes + kAlign;
  }

  void plan(const kvrt_attention_batch& batch, void* workspace, uint64_t workspace_bytes) {
    plan_sharded(batch, sdk::Shard{}, workspace, workspace_bytes);
  }

  void plan_sharded(const kvrt_attention_batch& batch, const sdk::Shard& shard, void* workspace,
                    uint64_t workspace_bytes) {
    planned_ = false;
    const Shape shape = check(batch, shard);
    const Packed packed = Packed::of(batch.batch_size, shape.nnz);
    if (workspace == nullptr) sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "workspace is NULL");
    if (workspace_bytes < packed.bytes + kAlign) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "workspace of " + std::to_string(workspace_bytes) +
                                               " bytes is smaller than workspace_size() = " +
                                               std::to_string(packed.bytes + kAlign));
    }
    const uint32_t b = batch.batch_size;
    if (b == 0) {  // nothing to attend to (its arrays may be NULL): run() returns at once
      batch_ = {};
      max_page_ = -1;
      planned_ = true;
      return;
    }
    auto* staging = reinterpret_cast<uint8_t*>(align_up(reinterpret_cast<uintptr_t>(workspace)));
    auto put = [&](uint64_t offset, const int32_t* from, uint64_t count) {
      if (count > 0) std::memcpy(staging + offset, from, 4 * count);
    };
    put(packed.qo, batch.qo_indptr, b + 1);
    put(packed.kv_indptr, batch.kv_page_indptr, b + 1);
    put(packed.last_len, batch.kv_last_page_len, b);
    if (shard.count > 1) put(packed.kv_len, shard.kv_len, b);
    if (shape.nnz > 0) {
      put(packed.indices, batch.kv_page_indices + batch.kv_page_indptr[0],
          static_cast<uint64_t>(shape.nnz));
    }
    // The kernels index kv_page_indices from kv_page_indptr's values: rebase them to 0.
    auto* indptr = reinterpret_cast<int32_t*>(staging + packed.kv_indptr);
    const int32_t first = indptr[0];
    for (uint32_t s = 0; s <= b; ++s) indptr[s] -= first;

    // Every row gets room for the same number of splits, so a batch of many rows (a long
    // prefill) splits less: its rows are parallel enough already, and the partial states stay
    // within kMaxPartialBytes.
    const int64_t per_split = std::max<int64_t>(
        1, static_cast<int64_t>(cuda::paged_attention_workspace(shape.total_rows, dims_, 2) / 2));
    const int64_t affordable = std::max<int64_t>(1, kMaxPartialBytes / per_split);
    splits_ = static_cast<int32_t>(std::min(
        {max_splits_, affordable,
         kernels::shared::split_count(
             shape.max_kv_len, kernels::shared::split_chunk(chunk_tokens_, batch.page_size))}));
    partial_bytes_ = cuda::paged_attention_workspace(shape.total_rows, dims_, splits_);
    reserve(packed.bytes + align_up(partial_bytes_));
    // Between steps: the core waits for each rank's stream at the end of a step
    // (Backend::end_step), so no kernel still reads the buffer this overwrites.
    if (kvrt_status s = host()->copy(host(), device_, KVRT_MEMORY_DEVICE, staging, KVRT_MEMORY_HOST,
                                     packed.bytes);
        s != KVRT_OK) {
      sdk::fail(s, "copying the batch's page tables to the device");
    }
    batch_ = {};
    auto* d = static_cast<uint8_t*>(device_);
    batch_.qo_indptr = reinterpret_cast<const int32_t*>(d + packed.qo);
    batch_.kv_page_indptr = reinterpret_cast<const int32_t*>(d + packed.kv_indptr);
    batch_.kv_last_page_len = reinterpret_cast<const int32_t*>(d + packed.last_len);
    batch_.kv_page_indices = reinterpret_cast<const int32_t*>(d + packed.indices);
    batch_.batch_size = static_cast<int32_t>(b);
    batch_.total_rows = shape.total_rows;
    batch_.page_size = static_cast<int32_t>(batch.page_size);
    batch_.causal = batch.causal != 0;
    batch_.shard_count = static_cast<int32_t>(shard.count);
    batch_.shard_index = static_cast<int32_t>(shard.index);
    batch_.shard_interleave = static_cast<int32_t>(shard.interleave);
    batch_.shard_kv_len =
        shard.count > 1 ? reinterpret_cast<const int32_t*>(d + packed.kv_len) : nullptr;
    partial_ = d + packed.bytes;
    max_page_ = shape.max_page;
    planned_ = true;
  }

  void run(const kvrt_attention_run_args& a) { run_lse(a, nullptr, 0); }

  // lse null: run() alone.
  void run_lse(const kvrt_attention_run_args& a, float* lse, int64_t lse_row_stride) {
    if (!planned_) sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "run() without a successful plan()");
    if (a.q_dtype != KVRT_DTYPE_F32 || a.out_dtype != KVRT_DTYPE_F32) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, std::string("attn_cuda takes f32 q and out, found ") +
                                          sdk::dtype_name(a.q_dtype) + " and " +
                                          sdk::dtype_name(a.out_dtype));
    }
    const kvrt_kv_layout& l = *a.layout;
    if (std::string why = unreadable(l); !why.empty()) sdk::fail(KVRT_ERR_UNSUPPORTED, why);
    if (max_page_ >= 0 && static_cast<uint64_t>(max_page_) >= l.num_pages) {
      sdk::fail(KVRT_ERR_OUT_OF_RANGE, "page id " + std::to_string(max_page_) +
                                           " outside the store's " + std::to_string(l.num_pages) +
                                           " pages");
    }
    if (batch_.total_rows == 0) return;
    if (a.q == nullptr || a.out == nullptr) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "q and out must not be NULL");
    }
    const int64_t q_stride =
        a.q_row_stride != 0 ? a.q_row_stride : int64_t{dims_.q_heads} * dims_.qk_dim;
    const int64_t out_stride =
        a.out_row_stride != 0 ? a.out_row_stride : int64_t{dims_.q_heads} * dims_.v_dim;
    if (lse != nullptr && !cuda::is_device_memory(lse)) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "lse must be in CUDA device memory, as out is");
    }
    if (lse != nullptr && lse_row_stride != 0 && lse_row_stride < dims_.q_heads) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "lse_row_stride is shorter than a row's heads");
    }
    const cudaError_t e = cuda::paged_attention(
        batch_, paged_kv(l), dims_, static_cast<const float*>(a.q), q_stride,
        static_cast<float*>(a.out), out_stride, static_cast<int32_t>(chunk_tokens_), splits_,
        partial_, partial_bytes_, static_cast<cudaStream_t>(a.stream), lse, lse_row_stride);
    if (e != cudaSuccess) sdk::fail(KVRT_ERR_INTERNAL, "paged attention launch: " + cuda_error(e));
  }

 private:
  struct Shape {
    int64_t nnz = 0;
    int32_t total_rows = 0;
    int64_t max_kv_len = 0;
    int64_t max_page = -1;
  };

  static void check_device(int32_t ordinal) {
    int count = 0;
    if (cudaError_t e = cudaGetDeviceCount(&count); e != cudaSuccess) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, "no CUDA device: " + cuda_error(e));
    }
    if (count == 0) sdk::fail(KVRT_ERR_UNSUPPORTED, "no CUDA device on this machine");
    if (ordinal < 0 || ordinal >= count) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, "CUDA device " + std::to_string(ordinal) + " not found (" +
                                          std::to_string(count) + " present)");
    }
  }

  static void check_dim(const char* name, uint32_t dim) {
    if (dim == 0 || dim > static_cast<uint32_t>(cuda::kMaxHeadDim)) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, std::string(name) + " " + std::to_string(dim) +
                                          " not served: attn_cuda takes 1.." +
                                          std::to_string(cuda::kMaxHeadDim));
    }
  }

  static int64_t nnz(const kvrt_attention_batch& b) {
    if (b.batch_size == 0 || b.kv_page_indptr == nullptr) return 0;
    return std::max<int64_t>(0, int64_t{b.kv_page_indptr[b.batch_size]} - b.kv_page_indptr[0]);
  }

  // The batch's sizes, after the SDK's checks of every sequence (a bad batch must not reach a
  // kernel, where it would read outside the pages) and this kernel's own limits.
  Shape check(const kvrt_attention_batch& b, const sdk::Shard& shard) const {
    if (b.page_size == 0 || b.page_size > kMaxPageSize) {
      sdk::fail(KVRT_ERR_UNSUPPORTED, "batch.page_size " + std::to_string(b.page_size) +
                                          " not served: attn_cuda takes 1.." +
                                          std::to_string(kMaxPageSize));
    }
    Shape shape;
    sdk::check_batch(b, shard, [&](const sdk::BatchSequence& seq) {
      for (int32_t p = seq.page_begin; p < seq.page_begin + seq.pages; ++p) {
        shape.max_page = std::max<int64_t>(shape.max_page, b.kv_page_indices[p]);
      }
      shape.max_kv_len = std::max<int64_t>(shape.max_kv_len, seq.kv_len);
    });
    if (b.batch_size == 0) return shape;
    // The kernels find a row's sequence by its index into qo_indptr.
    if (b.qo_indptr[0] != 0) {
      sdk::fail(KVRT_ERR_INVALID_ARGUMENT, "batch.qo_indptr[0] must be 0");
    }
    shape.nnz = nnz(b);
    shape.total_rows = b.qo_indptr[b.batch_size];
    return shape;
  }

  // Why this handle cannot read `l` natively, or "" when it can.
  std::string unreadable(const kvrt_kv_layout& l) const {
    const kvrt_attention_params& p = params();
    auto differs = [](const char* field, uint64_t got, uint64_t want) {
      return std::string("layout.") + field + " is " + std::to_string(got) +
             ", this attention was created for " + std::to_string(want);
    };
    if (l.num_kv_heads != p.num_kv_heads) {
      return differs("num_kv_heads", l.num_kv_heads, p.num_kv_heads);
    }
    if (l.k_head_dim != p.qk_head_dim) return differs("k_head_dim", l.k_head_dim, p.qk_head_dim);
    const uint32_t width =
        l.v_width != 0 ? l.v_width : (l.v_head_dim != 0 ? l.v_head_dim : l.k_head_dim);
    if (width != v_dim_) return differs("v_width", width, v_dim_);
    if (l.v_head_dim != 0 && l.v_offset != 0) return differs("v_offset", l.v_offset, 0);
    if (l.v_head_dim == 0 && uint64_t{l.v_offset} + width > l.k_head_dim) {
      return "layout.v_offset " + std::to_string(l.v_offset) + " + v_width " +
             std::to_string(width) + " exceeds k_head_dim " + std::to_string(l.k_head_dim);
    }
    if (l.page_size == 0 || l.page_size > kMaxPageSize) {
      return "layout.page_size " + std::to_string(l.page_size) +
             " not served: attn_cuda takes 1.." + std::to_string(kMaxPageSize);
    }
    if (l.k_dtype != l.v_dtype || element_bytes(l.k_dtype) == 0) {
      return std::string("attn_cuda reads f32, bf16 and fp8_e4m3 pages with K and V alike, not ") +
             sdk::dtype_name(l.k_dtype) + " / " + sdk::dtype_name(l.v_dtype);
    }
    if (l.scale_mode != KVRT_SCALE_NONE && l.k_dtype != KVRT_DTYPE_FP8_E4M3) {
      return "scales are read with fp8_e4m3 pages only";
    }
    if (l.scale_mode != KVRT_SCALE_NONE && l.scale_mode != KVRT_SCALE_PER_TENSOR &&
        l.scale_mode != KVRT_SCALE_PER_TOKEN_HEAD) {
      return "scale mode " + std::to_string(l.scale_mode) + " not served";
    }
    if (l.scale_mode != KVRT_SCALE_NONE && (l.k_scale == nullptr || l.v_scale == nullptr)) {
      return "the layout's scale pointers are NULL";
    }
    if (!cuda::is_device_memory(l.k_base) || !cuda::is_device_memory(l.v_base) ||
        (l.scale_mode != KVRT_SCALE_NONE &&
         (!cuda::is_device_memory(l.k_scale) || !cuda::is_device_memory(l.v_scale)))) {
      return "attn_cuda reads pages in CUDA device memory only; this store's are in host memory";
    }
    return "";
  }

  static uint32_t element_bytes(kvrt_dtype d) {
    return d == KVRT_DTYPE_F32 ? 4 : d == KVRT_DTYPE_BF16 ? 2 : d == KVRT_DTYPE_FP8_E4M3 ? 1 : 0;
  }

  // The kernels' view of a layout. V inside the K row (an MLA latent) starts v_offset elements
  // in, with K's strides; a per-tensor scale is read as a per-token-head one with zero strides,
  // since it lives in device memory where the host cannot read it.
  cuda::PagedKv paged_kv(const kvrt_kv_layout& l) const {
    const uint32_t elem = element_bytes(l.k_dtype);
    cuda::PagedKv kv;
    kv.k_base = l.k_base;
    kv.k_page_stride = l.k_page_stride;
    kv.k_token_stride = l.k_token_stride;
    kv.k_head_stride = l.k_head_stride;
    if (l.v_head_dim == 0) {
      kv.v_base = static_cast<const uint8_t*>(l.k_base) + uint64_t{l.v_offset} * elem;
      kv.v_page_stride = l.k_page_stride;
      kv.v_token_stride = l.k_token_stride;
      kv.v_head_stride = l.k_head_stride;
    } else {
      kv.v_base = l.v_base;
      kv.v_page_stride = l.v_page_stride;
      kv.v_token_stride = l.v_token_stride;
      kv.v_head_stride = l.v_head_stride;
    }
    kv.dtype = l.k_dtype == KVRT_DTYPE_F32    ? cuda::KvDtype::kF32
               : l.k_dtype == KVRT_DTYPE_BF16 ? cuda::KvDtype::kBf16
                                              : cuda::KvDtype::kE4M3;
    if (l.scale_mode != KVRT_SCALE_NONE) {
      kv.scales = cuda::KvScales::kPerTokenHead;
      kv.k_scales = l.k_scale;
      kv.v_scales = l.v_scale;
      if (l.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD) {
        kv.scale_page_stride = l.scale_page_stride;
        kv.scale_token_stride = l.scale_token_stride;
        kv.scale_head_stride = l.scale_head_stride;
      }
    }
    return kv;
  }

  // The device buffer holds at least `bytes` afterwards; it grows by half again so a batch
  // that creeps up does not reallocate every step.
  void reserve(uint64_t bytes) {
    if (bytes <= device_bytes_) return;
    const uint64_t grown = std::max(bytes, device_bytes_ + device_bytes_ / 2);
    release();
    void* p = nullptr;
    if (kvrt_status s = host()->alloc(host(), KVRT_MEMORY_DEVICE, grown, kAlign, &p);
        s != KVRT_OK) {
      sdk::fail(s, "cannot allocate " + std::to_string(grown) +
                       " bytes of device memory for the attention plan");
    }
    device_ = p;
    device_bytes_ = grown;
  }

  void release() {
    if (device_ != nullptr) host()->free(host(), KVRT_MEMORY_DEVICE, device_, device_bytes_);
    device_ = nullptr;
    device_bytes_ = 0;
  }

  uint32_t v_dim_ = 0;
  int64_t chunk_tokens_ = kDefaultChunkTokens;
  int64_t max_splits_ = kDefaultMaxSplits;
  cuda::AttentionDims dims_;
  // The last successful plan: the batch in device memory and the splits' partial states.
  bool planned_ = false;
  cuda::DeviceBatch batch_;
  int32_t splits_ = 1;
  void* partial_ = nullptr;
  size_t partial_bytes_ = 0;
  int64_t max_page_ = -1;
  void* device_ = nullptr;
  uint64_t device_bytes_ = 0;
};

const kvrt_option_desc kOptions[] = {
    {sizeof(kvrt_option_desc), KVRT_OPTION_INT, "decode_chunk_tokens", "256",
     "rows over more KV tokens than this are split into chunks of whole pages (flash-decoding)"},
    {sizeof(kvrt_option_desc), KVRT_OPTION_INT, "max_splits", "64",
     "the most chunks one row is split into (the chunk grows to fit)"},
};

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc = {
      sizeof(kvrt_plugin_desc),
      KVRT_ABI_MAJOR,
      KVRT_ABI_MINOR,
      KVRT_PLUGIN_ATTENTION,
      "attn_cuda",
      "0.1.0",
      "CUDA paged attention: f32/bf16/fp8 KV pages in device memory, GQA, MLA latents",
      &sdk::attention_table<CudaAttention>(),
      kOptions,
      2,
      kQDtypes,
      nullptr};  // no probe: `kvrt plugins` lists it on any machine; create() refuses a CPU
  return desc;
}

}  // namespace
}  // namespace kvrt::plugins

KVRT_PLUGIN_ENTRY(kvrt::plugins::describe)
