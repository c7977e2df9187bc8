// The capacity of real KV store plugins: their page bytes for a geometry, planned on a budget,
// one store or every loadable one side by side (DESIGN.md, Capacity and Diagnosis).
#pragma once

#include <toml++/toml.h>

#include <string>
#include <vector>

#include "core/capacity/capacity.h"
#include "core/plugin/registry.h"

namespace kvrt::capacity {

// Asks `store` for its page bytes on `geometry` with its option table `config` (nullptr: its
// defaults) and plans them on `budget`. A refusal (page_bytes failing, or a budget with no room
// for one page) is returned in .error, naming the plugin or the shortfall in bytes. A tier's
// size comes from the store's own tier_pages (ABI 1.1); a 1.0 tier's is left unknown
// (host_tier_sized false). Thread: whichever thread may call the plugin's page_bytes (any).
// Under decode context parallelism (`dcp`, tp.dcp_size) a page id holds a page on each of the
// group's ranks: the tokens (the tier's too) are dcp times one rank's.
struct Dcp {
  uint32_t size = 1;
  std::string removes;  // what it removes (dcp_removes()), for the report
};
StoreCapacity store_capacity(const plugin::LoadedPlugin& store, const toml::table* config,
                             const kvrt_kv_geometry& geometry, const Budget& budget,
                             const Dcp& dcp = {});

// store_capacity() of every KV store `registry` can load (it runs registry.discover() first),
// each with its own table from the registry's config source, in the registry's order. What
// the diagnosis prints as "the ceiling each other loadable store would give on the same
// budget". Stores that cannot serve the geometry are listed with their error, not dropped.
std::vector<StoreCapacity> compare_stores(plugin::Registry& registry,
                                          const kvrt_kv_geometry& geometry, const Budget& budget,
                                          const Dcp& dcp = {});

}  // namespace kvrt::capacity
