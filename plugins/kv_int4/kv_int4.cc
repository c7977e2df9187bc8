// kv_int4: pages of 4-bit K and V codes with an f32 scale per token and KV head (amax / 7,
// symmetric codes -7..7, rounded to nearest), optionally after a block Walsh-Hadamard rotation
// of each head row (rotation = "hadamard"; default "none"), which spreads a row's outliers over
// its block so one large element no longer coarsens the step for all the others. A row of D
// elements takes D / 2 + 4 bytes: 68 for D = 128, against 256 for bf16.
//
// The rotation is off by default for its cost: read through gather(), every cached row is
// rotated back at every layer of every step (O(D log D) per row, several times what attention
// itself spends on the row). A reader that knew the rotation would rotate the query and the
// output once instead (q.k = Hq.Hk); none does yet.
//
// The dtype it publishes says how its rows read:
//  - rotation = "none" (the default): KVRT_DTYPE_INT4 with per-token-head scales, decodable
//    from the layout by anyone (stored value = code * scale);
//  - rotation = "hadamard": a private code (kKvInt4Hadamard, in the vendor range), because the
//    codes are of H x, not x: a reader must decode and then apply H again (H is its own
//    inverse). attn_cpu reads both through gather(), on all of the rank's threads.
// The error bound it declares (kvrt_kv_format): half a step of the scale per element without the
// rotation; with it, half a step per element of the rotated row, so half a step of RMS over the
// row (the rotation keeps L2 norms). CPU memory only: for a CUDA device, page_bytes and create
// refuse, saying so.
#include <algorithm>
#include <string>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kernels/cpu/int4.h"
#include "kvrt/plugin.hpp"
#include "plugins/common/device_pages.h"

namespace kvrt::plugins {
namespace {

constexpr uint32_t kInputDtypes = KVRT_DTYPE_BIT(KVRT_DTYPE_F32) | KVRT_DTYPE_BIT(KVRT_DTYPE_BF16);
// kv_int4's private dtype: int4 codes (as KVRT_DTYPE_INT4) of the block-Hadamard-rotated row.
constexpr kvrt_dtype kKvInt4Hadamard = KVRT_DTYPE_VENDOR_FIRST | 0x1404u;
constexpr size_t kMaxAutoBlock = 128;

struct Int4Options {
  size_t block = 0;  // Hadamard block; 0: no rotation

  Int4Options(const sdk::ConfigView& config, const kvrt_kv_geometry& g) {
    sdk::check_geometry(g);
    if (g.k_head_dim % 2 != 0 || g.v_head_dim % 2 != 0) {
      sdk::fail(KVRT_ERR_UNSUPPORTED,
                "head dims must be even (two 4-bit codes per byte), found K " +
                    std::to_string(g.k_head_dim) + ", V " + std::to_string(g.v_head_dim));
    }
    if (device::on_cuda(g)) {
      sdk::fail(KVRT_ERR_UNSUPPORTED,
                "kv_int4 keeps its pages in CPU memory only: no CUDA write path or kernel reads "
                "its format yet (use kv_fp8_e4m3 on a GPU)");
    }
    const std::string rotation = config.string("rotation", "none");
    if (rotation == "none") {
      if (config.has("hadamard_block")) {
        sdk::fail(KVRT_ERR_CONFIG, "hadamard_block: given with rotation = \"none\"");
      }
      return;
    }
    if (rotation != "hadamard") {
      sdk::fail(KVRT_ERR_CONFIG,
                "rotation: expected \"hadamard\" or \"none\", found \"" + rotation + "\"");
    }
    const int64_t given = config.integer("hadamard_block", 0);
    if (given == 0) {
      block = kernels::hadamard_block_for(g.k_head_dim, kMaxAutoBlock);
      if (g.v_head_dim != 0) {
        block = std::min(block, kernels::hadamard_block_for(g.v_head_dim, kMaxAutoBlock));
      }
      return;
    }
    const bool power_of_two = given >= 2 && (given & (given - 1)) == 0;
    if (!power_of_two || g.k_head_dim % given != 0 || g.v_head_dim % given != 0) {
      sdk::fail(KVRT_ERR_CONFIG,
                "hadamard_block: expected a power of two >= 2 dividing the head "
                "dims (K " +
                    std::to_string(g.k_head_dim) + ", V " + std::to_string(g.v_head_dim) +
                    "), found " + std::to_string(given) + " (0 picks one)");
    }
    block = static_cast<size_t>(given);
  }
};

class Int4Store : public sdk::StoreBase {
 public:
  Int4Store(const kvrt_host_api* host, const kvrt_kv_geometry& g, uint64_t num_pages,
            sdk::ConfigView config)
      : StoreBase(host, g, num_pages),
        options_(config, g),
        memory_(host, KVRT_MEMORY_DEVICE, num_pages * bytes_per_page(g), "int4 pages") {}

