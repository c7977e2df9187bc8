// kvrt-conformance: runs the conformance suite of the plugin's kind (KV store or attention)
// against one plugin.
//   kvrt-conformance --plugin path/to/kv_mine.so [--config kvrt.toml] [--set kv.kv_mine.x=1]
//   kvrt-conformance --plugin attn_mine.so [--set attention.attn_mine.x=1]
// Exit status 0 when every property passes or does not apply (N/A: the tier suite for a store
// without a tier); 1 when one fails, or when one applies but could not run (SKIP), unless
// --allow-skip is given. Skipped properties are listed by name.
// The results go to stdout; the plugin's log lines and errors to stderr.
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <iostream>

#include "core/config/config.h"
#include "core/plugin/plugin_config.h"
#include "core/plugin/registry.h"
#include "sdk/conformance/attention_conformance.h"
#include "sdk/conformance/kv_conformance.h"

namespace {

int run(int argc, char** argv) {
  CLI::App app{"Runs the kvrt conformance suite (KV store or attention) against a plugin"};
  std::string plugin_path, config_path;
  std::vector<std::string> overrides;
  kvrt::conformance::Options options;
  app.add_option("--plugin", plugin_path, "plugin file (or name, searched)")->required();
  app.add_option("--config", config_path, "TOML config whose [kv.<name>] table the plugin gets");
  app.add_option("--set", overrides, "override a config key: section.key=value");
  app.add_option("--seed", options.seed, "random seed");
  app.add_option("--threads", options.threads, "threads for the concurrent-write property");
  bool allow_skip = false;
  app.add_flag("--allow-skip", allow_skip,
               "exit 0 although some properties that apply could not run (they are still listed)");
  CLI11_PARSE(app, argc, argv);
  spdlog::set_default_logger(spdlog::stderr_color_mt("kvrt-conformance"));

  kvrt::Result<kvrt::config::Config> config =
      config_path.empty() ? kvrt::config::load_string("", "<defaults>", overrides)
                          : kvrt::config::load_file(config_path, overrides);
  if (!config.ok()) {
    std::cerr << "kvrt-conformance: " << config.status().message() << "\n";
    return 2;
  }
  kvrt::plugin::Registry registry;
  registry.add_search_dirs(config->plugin_paths);
  // A plugin's table is [kv.<name>] or [attention.<name>]: names are unique across kinds.
  registry.set_config_source([&config](const std::string& name) {
    const toml::table* kv = config->plugin_table("kv", name);
    return kv != nullptr ? kv : config->plugin_table("attention", name);
  });
  kvrt::Result<const kvrt::plugin::LoadedPlugin*> plugin = registry.load(plugin_path);
  if (!plugin.ok()) {
    std::cerr << "kvrt-conformance: " << plugin.status().message() << "\n";
    return 2;
  }
  const bool attention = (*plugin)->kind() == KVRT_PLUGIN_ATTENTION;
  for (const char* section : {"kv", "attention"}) {
    if (kvrt::Status s = kvrt::plugin::check_plugin_section(registry, *config, section); !s.ok()) {
      std::cerr << "kvrt-conformance: " << s.message() << "\n";
      return 2;
    }
  }
  auto results =
      attention ? kvrt::conformance::run_attention_suite(registry, **plugin, options, std::cout)
                : kvrt::conformance::run_kv_store_suite(registry, **plugin, options, std::cout);
  const kvrt::conformance::Tally t = kvrt::conformance::tally(results);
  std::cout << (*plugin)->name << ": " << t.passed << " passed, " << t.failed << " failed, "
            << t.skipped << " skipped, " << t.not_applicable << " not applicable\n";
  if (t.skipped > 0) {
    std::cout << "skipped (they apply but could not run):";
    for (const std::string& name : t.skipped_names) std::cout << " " << name;
    std::cout << (allow_skip ? " -- allowed by --allow-skip\n"
                             : " -- exit 1 (--allow-skip allows them)\n");
  }
  return t.failed == 0 && (t.skipped == 0 || allow_skip) ? 0 : 1;
}

}  // namespace

// A property's failure is a result, not an exception; anything that still escapes (memory
// exhausted) ends the run with one line and exit code 2, as a load failure does.
int main(int argc, char** argv) {
  try {
    return run(argc, argv);
  } catch (const std::exception& e) {
    std::cerr << "kvrt-conformance: internal error: " << e.what() << "\n";
  }
  return 2;
}
