// The TOML configuration with plugin tables: kvrt config check's path (parse, validate, check
// each [kv.<plugin>] / [attention.<plugin>] table against the plugins found next to this binary,
// run the chosen store's own option checks), then the property that the effective configuration
// written by to_toml loads back to the same text.
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>

#include "core/config/config.h"
#include "core/plugin/plugin_config.h"
#include "core/plugin/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static kvrt::plugin::Registry* registry = new kvrt::plugin::Registry();
  const std::string text(reinterpret_cast<const char*>(data), size);
  kvrt::Result<kvrt::config::Config> cfg = kvrt::config::load_string(text, "fuzz.toml", {});
  if (!cfg.ok()) return 0;
  // The tables of this input, not of an earlier one.
  registry->set_config_source([&cfg](const std::string& name) -> const toml::table* {
    const toml::table* t = cfg->plugin_table("kv", name);
    return t != nullptr ? t : cfg->plugin_table("attention", name);
  });
  (void)kvrt::plugin::check_plugin_tables(*registry, *cfg);
  registry->set_config_source(nullptr);

  // The first line names the source; the rest must be the same.
  auto body = [](const std::string& toml) { return toml.substr(toml.find('\n')); };
  const std::string written = kvrt::config::to_toml(*cfg);
  kvrt::Result<kvrt::config::Config> again = kvrt::config::load_string(written, "written", {});
  if (!again.ok() || body(kvrt::config::to_toml(*again)) != body(written)) {
    std::fprintf(stderr, "to_toml does not load back:\n%s\n%s\n", written.c_str(),
                 again.ok() ? "(different text)" : again.status().message().c_str());
    std::abort();
  }
  return 0;
}
