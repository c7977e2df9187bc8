// Loads plugins (Boost.DLL), validates their tables and keeps them for the life of the process.
#pragma once

#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "core/plugin/host.h"
#include "core/util/status.h"
#include "kvrt/abi.h"
#include "kvrt/attention.h"
#include "kvrt/kv_store.h"
#include "kvrt/plugin.hpp"

namespace kvrt::plugin {

// A validated plugin. The tables are the plugin's, copied over zeroed structs of this host's
// size, so a slot the plugin's (older, shorter) table lacks reads as NULL.
struct LoadedPlugin {
  std::string name;
  std::filesystem::path path;
  // The plugin's descriptor copied over a zeroed one of this host's size (an older plugin's
  // shorter descriptor reads as NULL / 0 beyond its struct_size).
  kvrt_plugin_desc desc{};
  // A store's table as ABI 1.3 extends it (kv_store.h); `kv` is its 1.2 part. kv_1_3.format
  // is NULL for an older store, whose kv.struct_size says so (kvrt_kv_store_api_1_3_of).
  kvrt_kv_store_api_1_3 kv_1_3{};
  kvrt_kv_store_api& kv = kv_1_3.base;
  kvrt_attention_api attention{};
  std::vector<kvrt_option_desc> options;
  std::unique_ptr<PluginHost> host;

  kvrt_plugin_kind kind() const { return desc.kind; }
  const kvrt_host_api* host_api() const { return host->api(); }
  // "layout,gather,tier,format" for stores (what the table offers); "paged" for attention.
  std::string capabilities() const;
  std::string input_dtype_names() const;
};

struct LoadFailure {
  std::filesystem::path path;
  std::string message;
};

class Registry {
 public:
  // `device` is what plugins are probed for.
  explicit Registry(kvrt_device device = {sizeof(kvrt_device), KVRT_DEVICE_CPU, 0, 0},
                    uint64_t device_budget = UINT64_MAX);
  Registry(const Registry&) = delete;
  Registry& operator=(const Registry&) = delete;

  // Extra folders searched after KVRT_PLUGIN_PATH and before the defaults.
  void add_search_dirs(const std::vector<std::string>& dirs);
  // The folders searched by name, in order: KVRT_PLUGIN_PATH, added dirs, next to the
  // binary, <binary>/../lib/kvrt, the install prefix.
  std::vector<std::filesystem::path> search_dirs() const;

  // Where a plugin's own table comes from (e.g. [kv.<name>] of the effective config); used
  // when one store opens another through the host.
  void set_config_source(std::function<const toml::table*(const std::string& name)> source);
  std::function<const toml::table*(const std::string& name)> config_source() const;
  const toml::table* plugin_config(const std::string& name) const;

  // By name ("kv_fp8_e4m3": searched) or by path (contains '/' or ends in ".so"). Loading the
  // same library twice returns the first load. Each error is one line naming file and reason.
  Result<const LoadedPlugin*> load(const std::string& name_or_path);
  Result<const LoadedPlugin*> load_kv_store(const std::string& name_or_path);

  // Every *.so in the search folders, loaded; failures are listed, not fatal.
  std::vector<LoadFailure> discover();
  std::vector<const LoadedPlugin*> loaded() const;

  MemoryAccount& memory() { return memory_; }
  // Where the plugins' device and pinned memory come from (a CUDA device's allocator); null, the
  // default, on the CPU. Must outlive the registry.
  void set_device_memory(DeviceMemory* memory) { context_.device_memory = memory; }
  const kvrt_device& device() const { return device_; }

 private:
  Result<const LoadedPlugin*> load_path(const std::filesystem::path& path);
  // Validates a queried plugin and registers it, or refuses it keeping its host alive.
  Result<const LoadedPlugin*> accept(std::unique_ptr<LoadedPlugin> plugin,
                                     const kvrt_plugin_desc* desc);

  kvrt_device device_;
  MemoryAccount memory_;
  HostContext context_;
  std::vector<std::string> extra_dirs_;
  std::function<const toml::table*(const std::string&)> config_source_;
  mutable std::recursive_mutex mutex_;
  std::map<std::string, std::unique_ptr<LoadedPlugin>> by_path_;
  std::map<std::string, LoadedPlugin*> by_name_;
  // A library whose query ran keeps its host instance even if it was then refused (it may
  // hold the pointer), and is not queried again: the refusal is remembered by path.
  std::vector<std::unique_ptr<PluginHost>> refused_hosts_;
  std::map<std::string, Status> refused_;
};

using sdk::dtype_name;  // one name table, shared with the plugins
const char* kind_name(kvrt_plugin_kind kind);

}  // namespace kvrt::plugin
