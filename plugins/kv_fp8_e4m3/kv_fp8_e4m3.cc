// kv_fp8_e4m3: pages of OCP FP8 E4M3 K and V (max 448, no infinities). Two scale modes:
//  - per_token_head (default): a float scale per token and KV head, amax / 448, computed on
//    write, so no calibration is needed and nothing saturates;
//  - per_tensor: static K and V scales (from config, as SGLang and vLLM take them from a
//    checkpoint): k_scale / v_scale for every layer, or a `calibrated` table of one K and one V
//    scale per layer (kvrt eval --calibrate writes it); default 1.0 with a warning. Values beyond
//    448 * scale saturate.
// Stored value = code * scale. Finite input never becomes NaN. On a CUDA device the pages are
// device memory, quantized on write by kernels/cuda/kv_write.h with the same encoding.
#include <cmath>
#include <cstring>
#include <mutex>
#include <string>
#include <vector>

#include "kernels/cpu/convert.h"
#include "kvrt/plugin.hpp"
#include "plugins/common/paged_pool.h"

namespace kvrt::plugins {
namespace {

constexpr uint32_t kInputDtypes = KVRT_DTYPE_BIT(KVRT_DTYPE_F32) | KVRT_DTYPE_BIT(KVRT_DTYPE_BF16);

// A positive finite scale, or a config error naming where it came from.
float checked_scale(double value, const std::string& where) {
  if (!(value > 0) || !std::isfinite(value)) {
    sdk::fail(KVRT_ERR_CONFIG,
              where + ": expected a positive finite number, found " + std::to_string(value));
  }
  return static_cast<float>(value);
}

struct Fp8Options {
  bool per_tensor = false;
  float k_scale = 1.0f;
  float v_scale = 1.0f;
  bool scales_given = false;
  // calibrated.k / calibrated.v: one scale per layer (empty: k_scale / v_scale everywhere).
  std::vector<float> layer_k_scales, layer_v_scales;

  explicit Fp8Options(const sdk::ConfigView& config) {
    const std::string mode = config.string("scale_mode", "per_token_head");
    if (mode == "per_tensor") {
      per_tensor = true;
    } else if (mode != "per_token_head") {
      sdk::fail(
          KVRT_ERR_CONFIG,
          "scale_mode: expected \"per_token_head\" or \"per_tensor\", found \"" + mode + "\"");
    }
    scales_given = config.has("k_scale") || config.has("v_scale");
    k_scale = checked_scale(config.real("k_scale", 1.0), "k_scale");
    v_scale = checked_scale(config.real("v_scale", 1.0), "v_scale");
    for (auto [part, out] : {std::pair{"k", &layer_k_scales}, std::pair{"v", &layer_v_scales}}) {
      for (size_t layer = 0;; ++layer) {
        const std::string key = std::string("calibrated.") + part + "[" + std::to_string(layer) + "]";
        if (!config.has(key.c_str())) break;
        out->push_back(checked_scale(config.real(key.c_str(), 1.0),
                                     key + " (layer " + std::to_string(layer) + ")"));
      }
    }
    if (!layer_k_scales.empty() || !layer_v_scales.empty()) {
      if (!per_tensor) {
        sdk::fail(KVRT_ERR_CONFIG, "calibrated: static scales need scale_mode = \"per_tensor\"");
      }
      if (scales_given) {
        sdk::fail(KVRT_ERR_CONFIG, "calibrated and k_scale/v_scale both give the scales: keep one");
      }
      scales_given = true;
    }
  }

