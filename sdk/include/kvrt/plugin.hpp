// C++ helpers for plugin authors: exceptions become status codes at the boundary, config
// lookups become typed calls, and a store written as a class becomes a kvrt_kv_store_api.
//
//   class MyStore : public kvrt::sdk::StoreBase { ... };          // see sdk/examples/
//   const kvrt_plugin_desc& describe() { static kvrt_plugin_desc d = {...,
//       &kvrt::sdk::kv_store_table<MyStore>(), ...}; return d; }
//   KVRT_PLUGIN_ENTRY(describe)
//
// Build plugins with -fvisibility=hidden (the CMake function kvrt_add_plugin does) so only
// kvrt_plugin_query is exported.
#ifndef KVRT_PLUGIN_HPP
#define KVRT_PLUGIN_HPP

#include <algorithm>
#include <concepts>
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <exception>
#include <new>
#include <optional>
#include <stdexcept>
#include <string>

#include "kvrt/abi.h"
#include "kvrt/attention.h"
#include "kvrt/kv_store.h"

namespace kvrt::sdk {

// Thrown inside a plugin; the trampolines turn it into `status` plus host->set_error(message).
class Error : public std::runtime_error {
 public:
  Error(kvrt_status status, const std::string& message)
      : std::runtime_error(message), status_(status) {}
  kvrt_status status() const { return status_; }

 private:
  kvrt_status status_;
};

[[noreturn]] inline void fail(kvrt_status status, const std::string& message) {
  throw Error(status, message);
}

// Thrown when a host service or a wrapped plugin's callback failed and already recorded its
// message with the host: the trampoline returns `status` and keeps that message.
class Forwarded : public std::exception {
 public:
  explicit Forwarded(kvrt_status status) : status_(status) {}
  kvrt_status status() const { return status_; }
  const char* what() const noexcept override { return "error recorded by the callee"; }

