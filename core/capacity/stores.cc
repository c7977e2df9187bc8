#include "core/capacity/stores.h"

#include <cstdlib>

#include "core/plugin/host.h"
#include "core/plugin/kv_store.h"

namespace kvrt::capacity {
namespace {

// An option's value from the store's table, else the default the plugin declares, else 0.
double store_option(const plugin::LoadedPlugin& store, const toml::table* config,
                    const char* name) {
  if (config != nullptr) {
    if (std::optional<double> v = config->at_path(name).value<double>()) return *v;
  }
  for (const kvrt_option_desc& o : store.options) {
    if (o.name != nullptr && o.default_value != nullptr && std::string_view(o.name) == name) {
      return std::strtod(o.default_value, nullptr);
    }
  }
  return 0;
}

}  // namespace

StoreCapacity store_capacity(const plugin::LoadedPlugin& store, const toml::table* config,
                             const kvrt_kv_geometry& geometry, const Budget& budget) {
  StoreCapacity out;
  out.store = store.name;
  Result<uint64_t> bytes = plugin::page_bytes(store, geometry, plugin::as_config(config));
  if (!bytes.ok()) {
    out.error = bytes.status();
    return out;
  }
  out.page_bytes = *bytes;
  Result<Plan> plan = capacity::plan(budget, out.page_bytes, geometry.page_size);
  if (!plan.ok()) {
    out.error = plan.status();
    return out;
  }
  out.plan = *plan;
  // Tier operations come all or none; tier_info stands for them. The tier is sized like
  // kv_host_tiered's: host_pool_gib when positive, else host_pool_ratio times the device pages.
  if (store.kv.tier_info != nullptr) {
    out.host_tier = true;
    const double gib = store_option(store, config, "host_pool_gib");
    const double ratio = store_option(store, config, "host_pool_ratio");
    const uint64_t pages = gib > 0 ? static_cast<uint64_t>(gib * (1ull << 30)) / out.page_bytes
                                   : static_cast<uint64_t>(ratio * out.plan.num_pages);
    out.host_tier_tokens = pages * geometry.page_size;
  }
  return out;
}

std::vector<StoreCapacity> compare_stores(plugin::Registry& registry,
                                          const kvrt_kv_geometry& geometry, const Budget& budget) {
  registry.discover();
  std::vector<StoreCapacity> out;
  for (const plugin::LoadedPlugin* p : registry.loaded()) {
    if (p->kind() != KVRT_PLUGIN_KV_STORE) continue;
    out.push_back(store_capacity(*p, registry.plugin_config(p->name), geometry, budget));
  }
  return out;
}

}  // namespace kvrt::capacity
