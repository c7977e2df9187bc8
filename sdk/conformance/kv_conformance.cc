#include "sdk/conformance/kv_conformance.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <numeric>
#include <optional>
#include <random>
#include <stdexcept>
#include <thread>

#include "core/sched/page_hash.h"

namespace kvrt::conformance {
namespace {

using plugin::LoadedPlugin;
using plugin::status_name;
using plugin::take_last_error;

struct Failure : std::runtime_error {
  using std::runtime_error::runtime_error;
};

#define KVRT_REQUIRE(cond, message)                   \
  do {                                                \
    if (!(cond)) throw Failure(std::string(message)); \
  } while (0)

// ---- the suite's own reading of stored formats (independent of the stores' kernels) ---------

// Dtypes whose bytes the suite decodes from the layout itself. 4-bit codes need the store's
// format (ABI 1.3) for their packing; a vendor code is never decoded here, only through gather.
bool known_dtype(kvrt_dtype d) {
  return d == KVRT_DTYPE_F32 || d == KVRT_DTYPE_BF16 || d == KVRT_DTYPE_F16 ||
         d == KVRT_DTYPE_FP8_E4M3 || d == KVRT_DTYPE_INT8 || d == KVRT_DTYPE_INT4 ||
         d == KVRT_DTYPE_UINT4;
}

bool four_bit(kvrt_dtype d) { return d == KVRT_DTYPE_INT4 || d == KVRT_DTYPE_UINT4; }

// Slots 0 .. n - 1: every slot of a store of n slots.
std::vector<int64_t> every_slot(uint64_t n) {
  std::vector<int64_t> all(n);
  std::iota(all.begin(), all.end(), 0);
  return all;
}

size_t dtype_bytes(kvrt_dtype d) {
  return d == KVRT_DTYPE_F32 ? 4 : (d == KVRT_DTYPE_BF16 || d == KVRT_DTYPE_F16) ? 2 : 1;
}

// Bytes of a head row of `dim` elements.
uint64_t row_bytes(kvrt_dtype d, uint32_t dim) {
  return four_bit(d) ? (uint64_t{dim} + 1) / 2 : uint64_t{dim} * dtype_bytes(d);
}

float bits_to_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

float decode_element(kvrt_dtype d, const uint8_t* p) {
  switch (d) {
    case KVRT_DTYPE_F32: {
      float f;
      std::memcpy(&f, p, 4);
      return f;
    }
    case KVRT_DTYPE_BF16: {
      uint16_t b;
      std::memcpy(&b, p, 2);
      return bits_to_float(uint32_t{b} << 16);
    }
    case KVRT_DTYPE_F16: {
      uint16_t h;
      std::memcpy(&h, p, 2);
      int exp = (h >> 10) & 0x1F, mant = h & 0x3FF;
      float v = exp == 0    ? std::ldexp(static_cast<float>(mant), -24)
                : exp == 31 ? (mant ? NAN : INFINITY)
                            : std::ldexp(static_cast<float>(mant | 0x400), exp - 25);
      return (h & 0x8000) ? -v : v;
    }
    case KVRT_DTYPE_FP8_E4M3: {
      uint8_t c = *p;
      int exp = (c >> 3) & 0xF, mant = c & 7;
      float v = (exp == 15 && mant == 7) ? NAN
                : exp == 0               ? std::ldexp(static_cast<float>(mant), -9)
                                         : std::ldexp(static_cast<float>(8 + mant), exp - 10);
      return (c & 0x80) ? -v : v;
    }
    case KVRT_DTYPE_INT8:
      return static_cast<float>(static_cast<int8_t>(*p));
    default:
      return NAN;
  }
}

// Element d of a packed 4-bit row: the code, signed for INT4.
float decode_nibble(kvrt_dtype d, const uint8_t* row, uint32_t index, kvrt_pack_order order) {
  const uint8_t byte = row[index / 2];
  const bool low = (index % 2 == 0) == (order == KVRT_PACK_LOW_FIRST);
  const int code = low ? byte & 0xF : byte >> 4;
  return static_cast<float>(d == KVRT_DTYPE_INT4 && code >= 8 ? code - 16 : code);
}

// The error a correct store may make, in the shape kvrt_kv_format declares it: per element
// relative + scale units, per row RMS relative + scale units; and, for the default bound only,
// one over all the rows a check reads back. `source` says where it came from, for messages.
struct Bound {
  bool element = false;
  double element_relative = 0, element_scale_units = 0;
  bool row = false;
  double row_relative = 0, row_scale_units = 0;
  // Over the rows of K (or of V) one check reads back: the RMS of each row's relative error
  // rms(y - x) / rms(x) at most this (0: no such bound).
  double rows_relative = 0;
  std::string source;
};

// The default, for a store that declares nothing and whose dtype the suite does not know. It is
// set for the coarsest format it passes: symmetric 4-bit codes with one scale (amax / 7) per
// head row, up to MLA's 576-wide latent. Such a row's relative error is about
// amax / (7 sqrt(12) rms(x)), and the peak amax / rms(x) of a Gaussian row grows with its width:
// over 300 seeds of the suite (6.3M rows), kv_q4 without its bound errs by 0.07 (RMS over rows)
// at width 8, 0.11 at 64 and 0.136 at 576, its worst row 0.233. No bound on single rows both
// passes that and fails a scale 25% too large (0.26-0.30 of the RMS); one on the RMS over the
// rows of a check does, with room either side: correct at most 0.17 (a check of 3 rows of 576),
// a scale 25% off at least 0.23, a nibble decoded twice 0.52, a dropped inverse rotation 0.93.
// docs/writing-a-kv-store.md (section 3) has the table.
constexpr double kDefaultRowsRmsBound = 0.2;
// Each row is still held to a cap: 0.3 is a peak of 7.3 RMS, which a Gaussian row of 576
// reaches about once in 5e9 rows, and a row read from the wrong place or undecoded exceeds.
constexpr double kDefaultRowRmsCap = 0.3;

// What the suite itself knows of a dtype: half an ulp. With p significand bits, |x| = m * 2^e
// (1 <= m < 2) rounds by at most 2^(e - p) <= 2^-p * |x|: bf16 p = 8, f16 p = 11, e4m3 p = 4
// (whose subnormals are 2^-9 apart in units of the scale: half a step is 2^-10); integer codes
// half a step of the scale.
std::optional<Bound> dtype_bound(kvrt_dtype d) {
  Bound b;
  b.element = true;
  b.source = std::string("half a step of ") + plugin::dtype_name(d);
  switch (d) {
    case KVRT_DTYPE_F32:
      b.source = "f32 (exact)";
      return b;
    case KVRT_DTYPE_BF16:
      b.element_relative = std::ldexp(1.0, -8);
      return b;
    case KVRT_DTYPE_F16:
      b.element_relative = std::ldexp(1.0, -11);
      b.element_scale_units = std::ldexp(1.0, -25);
      return b;
    case KVRT_DTYPE_FP8_E4M3:
      b.element_relative = std::ldexp(1.0, -4);
      b.element_scale_units = std::ldexp(1.0, -10);
      return b;
    case KVRT_DTYPE_INT8:
    case KVRT_DTYPE_INT4:
    case KVRT_DTYPE_UINT4:
      b.element_scale_units = 0.5;
      return b;
    default:
      return std::nullopt;
  }
}

// The bound a store is held to: what its format declares (ABI 1.3), else what the suite knows
// of its dtype, else the default.
Bound store_bound(const std::optional<kvrt_kv_format>& f, kvrt_dtype k, kvrt_dtype v) {
  if (f && (f->bound_flags & (KVRT_BOUND_ELEMENT | KVRT_BOUND_ROW_RMS)) != 0) {
    Bound b;
    b.element = (f->bound_flags & KVRT_BOUND_ELEMENT) != 0;
    b.element_relative = f->bound_element_relative;
    b.element_scale_units = f->bound_element_scale_units;
    b.row = (f->bound_flags & KVRT_BOUND_ROW_RMS) != 0;
    b.row_relative = f->bound_row_rms_relative;
    b.row_scale_units = f->bound_row_rms_scale_units;
    b.source = "the bound its format declares";
    return b;
  }
  std::optional<Bound> kb = dtype_bound(k), vb = dtype_bound(v);
  if (kb && vb && k == v) return *kb;
  Bound b;
  b.row = true;
  b.row_relative = kDefaultRowRmsCap;
  b.rows_relative = kDefaultRowsRmsBound;
  b.source = "the default bound (declare one in kvrt_kv_format)";
  return b;
}

std::string bound_text(const Bound& b) {
  std::string text;
  if (b.element) {
    text += "|err| <= " + std::to_string(b.element_relative) + " |x| + " +
            std::to_string(b.element_scale_units) + " scale";
  }
  if (b.row) {
    text += std::string(text.empty() ? "" : " and ") + "rms(err) <= " +
            std::to_string(b.row_relative) + " rms(x) + " + std::to_string(b.row_scale_units) +
            " scale";
  }
  if (b.rows_relative > 0) {
    text +=
        " per row, and over the rows rms(rms(err) / rms(x)) <= " + std::to_string(b.rows_relative);
  }
  return text + " (" + b.source + ")";
}

// One token's row for one head, read through the layout: stored values (unscaled) and the scale
// (and zero point) of each element.
struct HeadRow {
  std::vector<float> stored;
  std::vector<float> scales, zeros;
  std::vector<float> values() const {
    std::vector<float> v(stored.size());
    for (size_t d = 0; d < v.size(); ++d) v[d] = (stored[d] - zeros[d]) * scales[d];
    return v;
  }
};

// Where one head row's scales lie, and its scale for element d (groups: the format's).
struct ScaleAt {
  const uint8_t* first = nullptr;  // the row's (first group's) scale; NULL without scales
  int64_t offset = 0;              // of `first` from the scale base
};

ScaleAt scale_at(const kvrt_kv_layout& l, bool v_part, int64_t page, int64_t token,
                 uint32_t head) {
  const float* scales = v_part ? l.v_scale : l.k_scale;
  ScaleAt at;
  if (l.scale_mode == KVRT_SCALE_PER_TENSOR) {
    at.first = reinterpret_cast<const uint8_t*>(scales);
  } else if (l.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD) {
    at.offset = page * l.scale_page_stride + token * l.scale_token_stride +
                int64_t{head} * l.scale_head_stride;
    at.first = reinterpret_cast<const uint8_t*>(scales) + at.offset;
  }
  return at;
}

// The float of each element of a head row whose first group's float is at `first`: one per
// group of the format's group_size (the whole row without groups), scale_group_bytes apart.
// Scales and zero points are laid out alike.
std::vector<float> per_element(const uint8_t* first, const std::optional<kvrt_kv_format>& f,
                               uint32_t dim) {
  std::vector<float> out(dim);
  const uint32_t group = f && f->group_size != 0 ? f->group_size : dim;
  for (uint32_t d = 0; d < dim; ++d) {
    std::memcpy(&out[d], first + (f ? int64_t{d / group} * f->scale_group_bytes : 0), 4);
  }
  return out;
}

// The scale of each element of a head row as the bound counts it (1 without scales), for
// layouts the suite cannot decode too: scales are the layout's whatever the dtype.
std::vector<float> row_scales(const kvrt_kv_layout& l, const std::optional<kvrt_kv_format>& f,
                              bool v_part, int64_t slot, uint32_t head, uint32_t dim) {
  const ScaleAt at = scale_at(l, v_part, slot / l.page_size, slot % l.page_size, head);
  return at.first == nullptr ? std::vector<float>(dim, 1.0f) : per_element(at.first, f, dim);
}

HeadRow read_head(const kvrt_kv_layout& l, const std::optional<kvrt_kv_format>& f, bool v_part,
                  int64_t slot, uint32_t head) {
  const int64_t page = slot / l.page_size, token = slot % l.page_size;
  const bool shared = l.v_head_dim == 0;
  const kvrt_dtype dtype = v_part ? l.v_dtype : l.k_dtype;
  const uint32_t dim = (v_part && !shared) ? l.v_head_dim : l.k_head_dim;
  const uint8_t* base = static_cast<const uint8_t*>(v_part ? l.v_base : l.k_base);
  const int64_t ps = v_part ? l.v_page_stride : l.k_page_stride;
  const int64_t ts = v_part ? l.v_token_stride : l.k_token_stride;
  const int64_t hs = v_part ? l.v_head_stride : l.k_head_stride;
  HeadRow row;
  row.stored.resize(dim);
  row.zeros.assign(dim, 0.0f);
  const uint8_t* p = base + page * ps + token * ts + head * hs;
  const kvrt_pack_order order = f ? f->pack_order : KVRT_PACK_LOW_FIRST;
  for (uint32_t d = 0; d < dim; ++d) {
    row.stored[d] = four_bit(dtype) ? decode_nibble(dtype, p, d, order)
                                    : decode_element(dtype, p + d * dtype_bytes(dtype));
  }
  row.scales = row_scales(l, f, v_part, slot, head, dim);
  const float* zero_base = f ? (v_part ? f->v_zero_point : f->k_zero_point) : nullptr;
  const ScaleAt at = scale_at(l, v_part, page, token, head);
  if (at.first == nullptr || zero_base == nullptr) return row;
  row.zeros = per_element(reinterpret_cast<const uint8_t*>(zero_base) + at.offset, f, dim);
  return row;
}

uint16_t to_bf16(float f) {  // round to nearest even; inputs here are finite
  uint32_t bits;
  std::memcpy(&bits, &f, 4);
  bits += 0x7FFF + ((bits >> 16) & 1);
  return static_cast<uint16_t>(bits >> 16);
}

// ---- the suite ----------------------------------------------------------------------------

struct StoreDeleter {
  const kvrt_kv_store_api* api;
  void operator()(kvrt_kv_store* s) const { api->destroy(s); }
};
using StorePtr = std::unique_ptr<kvrt_kv_store, StoreDeleter>;

// Tokens to write: f32 values [n][heads][dim] for K and V, and their slots.
struct Batch {
  std::vector<int64_t> slots;
  std::vector<float> k, v;
};

class Suite {
 public:
  Suite(plugin::Registry& registry, const LoadedPlugin& p, const Options& options)
      : registry_(registry),
        plugin_(p),
        api_(p.kv),
        host_(p.host_api()),
        config_(plugin::as_config(registry.plugin_config(p.name))),
        options_(options),
        rng_(options.seed) {}