 private:
  kvrt_status status_;
};

// "f32", "bf16", "f16", "fp8_e4m3", "int8", "int4", "uint4"; "vendor" for a code of the
// private range (KVRT_DTYPE_IS_VENDOR); "unknown" for any other. dtype_text() adds the code.
inline const char* dtype_name(kvrt_dtype dtype) {
  switch (dtype) {
    case KVRT_DTYPE_F32:
      return "f32";
    case KVRT_DTYPE_BF16:
      return "bf16";
    case KVRT_DTYPE_F16:
      return "f16";
    case KVRT_DTYPE_FP8_E4M3:
      return "fp8_e4m3";
    case KVRT_DTYPE_INT8:
      return "int8";
    case KVRT_DTYPE_INT4:
      return "int4";
    case KVRT_DTYPE_UINT4:
      return "uint4";
    default:
      return KVRT_DTYPE_IS_VENDOR(dtype) ? "vendor" : "unknown";
  }
}

// dtype_name() for a known dtype; "vendor 0x80000001" or "unknown 9" otherwise, for messages.
inline std::string dtype_text(kvrt_dtype dtype) {
  const std::string name = dtype_name(dtype);
  if (name != "vendor" && name != "unknown") return name;
  char code[16];
  std::snprintf(code, sizeof(code), name == "vendor" ? "0x%08x" : "%u", dtype);
  return name + " " + code;
}

// ---- struct_size: readers use min(their size, struct_size) ---------------------------------

// The sizes of the ABI 1.0 versions of the input structs: a host built against 1.0 passes at
// least these; fields appended later read as zero from such a host.
inline constexpr uint32_t kGeometryV1Size =
    offsetof(kvrt_kv_geometry, device) + sizeof(kvrt_device);
inline constexpr uint32_t kKvWriteV1Size =
    offsetof(kvrt_kv_write, v_token_stride) + sizeof(int64_t);

// The V values attention reads per head (ABI 1.1's v_width; a 1.0 host leaves it 0): v_head_dim,
// or the whole K row when V shares K's storage (v_head_dim 0).
inline uint32_t v_width(const kvrt_kv_geometry& g) {
  return g.v_width != 0 ? g.v_width : (g.v_head_dim != 0 ? g.v_head_dim : g.k_head_dim);
}

// What page_bytes() owes the core for a geometry no store can hold: KVRT_ERR_UNSUPPORTED, naming
// the field, when a dimension is 0 (V's may be: V shares K's rows).
inline void check_geometry(const kvrt_kv_geometry& g) {
  const char* zero = g.num_layers == 0     ? "num_layers"
                     : g.num_kv_heads == 0 ? "num_kv_heads"
                     : g.k_head_dim == 0   ? "k_head_dim"
                     : g.page_size == 0    ? "page_size"
                                           : nullptr;
  if (zero != nullptr) fail(KVRT_ERR_UNSUPPORTED, std::string("geometry ") + zero + " is 0");
}

// Where one layer of a slot-major store lies: K rows of k_row_bytes per head, [slot][head],
// from k; V likewise from v (ignored when V shares K's rows, v_head_dim 0); with
// KVRT_SCALE_PER_TOKEN_HEAD, one float per (slot, head) from k_scale and v_scale.
struct SlotRows {
  kvrt_dtype dtype;
  kvrt_scale_mode scale_mode;
  void* k;
  int64_t k_row_bytes;
  void* v;
  int64_t v_row_bytes;
  float* k_scale;
  float* v_scale;
};

// The layout of such a layer (slot s is token s % page_size of page s / page_size, so pages are
// page_size slots apart).
inline kvrt_kv_layout slot_major_layout(const kvrt_kv_geometry& g, uint64_t num_pages,
                                        const SlotRows& rows) {
  const bool shared = g.v_head_dim == 0;
  kvrt_kv_layout l{};
  l.struct_size = sizeof(l);
  l.k_dtype = l.v_dtype = rows.dtype;
  l.scale_mode = rows.scale_mode;
  l.num_kv_heads = g.num_kv_heads;
  l.k_head_dim = g.k_head_dim;
  l.v_head_dim = g.v_head_dim;
  l.page_size = g.page_size;
  l.num_pages = num_pages;
  l.k_base = rows.k;
  l.k_head_stride = rows.k_row_bytes;
  l.k_token_stride = int64_t{g.num_kv_heads} * l.k_head_stride;
  l.k_page_stride = l.k_token_stride * g.page_size;
  l.v_base = shared ? rows.k : rows.v;
  l.v_head_stride = shared ? rows.k_row_bytes : rows.v_row_bytes;
  l.v_token_stride = int64_t{g.num_kv_heads} * l.v_head_stride;
  l.v_page_stride = l.v_token_stride * g.page_size;
  if (rows.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD) {
    l.k_scale = rows.k_scale;
    l.v_scale = shared ? rows.k_scale : rows.v_scale;
    l.scale_head_stride = sizeof(float);
    l.scale_token_stride = int64_t{sizeof(float)} * g.num_kv_heads;
    l.scale_page_stride = l.scale_token_stride * g.page_size;
  }
  l.v_width = v_width(g);
  l.v_offset = g.v_offset;
  return l;
}

// Copies a host's input struct over a zeroed one of this plugin's size.
template <class T>
T read_input(const T* in, uint32_t minimum_size, const char* name) {
  if (in == nullptr) throw Error(KVRT_ERR_INVALID_ARGUMENT, std::string(name) + " is NULL");
  if (in->struct_size < minimum_size) {
    throw Error(KVRT_ERR_INVALID_ARGUMENT, std::string(name) + ".struct_size " +
                                               std::to_string(in->struct_size) + " < " +
                                               std::to_string(minimum_size));
  }
  T copy{};
  std::memcpy(&copy, in, std::min<size_t>(in->struct_size, sizeof(T)));
  copy.struct_size = sizeof(T);
  return copy;
}

// Writes an output struct, no more than the caller's struct_size (which the caller must set).
template <class T>
void write_output(T* out, const T& value) {
  if (out->struct_size < sizeof(uint32_t)) {
    throw Error(KVRT_ERR_INVALID_ARGUMENT, "output struct_size is not set");
  }
  const uint32_t size = std::min<uint32_t>(out->struct_size, sizeof(T));
  std::memcpy(out, &value, size);
  out->struct_size = size;
}

// Runs `body` and maps every exception to a status code, recording the message with the host.
template <class Body>
kvrt_status guard(const kvrt_host_api* host, Body&& body) noexcept {
  auto report = [host](kvrt_status status, const char* message) {
    if (host != nullptr && host->set_error != nullptr) host->set_error(host, status, message);
    return status;
  };
  try {
    body();
    return KVRT_OK;
  } catch (const Forwarded& e) {
    return e.status();
  } catch (const Error& e) {
    return report(e.status(), e.what());
  } catch (const std::bad_alloc&) {
    return report(KVRT_ERR_NO_MEMORY, "out of host memory (std::bad_alloc)");
  } catch (const std::exception& e) {
    return report(KVRT_ERR_INTERNAL, e.what());
  } catch (...) {
    return report(KVRT_ERR_INTERNAL, "unknown exception");
  }
}

inline void log(const kvrt_host_api* host, kvrt_log_level level, const std::string& message) {
  if (host != nullptr && host->log != nullptr) host->log(host, level, message.c_str());
}

// Typed reads of the plugin's config table. A missing key gives the default; a key of the
// wrong type throws Error(KVRT_ERR_CONFIG) naming the key.
class ConfigView {
 public:
  ConfigView(const kvrt_host_api* host, const kvrt_config* config) : host_(host), cfg_(config) {}

