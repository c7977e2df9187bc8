// The page pool the shipped stores share: one host->alloc'd block of exactly
// num_pages * page_bytes bytes, in device memory (host RAM on the CPU, the GPU's on CUDA).
// Per-token-head scales of every layer come first, so the floats stay 4-byte aligned whatever the
// element counts; then, per layer, K then V, page-major:
//   K scales [layer][num_pages][page_size][num_kv_heads] float, then V scales likewise
//   K [num_pages][page_size][num_kv_heads][k_head_dim]   (V likewise, absent when it shares K)
// so a slot's token row is contiguous and one page of one layer is a contiguous block per part.
#pragma once

#include <cstdint>

#include "kvrt/plugin.hpp"
#include "plugins/common/device_pages.h"

namespace kvrt::plugins {

class PagedPool {
 public:
  // elem_bytes: bytes per stored element; token_head_scales: one float per (token, head) for K
  // and V each.
  PagedPool(const kvrt_host_api* host, const kvrt_kv_geometry& g, uint64_t num_pages,
            uint32_t elem_bytes, bool token_head_scales)
      : g_(g), num_pages_(num_pages), elem_bytes_(elem_bytes), scales_(token_head_scales) {
    check_geometry(g);
    block_ = sdk::HostBuffer(host, KVRT_MEMORY_DEVICE,
                             num_pages * page_bytes(g, elem_bytes, token_head_scales),
                             "the KV page pool");
  }

  // Bytes of one page over all layers; what page_bytes() of the store returns.
  static uint64_t page_bytes(const kvrt_kv_geometry& g, uint32_t elem_bytes,
                             bool token_head_scales) {
    check_geometry(g);
    uint64_t per_token = uint64_t{g.num_kv_heads} * (g.k_head_dim + g.v_head_dim) * elem_bytes;
    if (token_head_scales) per_token += uint64_t{g.num_kv_heads} * (g.v_head_dim ? 2 : 1) * 4;
    return per_token * g.page_size * g.num_layers;
  }

  static void check_geometry(const kvrt_kv_geometry& g) {
    sdk::check_geometry(g);
    device::check_served(g);
  }

  // Bytes of each part of one page of one layer.
  uint64_t k_page_bytes() const { return uint64_t{g_.page_size} * k_token_bytes(); }
  uint64_t v_page_bytes() const { return uint64_t{g_.page_size} * v_token_bytes(); }
  uint64_t k_token_bytes() const { return uint64_t{g_.num_kv_heads} * g_.k_head_dim * elem_bytes_; }
  uint64_t v_token_bytes() const { return uint64_t{g_.num_kv_heads} * g_.v_head_dim * elem_bytes_; }

  float* k_scales(uint32_t layer) const {
    return reinterpret_cast<float*>(block_.data()) + layer * scales_per_layer();
  }
  float* v_scales(uint32_t layer) const {
    return g_.v_head_dim == 0 ? nullptr : k_scales(layer) + g_.num_layers * scales_per_layer();
  }
  uint8_t* k(uint32_t layer) const {
    return block_.data() + all_scale_bytes() +
           layer * num_pages_ * (k_page_bytes() + v_page_bytes());
  }
  uint8_t* v(uint32_t layer) const { return k(layer) + num_pages_ * k_page_bytes(); }

  // The layout with this pool's pointers and strides; the caller sets dtypes and scale mode
  // (and scale pointers for per-tensor scales).
  kvrt_kv_layout layout(uint32_t layer) const {
    kvrt_kv_layout l{};
    l.struct_size = sizeof(kvrt_kv_layout);
    l.num_kv_heads = g_.num_kv_heads;
    l.k_head_dim = g_.k_head_dim;
    l.v_head_dim = g_.v_head_dim;
    l.page_size = g_.page_size;
    l.num_pages = num_pages_;
    l.k_base = k(layer);
    l.k_page_stride = static_cast<int64_t>(k_page_bytes());
    l.k_token_stride = static_cast<int64_t>(k_token_bytes());
    l.k_head_stride = static_cast<int64_t>(g_.k_head_dim) * elem_bytes_;
    const bool shared = g_.v_head_dim == 0;
    l.v_base = shared ? l.k_base : v(layer);
    l.v_page_stride = shared ? l.k_page_stride : static_cast<int64_t>(v_page_bytes());
    l.v_token_stride = shared ? l.k_token_stride : static_cast<int64_t>(v_token_bytes());
    l.v_head_stride = shared ? l.k_head_stride : static_cast<int64_t>(g_.v_head_dim) * elem_bytes_;
    l.v_width = sdk::v_width(g_);
    l.v_offset = g_.v_offset;
    if (scales_) {
      l.k_scale = k_scales(layer);
      l.v_scale = shared ? l.k_scale : v_scales(layer);
      l.scale_head_stride = 4;
      l.scale_token_stride = 4 * static_cast<int64_t>(g_.num_kv_heads);
      l.scale_page_stride = l.scale_token_stride * g_.page_size;
    }
    return l;
  }

  // K's or V's pages of `layer` as the device write kernels take them.
  device::Part k_part(uint32_t layer) const {
    const kvrt_kv_layout l = layout(layer);
    return part(l.k_base, l.k_page_stride, l.k_token_stride, l.k_head_stride, l.k_scale, l);
  }
  device::Part v_part(uint32_t layer) const {
    const kvrt_kv_layout l = layout(layer);
    return part(l.v_base, l.v_page_stride, l.v_token_stride, l.v_head_stride, l.v_scale, l);
  }

  const kvrt_kv_geometry& geometry() const { return g_; }
  uint64_t num_pages() const { return num_pages_; }
  uint64_t bytes_per_page() const { return page_bytes(g_, elem_bytes_, scales_); }

 private:
  static device::Part part(void* base, int64_t page_stride, int64_t token_stride,
                           int64_t head_stride, float* scales, const kvrt_kv_layout& l) {
    device::Part p;
    p.base = base;
    p.page_stride = page_stride;
    p.token_stride = token_stride;
    p.head_stride = head_stride;
    p.scales = scales;  // null without per-token-head scales
    p.scale_page_stride = l.scale_page_stride;
    p.scale_token_stride = l.scale_token_stride;
    p.scale_head_stride = l.scale_head_stride;
    return p;
  }
  uint64_t scales_per_layer() const {
    return scales_ ? num_pages_ * g_.page_size * g_.num_kv_heads : 0;
  }
  uint64_t all_scale_bytes() const {
    return 4 * scales_per_layer() * g_.num_layers * (g_.v_head_dim ? 2 : 1);
  }

  kvrt_kv_geometry g_;
  uint64_t num_pages_;
  uint32_t elem_bytes_;
  bool scales_;
  sdk::HostBuffer block_;
};

}  // namespace kvrt::plugins