  // The calibrated table against the model's layers: a scale for each layer, no more.
  void check_layers(uint32_t layers) const {
    if (layer_k_scales.empty() && layer_v_scales.empty()) return;
    for (auto [part, scales] : {std::pair{"k", &layer_k_scales}, std::pair{"v", &layer_v_scales}}) {
      if (scales->size() < layers) {
        sdk::fail(KVRT_ERR_CONFIG, std::string("calibrated.") + part + ": no scale for layer " +
                                       std::to_string(scales->size()) + " (the model has " +
                                       std::to_string(layers) + " layers, the table " +
                                       std::to_string(scales->size()) + " scales)");
      }
      if (scales->size() > layers) {
        sdk::fail(KVRT_ERR_CONFIG, std::string("calibrated.") + part + "[" +
                                       std::to_string(layers) + "]: a scale for layer " +
                                       std::to_string(layers) + ", but the model has " +
                                       std::to_string(layers) + " layers (0.." +
                                       std::to_string(layers - 1) + ")");
      }
    }
  }
  float k_scale_of(uint32_t layer) const {
    return layer_k_scales.empty() ? k_scale : layer_k_scales[layer];
  }
  float v_scale_of(uint32_t layer) const {
    return layer_v_scales.empty() ? v_scale : layer_v_scales[layer];
  }
};

class Fp8Store : public sdk::StoreBase {
 public:
  Fp8Store(const kvrt_host_api* host, const kvrt_kv_geometry& g, uint64_t num_pages,
           sdk::ConfigView config)
      : StoreBase(host, g, num_pages),
        options_(config),
        pool_(host, g, num_pages, 1, !options_.per_tensor),
        tensor_scales_(host, KVRT_MEMORY_DEVICE,
                       options_.per_tensor ? 2 * sizeof(float) * g.num_layers : 0,
                       "per-tensor scales") {
    options_.check_layers(g.num_layers);
    if (options_.per_tensor) {  // the attention kernels read them from device memory
      std::vector<float> scales(2 * size_t{g.num_layers});
      for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
        scales[2 * layer] = options_.k_scale_of(layer);
        scales[2 * layer + 1] = options_.v_scale_of(layer);
      }
      if (device::on_cuda(g)) {
        device::to_device(host, tensor_scales_.data(), scales.data(), 4 * scales.size());
      } else {
        std::memcpy(tensor_scales_.data(), scales.data(), 4 * scales.size());
      }
    }
    static std::once_flag warned;  // once per process, not once per TP rank
    if (options_.per_tensor && !options_.scales_given) {
      std::call_once(warned, [host] {
        sdk::log(host, KVRT_LOG_WARN,
                 "scale_mode = per_tensor without k_scale/v_scale: using 1.0; K/V beyond +-448 "
                 "saturate");
      });
    }
  }

  static uint64_t page_bytes(const kvrt_host_api*, const kvrt_kv_geometry& g,
                             sdk::ConfigView config) {
    return PagedPool::page_bytes(g, 1, !Fp8Options(config).per_tensor);
  }

  // (ABI 1.3) Bytes of E4M3; gather() only reads. The bound: half an ulp of e4m3 (2^-4 of |x|)
  // times the scale, and half the subnormal step (2^-10 of the scale) near zero.
  kvrt_kv_format format(uint32_t) const {
    kvrt_kv_format f{};
    f.struct_size = sizeof(f);
    f.capabilities = KVRT_KV_GATHER_THREAD_SAFE;
    f.k_bits = f.v_bits = 8;
    f.bound_flags = KVRT_BOUND_ELEMENT;
    f.bound_element_relative = 1.0f / 16;
    f.bound_element_scale_units = 1.0f / 1024;
    return f;
  }

  kvrt_kv_info info() const {
    kvrt_kv_info info{};
    info.struct_size = sizeof(info);
    info.k_dtype = info.v_dtype = KVRT_DTYPE_FP8_E4M3;
    info.scale_mode = scale_mode();
    info.bytes_per_page = pool_.bytes_per_page();
    info.bytes_per_token = info.bytes_per_page / geometry().page_size;
    info.num_pages = num_pages();
    return info;
  }

  kvrt_kv_layout layout(uint32_t layer) const {
    kvrt_kv_layout l = pool_.layout(layer);
    l.k_dtype = l.v_dtype = KVRT_DTYPE_FP8_E4M3;
    l.scale_mode = scale_mode();
    if (options_.per_tensor) {
      l.k_scale = reinterpret_cast<float*>(tensor_scales_.data()) + 2 * layer;
      l.v_scale = geometry().v_head_dim == 0 ? l.k_scale : l.k_scale + 1;
    }
    return l;
  }

  void write(const kvrt_kv_write* w) {
    check_write(w, kInputDtypes);
    const kvrt_kv_geometry& g = geometry();
    if (device::on_cuda(g)) {
      device::Part k = pool_.k_part(w->layer);
      k.tensor_scale = options_.k_scale_of(w->layer);
      device::write(*w, g, device::Format::kE4M3, w->k, w->k_token_stride, g.k_head_dim, k);
      if (g.v_head_dim != 0) {
        device::Part v = pool_.v_part(w->layer);
        v.tensor_scale = options_.v_scale_of(w->layer);
        device::write(*w, g, device::Format::kE4M3, w->v, w->v_token_stride, g.v_head_dim, v);
      }
      return;
    }
    quantize(*w, w->k, w->k_token_stride, g.k_head_dim, pool_.k(w->layer), pool_.k_scales(w->layer),
             options_.k_scale_of(w->layer));
    if (g.v_head_dim != 0) {
      quantize(*w, w->v, w->v_token_stride, g.v_head_dim, pool_.v(w->layer),
               pool_.v_scales(w->layer), options_.v_scale_of(w->layer));
    }
  }

  void gather(uint32_t layer, uint32_t n, const int64_t* slots, float* k, float* v) const {
    const kvrt_kv_geometry& g = geometry();
    dequantize(pool_.k(layer), pool_.k_scales(layer), options_.k_scale_of(layer), g.k_head_dim, n,
               slots, k);
    if (g.v_head_dim != 0) {
      dequantize(pool_.v(layer), pool_.v_scales(layer), options_.v_scale_of(layer), g.v_head_dim,
                 n, slots, v);
    }
  }

