// kv_bf16_paged: pages of bf16 K and V. Writes take f32 (rounded to nearest even) or bf16
// (copied); the layout is what attention kernels read directly.
#include <cstring>

#include "kernels/cpu/convert.h"
#include "kvrt/plugin.hpp"
#include "plugins/common/paged_pool.h"

namespace kvrt::plugins {
namespace {

constexpr uint32_t kInputDtypes = KVRT_DTYPE_BIT(KVRT_DTYPE_F32) | KVRT_DTYPE_BIT(KVRT_DTYPE_BF16);

class Bf16PagedStore : public sdk::StoreBase {
 public:
  Bf16PagedStore(const kvrt_host_api* host, const kvrt_kv_geometry& g, uint64_t num_pages,
                 sdk::ConfigView)
      : StoreBase(host, g, num_pages), pool_(host, g, num_pages, 2, false) {}

  static uint64_t page_bytes(const kvrt_host_api*, const kvrt_kv_geometry& g, sdk::ConfigView) {
    return PagedPool::page_bytes(g, 2, false);
  }

  kvrt_kv_info info() const {
    kvrt_kv_info info{};
    info.struct_size = sizeof(info);
    info.k_dtype = info.v_dtype = KVRT_DTYPE_BF16;
    info.scale_mode = KVRT_SCALE_NONE;
    info.bytes_per_page = pool_.bytes_per_page();
    info.bytes_per_token = info.bytes_per_page / geometry().page_size;
    info.num_pages = num_pages();
    return info;
  }

  kvrt_kv_layout layout(uint32_t layer) const {
    kvrt_kv_layout l = pool_.layout(layer);
    l.k_dtype = l.v_dtype = KVRT_DTYPE_BF16;
    l.scale_mode = KVRT_SCALE_NONE;
    return l;
  }

  void write(const kvrt_kv_write* w) {
    check_write(w, kInputDtypes);
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
    auto* dst = reinterpret_cast<uint16_t*>(base);
    for (uint32_t i = 0; i < w.num_tokens; ++i) {
      uint16_t* out = dst + w.slots[i] * row;
      if (w.dtype == KVRT_DTYPE_F32) {
        kernels::f32_to_bf16(static_cast<const float*>(src) + i * stride, out, row);
      } else {
        std::memcpy(out, static_cast<const uint16_t*>(src) + i * stride, row * 2);
      }
    }
  }

  void load_rows(const uint8_t* base, uint32_t dim, uint32_t n, const int64_t* slots,
                 float* out) const {
    const size_t row = size_t{geometry().num_kv_heads} * dim;
    const auto* src = reinterpret_cast<const uint16_t*>(base);
    for (uint32_t i = 0; i < n; ++i) kernels::bf16_to_f32(src + slots[i] * row, out + i * row, row);
  }

  PagedPool pool_;
};

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc = {sizeof(kvrt_plugin_desc),
                                        KVRT_ABI_MAJOR,
                                        KVRT_ABI_MINOR,
                                        KVRT_PLUGIN_KV_STORE,
                                        "kv_bf16_paged",
                                        "0.1.0",
                                        "paged bf16 K/V; the reference store",
                                        &sdk::kv_store_table<Bf16PagedStore>(),
                                        nullptr,
                                        0,
                                        kInputDtypes,
                                        nullptr};
  return desc;
}

}  // namespace
}  // namespace kvrt::plugins

KVRT_PLUGIN_ENTRY(kvrt::plugins::describe)