  void geometry_and_info();
  void write_gather_round_trip();
  void layout_agrees_with_gather();
  void overwrite();
  void head_isolation();
  void rounding();
  void attention_error();
  void page_boundaries();
  void concurrent_writes();
  void tier_round_trip();
  void tier_under_pressure();
  void bad_arguments();

 private:
  static kvrt_kv_geometry geometry(uint32_t layers, uint32_t heads, uint32_t k_dim, uint32_t v_dim,
                                   uint32_t page_size) {
    kvrt_kv_geometry g{};
    g.struct_size = sizeof(g);
    g.num_layers = layers;
    g.num_kv_heads = heads;
    g.total_kv_heads = heads;
    g.k_head_dim = k_dim;
    g.v_head_dim = v_dim;
    g.page_size = page_size;
    g.input_dtype = KVRT_DTYPE_F32;
    g.tp_size = 1;
    g.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
    return g;
  }
  static std::string describe(const kvrt_kv_geometry& g) {
    return "geometry(layers " + std::to_string(g.num_layers) + ", heads " +
           std::to_string(g.num_kv_heads) + ", k " + std::to_string(g.k_head_dim) + ", v " +
           std::to_string(g.v_head_dim) + ", page " + std::to_string(g.page_size) + ")";
  }

  void ok(kvrt_status s, const std::string& what) const {
    if (s != KVRT_OK) {
      std::string message = take_last_error();
      throw Failure(what + " returned " + status_name(s) + (message.empty() ? "" : ": " + message));
    }
  }

  StorePtr create(const kvrt_kv_geometry& g, uint64_t pages) {
    kvrt_kv_store* s = nullptr;
    ok(api_.create(host_, &g, pages, config_, &s), "create " + describe(g));
    KVRT_REQUIRE(s != nullptr, "create returned OK but no store");
    return StorePtr(s, StoreDeleter{&api_});
  }

  kvrt_kv_layout layout(const kvrt_kv_store* s, uint32_t layer) const {
    kvrt_kv_layout l{};
    l.struct_size = sizeof(l);
    ok(api_.layout(s, layer, &l), "layout(" + std::to_string(layer) + ")");
    check_layout_bounds(l, layer);
    return l;
  }

  // The layer's format (ABI 1.3), nullopt for a store without one (or one that says it has
  // none: KVRT_ERR_UNSUPPORTED).
  std::optional<kvrt_kv_format> format(const kvrt_kv_store* s, uint32_t layer) const {
    kvrt_kv_format f;
    const kvrt_status st = sdk::store_format(&api_, s, layer, &f);
    if (st == KVRT_ERR_UNSUPPORTED) {
      take_last_error();
      return std::nullopt;
    }
    ok(st, "format(" + std::to_string(layer) + ")");
    return f;
  }

  // Whether the suite decodes the layout's bytes itself (a dtype it knows; 4-bit codes with the
  // format that says how they are packed).
  bool layout_decodable(const kvrt_kv_layout& l, const std::optional<kvrt_kv_format>& f) const {
    return known_dtype(l.k_dtype) && known_dtype(l.v_dtype) &&
           ((!four_bit(l.k_dtype) && !four_bit(l.v_dtype)) || f.has_value());
  }

  // How values are read back: through gather() when the store has it, else the layout. A store
  // with neither a dtype the suite decodes nor a gather() cannot be checked: it fails by name.
  bool gather_reference(const kvrt_kv_store* s) const {
    if (api_.gather != nullptr) return true;
    const kvrt_kv_layout l = layout(s, 0);
    if (layout_decodable(l, format(s, 0))) return false;
    throw Failure("the store's K/V dtype " + sdk::dtype_text(l.k_dtype) + "/" +
                  sdk::dtype_text(l.v_dtype) +
                  " is not one the suite decodes (f32, bf16, f16, fp8_e4m3, int8; int4 and uint4 "
                  "with a format()) and it has no gather(): a store of its own format must offer "
                  "gather() as the reference decode of its values");
  }

