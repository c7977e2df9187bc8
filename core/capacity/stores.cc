#include "core/capacity/stores.h"

#include <spdlog/spdlog.h>

#include "core/plugin/host.h"
#include "core/plugin/kv_store.h"

namespace kvrt::capacity {

StoreCapacity store_capacity(const plugin::LoadedPlugin& store, const toml::table* config,
                             const kvrt_kv_geometry& geometry, const Budget& budget,
                             const Dcp& dcp) {
  StoreCapacity out;
  out.store = store.name;
  out.dcp_removes = dcp.removes;
  Result<uint64_t> bytes = plugin::page_bytes(store, geometry, plugin::as_config(config));
  if (!bytes.ok()) {
    out.error = bytes.status();
    return out;
  }
  out.page_bytes = *bytes;
  Result<Plan> plan = capacity::plan(budget, out.page_bytes, geometry.page_size, dcp.size);
  if (!plan.ok()) {
    out.error = plan.status();
    return out;
  }
  out.plan = *plan;
  // The tier's own sizing rule (tier_pages, ABI 1.1), for a tier of any store.
  if (store.kv.tier_info != nullptr) {
    out.host_tier = true;
    Result<uint64_t> pages =
        plugin::tier_pages(store, geometry, plugin::as_config(config), out.plan.num_pages);
    if (pages.ok()) {
      out.host_tier_sized = true;
      out.host_tier_tokens = *pages * geometry.page_size * dcp.size;
    } else if (!pages.status().IsNotFound()) {
      // The tier's size is for the report; the store itself is usable (its page_bytes held).
      spdlog::warn("{}; its host tier's size is reported unknown", pages.status().message());
    }
  }
  return out;
}

std::vector<StoreCapacity> compare_stores(plugin::Registry& registry,
                                          const kvrt_kv_geometry& geometry, const Budget& budget,
                                          const Dcp& dcp) {
  registry.discover();
  std::vector<StoreCapacity> out;
  for (const plugin::LoadedPlugin* p : registry.loaded()) {
    if (p->kind() != KVRT_PLUGIN_KV_STORE) continue;
    out.push_back(store_capacity(*p, registry.plugin_config(p->name), geometry, budget, dcp));
  }
  return out;
}

}  // namespace kvrt::capacity
