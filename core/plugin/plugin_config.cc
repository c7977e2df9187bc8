#include "core/plugin/plugin_config.h"

#include <spdlog/spdlog.h>

#include "core/plugin/kv_store.h"

namespace kvrt::plugin {
namespace {

config::KeySpec::Type option_type(kvrt_option_type type) {
  switch (type) {
    case KVRT_OPTION_INT:
      return config::KeySpec::Type::kInt;
    case KVRT_OPTION_FLOAT:
      return config::KeySpec::Type::kFloat;
    case KVRT_OPTION_BOOL:
      return config::KeySpec::Type::kBool;
    case KVRT_OPTION_TABLE:
      return config::KeySpec::Type::kTable;
    default:
      return config::KeySpec::Type::kString;
  }
}

// A store's own check of its options fails with "...(CONFIG): <key>: <why>": the key's place in
// the file, when the plugin's table has that key, so the message reads like `kvrt config
// check`'s others; else the file and the table.
std::string option_position(const config::Config& cfg, const LoadedPlugin& p,
                            const std::string& message) {
  const std::string fallback = cfg.source + ": [kv." + p.name + "]";
  const toml::table* table = cfg.plugin_table("kv", p.name);
  const std::string marker = "(CONFIG): ";
  const size_t at = message.find(marker);
  if (table == nullptr || at == std::string::npos) return fallback;
  const std::string rest = message.substr(at + marker.size());
  const std::string key = rest.substr(0, rest.find(':'));
  const toml::node* node = table->get(key);
  return node == nullptr ? fallback : config::position_of(*node, cfg.source);
}

// The key of [<section>] that chooses the plugin, as opposed to naming a plugin's table.
const char* chooser_key(std::string_view section) { return section == "kv" ? "store" : "backend"; }

}  // namespace

Status check_plugin_section(Registry& registry, const config::Config& cfg, const char* section) {
  const toml::table* tables = cfg.table()[section].as_table();
  if (tables == nullptr) return Status::Ok();
  for (const auto& [key, node] : *tables) {
    const std::string name(key.str());
    if (name == chooser_key(section) || !node.is_table()) continue;
    Result<const LoadedPlugin*> plugin = registry.load(name);
    const std::string where = cfg.source + ": [" + section + "." + name + "]";
    if (!plugin.ok()) return Status::ConfigError(where + ": " + plugin.status().message());
    std::vector<config::KeySpec> keys;
    for (const kvrt_option_desc& o : (*plugin)->options) {
      keys.push_back({o.name, option_type(o.type), o.help ? o.help : ""});
    }
    Status s = config::validate_keys(*node.as_table(), keys, cfg.source,
                                     std::string(section) + "." + name);
    if (!s.ok()) return s;
  }
  return Status::Ok();
}

Status check_plugin_tables(Registry& registry, const config::Config& cfg) {
  Result<const LoadedPlugin*> store = registry.load_kv_store(cfg.kv.store);
  if (!store.ok()) {
    return Status::ConfigError(cfg.source + ": kv.store = \"" + cfg.kv.store +
                               "\": " + store.status().message());
  }
  if (Status s = check_plugin_section(registry, cfg, "kv"); !s.ok()) return s;
  if (Status s = check_plugin_section(registry, cfg, "attention"); !s.ok()) return s;

  // The stores' own value checks (scale modes, policies, an inner store) run in page_bytes:
  // run them for the chosen store and every store that has a table.
  std::vector<const LoadedPlugin*> stores = {*store};
  if (const toml::table* kv = cfg.table()["kv"].as_table(); kv != nullptr) {
    for (const auto& [key, node] : *kv) {
      Result<const LoadedPlugin*> p = registry.load(std::string(key.str()));
      if (node.is_table() && p.ok() && (*p)->kind() == KVRT_PLUGIN_KV_STORE) stores.push_back(*p);
    }
  }
  kvrt_kv_geometry g{};
  g.struct_size = sizeof(g);
  g.num_layers = 1;
  g.num_kv_heads = g.total_kv_heads = 1;
  g.k_head_dim = g.v_head_dim = 64;
  g.page_size = static_cast<uint32_t>(cfg.scheduler.page_size);
  g.input_dtype = KVRT_DTYPE_BF16;
  g.tp_size = 1;
  g.device = registry.device();
  for (const LoadedPlugin* p : stores) {
    Result<uint64_t> bytes = page_bytes(*p, g, as_config(cfg.plugin_table("kv", p->name)));
    if (!bytes.ok()) {
      return bytes.status().WithContext(option_position(cfg, *p, bytes.status().message()));
    }
  }
  Result<const LoadedPlugin*> attention = registry.load(cfg.attention.backend);
  if (!attention.ok()) {
    // A file may be checked on a machine other than the one that serves it: the attention
    // backend is loaded and refused for good when a model runs (runtime::build_runtime).
    spdlog::warn("attention.backend = \"{}\": {}", cfg.attention.backend,
                 attention.status().message());
  }
  return Status::Ok();
}

}  // namespace kvrt::plugin