  // Every byte the layout addresses must lie in memory the store allocated through the host;
  // checked before the suite reads through it, so a wrong stride fails here instead of
  // reading out of bounds. Rows are sized by the dtype, or by the format's bits for a dtype the
  // suite does not know (unchecked without either).
  void check_layout_bounds(const kvrt_kv_layout& l, uint32_t layer) const {
    if (l.num_pages == 0 || l.page_size == 0) return;
    auto region = [&](const char* what, const void* base, int64_t page, int64_t token, int64_t head,
                      uint64_t tail_bytes) {
      if (base == nullptr) throw Failure(std::string("layout: ") + what + " pointer is NULL");
      if (page < 0 || token < 0 || head < 0) {
        throw Failure(std::string("layout: negative ") + what + " stride");
      }
      const uint64_t extent = static_cast<uint64_t>(page) * (l.num_pages - 1) +
                              static_cast<uint64_t>(token) * (l.page_size - 1) +
                              static_cast<uint64_t>(head) * (l.num_kv_heads - 1) + tail_bytes;
      if (!registry_.memory().covers(base, extent)) {
        throw Failure("layout(" + std::to_string(layer) + "): the " + what + " region (" +
                      std::to_string(extent) + " bytes by its strides) is not inside memory " +
                      "the store allocated through host->alloc");
      }
    };
    const uint32_t v_dim = l.v_head_dim ? l.v_head_dim : l.k_head_dim;
    if (known_dtype(l.k_dtype)) {
      region("K", l.k_base, l.k_page_stride, l.k_token_stride, l.k_head_stride,
             row_bytes(l.k_dtype, l.k_head_dim));
    }
    if (known_dtype(l.v_dtype)) {
      region("V", l.v_base, l.v_page_stride, l.v_token_stride, l.v_head_stride,
             row_bytes(l.v_dtype, v_dim));
    }
    if (l.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD) {
      region("K scale", l.k_scale, l.scale_page_stride, l.scale_token_stride, l.scale_head_stride,
             4);
      region("V scale", l.v_scale, l.scale_page_stride, l.scale_token_stride, l.scale_head_stride,
             4);
    } else if (l.scale_mode == KVRT_SCALE_PER_TENSOR) {
      region("K scale", l.k_scale, 0, 0, 0, 4);
      region("V scale", l.v_scale, 0, 0, 0, 4);
    }
  }

  bool accepts(kvrt_dtype d) const { return (plugin_.desc.input_dtypes & KVRT_DTYPE_BIT(d)) != 0; }

  // Normal values; with vary_magnitude, each token's are scaled by 2^-4 .. 2^4 so per-token
  // scales matter.
  Batch random_batch(const kvrt_kv_geometry& g, std::vector<int64_t> slots,
                     bool vary_magnitude = true) {
    std::normal_distribution<float> normal(0.f, 1.f);
    Batch b;
    b.slots = std::move(slots);
    b.k.resize(b.slots.size() * g.num_kv_heads * g.k_head_dim);
    b.v.resize(b.slots.size() * g.num_kv_heads * g.v_head_dim);
    for (size_t i = 0; i < b.slots.size(); ++i) {
      const int exponent = vary_magnitude ? static_cast<int>(rng_() % 9) - 4 : 0;
      const float magnitude = std::ldexp(1.0f, exponent);
      size_t kr = size_t{g.num_kv_heads} * g.k_head_dim, vr = size_t{g.num_kv_heads} * g.v_head_dim;
      for (size_t j = 0; j < kr; ++j) b.k[i * kr + j] = normal(rng_) * magnitude;
      for (size_t j = 0; j < vr; ++j) b.v[i * vr + j] = normal(rng_) * magnitude;
    }
    return b;
  }

  void write(kvrt_kv_store* s, const kvrt_kv_geometry& g, uint32_t layer, const Batch& b,
             kvrt_dtype dtype, std::vector<float>* stored_k = nullptr,
             std::vector<float>* stored_v = nullptr) {
    kvrt_kv_write w{};
    w.struct_size = sizeof(w);
    w.layer = layer;
    w.dtype = dtype;
    w.num_tokens = static_cast<uint32_t>(b.slots.size());
    w.slots = b.slots.data();
    std::vector<uint16_t> k16, v16;
    if (dtype == KVRT_DTYPE_BF16) {
      for (float x : b.k) k16.push_back(to_bf16(x));
      for (float x : b.v) v16.push_back(to_bf16(x));
      w.k = k16.data();
      w.v = g.v_head_dim ? v16.data() : nullptr;
    } else {
      w.k = b.k.data();
      w.v = g.v_head_dim ? b.v.data() : nullptr;
    }
    ok(api_.write(s, &w),
       "write(layer " + std::to_string(layer) + ", " + std::to_string(w.num_tokens) + " tokens)");
    // What the store was actually given, as f32.
    if (stored_k != nullptr) {
      stored_k->clear();
      for (size_t i = 0; i < b.k.size(); ++i) {
        stored_k->push_back(dtype == KVRT_DTYPE_BF16 ? bits_to_float(uint32_t{k16[i]} << 16)
                                                     : b.k[i]);
      }
    }
    if (stored_v != nullptr) {
      stored_v->clear();
      for (size_t i = 0; i < b.v.size(); ++i) {
        stored_v->push_back(dtype == KVRT_DTYPE_BF16 ? bits_to_float(uint32_t{v16[i]} << 16)
                                                     : b.v[i]);
      }
    }
  }

  // K and V of `slots` as f32 through gather, or through the layout (the suite's own decode).
  void read_back(const kvrt_kv_store* s, const kvrt_kv_geometry& g, uint32_t layer,
                 const std::vector<int64_t>& slots, std::vector<float>* k, std::vector<float>* v,
                 bool use_gather) {
    k->assign(slots.size() * g.num_kv_heads * g.k_head_dim, NAN);
    v->assign(slots.size() * g.num_kv_heads * g.v_head_dim, NAN);
    if (use_gather) {
      ok(api_.gather(s, layer, static_cast<uint32_t>(slots.size()), slots.data(), k->data(),
                     g.v_head_dim ? v->data() : nullptr),
         "gather");
      return;
    }
    kvrt_kv_layout l = layout(s, layer);
    const std::optional<kvrt_kv_format> f = format(s, layer);
    KVRT_REQUIRE(layout_decodable(l, f), "the suite cannot decode the layout's dtype " +
                                             sdk::dtype_text(l.k_dtype));
    for (size_t i = 0; i < slots.size(); ++i) {
      for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
        std::vector<float> kr = read_head(l, f, false, slots[i], h).values();
        std::copy(kr.begin(), kr.end(), k->begin() + (i * g.num_kv_heads + h) * g.k_head_dim);
        if (g.v_head_dim) {
          std::vector<float> vr = read_head(l, f, true, slots[i], h).values();
          std::copy(vr.begin(), vr.end(), v->begin() + (i * g.num_kv_heads + h) * g.v_head_dim);
        }
      }
    }
  }

  // Read back through the reference: gather() when the store has it, else the layout.
  void read_reference(const kvrt_kv_store* s, const kvrt_kv_geometry& g, uint32_t layer,
                      const std::vector<int64_t>& slots, std::vector<float>* k,
                      std::vector<float>* v) {
    read_back(s, g, layer, slots, k, v, gather_reference(s));
  }

