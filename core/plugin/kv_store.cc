#include "core/plugin/kv_store.h"

#include <algorithm>
#include <optional>
#include <tuple>
#include <utility>

#include "core/plugin/host.h"

namespace kvrt::plugin {

Result<uint64_t> page_bytes(const LoadedPlugin& store, const kvrt_kv_geometry& geometry,
                            const kvrt_config* config) {
  uint64_t bytes = 0;
  clear_last_error();
  if (kvrt_status st = store.kv.page_bytes(store.host_api(), &geometry, config, &bytes);
      st != KVRT_OK) {
    return plugin_failure(store.name, "page_bytes", st);
  }
  if (bytes == 0) {
    return Status::PluginError("plugin " + store.name + ": page_bytes returned 0 bytes");
  }
  return bytes;
}

Result<uint64_t> tier_pages(const LoadedPlugin& store, const kvrt_kv_geometry& geometry,
                            const kvrt_config* config, uint64_t device_pages) {
  if (store.kv.tier_info == nullptr) return uint64_t{0};
  if (store.kv.tier_pages == nullptr) {
    return Status::NotFound("plugin " + store.name +
                            " has a tier but no tier_pages (built against ABI 1.0)");
  }
  uint64_t pages = 0;
  clear_last_error();
  if (kvrt_status st =
          store.kv.tier_pages(store.host_api(), &geometry, config, device_pages, &pages);
      st != KVRT_OK) {
    return plugin_failure(store.name, "tier_pages", st);
  }
  return pages;
}

void complete_layout(const kvrt_kv_geometry& geometry, kvrt_kv_layout* layout) {
  if (layout->v_width == 0) {
    layout->v_width = sdk::v_width(geometry);
    layout->v_offset = geometry.v_offset;
  }
  // Complete now: an attention plugin reads what struct_size covers.
  layout->struct_size = sizeof(*layout);
}

namespace {

// Bits of one element of a dtype the core knows; 0 for a vendor or unknown code.
uint32_t known_bits(kvrt_dtype dtype) {
  switch (dtype) {
    case KVRT_DTYPE_F32:
      return 32;
    case KVRT_DTYPE_BF16:
    case KVRT_DTYPE_F16:
      return 16;
    case KVRT_DTYPE_FP8_E4M3:
    case KVRT_DTYPE_INT8:
      return 8;
    case KVRT_DTYPE_INT4:
    case KVRT_DTYPE_UINT4:
      return 4;
    default:
      return 0;
  }
}

// Bytes of `elements` elements of one head row: by the dtype's bits, else by the store's format
// (ABI 1.3), else -- an opaque dtype from an older store -- the distance from one head's row to
// the next as the layout's strides give it. Never 0.
uint64_t row_bytes(kvrt_dtype dtype, uint32_t format_bits, uint64_t elements,
                   const kvrt_kv_layout& l, int64_t token_stride, int64_t head_stride) {
  const uint32_t bits = known_bits(dtype) != 0 ? known_bits(dtype) : format_bits;
  if (bits != 0) return std::max<uint64_t>((elements * bits + 7) / 8, 1);
  const uint64_t head = static_cast<uint64_t>(head_stride < 0 ? -head_stride : head_stride);
  const uint64_t token = static_cast<uint64_t>(token_stride < 0 ? -token_stride : token_stride);
  if (l.num_kv_heads > 1 && head != 0) return head;
  return std::max<uint64_t>(token / std::max<uint32_t>(l.num_kv_heads, 1), 1);
}

// Every address a layout's strides reach for one tensor: from the lowest to one past the highest
// byte, over all pages, token slots and heads, each row `row_bytes` long. Computed in 128 bits,
// so strides that overflow 64 bits cannot wrap into a range that looks valid.
struct Reach {
  __int128 lo = 0, hi = 0;
};

Reach reach(const void* base, int64_t page_stride, int64_t token_stride, int64_t head_stride,
            uint64_t pages, uint32_t page_size, uint32_t heads, uint64_t row_bytes) {
  Reach r;
  r.lo = r.hi = static_cast<__int128>(reinterpret_cast<uintptr_t>(base));
  for (auto [stride, count] :
       {std::pair{page_stride, pages}, std::pair{token_stride, uint64_t{page_size}},
        std::pair{head_stride, uint64_t{heads}}}) {
    const __int128 extent =
        count == 0 ? 0 : static_cast<__int128>(stride) * static_cast<__int128>(count - 1);
    (extent < 0 ? r.lo : r.hi) += extent;
  }
  r.hi += row_bytes;
  return r;
}

// V as an ABI 1.0 plugin understands it: all of its row (of K's when v_head_dim is 0), from 0.
bool v_as_abi_1_0(const kvrt_kv_geometry& g) {
  return g.v_offset == 0 && sdk::v_width(g) == (g.v_head_dim != 0 ? g.v_head_dim : g.k_head_dim);
}

}  // namespace

KvStore::KvStore(const LoadedPlugin& plugin, const kvrt_kv_geometry& geometry, kvrt_kv_store* store)
    : plugin_(&plugin), geometry_(geometry), store_(store) {
  if (plugin.kv.tier_info != nullptr) tier_ = std::make_unique<StoreTier>(this, store_);
}

KvStore::~KvStore() { plugin_->kv.destroy(store_); }

Status KvStore::failure(const char* callback, kvrt_status status) const {
  return plugin_failure(plugin_->name, callback, status);
}

Result<std::unique_ptr<KvStore>> KvStore::create(const LoadedPlugin& plugin,
                                                 const kvrt_kv_geometry& geometry,
                                                 uint64_t num_pages, const kvrt_config* config) {
  if (plugin.kind() != KVRT_PLUGIN_KV_STORE) {
    return Status::PluginError("plugin " + plugin.name + " is not a KV store");
  }
  if (plugin.desc.abi_minor < 1 && !v_as_abi_1_0(geometry)) {
    return Status::Unsupported("plugin " + plugin.name +
                               " is built against ABI 1.0, which cannot hold V of width " +
                               std::to_string(sdk::v_width(geometry)) + " at offset " +
                               std::to_string(geometry.v_offset) + " (rebuild it against 1.1)");
  }
  Result<uint64_t> expected = page_bytes(plugin, geometry, config);
  if (!expected.ok()) return expected.status();
  kvrt_kv_store* handle = nullptr;
  clear_last_error();
  if (kvrt_status st = plugin.kv.create(plugin.host_api(), &geometry, num_pages, config, &handle);
      st != KVRT_OK) {
    return plugin_failure(plugin.name, "create", st);
  }
  if (handle == nullptr) {
    return Status::PluginError("plugin " + plugin.name + ": create returned OK and no store");
  }
  std::unique_ptr<KvStore> store(new KvStore(plugin, geometry, handle));
  if (Status s = store->check_created(num_pages, *expected); !s.ok()) return s;
  return store;
}

Status KvStore::check_created(uint64_t num_pages, uint64_t expected_page_bytes) {
  const std::string who = "plugin " + plugin_->name + ": ";
  info_.struct_size = sizeof(info_);
  clear_last_error();
  if (kvrt_status st = plugin_->kv.info(store_, &info_); st != KVRT_OK) return failure("info", st);
  if (info_.num_pages != num_pages) {
    return Status::PluginError(who + "info() reports " + std::to_string(info_.num_pages) +
                               " pages, " + std::to_string(num_pages) + " were created");
  }
  if (info_.bytes_per_page != expected_page_bytes) {
    return Status::PluginError(who + "info() reports " + std::to_string(info_.bytes_per_page) +
                               " bytes per page, page_bytes() said " +
                               std::to_string(expected_page_bytes));
  }
  for (uint32_t layer = 0; layer < geometry_.num_layers; ++layer) {
    Result<kvrt_kv_layout> l = layout(layer);
    if (!l.ok()) return l.status();
    if (plugin_->kv_1_3.format != nullptr) {
      Result<std::optional<kvrt_kv_format>> f = read_format(layer, *l);
      if (!f.ok()) return f.status();
      if (layer > 0 && f->has_value() != !formats_.empty()) {
        return Status::PluginError(who + "format() answers for some layers and not others");
      }
      if (f->has_value()) formats_.push_back(**f);
    }
    const std::string where = who + "layout(" + std::to_string(layer) + ") ";
    auto mismatch = [&](const char* field, uint64_t got, uint64_t want) {
      return Status::PluginError(where + "has " + field + " " + std::to_string(got) +
                                 ", the store was created with " + std::to_string(want));
    };
    if (l->page_size != geometry_.page_size) {
      return mismatch("page_size", l->page_size, geometry_.page_size);
    }
    if (l->num_pages != num_pages) return mismatch("num_pages", l->num_pages, num_pages);
    if (l->num_kv_heads != geometry_.num_kv_heads) {
      return mismatch("num_kv_heads", l->num_kv_heads, geometry_.num_kv_heads);
    }
    if (l->k_head_dim != geometry_.k_head_dim) {
      return mismatch("k_head_dim", l->k_head_dim, geometry_.k_head_dim);
    }
    if (l->v_head_dim != geometry_.v_head_dim) {
      return mismatch("v_head_dim", l->v_head_dim, geometry_.v_head_dim);
    }
    if (l->v_width != sdk::v_width(geometry_)) {
      return mismatch("v_width", l->v_width, sdk::v_width(geometry_));
    }
    if (l->v_offset != geometry_.v_offset) {
      return mismatch("v_offset", l->v_offset, geometry_.v_offset);
    }
    if (l->k_base == nullptr || (geometry_.v_head_dim > 0 && l->v_base == nullptr)) {
      return Status::PluginError(where + "has a null base pointer");
    }
    if (Status s = check_reach(layer, *l); !s.ok()) return s;
    checked_.push_back(*l);
  }
  return Status::Ok();
}

// The core accounts every byte a store allocates through the host: every address its layout
// can produce, for every page, token slot and head, must lie inside those allocations, or an
// attention plugin reading it would read memory that is not the store's.
Status KvStore::check_reach(uint32_t layer, const kvrt_kv_layout& l) const {
  const MemoryAccount& memory = *plugin_->host->context()->memory;
  auto inside = [&](const char* what, const void* base, int64_t ps, int64_t ts, int64_t hs,
                    uint64_t row_bytes) -> Status {
    const Reach r = reach(base, ps, ts, hs, l.num_pages, l.page_size, l.num_kv_heads,
                          std::max<uint64_t>(row_bytes, 1));
    const bool fits = r.lo >= 0 && r.hi > r.lo &&
                      r.hi - r.lo <= static_cast<__int128>(UINT64_MAX) &&
                      memory.covers(reinterpret_cast<const void*>(static_cast<uintptr_t>(r.lo)),
                                    static_cast<uint64_t>(r.hi - r.lo));
    if (fits) return Status::Ok();
    return Status::PluginError(
        "plugin " + plugin_->name + ": layout(" + std::to_string(layer) + ") " + what +
        " reaches " +
        std::to_string(static_cast<uint64_t>(std::min<__int128>(r.hi - r.lo, UINT64_MAX))) +
        " bytes over its pages, outside the memory the store allocated "
        "through the host; refusing the store (are its strides right?)");
  };
  const kvrt_kv_format* f = formats_.empty() ? nullptr : &formats_[layer];
  if (Status s = inside("K", l.k_base, l.k_page_stride, l.k_token_stride, l.k_head_stride,
                        row_bytes(l.k_dtype, f ? f->k_bits : 0, l.k_head_dim, l, l.k_token_stride,
                                  l.k_head_stride));
      !s.ok()) {
    return s;
  }
  if (Status s = inside("V", l.v_base, l.v_page_stride, l.v_token_stride, l.v_head_stride,
                        row_bytes(l.v_dtype, f ? f->v_bits : 0, uint64_t{l.v_offset} + l.v_width,
                                  l, l.v_token_stride, l.v_head_stride));
      !s.ok()) {
    return s;
  }
  if (l.scale_mode == KVRT_SCALE_PER_TENSOR) {
    for (auto [what, scale] : {std::pair{"K scale", l.k_scale}, std::pair{"V scale", l.v_scale}}) {
      if (scale == nullptr || !memory.covers(scale, sizeof(float))) {
        return Status::PluginError("plugin " + plugin_->name + ": layout(" + std::to_string(layer) +
                                   ") " + what +
                                   " is not in memory the store allocated through the host");
      }
    }
  } else if (l.scale_mode == KVRT_SCALE_PER_TOKEN_HEAD) {
    for (auto [what, scale] :
         {std::pair{"K scales", l.k_scale}, std::pair{"V scales", l.v_scale}}) {
      if (Status s = inside(what, scale, l.scale_page_stride, l.scale_token_stride,
                            l.scale_head_stride, sizeof(float));
          !s.ok()) {
        return s;
      }
    }
  }
  return Status::Ok();
}

// A layer's format (ABI 1.3), checked against its layout: element bits that a row can be sized
// by (and that agree with a known dtype's), a pack order, groups that divide nothing oddly.
Result<std::optional<kvrt_kv_format>> KvStore::read_format(uint32_t layer,
                                                            const kvrt_kv_layout& l) const {
  kvrt_kv_format f{};
  f.struct_size = sizeof(f);
  clear_last_error();
  if (kvrt_status st = plugin_->kv_1_3.format(store_, layer, &f); st != KVRT_OK) {
    if (st == KVRT_ERR_UNSUPPORTED) {  // no format to give (a wrapper over an older store)
      clear_last_error();
      return std::optional<kvrt_kv_format>{};
    }
    return failure("format", st);
  }
  const std::string where = "plugin " + plugin_->name + ": format(" + std::to_string(layer) + ") ";
  for (auto [part, dtype, bits] :
       {std::tuple{"K", l.k_dtype, f.k_bits}, std::tuple{"V", l.v_dtype, f.v_bits}}) {
    if (bits == 0 || bits > 64) {
      return Status::PluginError(where + "gives " + part + " " + std::to_string(bits) +
                                 " bits per element (1..64 expected)");
    }
    if (known_bits(dtype) != 0 && known_bits(dtype) != bits) {
      return Status::PluginError(where + "gives " + part + " " + std::to_string(bits) +
                                 " bits per element, but its dtype " + sdk::dtype_text(dtype) +
                                 " has " + std::to_string(known_bits(dtype)));
    }
  }
  if (f.pack_order != KVRT_PACK_LOW_FIRST && f.pack_order != KVRT_PACK_HIGH_FIRST) {
    return Status::PluginError(where + "has pack order " + std::to_string(f.pack_order) +
                               " (KVRT_PACK_LOW_FIRST or KVRT_PACK_HIGH_FIRST expected)");
  }
  if (f.group_size != 0 && (f.k_bits < 8 || f.v_bits < 8) && f.group_size % 2 != 0) {
    return Status::PluginError(where + "has scale groups of " + std::to_string(f.group_size) +
                               " sub-byte elements (a multiple of 2 expected)");
  }
  return std::optional<kvrt_kv_format>{f};
}

Result<kvrt_kv_layout> KvStore::layout(uint32_t layer) const {
  kvrt_kv_layout l{};
  l.struct_size = sizeof(l);
  clear_last_error();
  if (kvrt_status st = plugin_->kv.layout(store_, layer, &l); st != KVRT_OK) {
    return failure("layout", st);
  }
  complete_layout(geometry_, &l);
  return l;
}

Status KvStore::write(const kvrt_kv_write& w) {
  clear_last_error();
  kvrt_status st = plugin_->kv.write(store_, &w);
  return st == KVRT_OK ? Status::Ok() : failure("write", st);
}

Status KvStore::gather(uint32_t layer, std::span<const int64_t> slots, float* k_out,
                       float* v_out) const {
  if (!has_gather()) {
    return Status::Unsupported("plugin " + plugin_->name + " has no gather()");
  }
  clear_last_error();
  kvrt_status st = plugin_->kv.gather(store_, layer, static_cast<uint32_t>(slots.size()),
                                      slots.data(), k_out, v_out);
  return st == KVRT_OK ? Status::Ok() : failure("gather", st);
}

Result<kvrt_tier_info> StoreTier::info() const {
  kvrt_tier_info info{};
  info.struct_size = sizeof(info);
  clear_last_error();
  const kvrt_kv_store_api& api = store_->plugin().kv;
  if (kvrt_status st = api.tier_info(handle_, &info); st != KVRT_OK) {
    return plugin_failure(store_->name(), "tier_info", st);
  }
  return info;
}

Result<uint32_t> StoreTier::lookup(std::span<const uint64_t> hashes) {
  uint32_t hits = 0;
  clear_last_error();
  const kvrt_kv_store_api& api = store_->plugin().kv;
  const auto n = static_cast<uint32_t>(hashes.size());
  if (kvrt_status st = api.tier_lookup(handle_, n, hashes.data(), &hits); st != KVRT_OK) {
    return plugin_failure(store_->name(), "tier_lookup", st);
  }
  if (hits > n) {
    return Status::PluginError("plugin " + store_->name() + ": tier_lookup reports " +
                               std::to_string(hits) + " hits of " + std::to_string(n) + " pages");
  }
  return hits;
}

Result<uint64_t> StoreTier::save(std::span<const uint64_t> hashes,
                                 std::span<const int64_t> device_pages, kvrt_tier_reason reason) {
  uint64_t ticket = 0;
  clear_last_error();
  const kvrt_kv_store_api& api = store_->plugin().kv;
  if (kvrt_status st = api.tier_save(handle_, static_cast<uint32_t>(hashes.size()), hashes.data(),
                                     device_pages.data(), reason, &ticket);
      st != KVRT_OK) {
    return plugin_failure(store_->name(), "tier_save", st);
  }
  return ticket;
}

Result<uint64_t> StoreTier::load(std::span<const uint64_t> hashes,
                                 std::span<const int64_t> device_pages, std::span<uint8_t> loaded) {
  uint64_t ticket = 0;
  clear_last_error();
  const kvrt_kv_store_api& api = store_->plugin().kv;
  if (kvrt_status st = api.tier_load(handle_, static_cast<uint32_t>(hashes.size()), hashes.data(),
                                     device_pages.data(), loaded.data(), &ticket);
      st != KVRT_OK) {
    return plugin_failure(store_->name(), "tier_load", st);
  }
  return ticket;
}

Status StoreTier::wait(uint64_t ticket) {
  clear_last_error();
  kvrt_status st = store_->plugin().kv.tier_wait(handle_, ticket);
  return st == KVRT_OK ? Status::Ok() : plugin_failure(store_->name(), "tier_wait", st);
}

}  // namespace kvrt::plugin
