// The KV store conformance suite: the properties every KV store plugin must have, run through
// the C ABI exactly as the core uses it. `kvrt-conformance --plugin lib.so` runs it.
#pragma once

#include <functional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include "core/plugin/registry.h"

namespace kvrt::conformance {

struct PropertyResult {
  std::string property;
  enum class Outcome { kPass, kFail, kSkip } outcome;
  std::string detail;  // why it failed or was skipped; "" on pass
};

// Thrown by a property that does not apply to the plugin under test (e.g. tier properties for
// a store without tier callbacks).
struct Skip : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  uint32_t seed = 1234;
  uint32_t threads = 4;  // for the concurrent-write property
};

// Runs every property against `plugin` (a KV store loaded by `registry`, whose config source
// gives the plugin's table). Each property runs even when an earlier one failed.
std::vector<PropertyResult> run_kv_store_suite(plugin::Registry& registry,
                                               const plugin::LoadedPlugin& plugin,
                                               const Options& options, std::ostream& log);

// Runs one property of any suite: PASS, SKIP (`body` threw Skip) or FAIL (any other exception,
// whose message becomes the detail), logged as "[ FAIL ] <plugin>: <property>: <detail>".
PropertyResult run_property(const std::string& plugin, const std::string& property,
                            const std::function<void()>& body, std::ostream& log);

}  // namespace kvrt::conformance