  // Checks read-back values against what was written, head row by head row (and, for the default
  // bound, over all the rows of K and of V), under the store's bound (store_bound: declared,
  // known for the dtype, or the default), and that a dynamic scale fits its row.
  void check_values(const kvrt_kv_store* s, const kvrt_kv_geometry& g, uint32_t layer,
                    const std::vector<int64_t>& slots, const std::vector<float>& want_k,
                    const std::vector<float>& want_v, const std::vector<float>& got_k,
                    const std::vector<float>& got_v, const std::string& context) {
    kvrt_kv_layout l = layout(s, layer);
    const std::optional<kvrt_kv_format> f = format(s, layer);
    const Bound bound = store_bound(f, l.k_dtype, l.v_dtype);
    for (int part = 0; part < (g.v_head_dim ? 2 : 1); ++part) {
      const bool is_v = part == 1;
      const uint32_t dim = is_v ? g.v_head_dim : g.k_head_dim;
      const std::vector<float>& want = is_v ? want_v : want_k;
      const std::vector<float>& got = is_v ? got_v : got_k;
      const kvrt_dtype dtype = is_v ? l.v_dtype : l.k_dtype;
      // Each row's relative RMS error, squared and summed, and the worst row, for rows_relative.
      double sum_relative2 = 0, worst_relative = 0;
      std::string worst_row;
      for (size_t i = 0; i < slots.size(); ++i) {
        for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
          auto where = [&] {
            return context + ": layer " + std::to_string(layer) + " slot " +
                   std::to_string(slots[i]) + " head " + std::to_string(h) + " " +
                   (is_v ? "V" : "K");
          };
          const std::vector<float> scales = row_scales(l, f, is_v, slots[i], h, dim);
          const float* x = &want[(i * g.num_kv_heads + h) * dim];
          const float* y = &got[(i * g.num_kv_heads + h) * dim];
          const bool whole_row = !f || f->group_size == 0;
          if (l.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD && whole_row) {
            // A dynamic scale must fit the row (amax / qmax, up to a factor of 2 for stores
            // that round it to a power of two); a larger one would widen the bound.
            double amax = 0;
            for (uint32_t d = 0; d < dim; ++d) amax = std::max(amax, std::fabs(double{x[d]}));
            const double qmax = dtype == KVRT_DTYPE_INT8       ? 127
                                : dtype == KVRT_DTYPE_FP8_E4M3 ? 448
                                : dtype == KVRT_DTYPE_INT4     ? 7
                                                               : 0;
            if (qmax > 0 && amax > 0 && !(scales[0] <= 2 * amax / qmax * (1 + 1e-6))) {
              throw Failure(where() + " scale " + std::to_string(scales[0]) +
                            " is more than twice amax/" + std::to_string(static_cast<int>(qmax)) +
                            " = " + std::to_string(amax / qmax));
            }
          }
          double err2 = 0, x2 = 0, s2 = 0;
          for (uint32_t d = 0; d < dim; ++d) {
            const double err = std::fabs(double{y[d]} - double{x[d]});
            err2 += err * err, x2 += double{x[d]} * x[d], s2 += double{scales[d]} * scales[d];
            if (!bound.element && std::isfinite(err)) continue;
            double b = bound.element_relative * std::fabs(x[d]) +
                       bound.element_scale_units * scales[d];
            if (b > 0) b += 1e-6 * std::fabs(x[d]) + 1e-30;  // f32 arithmetic around the scale
            if (!(err <= b)) {
              throw Failure(where() + "[" + std::to_string(d) + "] = " + std::to_string(y[d]) +
                            ", wrote " + std::to_string(x[d]) + " (error " + std::to_string(err) +
                            " > bound " + std::to_string(b) + ": " + bound_text(bound) + ", " +
                            sdk::dtype_text(dtype) + ")");
            }
          }
          if (!bound.row) continue;
          const double rms_err = std::sqrt(err2 / dim), rms_x = std::sqrt(x2 / dim);
          const double b = bound.row_relative * rms_x +
                           bound.row_scale_units * std::sqrt(s2 / dim) + 1e-6 * rms_x + 1e-30;
          if (!(rms_err <= b)) {
            throw Failure(where() + ": RMS error " + std::to_string(rms_err) + " = " +
                          std::to_string(rms_x > 0 ? rms_err / rms_x : 0) +
                          " of the row's RMS " + std::to_string(rms_x) + " > bound " +
                          std::to_string(b) + ": " + bound_text(bound) + ", " +
                          sdk::dtype_text(dtype));
          }
          // A row of zeros read back as zeros errs by nothing; read back as anything else, by
          // more than any bound (the row check above has already failed it).
          const double relative = rms_x > 0 ? rms_err / rms_x : 0;
          sum_relative2 += relative * relative;
          if (relative > worst_relative) {
            worst_relative = relative;
            worst_row = "slot " + std::to_string(slots[i]) + " head " + std::to_string(h);
          }
        }
      }
      const size_t rows = slots.size() * g.num_kv_heads;
      if (bound.rows_relative <= 0 || rows == 0) continue;
      const double over_rows = std::sqrt(sum_relative2 / static_cast<double>(rows));
      if (!(over_rows <= bound.rows_relative + 1e-6)) {
        throw Failure(context + ": layer " + std::to_string(layer) + " " + (is_v ? "V" : "K") +
                      ": over its " + std::to_string(rows) +
                      " rows, the RMS of each row's RMS error relative to the row's RMS is " +
                      std::to_string(over_rows) + " > bound " +
                      std::to_string(bound.rows_relative) + " (worst row: " + worst_row + ", " +
                      std::to_string(worst_relative) + "): " + bound_text(bound) + ", " +
                      sdk::dtype_text(dtype));
      }
    }
  }

  std::vector<int64_t> shuffled_slots(uint64_t total, size_t n) {
    std::vector<int64_t> all = every_slot(total);
    std::shuffle(all.begin(), all.end(), rng_);
    all.resize(std::min<size_t>(n, total));
    return all;
  }

  // Every element and scale of one device page (all layers), decoded, for bit-exact compares;
  // through gather() for a layout the suite does not decode.
  std::vector<float> page_snapshot(const kvrt_kv_store* s, const kvrt_kv_geometry& g,
                                   int64_t page) {
    std::vector<float> out;
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      kvrt_kv_layout l = layout(s, layer);
      const std::optional<kvrt_kv_format> f = format(s, layer);
      if (!layout_decodable(l, f)) {
        std::vector<int64_t> slots(g.page_size);
        std::iota(slots.begin(), slots.end(), page * g.page_size);
        std::vector<float> k, v;
        read_back(s, g, layer, slots, &k, &v, gather_reference(s));
        out.insert(out.end(), k.begin(), k.end());
        out.insert(out.end(), v.begin(), v.end());
        continue;
      }
      for (uint32_t t = 0; t < g.page_size; ++t) {
        for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
          for (int part = 0; part < (g.v_head_dim ? 2 : 1); ++part) {
            HeadRow row = read_head(l, f, part == 1, page * g.page_size + t, h);
            out.insert(out.end(), row.stored.begin(), row.stored.end());
            out.insert(out.end(), row.scales.begin(), row.scales.end());
            out.insert(out.end(), row.zeros.begin(), row.zeros.end());
          }
        }
      }
    }
    return out;
  }

  void fill_page(kvrt_kv_store* s, const kvrt_kv_geometry& g, int64_t page) {
    std::vector<int64_t> slots(g.page_size);
    std::iota(slots.begin(), slots.end(), page * g.page_size);
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      write(s, g, layer, random_batch(g, slots), KVRT_DTYPE_F32);
    }
  }

  // Report the pages the way the core would over their life, so every write policy
  // (write-through, selective after up to kTierHits hits, write-back on eviction) copies them.
  static constexpr int kTierHits = 64;
  uint64_t save(kvrt_kv_store* s, const std::vector<uint64_t>& hashes,
                const std::vector<int64_t>& pages) {
    uint64_t ticket = 0;
    const uint32_t n = static_cast<uint32_t>(hashes.size());
    ok(api_.tier_save(s, n, hashes.data(), pages.data(), KVRT_TIER_INSERTED, &ticket), "tier_save");
    for (int hit = 0; hit < kTierHits; ++hit) {
      ok(api_.tier_save(s, n, hashes.data(), pages.data(), KVRT_TIER_HIT, &ticket), "tier_save");
    }
    ok(api_.tier_save(s, n, hashes.data(), pages.data(), KVRT_TIER_EVICTING, &ticket), "tier_save");
    return ticket;
  }

  kvrt_tier_info tier_info(const kvrt_kv_store* s) const {
    kvrt_tier_info info{};
    info.struct_size = sizeof(info);
    ok(api_.tier_info(s, &info), "tier_info");
    return info;
  }

  void require_tier() const {
    if (api_.tier_info == nullptr) throw NotApplicable("the store has no tier callbacks");
  }

  plugin::Registry& registry_;
  const LoadedPlugin& plugin_;
  const kvrt_kv_store_api& api_;
  const kvrt_host_api* host_;
  const kvrt_config* config_;
  Options options_;
  std::mt19937_64 rng_;
};

const std::vector<kvrt_kv_geometry>& many_geometries() {
  static const std::vector<kvrt_kv_geometry> all = [] {
    std::vector<kvrt_kv_geometry> g;
    // layers, KV heads, K dim, V dim (0: V in the K row), page size, V width (MLA latents:
    // Kimi-K2's 512 of 576, tiny-deepseek-v3's 32 of 40).
    const uint32_t shapes[][6] = {
        {1, 1, 8, 8, 1, 0},      {2, 2, 16, 16, 4, 0},   {3, 4, 64, 64, 16, 0},
        {2, 8, 128, 128, 16, 0}, {1, 2, 256, 256, 64, 0}, {2, 1, 576, 0, 1, 0},
        {1, 3, 40, 24, 128, 0},  {4, 2, 32, 32, 2, 0},   {3, 1, 576, 0, 64, 512},
        {3, 1, 40, 0, 16, 32},   {2, 1, 40, 0, 1, 32}};
    for (const auto& s : shapes) {
      kvrt_kv_geometry x{};
      x.struct_size = sizeof(x);
      x.num_layers = s[0];
      x.num_kv_heads = x.total_kv_heads = s[1];
      x.k_head_dim = s[2];
      x.v_head_dim = s[3];
      x.page_size = s[4];
      x.v_width = s[5];
      x.input_dtype = KVRT_DTYPE_F32;
      x.tp_size = 1;
      x.device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0};
      g.push_back(x);
    }
    return g;
  }();
  return all;
}

