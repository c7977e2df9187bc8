// A deliberately wrong KV store: it stores bf16 rows correctly but publishes a wrong layout,
// the kind of mistake the conformance suite must catch. Option `bug`:
//   "page_stride" (default): the page stride is one token too long, so the layout reaches past
//                            the store's memory (kvrt refuses it when the store is created);
//   "aliased_pages":         the page strides are 0, so every page reads as page 0: each address
//                            stays inside the store's memory but most read the wrong values
//                            (only the conformance suite, kvrt --verify-plugins, sees it).
#include <string>
#include <cstring>

#include "kernels/cpu/convert.h"
#include "kvrt/plugin.hpp"
#include "plugins/common/paged_pool.h"

namespace {

class WrongStrideStore : public kvrt::sdk::StoreBase {
 public:
  WrongStrideStore(const kvrt_host_api* host, const kvrt_kv_geometry& g, uint64_t num_pages,
                   kvrt::sdk::ConfigView config)
      : StoreBase(host, g, num_pages),
        aliased_(config.string("bug", "page_stride") == "aliased_pages"),
        pool_(host, g, num_pages, 2, false) {}

  static uint64_t page_bytes(const kvrt_host_api*, const kvrt_kv_geometry& g,
                             kvrt::sdk::ConfigView) {
    return kvrt::plugins::PagedPool::page_bytes(g, 2, false);
  }
  kvrt_kv_info info() const {
    kvrt_kv_info info{};
    info.struct_size = sizeof(info);
    info.k_dtype = info.v_dtype = KVRT_DTYPE_BF16;
    info.bytes_per_page = pool_.bytes_per_page();
    info.bytes_per_token = info.bytes_per_page / geometry().page_size;
    info.num_pages = num_pages();
    return info;
  }
  kvrt_kv_layout layout(uint32_t layer) const {
    kvrt_kv_layout l = pool_.layout(layer);
    l.k_dtype = l.v_dtype = KVRT_DTYPE_BF16;
    if (aliased_) {
      l.k_page_stride = l.v_page_stride = 0;
      return l;
    }
    l.k_page_stride += l.k_token_stride;  // the bug
    l.v_page_stride += l.v_token_stride;
    return l;
  }
  void write(const kvrt_kv_write* w) {
    check_write(w, KVRT_DTYPE_BIT(KVRT_DTYPE_F32));
    copy_in(static_cast<const float*>(w->k), pool_.k(w->layer), geometry().k_head_dim, *w);
    if (geometry().v_head_dim) {
      copy_in(static_cast<const float*>(w->v), pool_.v(w->layer), geometry().v_head_dim, *w);
    }
  }
  void gather(uint32_t layer, uint32_t n, const int64_t* slots, float* k, float* v) const {
    copy_out(pool_.k(layer), geometry().k_head_dim, n, slots, k);
    if (geometry().v_head_dim) copy_out(pool_.v(layer), geometry().v_head_dim, n, slots, v);
  }

 private:
  void copy_in(const float* src, uint8_t* base, uint32_t dim, const kvrt_kv_write& w) const {
    const size_t row = size_t{geometry().num_kv_heads} * dim;
    for (uint32_t i = 0; i < w.num_tokens; ++i) {
      kvrt::kernels::f32_to_bf16(src + i * row,
                                 reinterpret_cast<uint16_t*>(base) + w.slots[i] * row, row);
    }
  }
  void copy_out(const uint8_t* base, uint32_t dim, uint32_t n, const int64_t* slots,
                float* out) const {
    const size_t row = size_t{geometry().num_kv_heads} * dim;
    for (uint32_t i = 0; i < n; ++i) {
      kvrt::kernels::bf16_to_f32(reinterpret_cast<const uint16_t*>(base) + slots[i] * row,
                                 out + i * row, row);
    }
  }
  bool aliased_;
  kvrt::plugins::PagedPool pool_;
};

const kvrt_option_desc kOptions[] = {
    {sizeof(kvrt_option_desc), KVRT_OPTION_STRING, "bug", "page_stride",
     "page_stride (the layout reaches outside the store) | aliased_pages (every page is page 0)"},
};

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc = {
      sizeof(kvrt_plugin_desc),
      KVRT_ABI_MAJOR,
      KVRT_ABI_MINOR,
      KVRT_PLUGIN_KV_STORE,
      "kv_wrong_stride",
      "0.0.1",
      "a deliberately wrong store (layout page stride off by one)",
      &kvrt::sdk::kv_store_table<WrongStrideStore>(),
      kOptions,
      1,
      KVRT_DTYPE_BIT(KVRT_DTYPE_F32),
      nullptr};
  return desc;
}

}  // namespace

KVRT_PLUGIN_ENTRY(describe)