  static uint64_t page_bytes(const kvrt_host_api*, const kvrt_kv_geometry& g,
                             sdk::ConfigView config) {
    (void)Int4Options(config, g);  // the geometry and options, checked before any memory is sized
    return bytes_per_page(g);
  }

  kvrt_kv_info info() const {
    kvrt_kv_info info{};
    info.struct_size = sizeof(info);
    info.k_dtype = info.v_dtype = dtype();
    info.scale_mode = KVRT_SCALE_PER_TOKEN_HEAD;
    info.bytes_per_page = bytes_per_page(geometry());
    info.bytes_per_token = info.bytes_per_page / geometry().page_size;
    info.num_pages = num_pages();
    return info;
  }

  // Per layer: K codes [slot][head][k_dim / 2], V codes likewise, then K scales [slot][head] and
  // V scales. Strides in bytes.
  kvrt_kv_layout layout(uint32_t layer) const {
    const kvrt_kv_geometry& g = geometry();
    return sdk::slot_major_layout(
        g, num_pages(),
        {dtype(), KVRT_SCALE_PER_TOKEN_HEAD, codes(layer, false), g.k_head_dim / 2,
         codes(layer, true), g.v_head_dim / 2, scales(layer, false), scales(layer, true)});
  }

  // (ABI 1.3) 4 bits per element, the low nibble first; gather() only reads.
  kvrt_kv_format format(uint32_t) const {
    kvrt_kv_format f{};
    f.struct_size = sizeof(f);
    f.capabilities = KVRT_KV_GATHER_THREAD_SAFE;
    f.k_bits = f.v_bits = 4;
    f.pack_order = KVRT_PACK_LOW_FIRST;
    if (options_.block == 0) {
      f.bound_flags = KVRT_BOUND_ELEMENT;
      f.bound_element_scale_units = 0.5f;
    } else {
      // Rounding the rotated row: half a step of RMS; the transform's own f32 arithmetic adds a
      // few ulps of the row's RMS (2^-20 covers blocks up to 2^12).
      f.bound_flags = KVRT_BOUND_ROW_RMS;
      f.bound_row_rms_scale_units = 0.5f;
      f.bound_row_rms_relative = 1.0f / (1 << 20);
    }
    return f;
  }

  void write(const kvrt_kv_write* w) {
    check_write(w, kInputDtypes);
    const kvrt_kv_geometry& g = geometry();
    quantize(*w, w->k, w->k_token_stride, g.k_head_dim, w->layer, false);
    if (g.v_head_dim != 0) quantize(*w, w->v, w->v_token_stride, g.v_head_dim, w->layer, true);
  }

  void gather(uint32_t layer, uint32_t n, const int64_t* slots, float* k, float* v) const {
    const kvrt_kv_geometry& g = geometry();
    dequantize(layer, false, g.k_head_dim, n, slots, k);
    if (g.v_head_dim != 0) dequantize(layer, true, g.v_head_dim, n, slots, v);
  }