void Suite::geometry_and_info() {
  for (const kvrt_kv_geometry& g : many_geometries()) {
    uint64_t bytes = 0;
    ok(api_.page_bytes(host_, &g, config_, &bytes), "page_bytes " + describe(g));
    KVRT_REQUIRE(bytes > 0, "page_bytes is 0 for " + describe(g));
    const uint64_t before = registry_.memory().device_used();
    const uint64_t host_before = registry_.memory().host_used();
    {
      const uint64_t pages = 5;
      StorePtr s = create(g, pages);
      kvrt_kv_info info{};
      info.struct_size = sizeof(info);
      ok(api_.info(s.get(), &info), "info");
      KVRT_REQUIRE(info.bytes_per_page == bytes,
                   "info.bytes_per_page " + std::to_string(info.bytes_per_page) +
                       " differs from page_bytes " + std::to_string(bytes) + " for " + describe(g));
      KVRT_REQUIRE(info.bytes_per_token == info.bytes_per_page / g.page_size,
                   "info.bytes_per_token is not bytes_per_page / page_size for " + describe(g));
      KVRT_REQUIRE(info.num_pages == pages, "info.num_pages " + std::to_string(info.num_pages) +
                                                ", created with " + std::to_string(pages));
      // An older host's shorter struct: the store writes no more than its struct_size.
      struct {
        kvrt_kv_info info;
        uint64_t canary;
      } short_info{};
      const uint32_t older = offsetof(kvrt_kv_info, host_tier_pages);
      std::memset(&short_info, 0xA5, sizeof(short_info));
      short_info.info.struct_size = older;
      ok(api_.info(s.get(), &short_info.info), "info with struct_size " + std::to_string(older));
      const uint8_t* tail = reinterpret_cast<const uint8_t*>(&short_info.info) + older;
      const uint8_t* end = reinterpret_cast<const uint8_t*>(&short_info + 1);
      KVRT_REQUIRE(std::all_of(tail, end, [](uint8_t b) { return b == 0xA5; }),
                   "info wrote past the caller's struct_size");
      const uint64_t used = registry_.memory().device_used() - before;
      KVRT_REQUIRE(used >= pages * bytes, "the store holds " + std::to_string(pages * bytes) +
                                              " bytes of pages but took only " +
                                              std::to_string(used) +
                                              " bytes of device memory through host->alloc");
      for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
        kvrt_kv_layout l = layout(s.get(), layer);
        KVRT_REQUIRE(l.num_pages == pages && l.page_size == g.page_size &&
                         l.num_kv_heads == g.num_kv_heads && l.k_head_dim == g.k_head_dim &&
                         l.v_head_dim == g.v_head_dim,
                     "layout(" + std::to_string(layer) + ") does not echo " + describe(g));
        KVRT_REQUIRE(l.k_dtype == info.k_dtype && l.v_dtype == info.v_dtype &&
                         l.scale_mode == info.scale_mode,
                     "layout dtypes or scale mode differ from info");
      }
    }
    KVRT_REQUIRE(registry_.memory().device_used() == before,
                 "destroy did not return all device memory for " + describe(g));
    KVRT_REQUIRE(registry_.memory().host_used() == host_before,
                 "destroy did not return all host memory for " + describe(g));
  }
}

void Suite::write_gather_round_trip() {
  for (const kvrt_kv_geometry& g : many_geometries()) {
    const uint64_t pages = 6;
    StorePtr s = create(g, pages);
    const bool via_gather = gather_reference(s.get());
    for (kvrt_dtype dtype : {KVRT_DTYPE_F32, KVRT_DTYPE_BF16}) {
      if (!accepts(dtype)) continue;
      // Every layer gets its own data before any is read back, so layers that alias fail.
      const std::vector<int64_t> slots = shuffled_slots(pages * g.page_size, 3 * g.page_size + 1);
      std::vector<std::vector<float>> want_k(g.num_layers), want_v(g.num_layers);
      for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
        write(s.get(), g, layer, random_batch(g, slots), dtype, &want_k[layer], &want_v[layer]);
      }
      for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
        std::vector<float> got_k, got_v;
        read_back(s.get(), g, layer, slots, &got_k, &got_v, via_gather);
        check_values(s.get(), g, layer, slots, want_k[layer], want_v[layer], got_k, got_v,
                     std::string(plugin::dtype_name(dtype)) + " input, " + describe(g));
        kvrt_kv_layout l = layout(s.get(), layer);
        if (dtype == l.k_dtype && dtype == l.v_dtype && l.scale_mode == KVRT_SCALE_NONE) {
          KVRT_REQUIRE(got_k == want_k[layer] && got_v == want_v[layer],
                       std::string(plugin::dtype_name(dtype)) +
                           " input into a store of the same dtype is not bit-exact, " +
                           describe(g));
        }
      }
    }
    // Rows with a token stride: K and V as they come out of a fused QKV projection.
    if (accepts(KVRT_DTYPE_F32)) {
      const std::vector<int64_t> slots = shuffled_slots(pages * g.page_size, 2 * g.page_size + 1);
      const Batch b = random_batch(g, slots);
      const int64_t kr = int64_t{g.num_kv_heads} * g.k_head_dim;
      const int64_t vr = int64_t{g.num_kv_heads} * g.v_head_dim;
      const int64_t stride = kr + vr + 7;  // [K | V | padding] per token
      std::vector<float> fused(slots.size() * stride, NAN);
      for (size_t i = 0; i < slots.size(); ++i) {
        std::copy_n(b.k.begin() + i * kr, kr, fused.begin() + i * stride);
        std::copy_n(b.v.begin() + i * vr, vr, fused.begin() + i * stride + kr);
      }
      kvrt_kv_write w{};
      w.struct_size = sizeof(w);
      w.layer = g.num_layers - 1;
      w.dtype = KVRT_DTYPE_F32;
      w.num_tokens = static_cast<uint32_t>(slots.size());
      w.slots = slots.data();
      w.k = fused.data();
      w.v = g.v_head_dim ? fused.data() + kr : nullptr;
      w.k_token_stride = w.v_token_stride = stride;
      ok(api_.write(s.get(), &w), "write with token stride " + std::to_string(stride));
      std::vector<float> got_k, got_v;
      read_back(s.get(), g, w.layer, slots, &got_k, &got_v, via_gather);
      check_values(s.get(), g, w.layer, slots, b.k, b.v, got_k, got_v,
                   "rows " + std::to_string(stride) + " elements apart, " + describe(g));
    }
  }
}

void Suite::layout_agrees_with_gather() {
  if (api_.gather == nullptr) throw NotApplicable("the store has no gather (the layout is read)");
  for (const kvrt_kv_geometry& g : many_geometries()) {
    const uint64_t pages = 4;
    StorePtr s = create(g, pages);
    const kvrt_kv_layout first = layout(s.get(), 0);
    if (!layout_decodable(first, format(s.get(), 0))) {
      throw NotApplicable("the layout's dtype " + sdk::dtype_text(first.k_dtype) +
                          " is the store's own: gather() is the only reading of it");
    }
    const std::vector<int64_t> all = every_slot(pages * g.page_size);
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      write(s.get(), g, layer, random_batch(g, all), KVRT_DTYPE_F32);
    }
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      std::vector<float> gk, gv, lk, lv;
      read_back(s.get(), g, layer, all, &gk, &gv, true);
      read_back(s.get(), g, layer, all, &lk, &lv, false);
      for (size_t i = 0; i < gk.size() + gv.size(); ++i) {
        const bool is_v = i >= gk.size();
        float a = is_v ? lv[i - gk.size()] : lk[i];
        float b = is_v ? gv[i - gk.size()] : gk[i];
        if (std::memcmp(&a, &b, 4) != 0) {
          size_t j = is_v ? i - gk.size() : i;
          size_t row = size_t{g.num_kv_heads} * (is_v ? g.v_head_dim : g.k_head_dim);
          throw Failure("layer " + std::to_string(layer) + " slot " + std::to_string(j / row) +
                        " " + (is_v ? "V" : "K") + " element " + std::to_string(j % row) +
                        ": the layout reads " + std::to_string(a) + ", gather gives " +
                        std::to_string(b) + ", " + describe(g));
        }
      }
    }
  }
}

void Suite::overwrite() {
  // Every slot written, then written again with other values: the second write is what is
  // read, in every slot of every layer (a store that keeps the first, or mixes them, fails).
  const kvrt_kv_geometry g = geometry(2, 2, 32, 32, 4);
  const uint64_t pages = 6;
  StorePtr s = create(g, pages);
  const bool via_gather = gather_reference(s.get());
  const std::vector<int64_t> all = every_slot(pages * g.page_size);
  for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
    write(s.get(), g, layer, random_batch(g, all), KVRT_DTYPE_F32);
  }
  std::vector<std::vector<float>> want_k(g.num_layers), want_v(g.num_layers);
  for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
    write(s.get(), g, layer, random_batch(g, all), KVRT_DTYPE_F32, &want_k[layer],
          &want_v[layer]);
  }
  for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
    std::vector<float> got_k, got_v;
    read_back(s.get(), g, layer, all, &got_k, &got_v, via_gather);
    check_values(s.get(), g, layer, all, want_k[layer], want_v[layer], got_k, got_v,
                 "after every slot was written twice");
  }
}

void Suite::head_isolation() {
  // Heads of one token written with unrelated values of very different sizes (head h scaled by
  // 4^h): each head must read back its own row, not a neighbour's or a mix.
  const kvrt_kv_geometry g = geometry(1, 4, 32, 32, 4);
  const uint64_t pages = 4;
  StorePtr s = create(g, pages);
  const bool via_gather = gather_reference(s.get());
  const std::vector<int64_t> all = every_slot(pages * g.page_size);
  Batch b = random_batch(g, all, false);
  for (size_t i = 0; i < all.size(); ++i) {
    for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
      const float m = std::ldexp(1.0f, 2 * static_cast<int>(h) - 3);
      for (uint32_t d = 0; d < g.k_head_dim; ++d) b.k[(i * g.num_kv_heads + h) * 32 + d] *= m;
      for (uint32_t d = 0; d < g.v_head_dim; ++d) b.v[(i * g.num_kv_heads + h) * 32 + d] *= m;
    }
  }
  std::vector<float> want_k, want_v, got_k, got_v;
  write(s.get(), g, 0, b, KVRT_DTYPE_F32, &want_k, &want_v);
  read_back(s.get(), g, 0, all, &got_k, &got_v, via_gather);
  // Name the neighbour a head reads, if it reads one, before the bound says only "too far".
  const size_t row = g.k_head_dim;
  for (size_t i = 0; i < all.size(); ++i) {
    for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
      auto distance = [&](uint32_t other) {
        double e = 0;
        for (size_t d = 0; d < row; ++d) {
          const double x = got_k[(i * g.num_kv_heads + h) * row + d] -
                           want_k[(i * g.num_kv_heads + other) * row + d];
          e += x * x;
        }
        return e;
      };
      for (uint32_t other = 0; other < g.num_kv_heads; ++other) {
        KVRT_REQUIRE(other == h || distance(other) >= distance(h),
                     "slot " + std::to_string(all[i]) + ": head " + std::to_string(h) +
                         "'s K reads closer to what head " + std::to_string(other) + " wrote");
      }
    }
  }
  check_values(s.get(), g, 0, all, want_k, want_v, got_k, got_v,
               "heads of very different magnitudes");
}

