// The core's wrappers over a KV store plugin's table (kvrt/kv_store.h), in the manner of
// PostgreSQL's table-AM wrappers: the only code that calls the C callbacks. Each turns a status
// into a Status naming the plugin and the callback (with the message the plugin recorded),
// checks the documented invariants once, and exposes the optional parts as optional: gather()
// through has_gather(), the tier through tier() (nullptr without one).
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/plugin/registry.h"
#include "core/util/status.h"
#include "kvrt/kv_store.h"

namespace kvrt::plugin {

class StoreTier;

// Device bytes one page of `geometry` takes in `store` under `config` (page_bytes: pure, any
// thread). A refusal names the plugin and says why.
Result<uint64_t> page_bytes(const LoadedPlugin& store, const kvrt_kv_geometry& geometry,
                            const kvrt_config* config);

// Host pages the store's tier gives beside a pool of `device_pages` pages (its own sizing rule,
// tier_pages, ABI 1.1). 0 for a store without a tier; NotFound for a tier that cannot say (built
// against ABI 1.0).
Result<uint64_t> tier_pages(const LoadedPlugin& store, const kvrt_kv_geometry& geometry,
                            const kvrt_config* config, uint64_t device_pages);

// A layout from a store built against ABI 1.0 has no v_width / v_offset: they are filled in from
// the geometry's (sdk::v_width), so every reader sees explicit values.
void complete_layout(const kvrt_kv_geometry& geometry, kvrt_kv_layout* layout);

// One created store: a rank's KV pool. Not copyable; destroying it destroys the plugin's store.
// Thread-safety as kv_store.h says: write() from several threads on distinct slots, the tier
// beside writes on other pages, everything else from one thread at a time.
class KvStore {
 public:
  // Creates num_pages pages of `geometry`, then checks what the store reports against what was
  // asked: info() (num_pages, bytes_per_page == page_bytes()) and every layer's layout (page
  // size, pages, heads, dims, non-null bases, and every address its strides reach for every
  // page, slot and head -- scales included -- inside the memory the store allocated through
  // the host). A store that disagrees is destroyed and refused.
  static Result<std::unique_ptr<KvStore>> create(const LoadedPlugin& plugin,
                                                 const kvrt_kv_geometry& geometry,
                                                 uint64_t num_pages, const kvrt_config* config);
  ~KvStore();
  KvStore(const KvStore&) = delete;
  KvStore& operator=(const KvStore&) = delete;

  const LoadedPlugin& plugin() const { return *plugin_; }
  const std::string& name() const { return plugin_->name; }
  const kvrt_kv_geometry& geometry() const { return geometry_; }
  // What info() said at create (the totals do not change over the store's life).
  const kvrt_kv_info& info() const { return info_; }

  // The layout of one layer, as the store publishes it (checked at create; completed for a 1.0
  // store).
  Result<kvrt_kv_layout> layout(uint32_t layer) const;
  // The layout of each layer as it was checked at create (layer < geometry().num_layers).
  const kvrt_kv_layout& checked_layout(uint32_t layer) const { return checked_[layer]; }
  Status write(const kvrt_kv_write& write);
  bool has_gather() const { return plugin_->kv.gather != nullptr; }
  Status gather(uint32_t layer, std::span<const int64_t> slots, float* k_out, float* v_out) const;

  // The tier callbacks, or nullptr when the store has none.
  StoreTier* tier() { return tier_.get(); }

  // The raw handle and table, only for handing to an attention plugin's run() (which may call
  // the store's gather() itself).
  const kvrt_kv_store* handle() const { return store_; }
  const kvrt_kv_store_api* api() const { return &plugin_->kv; }

 private:
  KvStore(const LoadedPlugin& plugin, const kvrt_kv_geometry& geometry, kvrt_kv_store* store);
  Status check_created(uint64_t num_pages, uint64_t expected_page_bytes);
  Status check_reach(uint32_t layer, const kvrt_kv_layout& layout) const;
  // The layer's format, nullopt when the store says it has none (KVRT_ERR_UNSUPPORTED).
  Result<std::optional<kvrt_kv_format>> read_format(uint32_t layer,
                                                    const kvrt_kv_layout& layout) const;
  Status failure(const char* callback, kvrt_status status) const;

  const LoadedPlugin* plugin_;
  kvrt_kv_geometry geometry_;
  kvrt_kv_store* store_;
  kvrt_kv_info info_{};
  std::vector<kvrt_kv_layout> checked_;  // per layer, from check_created
  std::vector<kvrt_kv_format> formats_;  // per layer (ABI 1.3), for check_reach; empty without
  std::unique_ptr<StoreTier> tier_;
};

// The five tier callbacks of one store (all present, the loader checked). Asynchronous copies
// return a ticket; wait(ticket) covers that call's copies and every earlier one.
class StoreTier {
 public:
  explicit StoreTier(KvStore* store, kvrt_kv_store* handle) : store_(store), handle_(handle) {}

  Result<kvrt_tier_info> info() const;
  // Leading pages of `hashes` the tier holds now; never more than hashes.size().
  Result<uint32_t> lookup(std::span<const uint64_t> hashes);
  Result<uint64_t> save(std::span<const uint64_t> hashes, std::span<const int64_t> device_pages,
                        kvrt_tier_reason reason);
  // loaded[i] = 1 for a page the tier will copy in, 0 for one it no longer holds.
  Result<uint64_t> load(std::span<const uint64_t> hashes, std::span<const int64_t> device_pages,
                        std::span<uint8_t> loaded);
  Status wait(uint64_t ticket);

 private:
  KvStore* store_;
  kvrt_kv_store* handle_;
};

}  // namespace kvrt::plugin