 private:
  static uint64_t bytes_per_page(const kvrt_kv_geometry& g) {
    const uint64_t parts = g.v_head_dim ? 2 : 1;
    return uint64_t{g.num_layers} * g.page_size * g.num_kv_heads *
           ((g.k_head_dim + g.v_head_dim) / 2 + parts * sizeof(float));
  }
  kvrt_dtype dtype() const { return options_.block == 0 ? KVRT_DTYPE_INT4 : kKvInt4Hadamard; }
  uint64_t slots() const { return num_pages() * geometry().page_size; }
  uint64_t layer_bytes() const { return memory_.size() / geometry().num_layers; }
  uint8_t* codes(uint32_t layer, bool v) const {
    uint8_t* k = memory_.data() + layer * layer_bytes();
    return v ? k + slots() * geometry().num_kv_heads * (geometry().k_head_dim / 2) : k;
  }
  float* scales(uint32_t layer, bool v) const {
    const kvrt_kv_geometry& g = geometry();
    auto* k = reinterpret_cast<float*>(
        codes(layer, false) + slots() * g.num_kv_heads * ((g.k_head_dim + g.v_head_dim) / 2));
    return v ? k + slots() * g.num_kv_heads : k;
  }

  void quantize(const kvrt_kv_write& w, const void* src, int64_t stride, uint32_t dim,
                uint32_t layer, bool v) const {
    const uint32_t heads = geometry().num_kv_heads;
    if (stride == 0) stride = int64_t{heads} * dim;
    std::vector<float> row(dim);
    for (uint32_t i = 0; i < w.num_tokens; ++i) {
      const int64_t slot = w.slots[i];
      for (uint32_t h = 0; h < heads; ++h) {
        const int64_t at = i * stride + int64_t{h} * dim;
        // f32 rows are quantised where they lie, unless they are to be rotated first.
        const float* values = row.data();
        if (w.dtype == KVRT_DTYPE_F32 && options_.block == 0) {
          values = static_cast<const float*>(src) + at;
        } else if (w.dtype == KVRT_DTYPE_F32) {
          const float* in = static_cast<const float*>(src) + at;
          row.assign(in, in + dim);
        } else {
          kernels::bf16_to_f32(static_cast<const uint16_t*>(src) + at, row.data(), dim);
        }
        kernels::hadamard_blocks(row.data(), dim, options_.block);  // block 0: nothing to do
        const uint64_t r = uint64_t(slot) * heads + h;
        scales(layer, v)[r] =
            kernels::quantize_row_int4(values, dim, codes(layer, v) + r * (dim / 2));
      }
    }
  }

  void dequantize(uint32_t layer, bool v, uint32_t dim, uint32_t n, const int64_t* slots,
                  float* out) const {
    const uint32_t heads = geometry().num_kv_heads;
    const uint8_t* all_codes = codes(layer, v);
    const float* all_scales = scales(layer, v);
    for (uint32_t i = 0; i < n; ++i) {
      for (uint32_t h = 0; h < heads; ++h) {
        const uint64_t r = uint64_t(slots[i]) * heads + h;
        float* row = out + (uint64_t{i} * heads + h) * dim;
        kernels::dequantize_row_int4(all_codes + r * (dim / 2), dim, all_scales[r], row);
        kernels::hadamard_blocks(row, dim, options_.block);
      }
    }
  }

  Int4Options options_;
  sdk::HostBuffer memory_;
};

const kvrt_option_desc kOptions[] = {
    {sizeof(kvrt_option_desc), KVRT_OPTION_STRING, "rotation", "none",
     "none (plain int4, KVRT_DTYPE_INT4) or hadamard (a block Walsh-Hadamard rotation of each head "
     "row before it is quantised: more accurate on some models, and several times the gather's "
     "cost)"},
    {sizeof(kvrt_option_desc), KVRT_OPTION_INT, "hadamard_block", "0",
     "the rotation's block: a power of two dividing the head dims; 0 takes the largest up to 128"},
};

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc = {
      sizeof(kvrt_plugin_desc),
      KVRT_ABI_MAJOR,
      KVRT_ABI_MINOR,
      KVRT_PLUGIN_KV_STORE,
      "kv_int4",
      "0.1.0",
      "paged 4-bit K/V codes, a scale per token and KV head, optional block Hadamard rotation",
      &sdk::kv_store_table<Int4Store>(),
      kOptions,
      sizeof(kOptions) / sizeof(kOptions[0]),
      kInputDtypes,
      nullptr};
  return desc;
}

}  // namespace
}  // namespace kvrt::plugins

KVRT_PLUGIN_ENTRY(kvrt::plugins::describe)