void Suite::rounding() {
  // A store rounds to nearest: its errors are not biased one way (truncation towards -inf) and
  // do not shrink values towards zero (truncation towards zero, a scale too small). Over many
  // rows, with err = y - x: the mean error and the correlation <err, x> / (|err| |x|) of a
  // rounding store are near 0; truncation gives about -1 and -0.7, a scale 25% off +1.
  const kvrt_kv_geometry g = geometry(1, 2, 64, 64, 16);
  const uint64_t pages = 16;
  StorePtr s = create(g, pages);
  const bool via_gather = gather_reference(s.get());
  const std::vector<int64_t> all = every_slot(pages * g.page_size);
  std::vector<float> want_k, want_v, got_k, got_v;
  write(s.get(), g, 0, random_batch(g, all), KVRT_DTYPE_F32, &want_k, &want_v);
  read_back(s.get(), g, 0, all, &got_k, &got_v, via_gather);
  constexpr double kLimit = 0.2;
  for (int part = 0; part < 2; ++part) {
    const std::vector<float>& x = part ? want_v : want_k;
    const std::vector<float>& y = part ? got_v : got_k;
    const size_t dim = g.k_head_dim;
    double sum_err = 0, sum_abs = 0, inner = 0, norms = 0;
    for (size_t r = 0; r < x.size() / dim; ++r) {
      double dot = 0, e2 = 0, x2 = 0;
      for (size_t d = 0; d < dim; ++d) {
        const double xv = x[r * dim + d], e = double{y[r * dim + d]} - xv;
        sum_err += e, sum_abs += std::fabs(e), dot += e * xv, e2 += e * e, x2 += xv * xv;
      }
      inner += dot;
      norms += std::sqrt(e2 * x2);
    }
    if (sum_abs == 0) continue;  // exact
    const double bias = sum_err / sum_abs, shrink = norms > 0 ? inner / norms : 0;
    const char* name = part ? "V" : "K";
    KVRT_REQUIRE(std::fabs(bias) <= kLimit,
                 std::string(name) + " errors lean one way: mean error " +
                     std::to_string(bias) + " of the mean |error| (|.| <= 0.2 for rounding to " +
                     "nearest; truncation gives about -1)");
    KVRT_REQUIRE(std::fabs(shrink) <= kLimit,
                 std::string(name) + " errors follow the values: <err, x> / (|err| |x|) = " +
                     std::to_string(shrink) +
                     " (|.| <= 0.2 for rounding to nearest; truncation towards zero gives about "
                     "-0.7, a scale 25% too large +1)");
  }
}

void Suite::attention_error() {
  // One query per head against every written token: softmax(q.k * scale) v from the original
  // f32 K/V and from what the store gives back. With per-element errors |dk| <= bk and
  // |dv| <= bv (the format's bounds), each score moves by at most D = scale * sum|q||bk|, so
  // every softmax weight moves by a factor within exp(+-2D) and
  //   |o - o'| <= (exp(2 max D) - 1) * max|v| + max bv.
  const kvrt_kv_geometry g = geometry(1, 2, 64, 64, 16);
  const uint64_t pages = 8;
  StorePtr s = create(g, pages);
  std::vector<int64_t> slots = shuffled_slots(pages * g.page_size, 100);
  // Unit-scale data, as after a model's norms: the bound below is then tight enough to mean
  // something for 8-bit formats (about max|v| / 2 for fp8, a few percent for bf16).
  Batch b = random_batch(g, slots, false);
  write(s.get(), g, 0, b, KVRT_DTYPE_F32);
  std::vector<float> k, v;
  read_reference(s.get(), g, 0, slots, &k, &v);
  kvrt_kv_layout l = layout(s.get(), 0);
  const std::optional<kvrt_kv_format> f = format(s.get(), 0);
  const Bound bound = store_bound(f, l.k_dtype, l.v_dtype);
  // Bounds on one row's error: its L1 against |q| (element bound) or its L2 (row bound: the
  // RMS times sqrt(dim)), whichever is tighter.
  auto rms = [](const float* x, uint32_t n) {
    double sum = 0;
    for (uint32_t j = 0; j < n; ++j) sum += double{x[j]} * x[j];
    return std::sqrt(sum / n);
  };
  auto row_l2_bound = [&](const float* x, const std::vector<float>& scales, uint32_t n) {
    return std::sqrt(static_cast<double>(n)) * (bound.row_relative * rms(x, n) +
                                   bound.row_scale_units * rms(scales.data(), n));
  };
  const double softmax_scale = 1.0 / std::sqrt(static_cast<double>(g.k_head_dim));
  std::normal_distribution<double> normal(0, 1);
  for (uint32_t h = 0; h < g.num_kv_heads; ++h) {
    std::vector<double> q(g.k_head_dim);
    for (double& x : q) x = normal(rng_);
    const size_t n = slots.size();
    std::vector<double> s_ref(n), s_got(n);
    double max_d = 0, max_v = 0, max_bv = 0;
    double q_norm = 0;
    for (double x : q) q_norm += x * x;
    q_norm = std::sqrt(q_norm);
    for (size_t i = 0; i < n; ++i) {
      const size_t row = (i * g.num_kv_heads + h) * g.k_head_dim;
      const std::vector<float> k_scales = row_scales(l, f, false, slots[i], h, g.k_head_dim);
      const std::vector<float> v_scales = row_scales(l, f, true, slots[i], h, g.v_head_dim);
      double d = 0, bv = 0;
      for (uint32_t j = 0; j < g.k_head_dim; ++j) {
        s_ref[i] += q[j] * b.k[row + j] * softmax_scale;
        s_got[i] += q[j] * k[row + j] * softmax_scale;
        const double bk = bound.element_relative * std::fabs(b.k[row + j]) +
                          bound.element_scale_units * k_scales[j];
        d += std::fabs(q[j]) * (bk * (1 + 1e-6) + 1e-30) * softmax_scale;
        max_v = std::max(max_v, std::fabs(double{b.v[row + j]}));
        bv = std::max(bv, bound.element_relative * std::fabs(b.v[row + j]) +
                              bound.element_scale_units * v_scales[j]);
      }
      if (!bound.element) d = bv = INFINITY;
      if (bound.row) {
        d = std::min(d, softmax_scale * q_norm * row_l2_bound(&b.k[row], k_scales, g.k_head_dim));
        bv = std::min(bv, row_l2_bound(&b.v[row], v_scales, g.v_head_dim));
      }
      max_d = std::max(max_d, d);
      max_bv = std::max(max_bv, bv);
    }
    auto attend = [&](const std::vector<double>& scores, const std::vector<float>& values) {
      double m = *std::max_element(scores.begin(), scores.end()), sum = 0;
      std::vector<double> out(g.v_head_dim, 0.0);
      for (size_t i = 0; i < n; ++i) {
        double p = std::exp(scores[i] - m);
        sum += p;
        for (uint32_t j = 0; j < g.v_head_dim; ++j) {
          out[j] += p * values[(i * g.num_kv_heads + h) * g.v_head_dim + j];
        }
      }
      for (double& x : out) x /= sum;
      return out;
    };
    std::vector<double> o_ref = attend(s_ref, b.v), o_got = attend(s_got, v);
    const double limit = (std::exp(2 * max_d) - 1) * max_v + max_bv + 1e-9;
    for (uint32_t j = 0; j < g.v_head_dim; ++j) {
      double err = std::fabs(o_ref[j] - o_got[j]);
      KVRT_REQUIRE(err <= limit, "head " + std::to_string(h) + " output[" + std::to_string(j) +
                                     "] error " + std::to_string(err) + " exceeds the bound " +
                                     std::to_string(limit) + " the format allows (" +
                                     bound_text(bound) + ")");
    }
  }
}

void Suite::page_boundaries() {
  for (uint32_t page_size : {1u, 2u, 16u, 64u}) {
    const kvrt_kv_geometry g = geometry(2, 2, 16, 16, page_size);
    const uint64_t pages = 5;
    StorePtr s = create(g, pages);
    const bool decodable = layout_decodable(layout(s.get(), 0), format(s.get(), 0));
    if (!decodable && api_.gather == nullptr) gather_reference(s.get());  // fails by name
    const std::vector<int64_t> all = every_slot(pages * page_size);
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      Batch first = random_batch(g, all);
      std::vector<float> want_k, want_v;
      write(s.get(), g, layer, first, KVRT_DTYPE_F32, &want_k, &want_v);
      // Rewrite the last slot of each page and the first of the next, one token per call.
      std::vector<int64_t> edges;
      for (uint64_t p = 1; p < pages; ++p) {
        edges.push_back(static_cast<int64_t>(p * page_size) - 1);
        edges.push_back(static_cast<int64_t>(p * page_size));
      }
      const size_t kr = size_t{g.num_kv_heads} * g.k_head_dim,
                   vr = size_t{g.num_kv_heads} * g.v_head_dim;
      for (int64_t slot : edges) {
        Batch one = random_batch(g, {slot});
        std::vector<float> k1, v1;
        write(s.get(), g, layer, one, KVRT_DTYPE_F32, &k1, &v1);
        std::copy(k1.begin(), k1.end(), want_k.begin() + slot * kr);
        std::copy(v1.begin(), v1.end(), want_v.begin() + slot * vr);
      }
      for (bool via_gather : {false, true}) {
        if ((via_gather && api_.gather == nullptr) || (!via_gather && !decodable)) continue;
        std::vector<float> got_k, got_v;
        read_back(s.get(), g, layer, all, &got_k, &got_v, via_gather);
        check_values(s.get(), g, layer, all, want_k, want_v, got_k, got_v,
                     std::string("after rewriting page edges, read through ") +
                         (via_gather ? "gather" : "the layout") + ", page size " +
                         std::to_string(page_size));
      }
    }
  }
}