  std::string string(const char* key, const std::string& fallback) const {
    const char* value = nullptr;
    return check(host_->config_string(host_, cfg_, key, &value), key, "a string")
               ? std::string(value)
               : fallback;
  }
  int64_t integer(const char* key, int64_t fallback) const {
    int64_t value = 0;
    return check(host_->config_int(host_, cfg_, key, &value), key, "an integer") ? value : fallback;
  }
  double real(const char* key, double fallback) const {
    double value = 0;
    return check(host_->config_float(host_, cfg_, key, &value), key, "a number") ? value : fallback;
  }
  bool boolean(const char* key, bool fallback) const {
    int32_t value = 0;
    return check(host_->config_bool(host_, cfg_, key, &value), key, "a boolean") ? value != 0
                                                                                 : fallback;
  }
  bool has(const char* key) const {
    const char* s = nullptr;
    int64_t i = 0;
    double d = 0;
    int32_t b = 0;
    return host_->config_string(host_, cfg_, key, &s) == KVRT_OK ||
           host_->config_int(host_, cfg_, key, &i) == KVRT_OK ||
           host_->config_float(host_, cfg_, key, &d) == KVRT_OK ||
           host_->config_bool(host_, cfg_, key, &b) == KVRT_OK;
  }
  const kvrt_config* raw() const { return cfg_; }

 private:
  static bool check(kvrt_status status, const char* key, const char* expected) {
    if (status == KVRT_OK) return true;
    if (status == KVRT_ERR_NOT_FOUND) return false;
    fail(KVRT_ERR_CONFIG, std::string("key '") + key + "': expected " + expected);
  }
  const kvrt_host_api* host_;
  const kvrt_config* cfg_;
};

// Memory from the host, returned on destruction. Move-only.
class HostBuffer {
 public:
  HostBuffer() = default;
  HostBuffer(const kvrt_host_api* host, kvrt_memory_kind kind, uint64_t bytes, const char* what)
      : host_(host), kind_(kind), bytes_(bytes) {
    if (bytes == 0) return;
    kvrt_status s = host->alloc(host, kind, bytes, 64, &ptr_);
    if (s != KVRT_OK) {
      fail(s, std::string("cannot allocate ") + std::to_string(bytes) + " bytes for " + what);
    }
  }
  HostBuffer(HostBuffer&& o) noexcept { *this = static_cast<HostBuffer&&>(o); }
  HostBuffer& operator=(HostBuffer&& o) noexcept {
    if (this != &o) {
      release();
      host_ = o.host_, kind_ = o.kind_, bytes_ = o.bytes_, ptr_ = o.ptr_;
      o.ptr_ = nullptr, o.bytes_ = 0;
    }
    return *this;
  }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  ~HostBuffer() { release(); }

  uint8_t* data() const { return static_cast<uint8_t*>(ptr_); }
  uint64_t size() const { return bytes_; }

 private:
  void release() {
    if (ptr_ != nullptr) host_->free(host_, kind_, ptr_, bytes_);
    ptr_ = nullptr;
  }
  const kvrt_host_api* host_ = nullptr;
  kvrt_memory_kind kind_ = KVRT_MEMORY_DEVICE;
  uint64_t bytes_ = 0;
  void* ptr_ = nullptr;
};

// Base of a store class: keeps the host for error reporting and the geometry.
class StoreBase {
 public:
  StoreBase(const kvrt_host_api* host, const kvrt_kv_geometry& geometry, uint64_t num_pages)
      : host_(host), geometry_(geometry), num_pages_(num_pages) {}
  virtual ~StoreBase() = default;
  const kvrt_host_api* host() const { return host_; }
  const kvrt_kv_geometry& geometry() const { return geometry_; }
  uint64_t num_pages() const { return num_pages_; }

  // The argument checks every store owes the core (see kv_store.h, write and gather).
  void check_layer(uint32_t layer) const {
    if (layer >= geometry_.num_layers) {
      fail(KVRT_ERR_OUT_OF_RANGE, "layer " + std::to_string(layer) + " out of range (store has " +
                                      std::to_string(geometry_.num_layers) + " layers)");
    }
  }
  void check_slots(uint32_t n, const int64_t* slots) const {
    if (n > 0 && slots == nullptr) fail(KVRT_ERR_INVALID_ARGUMENT, "slots is NULL");
    const int64_t limit = static_cast<int64_t>(num_pages_) * geometry_.page_size;
    for (uint32_t i = 0; i < n; ++i) {
      if (slots[i] < 0 || slots[i] >= limit) {
        fail(KVRT_ERR_OUT_OF_RANGE, "slot " + std::to_string(slots[i]) + " (index " +
                                        std::to_string(i) + ") out of range [0, " +
                                        std::to_string(limit) + ")");
      }
    }
  }
  void check_page(int64_t page) const {
    if (page < 0 || static_cast<uint64_t>(page) >= num_pages_) {
      fail(KVRT_ERR_OUT_OF_RANGE, "page " + std::to_string(page) + " out of range [0, " +
                                      std::to_string(num_pages_) + ")");
    }
  }
  void check_write(const kvrt_kv_write* w, uint32_t accepted_dtypes) const {
    if (w == nullptr) fail(KVRT_ERR_INVALID_ARGUMENT, "write descriptor is NULL");
    check_layer(w->layer);
    if (w->dtype >= 32 || (KVRT_DTYPE_BIT(w->dtype) & accepted_dtypes) == 0) {
      fail(KVRT_ERR_UNSUPPORTED, "input dtype " + std::to_string(w->dtype) + " not supported");
    }
    if (w->num_tokens > 0 && (w->k == nullptr || (geometry_.v_head_dim != 0 && w->v == nullptr))) {
      fail(KVRT_ERR_INVALID_ARGUMENT, "K or V data is NULL");
    }
    check_slots(w->num_tokens, w->slots);
  }

