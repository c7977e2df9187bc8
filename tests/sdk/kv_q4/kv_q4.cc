// kv_q4: a 4-bit KV store of its own format, as a user would write one out of tree: each head
// row rotated by a block Walsh-Hadamard transform (blocks of 8), then symmetric codes -7..7 with
// a scale amax / 7 per token and head. A vendor dtype: the conformance suite can read it only
// through gather(). Built once correct and once per planted value bug, so the suite's value
// checks are shown to catch each kind (tests/sdk/kv_q4/CMakeLists.txt against an installed SDK,
// tests/plugins/CMakeLists.txt in tree, under the sanitizers):
//   PLANTED_NONE          correct
//   PLANTED_NIBBLE_TWICE  gather decodes the low nibble for both elements of a byte
//   PLANTED_SCALE_25      gather multiplies by a scale 25% too large
//   PLANTED_ONE_ROW       write puts every head's codes in head 0's row
//   PLANTED_TRUNCATE      write truncates towards zero instead of rounding
//   PLANTED_NO_INVERSE    gather does not undo the rotation
//   PLANTED_NO_GATHER     no gather(): nothing can read the format, which must fail by name
// Built with KV_Q4_NO_FORMAT, it has no format(), as a store written for ABI 1.2 has none: it
// declares no error bound, and conformance holds it to its default bound (tests/sdk).
// Written against the SDK alone. Layout per layer: codes [slots][heads][dim / 2] for K then V,
// then scales [slots][heads] for K then V.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kvrt/plugin.hpp"