void Suite::concurrent_writes() {
  // Threads own interleaved slots (thread t writes slots t, t + T, ...), so they share every
  // page, and write new data each round; the last round must be what is left.
  const kvrt_kv_geometry g = geometry(2, 2, 32, 32, 4);
  const uint32_t threads = std::max(2u, options_.threads);
  const uint64_t pages = 6 * threads;
  const int rounds = 8;
  StorePtr s = create(g, pages);
  const bool via_gather = gather_reference(s.get());
  // batches[t][round * layers + layer]
  std::vector<std::vector<Batch>> batches(threads);
  for (uint32_t t = 0; t < threads; ++t) {
    std::vector<int64_t> slots;
    for (uint64_t slot = t; slot < pages * g.page_size; slot += threads) slots.push_back(slot);
    for (int r = 0; r < rounds * static_cast<int>(g.num_layers); ++r) {
      batches[t].push_back(random_batch(g, slots));
    }
  }
  std::vector<std::string> errors(threads);
  std::vector<std::thread> workers;
  for (uint32_t t = 0; t < threads; ++t) {
    workers.emplace_back([&, t] {
      const size_t kr = size_t{g.num_kv_heads} * g.k_head_dim,
                   vr = size_t{g.num_kv_heads} * g.v_head_dim;
      for (int round = 0; round < rounds && errors[t].empty(); ++round) {
        for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
          const Batch& b = batches[t][round * g.num_layers + layer];
          for (size_t i = 0; i < b.slots.size(); ++i) {  // one token per call: many calls race
            kvrt_kv_write w{};
            w.struct_size = sizeof(w);
            w.layer = layer;
            w.dtype = KVRT_DTYPE_F32;
            w.num_tokens = 1;
            w.slots = &b.slots[i];
            w.k = &b.k[i * kr];
            w.v = &b.v[i * vr];
            kvrt_status st = api_.write(s.get(), &w);
            if (st != KVRT_OK) {
              errors[t] = std::string("write from thread ") + std::to_string(t) + " returned " +
                          status_name(st) + ": " + take_last_error();
              return;
            }
          }
        }
      }
    });
  }
  for (std::thread& w : workers) w.join();
  for (const std::string& e : errors) KVRT_REQUIRE(e.empty(), e);
  for (uint32_t t = 0; t < threads; ++t) {
    for (uint32_t layer = 0; layer < g.num_layers; ++layer) {
      const Batch& last = batches[t][(rounds - 1) * g.num_layers + layer];
      std::vector<float> got_k, got_v;
      read_back(s.get(), g, layer, last.slots, &got_k, &got_v, via_gather);
      check_values(s.get(), g, layer, last.slots, last.k, last.v, got_k, got_v,
                   "after concurrent writes from " + std::to_string(threads) + " threads");
    }
  }
}

void Suite::tier_round_trip() {
  require_tier();
  const kvrt_kv_geometry g = geometry(2, 2, 16, 16, 4);
  const uint64_t pages = 16;
  StorePtr s = create(g, pages);
  gather_reference(s.get());
  const uint64_t capacity = tier_info(s.get()).capacity_pages;
  if (capacity == 0) throw Skip("the tier holds no pages with this configuration");
  const int64_t n = static_cast<int64_t>(std::min<uint64_t>(4, capacity));
  // Keys as the core makes them: the chained hashes of a prompt's pages.
  std::vector<int32_t> prompt(n * g.page_size);
  for (int32_t& token : prompt) token = static_cast<int32_t>(rng_() % 32000);
  const std::vector<uint64_t> hashes =
      sched::page_hashes(sched::root_hash("kvrt-conformance"), prompt, g.page_size);
  std::vector<int64_t> source, target;
  std::vector<std::vector<float>> snapshots;
  for (int64_t p = 0; p < n; ++p) {
    fill_page(s.get(), g, p);
    snapshots.push_back(page_snapshot(s.get(), g, p));
    source.push_back(p);
    target.push_back(n + p);
  }
  ok(api_.tier_wait(s.get(), save(s.get(), hashes, source)), "tier_wait");
  uint32_t hits = 0;
  ok(api_.tier_lookup(s.get(), static_cast<uint32_t>(n), hashes.data(), &hits), "tier_lookup");
  KVRT_REQUIRE(hits == n, "tier_lookup finds " + std::to_string(hits) + " of " + std::to_string(n) +
                              " pages just saved (capacity " + std::to_string(capacity) + ")");
  // Overwrite the source pages: the tier must hold copies, not pointers to device pages.
  for (int64_t p = 0; p < n; ++p) fill_page(s.get(), g, p);
  std::vector<uint8_t> loaded(n, 0);
  uint64_t ticket = 0;
  ok(api_.tier_load(s.get(), static_cast<uint32_t>(n), hashes.data(), target.data(), loaded.data(),
                    &ticket),
     "tier_load");
  ok(api_.tier_wait(s.get(), ticket), "tier_wait");
  for (int64_t i = 0; i < n; ++i) {
    KVRT_REQUIRE(loaded[i] == 1, "tier_load reports page " + std::to_string(i) + " missing");
    std::vector<float> got = page_snapshot(s.get(), g, target[i]);
    KVRT_REQUIRE(got.size() == snapshots[i].size() &&
                     std::memcmp(got.data(), snapshots[i].data(), got.size() * 4) == 0,
                 "page saved from device page " + std::to_string(source[i]) + " and loaded into " +
                     std::to_string(target[i]) + " is not bit-exact");
  }
  kvrt_tier_info info = tier_info(s.get());
  KVRT_REQUIRE(info.used_pages <= info.capacity_pages, "tier_info.used_pages exceeds capacity");
  KVRT_REQUIRE(info.loaded_pages >= static_cast<uint64_t>(n),
               "tier_info.loaded_pages does not count the loads");
}

void Suite::tier_under_pressure() {
  require_tier();
  const kvrt_kv_geometry g = geometry(1, 1, 8, 8, 2);
  const uint64_t pages = 8;
  StorePtr s = create(g, pages);
  gather_reference(s.get());
  const uint64_t capacity = tier_info(s.get()).capacity_pages;
  if (capacity == 0) throw Skip("the tier holds no pages with this configuration");
  if (capacity > 4096) throw Skip("the tier holds over 4096 pages; configure a smaller pool");
  // Save capacity + extra distinct pages through one staging device page.
  const uint64_t extra = std::max<uint64_t>(3, capacity / 2), total = capacity + extra;
  std::vector<uint64_t> hashes(total);
  std::vector<std::vector<float>> snapshots(total);
  for (uint64_t i = 0; i < total; ++i) {
    fill_page(s.get(), g, 0);
    snapshots[i] = page_snapshot(s.get(), g, 0);
    const int32_t tokens[2] = {static_cast<int32_t>(i), static_cast<int32_t>(rng_() % 32000)};
    hashes[i] = sched::page_hash(sched::root_hash("kvrt-conformance"), tokens);
    ok(api_.tier_wait(s.get(), save(s.get(), {hashes[i]}, {0})), "tier_wait");
  }
  kvrt_tier_info info = tier_info(s.get());
  KVRT_REQUIRE(info.used_pages <= info.capacity_pages,
               "tier holds " + std::to_string(info.used_pages) + " pages, capacity " +
                   std::to_string(info.capacity_pages));
  uint64_t present = 0, missing = 0;
  for (uint64_t i = 0; i < total; ++i) {
    uint8_t loaded = 0;
    uint64_t ticket = 0;
    const int64_t target = 1 + static_cast<int64_t>(i % (pages - 1));
    ok(api_.tier_load(s.get(), 1, &hashes[i], &target, &loaded, &ticket), "tier_load");
    ok(api_.tier_wait(s.get(), ticket), "tier_wait");
    if (loaded == 0) {
      ++missing;
      continue;
    }
    ++present;
    KVRT_REQUIRE(page_snapshot(s.get(), g, target) == snapshots[i],
                 "under pressure, page " + std::to_string(i) + " of " + std::to_string(total) +
                     " loads wrong contents (must be exact or reported missing)");
  }
  KVRT_REQUIRE(present <= capacity, "loaded " + std::to_string(present) +
                                        " pages from a tier of capacity " +
                                        std::to_string(capacity));
  KVRT_REQUIRE(missing >= extra, "only " + std::to_string(missing) + " of " +
                                     std::to_string(total) + " pages reported missing");
  KVRT_REQUIRE(present > 0, "no page survived in the tier");
}

