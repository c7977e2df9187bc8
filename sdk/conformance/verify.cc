#include "sdk/conformance/verify.h"

#include <toml++/toml.h>

#include <cstdlib>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "sdk/conformance/attention_conformance.h"
#include "sdk/conformance/kv_conformance.h"

namespace kvrt::conformance {

namespace {

// A library passes or fails the same way for the same options: each (file, table) is verified
// once per process, so a process that builds many runtimes (the tests) pays for it once.
std::string verified_key(plugin::Registry& registry, const plugin::LoadedPlugin& p) {
  std::ostringstream key;
  key << p.path.string() << '\n';
  if (const toml::table* t = registry.plugin_config(p.name)) key << *t;
  return key.str();
}

// The plugin's table without its nested tables (KVRT_OPTION_TABLE options): those hold data
// tied to one model, such as kv_fp8_e4m3's calibrated per-layer scales, which the suite's own
// geometries cannot match. nullopt when the table has none.
std::optional<toml::table> without_nested_tables(plugin::Registry& registry,
                                                 const plugin::LoadedPlugin& p) {
  const toml::table* t = registry.plugin_config(p.name);
  if (t == nullptr) return std::nullopt;
  std::optional<toml::table> out;
  for (const kvrt_option_desc& o : p.options) {
    if (o.type != KVRT_OPTION_TABLE || !t->contains(o.name)) continue;
    if (!out) out = *t;
    out->erase(o.name);
  }
  return out;
}

std::mutex verified_mutex;
std::set<std::string>& verified() {
  static auto* passed = new std::set<std::string>();
  return *passed;
}

}  // namespace

Status verify_plugins(plugin::Registry& registry, const plugin::LoadedPlugin* store,
                      const plugin::LoadedPlugin* attention, std::ostream& log) {
  const Options options;
  for (const plugin::LoadedPlugin* p : {store, attention}) {
    if (p == nullptr) continue;
    // Model-specific tables stay out of the suite while it runs (and out of the cache key).
    const std::optional<toml::table> general = without_nested_tables(registry, *p);
    const auto previous = registry.config_source();
    if (general) {
      registry.set_config_source([&](const std::string& name) -> const toml::table* {
        return name == p->name ? &*general : previous ? previous(name) : nullptr;
      });
      log << "verifying " << p->name << " without its nested option tables (model-specific data)\n";
    }
    struct Restore {
      plugin::Registry& registry;
      std::function<const toml::table*(const std::string&)> source;
      bool active;
      ~Restore() {
        if (active) registry.set_config_source(source);
      }
    } restore{registry, previous, general.has_value()};
    const std::string key = verified_key(registry, *p);
    {
      std::lock_guard lock(verified_mutex);
      if (verified().count(key) != 0) continue;
    }
    const std::vector<PropertyResult> results =
        p->kind() == KVRT_PLUGIN_ATTENTION ? run_attention_suite(registry, *p, options, log)
                                           : run_kv_store_suite(registry, *p, options, log);
    size_t failed = 0;
    const PropertyResult* first = nullptr;
    // A property that applies but could not run is not a pass either.
    for (const PropertyResult& r : results) {
      if (r.outcome != PropertyResult::Outcome::kFail &&
          r.outcome != PropertyResult::Outcome::kSkip) {
        continue;
      }
      ++failed;
      if (first == nullptr) first = &r;
    }
    if (first != nullptr) {
      return Status::PluginError("plugin " + p->name + " (" + p->path.string() + ") fails " +
                                 std::to_string(failed) + " of " +
                                 std::to_string(results.size()) +
                                 " conformance properties; first: " + first->property + ": " +
                                 first->detail + " (kvrt-conformance --plugin " +
                                 p->path.string() + " shows them all)");
    }
    std::lock_guard lock(verified_mutex);
    verified().insert(key);
  }
  return Status::Ok();
}

bool verify_requested_by_environment() {
  const char* v = std::getenv("KVRT_VERIFY_PLUGINS");
  return v != nullptr && std::string(v) == "1";
}

}  // namespace kvrt::conformance