namespace {

using kvrt::sdk::fail;
constexpr kvrt_dtype kQ4 = KVRT_DTYPE_VENDOR_FIRST | 0x7134u;  // private code
constexpr uint32_t kBlock = 8;                                 // the rotation's block

// x <- H x / sqrt(8) over each block of 8 (the fast Walsh-Hadamard transform). H is symmetric
// and orthonormal once scaled: the same call undoes it.
void rotate(float* x, uint32_t dim) {
  for (uint32_t b = 0; b < dim; b += kBlock) {
    for (uint32_t half = 1; half < kBlock; half *= 2) {
      for (uint32_t i = b; i < b + kBlock; i += 2 * half) {
        for (uint32_t j = i; j < i + half; ++j) {
          const float a = x[j], c = x[j + half];
          x[j] = a + c, x[j + half] = a - c;
        }
      }
    }
    for (uint32_t j = b; j < b + kBlock; ++j) x[j] *= 0.35355339f;  // 1 / sqrt(8)
  }
}

float input(const kvrt_kv_write& w, const void* src, int64_t at) {
  if (w.dtype == KVRT_DTYPE_F32) return static_cast<const float*>(src)[at];
  const uint32_t bits = uint32_t{static_cast<const uint16_t*>(src)[at]} << 16;
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

class Q4Store : public kvrt::sdk::StoreBase {
 public:
  Q4Store(const kvrt_host_api* host, const kvrt_kv_geometry& g, uint64_t num_pages,
          kvrt::sdk::ConfigView config)
      : StoreBase(host, g, num_pages),
        memory_(host, KVRT_MEMORY_DEVICE, num_pages * page_bytes(host, g, config), "q4 pages") {}

  static uint64_t page_bytes(const kvrt_host_api*, const kvrt_kv_geometry& g,
                             kvrt::sdk::ConfigView) {
    kvrt::sdk::check_geometry(g);
    if (g.k_head_dim % kBlock != 0 || g.v_head_dim % kBlock != 0) {
      fail(KVRT_ERR_UNSUPPORTED, "head dims must be multiples of 8 (the rotation's block)");
    }
    const uint64_t parts = g.v_head_dim ? 2 : 1;
    return uint64_t{g.num_layers} * g.page_size * g.num_kv_heads *
           ((g.k_head_dim + g.v_head_dim) / 2 + parts * sizeof(float));
  }

  kvrt_kv_info info() const {
    kvrt_kv_info info{};
    info.struct_size = sizeof(info);
    info.k_dtype = info.v_dtype = kQ4;
    info.scale_mode = KVRT_SCALE_PER_TOKEN_HEAD;
    info.bytes_per_page = memory_.size() / num_pages();
    info.bytes_per_token = info.bytes_per_page / geometry().page_size;
    info.num_pages = num_pages();
    return info;
  }

  kvrt_kv_layout layout(uint32_t layer) const {
    const kvrt_kv_geometry& g = geometry();
    return kvrt::sdk::slot_major_layout(
        g, num_pages(),
        {kQ4, KVRT_SCALE_PER_TOKEN_HEAD, codes(layer, false), g.k_head_dim / 2, codes(layer, true),
         g.v_head_dim / 2, scales(layer, false), scales(layer, true)});
  }

#ifndef KV_Q4_NO_FORMAT
  kvrt_kv_format format(uint32_t) const {
    kvrt_kv_format f{};
    f.struct_size = sizeof(f);
    f.capabilities = KVRT_KV_GATHER_THREAD_SAFE;
    f.k_bits = f.v_bits = 4;
    f.pack_order = KVRT_PACK_LOW_FIRST;
    // Rounding to the nearest code: half a step of the scale per element of the rotated row, so
    // half a step of RMS over the row once rotated back (and a little for the f32 arithmetic).
    f.bound_flags = KVRT_BOUND_ROW_RMS;
    f.bound_row_rms_scale_units = 0.5f;
    f.bound_row_rms_relative = 1e-6f;
    return f;
  }
#endif

  void write(const kvrt_kv_write* w) {
    check_write(w, KVRT_DTYPE_BIT(KVRT_DTYPE_F32) | KVRT_DTYPE_BIT(KVRT_DTYPE_BF16));
    const kvrt_kv_geometry& g = geometry();
    quantize(*w, w->k, w->k_token_stride, g.k_head_dim, w->layer, false);
    if (g.v_head_dim) quantize(*w, w->v, w->v_token_stride, g.v_head_dim, w->layer, true);
  }

#ifndef PLANTED_NO_GATHER
  void gather(uint32_t layer, uint32_t n, const int64_t* slots, float* k, float* v) const {
    const kvrt_kv_geometry& g = geometry();
    dequantize(layer, false, g.k_head_dim, n, slots, k);
    if (g.v_head_dim) dequantize(layer, true, g.v_head_dim, n, slots, v);
  }
#endif

 private:
  uint64_t slots() const { return num_pages() * geometry().page_size; }
  uint64_t layer_bytes() const { return memory_.size() / geometry().num_layers; }
  uint8_t* codes(uint32_t layer, bool v) const {
    uint8_t* k = memory_.data() + layer * layer_bytes();
    return v ? k + slots() * geometry().num_kv_heads * geometry().k_head_dim / 2 : k;
  }
  float* scales(uint32_t layer, bool v) const {
    const kvrt_kv_geometry& g = geometry();
    auto* k = reinterpret_cast<float*>(codes(layer, false) + slots() * g.num_kv_heads *
                                                                 (g.k_head_dim + g.v_head_dim) / 2);
    return v ? k + slots() * g.num_kv_heads : k;
  }

  void quantize(const kvrt_kv_write& w, const void* src, int64_t stride, uint32_t dim,
                uint32_t layer, bool v) const {
    const uint32_t heads = geometry().num_kv_heads;
    if (stride == 0) stride = int64_t{heads} * dim;
    std::vector<float> row(dim);
    for (uint32_t i = 0; i < w.num_tokens; ++i) {
      for (uint32_t h = 0; h < heads; ++h) {
        const int64_t at = i * stride + int64_t{h} * dim;
        for (uint32_t d = 0; d < dim; ++d) row[d] = input(w, src, at + d);
        rotate(row.data(), dim);
        float amax = 0;
        for (uint32_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(row[d]));
        const float scale = amax > 0 ? amax / 7.0f : 1.0f;
#ifdef PLANTED_ONE_ROW
        const uint32_t row_head = 0;
#else
        const uint32_t row_head = h;
#endif
        uint8_t* out = codes(layer, v) + (w.slots[i] * heads + row_head) * (dim / 2);
        for (uint32_t d = 0; d < dim; d += 2) {
          int q[2];
          for (int j = 0; j < 2; ++j) {
            const float x = row[d + j] / scale;
#ifdef PLANTED_TRUNCATE
            q[j] = static_cast<int>(std::clamp(std::trunc(x), -7.0f, 7.0f));
#else
            q[j] = static_cast<int>(std::clamp(std::nearbyint(x), -7.0f, 7.0f));
#endif
          }
          out[d / 2] = static_cast<uint8_t>((q[0] & 0xF) | ((q[1] & 0xF) << 4));
        }
        scales(layer, v)[w.slots[i] * heads + h] = scale;
      }
    }
  }

  void dequantize(uint32_t layer, bool v, uint32_t dim, uint32_t n, const int64_t* slots,
                  float* out) const {
    const uint32_t heads = geometry().num_kv_heads;
    for (uint32_t i = 0; i < n; ++i) {
      for (uint32_t h = 0; h < heads; ++h) {
        float scale = scales(layer, v)[slots[i] * heads + h];
#ifdef PLANTED_SCALE_25
        scale *= 1.25f;
#endif
        const uint8_t* in = codes(layer, v) + (slots[i] * heads + h) * (dim / 2);
        for (uint32_t d = 0; d < dim; ++d) {
#ifdef PLANTED_NIBBLE_TWICE
          const int nibble = in[d / 2] & 0xF;
#else
          const int nibble = d % 2 == 0 ? in[d / 2] & 0xF : in[d / 2] >> 4;
#endif
          const int code = nibble >= 8 ? nibble - 16 : nibble;
          out[(i * heads + h) * dim + d] = static_cast<float>(code) * scale;
        }
#ifndef PLANTED_NO_INVERSE
        rotate(out + (i * heads + h) * dim, dim);
#endif
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
      PLANTED_NAME,
      "0.1.0",
      "test: a 4-bit vendor format, correct or with one planted value bug",
      &kvrt::sdk::kv_store_table<Q4Store>(),
      nullptr,
      0,
      KVRT_DTYPE_BIT(KVRT_DTYPE_F32) | KVRT_DTYPE_BIT(KVRT_DTYPE_BF16),
      nullptr};
  return desc;
}

}  // namespace

KVRT_PLUGIN_ENTRY(describe)
