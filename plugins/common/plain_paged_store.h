// The store both unscaled formats share: pages of K and V in one element type, bf16
// (kv_bf16_paged) or f32 (kv_f32_paged). Writes take f32 or bf16 input, converted (bf16 rounded
// to nearest even) or copied; gather() gives f32; the layout is what attention kernels read.
// On a CUDA device the pages are device memory and writes (f32 rows) run on the device.
#pragma once

#include <cstring>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kvrt/plugin.hpp"
#include "plugins/common/paged_pool.h"

namespace kvrt::plugins {

inline constexpr uint32_t kPlainInputDtypes =
    KVRT_DTYPE_BIT(KVRT_DTYPE_F32) | KVRT_DTYPE_BIT(KVRT_DTYPE_BF16);

// Dtype: KVRT_DTYPE_BF16 or KVRT_DTYPE_F32, the element stored.
template <kvrt_dtype Dtype>
class PlainPagedStore : public sdk::StoreBase {
  static_assert(Dtype == KVRT_DTYPE_BF16 || Dtype == KVRT_DTYPE_F32);
  static constexpr uint32_t kElemBytes = Dtype == KVRT_DTYPE_F32 ? 4 : 2;

 public:
  PlainPagedStore(const kvrt_host_api* host, const kvrt_kv_geometry& g, uint64_t num_pages,
                  sdk::ConfigView)
      : StoreBase(host, g, num_pages), pool_(host, g, num_pages, kElemBytes, false) {}

  static uint64_t page_bytes(const kvrt_host_api*, const kvrt_kv_geometry& g, sdk::ConfigView) {
    return PagedPool::page_bytes(g, kElemBytes, false);
  }

  kvrt_kv_info info() const {
    kvrt_kv_info info{};
    info.struct_size = sizeof(info);
    info.k_dtype = info.v_dtype = Dtype;
    info.scale_mode = KVRT_SCALE_NONE;
    info.bytes_per_page = pool_.bytes_per_page();
    info.bytes_per_token = info.bytes_per_page / geometry().page_size;
    info.num_pages = num_pages();
    return info;
  }

  // (ABI 1.3) Whole elements; gather() only reads, so it may run on several threads. The bound:
  // f32 holds its input exactly, bf16 within half an ulp (2^-8 of |x|).
  kvrt_kv_format format(uint32_t) const {
    kvrt_kv_format f{};
    f.struct_size = sizeof(f);
    f.capabilities = KVRT_KV_GATHER_THREAD_SAFE;
    f.k_bits = f.v_bits = kElemBytes * 8;
    f.bound_flags = KVRT_BOUND_ELEMENT;
    f.bound_element_relative = Dtype == KVRT_DTYPE_F32 ? 0.0f : 1.0f / 256;
    return f;
  }

  kvrt_kv_layout layout(uint32_t layer) const {
    kvrt_kv_layout l = pool_.layout(layer);
    l.k_dtype = l.v_dtype = Dtype;
    l.scale_mode = KVRT_SCALE_NONE;
    return l;
  }

  void write(const kvrt_kv_write* w) {
    check_write(w, kPlainInputDtypes);
    if (device::on_cuda(geometry())) {
      constexpr auto format =
          Dtype == KVRT_DTYPE_F32 ? device::Format::kF32 : device::Format::kBf16;
      device::write(*w, geometry(), format, w->k, w->k_token_stride, geometry().k_head_dim,
                    pool_.k_part(w->layer));
      if (geometry().v_head_dim != 0) {
        device::write(*w, geometry(), format, w->v, w->v_token_stride, geometry().v_head_dim,
                      pool_.v_part(w->layer));
      }
      return;
    }
    store_rows(w->k, w->k_token_stride, pool_.k(w->layer), geometry().k_head_dim, *w);
    if (geometry().v_head_dim != 0) {
      store_rows(w->v, w->v_token_stride, pool_.v(w->layer), geometry().v_head_dim, *w);
    }
  }

  void gather(uint32_t layer, uint32_t n, const int64_t* slots, float* k, float* v) const {
    load_rows(pool_.k(layer), geometry().k_head_dim, n, slots, k);
    if (geometry().v_head_dim != 0) load_rows(pool_.v(layer), geometry().v_head_dim, n, slots, v);
  }

 private:
  void store_rows(const void* src, int64_t stride, uint8_t* base, uint32_t dim,
                  const kvrt_kv_write& w) const {
    const size_t row = size_t{geometry().num_kv_heads} * dim;
    if (stride == 0) stride = static_cast<int64_t>(row);
    for (uint32_t i = 0; i < w.num_tokens; ++i) {
      uint8_t* out = base + w.slots[i] * row * kElemBytes;
      if (w.dtype == Dtype) {  // the stored type: copied
        std::memcpy(out, static_cast<const uint8_t*>(src) + i * stride * kElemBytes,
                    row * kElemBytes);
      } else if constexpr (Dtype == KVRT_DTYPE_BF16) {
        kernels::f32_to_bf16(static_cast<const float*>(src) + i * stride,
                             reinterpret_cast<uint16_t*>(out), row);
      } else {
        kernels::bf16_to_f32(static_cast<const uint16_t*>(src) + i * stride,
                             reinterpret_cast<float*>(out), row);
      }
    }
  }

  void load_rows(const uint8_t* base, uint32_t dim, uint32_t n, const int64_t* slots,
                 float* out) const {
    const size_t row = size_t{geometry().num_kv_heads} * dim;
    std::vector<uint8_t> copied;  // on a device: the slots' rows, copied to the host in order
    if (device::on_cuda(geometry())) {
      copied = device::rows_to_host(host(), base, row * kElemBytes, n, slots);
    }
    for (uint32_t i = 0; i < n; ++i) {
      const uint8_t* in = copied.empty() ? base + slots[i] * row * kElemBytes
                                         : copied.data() + i * row * kElemBytes;
      if constexpr (Dtype == KVRT_DTYPE_F32) {
        std::memcpy(out + i * row, in, row * 4);
      } else {
        kernels::bf16_to_f32(reinterpret_cast<const uint16_t*>(in), out + i * row, row);
      }
    }
  }

  PagedPool pool_;
};

// The plugin description of a PlainPagedStore<Dtype> store (no options).
template <kvrt_dtype Dtype>
kvrt_plugin_desc plain_store_desc(const char* name, const char* description) {
  return {sizeof(kvrt_plugin_desc),
          KVRT_ABI_MAJOR,
          KVRT_ABI_MINOR,
          KVRT_PLUGIN_KV_STORE,
          name,
          "0.1.0",
          description,
          &sdk::kv_store_table<PlainPagedStore<Dtype>>(),
          nullptr,
          0,
          kPlainInputDtypes,
          nullptr};
}

}  // namespace kvrt::plugins
