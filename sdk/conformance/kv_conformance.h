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
  // kSkip: the property applies but could not run (counts against the plugin unless the caller
  // allows skips); kNotApplicable: it does not apply (the tier suite for a store without a tier).
  enum class Outcome { kPass, kFail, kSkip, kNotApplicable } outcome;
  std::string detail;  // why it failed, was skipped or does not apply; "" on pass
};

// Thrown by a property that applies to the plugin under test but cannot run here (e.g. a tier
// configured to hold no pages).
struct Skip : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Thrown by a property that does not apply to the plugin under test (e.g. tier properties for
// a store without tier callbacks).
struct NotApplicable : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Options {
  uint32_t seed = 1234;
  uint32_t threads = 4;  // for the concurrent-write property
};

// Counts of a suite's outcomes, and the names of the skipped properties.
struct Tally {
  int passed = 0, failed = 0, skipped = 0, not_applicable = 0;
  std::vector<std::string> skipped_names;
};
Tally tally(const std::vector<PropertyResult>& results);

// Runs every property against `plugin` (a KV store loaded by `registry`, whose config source
// gives the plugin's table). Each property runs even when an earlier one failed.
std::vector<PropertyResult> run_kv_store_suite(plugin::Registry& registry,
                                               const plugin::LoadedPlugin& plugin,
                                               const Options& options, std::ostream& log);

// Runs one property of any suite: PASS, SKIP (`body` threw Skip), N/A (`body` threw
// NotApplicable) or FAIL (any other exception, whose message becomes the detail), logged as
// "[ FAIL ] <plugin>: <property>: <detail>".
PropertyResult run_property(const std::string& plugin, const std::string& property,
                            const std::function<void()>& body, std::ostream& log);

}  // namespace kvrt::conformance
