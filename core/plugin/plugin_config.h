// Checks the plugin tables of a configuration against the plugins themselves.
#pragma once

#include "core/config/config.h"
#include "core/plugin/registry.h"
#include "core/util/status.h"

namespace kvrt::plugin {

// [kv] store must load as a KV store; every [kv.<name>] table must name a loadable plugin and
// use only the keys that plugin declares; the chosen store must accept its table (page_bytes
// on a sample geometry runs the plugin's own value checks). Errors name the file and key.
Status check_plugin_tables(Registry& registry, const config::Config& cfg);

// Just the [<section>.<name>] tables: each names a loadable plugin and uses only its keys.
Status check_plugin_section(Registry& registry, const config::Config& cfg, const char* section);

}  // namespace kvrt::plugin