 private:
  const kvrt_host_api* host_;
  kvrt_kv_geometry geometry_;
  uint64_t num_pages_;
};

namespace detail {
template <class S>
S* self(kvrt_kv_store* s) {
  return reinterpret_cast<S*>(s);
}
template <class S>
const S* self(const kvrt_kv_store* s) {
  return reinterpret_cast<const S*>(s);
}
inline kvrt_status null_store(const void* p) {
  return p == nullptr ? KVRT_ERR_INVALID_ARGUMENT : KVRT_OK;
}
}  // namespace detail

// A kvrt_kv_store_api whose callbacks forward to the class S (derived from StoreBase):
//   static uint64_t page_bytes(const kvrt_host_api*, const kvrt_kv_geometry&, ConfigView);
//   S(const kvrt_host_api*, const kvrt_kv_geometry&, uint64_t num_pages, ConfigView);
//   kvrt_kv_info info() const;  kvrt_kv_layout layout(uint32_t layer) const;
//   void write(const kvrt_kv_write*);
// optional: void gather(uint32_t layer, uint32_t n, const int64_t*, float*, float*) const;
// optional, all or none: kvrt_tier_info tier_info() const; uint32_t tier_lookup(n, hashes);
//   uint64_t tier_save(n, hashes, pages, reason); uint64_t tier_load(n, hashes, pages, loaded);
//   void tier_wait(uint64_t ticket);
// optional, with the tier (ABI 1.1): static uint64_t tier_pages(const kvrt_host_api*,
//   const kvrt_kv_geometry&, ConfigView, uint64_t device_pages);
// optional (ABI 1.3): kvrt_kv_format format(uint32_t layer) const;
// The table is a kvrt_kv_store_api_1_3 (see kv_store.h); this returns its base.
template <class S>
const kvrt_kv_store_api& kv_store_table() {
  using detail::self;
  static const kvrt_kv_store_api_1_3 table = [] {
    kvrt_kv_store_api_1_3 table_1_3{};
    kvrt_kv_store_api& t = table_1_3.base;
    t.struct_size = sizeof(kvrt_kv_store_api_1_3);
    t.page_bytes = [](const kvrt_host_api* host, const kvrt_kv_geometry* g, const kvrt_config* cfg,
                      uint64_t* out) -> kvrt_status {
      return guard(host, [&] {
        if (out == nullptr) fail(KVRT_ERR_INVALID_ARGUMENT, "out_bytes is NULL");
        *out =
            S::page_bytes(host, read_input(g, kGeometryV1Size, "geometry"), ConfigView(host, cfg));
      });
    };
    t.create = [](const kvrt_host_api* host, const kvrt_kv_geometry* g, uint64_t num_pages,
                  const kvrt_config* cfg, kvrt_kv_store** out) -> kvrt_status {
      return guard(host, [&] {
        if (out == nullptr) fail(KVRT_ERR_INVALID_ARGUMENT, "out is NULL");
        const kvrt_kv_geometry geometry = read_input(g, kGeometryV1Size, "geometry");
        *out = reinterpret_cast<kvrt_kv_store*>(
            new S(host, geometry, num_pages, ConfigView(host, cfg)));
      });
    };
    t.destroy = [](kvrt_kv_store* s) { delete self<S>(s); };
    t.info = [](const kvrt_kv_store* s, kvrt_kv_info* out) -> kvrt_status {
      if (detail::null_store(s) || out == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
      return guard(self<S>(s)->host(), [&] { write_output(out, self<S>(s)->info()); });
    };
    t.layout = [](const kvrt_kv_store* s, uint32_t layer, kvrt_kv_layout* out) -> kvrt_status {
      if (detail::null_store(s) || out == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
      return guard(self<S>(s)->host(), [&] {
        self<S>(s)->check_layer(layer);
        write_output(out, self<S>(s)->layout(layer));
      });
    };
    t.write = [](kvrt_kv_store* s, const kvrt_kv_write* w) -> kvrt_status {
      if (detail::null_store(s)) return KVRT_ERR_INVALID_ARGUMENT;
      return guard(self<S>(s)->host(), [&] {
        const kvrt_kv_write copy = read_input(w, kKvWriteV1Size, "write");
        self<S>(s)->write(&copy);
      });
    };
    if constexpr (requires(const S& c, float* f, const int64_t* p) { c.gather(0u, 0u, p, f, f); }) {
      t.gather = [](const kvrt_kv_store* s, uint32_t layer, uint32_t n, const int64_t* slots,
                    float* k, float* v) -> kvrt_status {
        if (detail::null_store(s)) return KVRT_ERR_INVALID_ARGUMENT;
        return guard(self<S>(s)->host(), [&] {
          const S* store = self<S>(s);
          store->check_layer(layer);
          store->check_slots(n, slots);
          if (n > 0 && (k == nullptr || (store->geometry().v_head_dim != 0 && v == nullptr))) {
            fail(KVRT_ERR_INVALID_ARGUMENT, "output buffer is NULL");
          }
          store->gather(layer, n, slots, k, v);
        });
      };
    }
    if constexpr (requires(S & m, const S& c, const uint64_t* h, const int64_t* p, uint8_t* l) {
                    c.tier_info();
                    m.tier_lookup(0u, h);
                    m.tier_save(0u, h, p, 0u);
                    m.tier_load(0u, h, p, l);
                    m.tier_wait(uint64_t{0});
                  }) {
      t.tier_info = [](const kvrt_kv_store* s, kvrt_tier_info* out) -> kvrt_status {
        if (detail::null_store(s) || out == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
        return guard(self<S>(s)->host(), [&] { write_output(out, self<S>(s)->tier_info()); });
      };
      t.tier_lookup = [](kvrt_kv_store* s, uint32_t n, const uint64_t* h,
                         uint32_t* out) -> kvrt_status {
        if (detail::null_store(s) || out == nullptr || (n > 0 && h == nullptr)) {
          return KVRT_ERR_INVALID_ARGUMENT;
        }
        return guard(self<S>(s)->host(), [&] { *out = self<S>(s)->tier_lookup(n, h); });
      };
      t.tier_save = [](kvrt_kv_store* s, uint32_t n, const uint64_t* h, const int64_t* pages,
                       kvrt_tier_reason reason, uint64_t* ticket) -> kvrt_status {
        if (detail::null_store(s) || ticket == nullptr ||
            (n > 0 && (h == nullptr || pages == nullptr))) {
          return KVRT_ERR_INVALID_ARGUMENT;
        }
        return guard(self<S>(s)->host(), [&] {
          for (uint32_t i = 0; i < n; ++i) self<S>(s)->check_page(pages[i]);
          *ticket = self<S>(s)->tier_save(n, h, pages, reason);
        });
      };
      t.tier_load = [](kvrt_kv_store* s, uint32_t n, const uint64_t* h, const int64_t* pages,
                       uint8_t* loaded, uint64_t* ticket) -> kvrt_status {
        if (detail::null_store(s) || ticket == nullptr ||
            (n > 0 && (h == nullptr || pages == nullptr || loaded == nullptr))) {
          return KVRT_ERR_INVALID_ARGUMENT;
        }
        return guard(self<S>(s)->host(), [&] {
          for (uint32_t i = 0; i < n; ++i) self<S>(s)->check_page(pages[i]);
          *ticket = self<S>(s)->tier_load(n, h, pages, loaded);
        });
      };
      t.tier_wait = [](kvrt_kv_store* s, uint64_t ticket) -> kvrt_status {
        if (detail::null_store(s)) return KVRT_ERR_INVALID_ARGUMENT;
        return guard(self<S>(s)->host(), [&] { self<S>(s)->tier_wait(ticket); });
      };
      if constexpr (requires(const kvrt_host_api* h, const kvrt_kv_geometry& g, ConfigView c) {
                      { S::tier_pages(h, g, c, uint64_t{0}) } -> std::convertible_to<uint64_t>;
                    }) {
        t.tier_pages = [](const kvrt_host_api* host, const kvrt_kv_geometry* g,
                          const kvrt_config* cfg, uint64_t device_pages,
                          uint64_t* out) -> kvrt_status {
          return guard(host, [&] {
            if (out == nullptr) fail(KVRT_ERR_INVALID_ARGUMENT, "out_pages is NULL");
            *out = S::tier_pages(host, read_input(g, kGeometryV1Size, "geometry"),
                                 ConfigView(host, cfg), device_pages);
          });
        };
      }
    }
    if constexpr (requires(const S& c) {
                    { c.format(0u) } -> std::convertible_to<kvrt_kv_format>;
                  }) {
      table_1_3.format = [](const kvrt_kv_store* s, uint32_t layer,
                            kvrt_kv_format* out) -> kvrt_status {
        if (detail::null_store(s) || out == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
        return guard(self<S>(s)->host(), [&] {
          self<S>(s)->check_layer(layer);
          write_output(out, self<S>(s)->format(layer));
        });
      };
    }
    return table_1_3;
  }();
  return table.base;
}

// A store's format() (ABI 1.3) for `layer` into *out (zeroed, its struct_size set): the call's
// status, or KVRT_ERR_UNSUPPORTED -- recording no message -- when the table has no format()
// (a store built against 1.2 or older).
inline kvrt_status store_format(const kvrt_kv_store_api* api, const kvrt_kv_store* store,
                                uint32_t layer, kvrt_kv_format* out) {
  *out = kvrt_kv_format{};
  out->struct_size = sizeof(*out);
  const kvrt_kv_store_api_1_3* t = kvrt_kv_store_api_1_3_of(api);
  if (t == nullptr || t->format == nullptr) return KVRT_ERR_UNSUPPORTED;
  return t->format(store, layer, out);
}

// The format of a store's layer through its table (ABI 1.3), or nullopt when the table has no
// format() (an older store) or it failed (its message is recorded with the host).
inline std::optional<kvrt_kv_format> kv_format(const kvrt_kv_store_api* api,
                                               const kvrt_kv_store* store, uint32_t layer) {
  kvrt_kv_format f;
  if (store == nullptr || store_format(api, store, layer, &f) != KVRT_OK) return std::nullopt;
  return f;
}

// The body of kvrt_plugin_query: version check, then the plugin's describe() (which may throw;
// its message reaches the user as the plugin's init error).
inline kvrt_status query_entry(uint32_t host_major, uint32_t host_minor, const kvrt_host_api* host,
                               const kvrt_plugin_desc** out,
                               const kvrt_plugin_desc& (*describe)(const kvrt_host_api*)) {
  (void)host_minor;
  if (host_major != KVRT_ABI_MAJOR) {
    if (host != nullptr && host->set_error != nullptr) {
      host->set_error(host, KVRT_ERR_ABI_MISMATCH,
                      ("plugin built for ABI major " + std::to_string(KVRT_ABI_MAJOR) +
                       ", host is " + std::to_string(host_major))
                          .c_str());
    }
    return KVRT_ERR_ABI_MISMATCH;
  }
  if (host == nullptr || out == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
  return guard(host, [&] { *out = &describe(host); });
}

// ---- attention plugins -------------------------------------------------------------------

// The sizes of the ABI 1.0 versions of the attention input structs (see kGeometryV1Size).
inline constexpr uint32_t kAttentionParamsV1Size =
    offsetof(kvrt_attention_params, device) + sizeof(kvrt_device);
inline constexpr uint32_t kAttentionBatchV1Size =
    offsetof(kvrt_attention_batch, kv_last_page_len) + sizeof(void*);
inline constexpr uint32_t kAttentionRunArgsV1Size =
    offsetof(kvrt_attention_run_args, stream) + sizeof(void*);
inline constexpr uint32_t kKvLayoutV1Size =
    offsetof(kvrt_kv_layout, scale_head_stride) + sizeof(int64_t);

// One sequence of a batch check_batch() accepted: its query rows [q_begin, q_begin + q_len),
// its pages kv_page_indices[page_begin .. page_begin + pages) and its kv_len KV tokens (this
// shard's, for a sharded batch). Its first query row is the token at global position first_pos
// (kv_len - q_len unsharded; the sequence's length over all shards minus q_len when sharded).
struct BatchSequence {
  uint32_t index;
  int32_t q_begin, q_len;
  int32_t page_begin, pages;
  int32_t kv_len;
  int32_t first_pos;
};

// (ABI 1.4) How a batch's sequences are spread over ranks (kvrt_attention_shard): one shard of
// one (the default) is the whole sequence.
struct Shard {
  uint32_t count = 1, index = 0, interleave = 1;
  const int32_t* kv_len = nullptr;  // [batch_size], over all shards; null when count is 1

  // For workspace_size(), which bounds plan() and plan_sharded() of the same batch alike: any
  // shard. check_batch then checks the batch's own arrays only (a sequence may keep no token)
  // and gives first_pos -1.
  static Shard any() { return Shard{0, 0, 1, nullptr}; }

  // How many of the global positions [0, n) this shard keeps.
  int64_t tokens_before(int64_t n) const {
    const int64_t cycle = int64_t{count} * interleave;
    const int64_t rest = n % cycle - int64_t{index} * interleave;
    return n / cycle * interleave + std::clamp<int64_t>(rest, 0, interleave);
  }
};

// The shard a kvrt_attention_shard describes, checked (count >= 1, index < count, interleave
// >= 1, kv_len present); throws Error(KVRT_ERR_INVALID_ARGUMENT) naming the field otherwise.
inline Shard read_shard(const kvrt_attention_shard& s) {
  auto invalid = [](const std::string& what) { fail(KVRT_ERR_INVALID_ARGUMENT, what); };
  if (s.count == 0) invalid("shard.count is 0");
  if (s.index >= s.count) {
    invalid("shard.index " + std::to_string(s.index) + " is not below shard.count " +
            std::to_string(s.count));
  }
  if (s.interleave == 0) invalid("shard.interleave is 0");
  if (s.kv_len == nullptr) invalid("shard.kv_len is NULL");
  return Shard{s.count, s.index, s.interleave, s.kv_len};
}

// The checks every attention plugin owes a batch before a kernel reads pages through it: the
// arrays present, indptrs that never decrease, page ids >= 0, last-page lengths in
// 1..page_size, and no more causal query rows than KV tokens. Calls visit(BatchSequence) for
// each sequence in order; throws Error(KVRT_ERR_INVALID_ARGUMENT) naming the first problem (and
// its sequence) otherwise. For a sharded batch (plan_sharded, ABI 1.4) each sequence's local
// length must be what the shard keeps of its global one, and a sequence may keep none.
template <class Visit>
void check_batch(const kvrt_attention_batch& b, const Shard& shard, Visit&& visit) {
  auto invalid = [](const std::string& what) { fail(KVRT_ERR_INVALID_ARGUMENT, what); };
  if (b.page_size == 0) invalid("batch.page_size is 0");
  if (b.batch_size == 0) return;
  if (b.qo_indptr == nullptr || b.kv_page_indptr == nullptr || b.kv_last_page_len == nullptr) {
    invalid("batch arrays qo_indptr, kv_page_indptr and kv_last_page_len must not be NULL");
  }
  if (b.qo_indptr[0] < 0 || b.kv_page_indptr[0] < 0) invalid("batch indptr[0] is negative");
  if (b.kv_page_indptr[b.batch_size] > b.kv_page_indptr[0] && b.kv_page_indices == nullptr) {
    invalid("batch.kv_page_indices is NULL");
  }
  for (uint32_t s = 0; s < b.batch_size; ++s) {
    auto seq = [s] { return "sequence " + std::to_string(s) + ": "; };  // for messages only
    const int32_t q_begin = b.qo_indptr[s], q_len = b.qo_indptr[s + 1] - q_begin;
    const int32_t page_begin = b.kv_page_indptr[s];
    const int32_t pages = b.kv_page_indptr[s + 1] - page_begin;
    if (q_len < 0) invalid(seq() + "qo_indptr decreases");
    if (pages < 0) invalid(seq() + "kv_page_indptr decreases");
    for (int32_t p = 0; p < pages; ++p) {
      if (b.kv_page_indices[page_begin + p] < 0) {
        invalid(seq() + "negative page id " + std::to_string(b.kv_page_indices[page_begin + p]));
      }
    }
    const int32_t last = b.kv_last_page_len[s];
    if (pages > 0 && (last < 1 || static_cast<uint32_t>(last) > b.page_size)) {
      invalid(seq() + "kv_last_page_len " + std::to_string(last) + " outside 1.." +
              std::to_string(b.page_size));
    }
    const int64_t kv_len64 = pages == 0 ? 0 : int64_t{pages - 1} * b.page_size + last;
    if (kv_len64 > INT32_MAX) invalid(seq() + "too many KV tokens");
    const auto kv_len = static_cast<int32_t>(kv_len64);
    if (shard.count == 0) {  // sizing: any shard
      visit(BatchSequence{s, q_begin, q_len, page_begin, pages, kv_len, -1});
      continue;
    }
    // The sequence's length over all shards (its own, unsharded).
    const int32_t whole = shard.count > 1 ? shard.kv_len[s] : kv_len;
    if (shard.count > 1) {
      if (whole < 0) invalid(seq() + "shard.kv_len " + std::to_string(whole) + " is negative");
      if (shard.tokens_before(whole) != kv_len) {
        invalid(seq() + std::to_string(kv_len) + " KV tokens in its pages, but shard " +
                std::to_string(shard.index) + " of " + std::to_string(shard.count) +
                " keeps " + std::to_string(shard.tokens_before(whole)) + " of " +
                std::to_string(whole));
      }
    }
    if (q_len > 0 && whole == 0) invalid(seq() + "query rows but no KV tokens");
    if (b.causal != 0 && q_len > whole) {
      invalid(seq() + std::to_string(q_len) + " causal query rows but only " +
              std::to_string(whole) + " KV tokens (the new tokens' K/V must be written)");
    }
    visit(BatchSequence{s, q_begin, q_len, page_begin, pages, kv_len, whole - q_len});
  }
}

template <class Visit>
void check_batch(const kvrt_attention_batch& b, Visit&& visit) {
  check_batch(b, Shard{}, std::forward<Visit>(visit));
}

// Base of an attention class: keeps the host for error reporting and the creation parameters.
class AttentionBase {
 public:
  AttentionBase(const kvrt_host_api* host, const kvrt_attention_params& params)
      : host_(host), params_(params) {}
  virtual ~AttentionBase() = default;
  const kvrt_host_api* host() const { return host_; }
  const kvrt_attention_params& params() const { return params_; }

 private:
  const kvrt_host_api* host_;
  kvrt_attention_params params_;
};

namespace detail {
template <class A>
A* attention_self(kvrt_attention* a) {
  return reinterpret_cast<A*>(a);
}
template <class A>
const A* attention_self(const kvrt_attention* a) {
  return reinterpret_cast<const A*>(a);
}
}  // namespace detail

// A kvrt_attention_api whose callbacks forward to the class A (derived from AttentionBase):
//   A(const kvrt_host_api*, const kvrt_attention_params&, ConfigView);   // throws to refuse
//   void supports(const kvrt_kv_layout&) const;  // returns if native, else throws
//                                                // Error(KVRT_ERR_UNSUPPORTED, why)
//   uint64_t workspace_size(const kvrt_attention_batch&) const;
//   void plan(const kvrt_attention_batch&, void* workspace, uint64_t workspace_bytes);
//   void run(const kvrt_attention_run_args&);
// and, for context parallelism (ABI 1.4; both or neither: the table's plan_sharded and run_lse
// stay NULL without them),
//   void plan_sharded(const kvrt_attention_batch&, const Shard&, void* workspace,
//                     uint64_t workspace_bytes);        // the shard checked by read_shard
//   void run_lse(const kvrt_attention_run_args&, float* lse, int64_t lse_row_stride);
// Input structs reach A copied over zeroed ones of this SDK's size (read_input), the layout that
// run() gets included: args.layout points at such a copy, never NULL. A NULL handle or output
// pointer gives KVRT_ERR_INVALID_ARGUMENT before A is called.
template <class A>
const kvrt_attention_api& attention_table() {
  using detail::attention_self;
  static const kvrt_attention_api table = [] {
    kvrt_attention_api t{};
    t.struct_size = sizeof(kvrt_attention_api);
    t.create = [](const kvrt_host_api* host, const kvrt_attention_params* p, const kvrt_config* cfg,
                  kvrt_attention** out) -> kvrt_status {
      return guard(host, [&] {
        if (out == nullptr) fail(KVRT_ERR_INVALID_ARGUMENT, "out is NULL");
        const kvrt_attention_params params = read_input(p, kAttentionParamsV1Size, "params");
        *out = reinterpret_cast<kvrt_attention*>(new A(host, params, ConfigView(host, cfg)));
      });
    };
    t.destroy = [](kvrt_attention* a) { delete attention_self<A>(a); };
    t.supports = [](const kvrt_attention* a, const kvrt_kv_layout* layout) -> kvrt_status {
      if (a == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
      return guard(attention_self<A>(a)->host(), [&] {
        attention_self<A>(a)->supports(read_input(layout, kKvLayoutV1Size, "layout"));
      });
    };
    t.workspace_size = [](const kvrt_attention* a, const kvrt_attention_batch* batch,
                          uint64_t* out) -> kvrt_status {
      if (a == nullptr || out == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
      return guard(attention_self<A>(a)->host(), [&] {
        *out =
            attention_self<A>(a)->workspace_size(read_input(batch, kAttentionBatchV1Size, "batch"));
      });
    };
    t.plan = [](kvrt_attention* a, const kvrt_attention_batch* batch, void* workspace,
                uint64_t workspace_bytes) -> kvrt_status {
      if (a == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
      return guard(attention_self<A>(a)->host(), [&] {
        attention_self<A>(a)->plan(read_input(batch, kAttentionBatchV1Size, "batch"), workspace,
                                   workspace_bytes);
      });
    };
    t.run = [](kvrt_attention* a, const kvrt_attention_run_args* args) -> kvrt_status {
      if (a == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
      return guard(attention_self<A>(a)->host(), [&] {
        kvrt_attention_run_args copy = read_input(args, kAttentionRunArgsV1Size, "run args");
        const kvrt_kv_layout layout = read_input(copy.layout, kKvLayoutV1Size, "layout");
        copy.layout = &layout;
        attention_self<A>(a)->run(copy);
      });
    };
    if constexpr (requires(A & x, const kvrt_attention_batch& b, const Shard& sh, void* w,
                           const kvrt_attention_run_args& r, float* lse) {
                    x.plan_sharded(b, sh, w, uint64_t{0});
                    x.run_lse(r, lse, int64_t{0});
                  }) {
      t.plan_sharded = [](kvrt_attention* a, const kvrt_attention_batch* batch,
                          const kvrt_attention_shard* shard, void* workspace,
                          uint64_t workspace_bytes) -> kvrt_status {
        if (a == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
        return guard(attention_self<A>(a)->host(), [&] {
          const Shard sh = read_shard(read_input(shard, sizeof(kvrt_attention_shard), "shard"));
          attention_self<A>(a)->plan_sharded(read_input(batch, kAttentionBatchV1Size, "batch"), sh,
                                             workspace, workspace_bytes);
        });
      };
      t.run_lse = [](kvrt_attention* a, const kvrt_attention_run_args* args, float* lse,
                     int64_t lse_row_stride) -> kvrt_status {
        if (a == nullptr || lse == nullptr || lse_row_stride < 0) return KVRT_ERR_INVALID_ARGUMENT;
        return guard(attention_self<A>(a)->host(), [&] {
          kvrt_attention_run_args copy = read_input(args, kAttentionRunArgsV1Size, "run args");
          const kvrt_kv_layout layout = read_input(copy.layout, kKvLayoutV1Size, "layout");
          copy.layout = &layout;
          attention_self<A>(a)->run_lse(copy, lse, lse_row_stride);
        });
      };
    }
    return t;
  }();
  return table;
}

}  // namespace kvrt::sdk

// Defines the library's one exported symbol, kvrt_plugin_query, around
// `const kvrt_plugin_desc& describe(const kvrt_host_api*)`.
#define KVRT_PLUGIN_ENTRY(describe)                                                              \
  extern "C" KVRT_EXPORT kvrt_status kvrt_plugin_query(uint32_t host_major, uint32_t host_minor, \
                                                       const kvrt_host_api* host,                \
                                                       const kvrt_plugin_desc** out) {           \
    return ::kvrt::sdk::query_entry(host_major, host_minor, host, out, describe);                \
  }

#endif  // KVRT_PLUGIN_HPP
