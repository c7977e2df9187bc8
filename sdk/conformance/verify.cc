#include "sdk/conformance/verify.h"

#include <toml++/toml.h>

#include <cstdlib>
#include <mutex>
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
    for (const PropertyResult& r : results) {
      if (r.outcome != PropertyResult::Outcome::kFail) continue;
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