 private:
  kvrt_scale_mode scale_mode() const {
    return options_.per_tensor ? KVRT_SCALE_PER_TENSOR : KVRT_SCALE_PER_TOKEN_HEAD;
  }

  void quantize(const kvrt_kv_write& w, const void* src, int64_t stride, uint32_t dim,
                uint8_t* codes, float* scales, float tensor_scale) const {
    const uint32_t heads = geometry().num_kv_heads;
    const size_t row = size_t{heads} * dim;
    if (stride == 0) stride = static_cast<int64_t>(row);
    const float inv_scale = 1.0f / tensor_scale;
    for (uint32_t i = 0; i < w.num_tokens; ++i) {
      const int64_t slot = w.slots[i];
      uint8_t* out = codes + slot * row;
      if (w.dtype == KVRT_DTYPE_F32) {
        const float* in = static_cast<const float*>(src) + i * stride;
        if (options_.per_tensor) {
          kernels::f32_to_e4m3(in, out, row, inv_scale);
        } else {
          kernels::quantize_rows_e4m3_f32(in, dim, heads, dim, out, dim, scales + slot * heads, 1);
        }
      } else {
        const uint16_t* in = static_cast<const uint16_t*>(src) + i * stride;
        if (options_.per_tensor) {
          kernels::bf16_to_e4m3(in, out, row, inv_scale);
        } else {
          kernels::quantize_rows_e4m3_bf16(in, dim, heads, dim, out, dim, scales + slot * heads, 1);
        }
      }
    }
  }

  void dequantize(const uint8_t* codes, const float* scales, float tensor_scale, uint32_t dim,
                  uint32_t n, const int64_t* slots, float* out) const {
    const uint32_t heads = geometry().num_kv_heads;
    const size_t row = size_t{heads} * dim;
    // On a device, the slots' codes and scales are first copied to the host, in slot order.
    std::vector<uint8_t> device_codes, device_scales;
    if (device::on_cuda(geometry()) && n > 0) {
      device_codes = device::rows_to_host(host(), codes, row, n, slots);
      if (!options_.per_tensor) {
        device_scales = device::rows_to_host(host(), reinterpret_cast<const uint8_t*>(scales),
                                             4 * uint64_t{heads}, n, slots);
      }
    }
    for (uint32_t i = 0; i < n; ++i) {
      const uint8_t* code_row =
          device_codes.empty() ? codes + slots[i] * row : device_codes.data() + i * row;
      const float* scale_row = device_scales.empty()
                                   ? (scales == nullptr ? nullptr : scales + slots[i] * heads)
                                   : reinterpret_cast<const float*>(device_scales.data()) +
                                         uint64_t{i} * heads;
      for (uint32_t h = 0; h < heads; ++h) {
        const float scale = options_.per_tensor ? tensor_scale : scale_row[h];
        kernels::e4m3_to_f32(code_row + h * dim, out + i * row + h * dim, dim, scale);
      }
    }
  }

  Fp8Options options_;
  PagedPool pool_;
  sdk::HostBuffer tensor_scales_;
};

const kvrt_option_desc kOptions[] = {
    {sizeof(kvrt_option_desc), KVRT_OPTION_STRING, "scale_mode", "per_token_head",
     "per_token_head (dynamic, a scale per token and KV head) or per_tensor (static)"},
    {sizeof(kvrt_option_desc), KVRT_OPTION_FLOAT, "k_scale", "1.0",
     "per_tensor only: the K scale (stored = code * k_scale)"},
    {sizeof(kvrt_option_desc), KVRT_OPTION_FLOAT, "v_scale", "1.0", "per_tensor only: the V scale"},
    {sizeof(kvrt_option_desc), KVRT_OPTION_TABLE, "calibrated", "",
     "per_tensor only: {k = [...], v = [...]}, a K and a V scale per layer (kvrt eval "
     "--calibrate writes them)"},
};

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc = {
      sizeof(kvrt_plugin_desc),
      KVRT_ABI_MAJOR,
      KVRT_ABI_MINOR,
      KVRT_PLUGIN_KV_STORE,
      "kv_fp8_e4m3",
      "0.1.0",
      "paged FP8 E4M3 K/V with per-token-head or per-tensor scales",
      &sdk::kv_store_table<Fp8Store>(),
      kOptions,
      sizeof(kOptions) / sizeof(kOptions[0]),
      kInputDtypes,
      nullptr};
  return desc;
}

}  // namespace
}  // namespace kvrt::plugins

KVRT_PLUGIN_ENTRY(kvrt::plugins::describe)
