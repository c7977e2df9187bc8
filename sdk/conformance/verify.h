// The conformance suites as a gate before serving (`kvrt generate|bench --verify-plugins`,
// [plugins] verify, KVRT_VERIFY_PLUGINS=1): a store whose layout does not describe its memory,
// or whose values do not round-trip, is refused before the model loads instead of producing
// wrong tokens or reading past its allocation.
#pragma once

#include <ostream>

#include "core/plugin/registry.h"
#include "core/util/status.h"

namespace kvrt::conformance {

// Runs the KV store suite on `store` and the attention suite on `attention` (either may be
// null), each property's line going to `log`. PluginError naming the plugin, the first failed
// property and its detail when any fails; Ok when every property passed or was skipped.
Status verify_plugins(plugin::Registry& registry, const plugin::LoadedPlugin* store,
                      const plugin::LoadedPlugin* attention, std::ostream& log);

// Whether the environment asks for verification (KVRT_VERIFY_PLUGINS=1, as the tests set it).
bool verify_requested_by_environment();

}  // namespace kvrt::conformance