void Suite::bad_arguments() {
  const kvrt_kv_geometry g = geometry(2, 2, 16, 16, 4);
  const uint64_t pages = 4;
  const int64_t limit = static_cast<int64_t>(pages * g.page_size);
  StorePtr s = create(g, pages);
  // Runs `call` with no stale message about, then checks its status and message.
  auto expect = [&](auto&& call, kvrt_status want, const std::string& name) {
    take_last_error();
    const kvrt_status got = call();
    std::string message = take_last_error();
    KVRT_REQUIRE(got == want,
                 name + " returned " + status_name(got) + ", expected " + status_name(want));
    KVRT_REQUIRE(!message.empty() || want == KVRT_ERR_INVALID_ARGUMENT,
                 name + " returned " + status_name(got) + " without a message (set_error)");
  };
  Batch b = random_batch(g, {3});
  auto attempt = [&](std::vector<int64_t> slots, uint32_t layer, kvrt_dtype dtype, bool null_slots,
                     bool null_k) {
    kvrt_kv_write w{};
    w.struct_size = sizeof(w);
    w.layer = layer;
    w.dtype = dtype;
    w.num_tokens = static_cast<uint32_t>(slots.size());
    std::vector<float> k(slots.size() * 32, 1.f), v(slots.size() * 32, 1.f);
    w.slots = null_slots ? nullptr : slots.data();
    w.k = null_k ? nullptr : k.data();
    w.v = v.data();
    return api_.write(s.get(), &w);
  };
  expect([&] { return attempt({limit}, 0, KVRT_DTYPE_F32, false, false); }, KVRT_ERR_OUT_OF_RANGE,
         "write to slot " + std::to_string(limit) + " of " + std::to_string(limit));
  expect([&] { return attempt({-1}, 0, KVRT_DTYPE_F32, false, false); }, KVRT_ERR_OUT_OF_RANGE,
         "write to slot -1");
  expect([&] { return attempt({0}, g.num_layers, KVRT_DTYPE_F32, false, false); },
         KVRT_ERR_OUT_OF_RANGE, "write to layer " + std::to_string(g.num_layers));
  expect([&] { return attempt({0}, 0, KVRT_DTYPE_F32, true, false); }, KVRT_ERR_INVALID_ARGUMENT,
         "write with NULL slots");
  expect([&] { return attempt({0}, 0, KVRT_DTYPE_F32, false, true); }, KVRT_ERR_INVALID_ARGUMENT,
         "write with NULL K");
  expect([&] { return api_.write(s.get(), nullptr); }, KVRT_ERR_INVALID_ARGUMENT, "write(NULL)");
  for (kvrt_dtype d : {KVRT_DTYPE_F16, KVRT_DTYPE_INT8, KVRT_DTYPE_FP8_E4M3, KVRT_DTYPE_INVALID}) {
    if (!accepts(d)) {
      expect([&] { return attempt({0}, 0, d, false, false); }, KVRT_ERR_UNSUPPORTED,
             std::string("write with input dtype ") + plugin::dtype_name(d));
      break;
    }
  }
  kvrt_kv_layout l{};
  l.struct_size = sizeof(l);
  expect([&] { return api_.layout(s.get(), g.num_layers, &l); }, KVRT_ERR_OUT_OF_RANGE,
         "layout(num_layers)");
  expect([&] { return api_.layout(s.get(), 0, nullptr); }, KVRT_ERR_INVALID_ARGUMENT,
         "layout(0, NULL)");
  expect([&] { return api_.info(s.get(), nullptr); }, KVRT_ERR_INVALID_ARGUMENT, "info(NULL)");
  kvrt_kv_store* never = nullptr;
  expect([&] { return api_.create(host_, &g, pages, config_, nullptr); }, KVRT_ERR_INVALID_ARGUMENT,
         "create(out = NULL)");
  kvrt_kv_geometry empty = g;
  empty.num_layers = 0;
  uint64_t bytes = 0;
  kvrt_status st = api_.page_bytes(host_, &empty, config_, &bytes);
  take_last_error();
  KVRT_REQUIRE(st != KVRT_OK, "page_bytes accepts a geometry with 0 layers");
  st = api_.create(host_, &empty, pages, config_, &never);
  take_last_error();
  KVRT_REQUIRE(st != KVRT_OK && never == nullptr, "create accepts a geometry with 0 layers");
  if (api_.gather != nullptr) {
    std::vector<float> k(32), v(32);
    const int64_t bad = limit;
    expect([&] { return api_.gather(s.get(), 0, 1, &bad, k.data(), v.data()); },
           KVRT_ERR_OUT_OF_RANGE, "gather of slot " + std::to_string(limit));
    expect([&] { return api_.gather(s.get(), g.num_layers, 1, &b.slots[0], k.data(), v.data()); },
           KVRT_ERR_OUT_OF_RANGE, "gather of layer num_layers");
  }
  if (api_.tier_info != nullptr) {
    const uint64_t hash = 42;
    const int64_t bad_page = static_cast<int64_t>(pages), negative = -1;
    uint8_t loaded = 0;
    uint64_t ticket = 0;
    expect([&] { return api_.tier_load(s.get(), 1, &hash, &bad_page, &loaded, &ticket); },
           KVRT_ERR_OUT_OF_RANGE, "tier_load into page " + std::to_string(pages));
    expect(
        [&] { return api_.tier_save(s.get(), 1, &hash, &negative, KVRT_TIER_INSERTED, &ticket); },
        KVRT_ERR_OUT_OF_RANGE, "tier_save of page -1");
  }
  // A failed write writes nothing: every slot is checked first.
  {
    const bool via_gather = gather_reference(s.get());
    std::vector<float> before_k, before_v, after_k, after_v;
    write(s.get(), g, 0, b, KVRT_DTYPE_F32);
    read_back(s.get(), g, 0, {3}, &before_k, &before_v, via_gather);
    kvrt_status partial = attempt({3, limit}, 0, KVRT_DTYPE_F32, false, false);
    take_last_error();
    KVRT_REQUIRE(partial == KVRT_ERR_OUT_OF_RANGE, "write with one bad slot did not fail");
    read_back(s.get(), g, 0, {3}, &after_k, &after_v, via_gather);
    KVRT_REQUIRE(before_k == after_k && before_v == after_v,
                 "a write that failed on its second slot changed its first slot");
  }
}

struct Property {
  const char* name;
  void (Suite::*run)();
};

const std::vector<Property>& properties() {
  static const std::vector<Property> all = {
      {"geometry_and_info", &Suite::geometry_and_info},
      {"write_gather_round_trip", &Suite::write_gather_round_trip},
      {"layout_agrees_with_gather", &Suite::layout_agrees_with_gather},
      {"overwrite", &Suite::overwrite},
      {"head_isolation", &Suite::head_isolation},
      {"rounding", &Suite::rounding},
      {"attention_error", &Suite::attention_error},
      {"page_boundaries", &Suite::page_boundaries},
      {"concurrent_writes", &Suite::concurrent_writes},
      {"tier_round_trip", &Suite::tier_round_trip},
      {"tier_under_pressure", &Suite::tier_under_pressure},
      {"bad_arguments", &Suite::bad_arguments},
  };
  return all;
}

}  // namespace

PropertyResult run_property(const std::string& plugin, const std::string& property,
                            const std::function<void()>& body, std::ostream& log) {
  PropertyResult r{property, PropertyResult::Outcome::kPass, ""};
  try {
    body();
  } catch (const Skip& e) {
    r.outcome = PropertyResult::Outcome::kSkip;
    r.detail = e.what();
  } catch (const NotApplicable& e) {
    r.outcome = PropertyResult::Outcome::kNotApplicable;
    r.detail = e.what();
  } catch (const std::exception& e) {
    r.outcome = PropertyResult::Outcome::kFail;
    r.detail = e.what();
  }
  take_last_error();  // nothing a property left behind leaks into the next
  using Outcome = PropertyResult::Outcome;
  const char* tag = r.outcome == Outcome::kPass            ? "[ PASS ] "
                    : r.outcome == Outcome::kSkip          ? "[ SKIP ] "
                    : r.outcome == Outcome::kNotApplicable ? "[ N/A  ] "
                                                           : "[ FAIL ] ";
  log << tag << plugin << ": " << r.property << (r.detail.empty() ? "" : ": ") << r.detail
      << std::endl;
  return r;
}

Tally tally(const std::vector<PropertyResult>& results) {
  Tally t;
  for (const PropertyResult& r : results) {
    switch (r.outcome) {
      case PropertyResult::Outcome::kPass:
        ++t.passed;
        break;
      case PropertyResult::Outcome::kFail:
        ++t.failed;
        break;
      case PropertyResult::Outcome::kSkip:
        ++t.skipped;
        t.skipped_names.push_back(r.property);
        break;
      case PropertyResult::Outcome::kNotApplicable:
        ++t.not_applicable;
        break;
    }
  }
  return t;
}

std::vector<PropertyResult> run_kv_store_suite(plugin::Registry& registry,
                                               const plugin::LoadedPlugin& plugin,
                                               const Options& options, std::ostream& log) {
  std::vector<PropertyResult> results;
  for (const Property& p : properties()) {
    Suite suite(registry, plugin, options);
    results.push_back(run_property(
        plugin.name, p.name, [&] { (suite.*p.run)(); }, log));
  }
  return results;
}

}  // namespace kvrt::conformance
