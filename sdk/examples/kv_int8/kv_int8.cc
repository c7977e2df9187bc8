// kv_int8: an example KV store written against the kvrt SDK alone. Symmetric int8 with one
// float scale per token and KV head (amax / 127), so a token costs about half of bf16.
// Layout per layer: K codes [pages][page_size][heads][k_dim], then V codes, then K scales
// [pages][page_size][heads], then V scales.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "kvrt/plugin.hpp"

namespace {

using kvrt::sdk::fail;

float bf16_to_float(uint16_t b) {
  uint32_t bits = uint32_t{b} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

class Int8Store : public kvrt::sdk::StoreBase {
 public:
  Int8Store(const kvrt_host_api* host, const kvrt_kv_geometry& g, uint64_t num_pages,
            kvrt::sdk::ConfigView config)
      : StoreBase(host, g, num_pages),
        memory_(host, KVRT_MEMORY_DEVICE, num_pages * page_bytes(host, g, config), "int8 pages") {}

  static uint64_t page_bytes(const kvrt_host_api*, const kvrt_kv_geometry& g,
                             kvrt::sdk::ConfigView) {
    kvrt::sdk::check_geometry(g);
    const uint64_t parts = g.v_head_dim ? 2 : 1;
    return uint64_t{g.num_layers} * g.page_size * g.num_kv_heads *
           (g.k_head_dim + g.v_head_dim + parts * sizeof(float));
  }

  kvrt_kv_info info() const {
    kvrt_kv_info info{};
    info.struct_size = sizeof(info);
    info.k_dtype = info.v_dtype = KVRT_DTYPE_INT8;
    info.scale_mode = KVRT_SCALE_PER_TOKEN_HEAD;
    info.bytes_per_page = memory_.size() / num_pages();
    info.bytes_per_token = info.bytes_per_page / geometry().page_size;
    info.num_pages = num_pages();
    return info;
  }

  // Per layer: K codes [slot][head][k_head_dim], V codes likewise, then the K and V scales
  // [slot][head] (kvrt::sdk::slot_major_layout gives the strides).
  kvrt_kv_layout layout(uint32_t layer) const {
    const kvrt_kv_geometry& g = geometry();
    return kvrt::sdk::slot_major_layout(
        g, num_pages(),
        {KVRT_DTYPE_INT8, KVRT_SCALE_PER_TOKEN_HEAD, k_codes(layer), g.k_head_dim, v_codes(layer),
         g.v_head_dim, k_scales(layer), v_scales(layer)});
  }

  void write(const kvrt_kv_write* w) {
    check_write(w, KVRT_DTYPE_BIT(KVRT_DTYPE_F32) | KVRT_DTYPE_BIT(KVRT_DTYPE_BF16));
    const kvrt_kv_geometry& g = geometry();
    quantize(*w, w->k, w->k_token_stride, g.k_head_dim, k_codes(w->layer), k_scales(w->layer));
    if (g.v_head_dim) {
      quantize(*w, w->v, w->v_token_stride, g.v_head_dim, v_codes(w->layer), v_scales(w->layer));
    }
  }

  void gather(uint32_t layer, uint32_t n, const int64_t* slots, float* k, float* v) const {
    const kvrt_kv_geometry& g = geometry();
    dequantize(k_codes(layer), k_scales(layer), g.k_head_dim, n, slots, k);
    if (g.v_head_dim) dequantize(v_codes(layer), v_scales(layer), g.v_head_dim, n, slots, v);
  }

 private:
  uint64_t tokens() const { return num_pages() * geometry().page_size; }
  uint64_t layer_bytes() const { return memory_.size() / geometry().num_layers; }
  int8_t* k_codes(uint32_t layer) const {
    return reinterpret_cast<int8_t*>(memory_.data() + layer * layer_bytes());
  }
  int8_t* v_codes(uint32_t layer) const {
    return k_codes(layer) + tokens() * geometry().num_kv_heads * geometry().k_head_dim;
  }
  float* k_scales(uint32_t layer) const {
    return reinterpret_cast<float*>(v_codes(layer) +
                                    tokens() * geometry().num_kv_heads * geometry().v_head_dim);
  }
  float* v_scales(uint32_t layer) const {
    return k_scales(layer) + tokens() * geometry().num_kv_heads;
  }

  void quantize(const kvrt_kv_write& w, const void* src, int64_t stride, uint32_t dim,
                int8_t* codes, float* scales) const {
    const uint32_t heads = geometry().num_kv_heads;
    if (stride == 0) stride = int64_t{heads} * dim;
    float row[4096];
    if (dim > 4096) fail(KVRT_ERR_UNSUPPORTED, "head dim above 4096");
    for (uint32_t i = 0; i < w.num_tokens; ++i) {
      for (uint32_t h = 0; h < heads; ++h) {
        const int64_t at = i * stride + int64_t{h} * dim;
        for (uint32_t d = 0; d < dim; ++d) {
          row[d] = w.dtype == KVRT_DTYPE_F32
                       ? static_cast<const float*>(src)[at + d]
                       : bf16_to_float(static_cast<const uint16_t*>(src)[at + d]);
        }
        float amax = 0;
        for (uint32_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(row[d]));
        const float scale = amax > 0 ? amax / 127.0f : 1.0f;
        int8_t* out = codes + (w.slots[i] * heads + h) * dim;
        for (uint32_t d = 0; d < dim; ++d) {
          out[d] = static_cast<int8_t>(std::clamp(std::nearbyint(row[d] / scale), -127.0f, 127.0f));
        }
        scales[w.slots[i] * heads + h] = scale;
      }
    }
  }

  void dequantize(const int8_t* codes, const float* scales, uint32_t dim, uint32_t n,
                  const int64_t* slots, float* out) const {
    const uint32_t heads = geometry().num_kv_heads;
    for (uint32_t i = 0; i < n; ++i) {
      for (uint32_t h = 0; h < heads; ++h) {
        const float scale = scales[slots[i] * heads + h];
        const int8_t* in = codes + (slots[i] * heads + h) * dim;
        for (uint32_t d = 0; d < dim; ++d) out[(i * heads + h) * dim + d] = in[d] * scale;
      }
    }
  }

  kvrt::sdk::HostBuffer memory_;
};

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc = {
      sizeof(kvrt_plugin_desc),
      KVRT_ABI_MAJOR,
      KVRT_ABI_MINOR,
      KVRT_PLUGIN_KV_STORE,
      "kv_int8",
      "0.1.0",
      "example: symmetric int8 K/V with per-token-head scales",
      &kvrt::sdk::kv_store_table<Int8Store>(),
      nullptr,
      0,
      KVRT_DTYPE_BIT(KVRT_DTYPE_F32) | KVRT_DTYPE_BIT(KVRT_DTYPE_BF16),
      nullptr};
  return desc;
}

}  // namespace

KVRT_PLUGIN_ENTRY(describe)
