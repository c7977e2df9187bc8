#include "core/plugin/registry.h"

#include <unistd.h>

#include <boost/dll/shared_library.hpp>
#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <system_error>

#include "core/plugin/elf_check.h"

namespace kvrt::plugin {
namespace fs = std::filesystem;

namespace {

// Loaded libraries are never unloaded (a plugin's threads, statics and the pointers the core
// holds into it stay valid until exit): the handles live here and are never destroyed.
std::vector<boost::dll::shared_library>& kept_libraries() {
  static auto* libraries = new std::vector<boost::dll::shared_library>();
  return *libraries;
}

fs::path executable_dir() {
  std::error_code ec;
  fs::path exe = fs::read_symlink("/proc/self/exe", ec);
  return ec ? fs::path() : exe.parent_path();
}

// The dynamic loader's own words from Boost.DLL's exception text, which reads "... (dlerror
// system message: PATH: REASON): ERRNO TEXT": the errno text is whatever errno last held, not
// the loader's reason, and PATH repeats what the caller's message already names.
std::string dl_reason(const std::exception& e, const std::string& path) {
  std::string what = e.what();
  const std::string marker = "dlerror system message: ";
  size_t at = what.find(marker);
  if (at == std::string::npos) return what;
  std::string reason = what.substr(at + marker.size());
  if (size_t close = reason.rfind(')'); close != std::string::npos) reason.resize(close);
  if (reason.rfind(path + ": ", 0) == 0) reason = reason.substr(path.size() + 2);
  return reason;
}

// Copies a plugin's table over a zeroed struct of the host's size; its struct_size says how
// much of the copy came from the plugin (no more than the host's size).
template <class Table>
void copy_table(const void* source, Table* table, uint32_t* struct_size) {
  *table = Table{};
  uint32_t size = *static_cast<const uint32_t*>(source);
  std::memcpy(table, source, std::min<size_t>(size, sizeof(Table)));
  *struct_size = std::min<uint32_t>(size, sizeof(Table));
}

struct Slot {
  const char* name;
  const void* fn;
};

// Required slots present, paired slots all-or-none; "" when valid.
std::string check_slots(const std::vector<Slot>& required, const std::vector<Slot>& all_or_none,
                        const char* group) {
  for (const Slot& slot : required) {
    if (slot.fn == nullptr) return std::string("required callback '") + slot.name + "' is missing";
  }
  size_t present = 0;
  for (const Slot& slot : all_or_none) present += slot.fn != nullptr;
  if (present != 0 && present != all_or_none.size()) {
    for (const Slot& slot : all_or_none) {
      if (slot.fn == nullptr) {
        return std::string(group) + " callbacks must all be present or all absent: '" + slot.name +
               "' is missing";
      }
    }
  }
  return "";
}

std::string validate_kv_table(const void* raw, kvrt_kv_store_api_1_3* out) {
  constexpr uint32_t kMinimum = offsetof(kvrt_kv_store_api, write) + sizeof(void*);
  uint32_t size = *static_cast<const uint32_t*>(raw);
  if (size < kMinimum) {
    return "KV store table too small: struct_size " + std::to_string(size) + ", at least " +
           std::to_string(kMinimum) + " needed (through 'write')";
  }
  copy_table(raw, out, &out->base.struct_size);
  if (out->base.struct_size < sizeof(kvrt_kv_store_api_1_3)) {  // 1.2 or older: no 1.3 part
    out->format = nullptr;
    out->base.struct_size = std::min<uint32_t>(size, sizeof(kvrt_kv_store_api));
  }
  const kvrt_kv_store_api& t = out->base;
  return check_slots({{"page_bytes", reinterpret_cast<const void*>(t.page_bytes)},
                      {"create", reinterpret_cast<const void*>(t.create)},
                      {"destroy", reinterpret_cast<const void*>(t.destroy)},
                      {"info", reinterpret_cast<const void*>(t.info)},
                      {"layout", reinterpret_cast<const void*>(t.layout)},
                      {"write", reinterpret_cast<const void*>(t.write)}},
                     {{"tier_info", reinterpret_cast<const void*>(t.tier_info)},
                      {"tier_lookup", reinterpret_cast<const void*>(t.tier_lookup)},
                      {"tier_save", reinterpret_cast<const void*>(t.tier_save)},
                      {"tier_load", reinterpret_cast<const void*>(t.tier_load)},
                      {"tier_wait", reinterpret_cast<const void*>(t.tier_wait)}},
                     "tier");
}

std::string validate_attention_table(const void* raw, kvrt_attention_api* out) {
  constexpr uint32_t kMinimum = offsetof(kvrt_attention_api, run) + sizeof(void*);
  uint32_t size = *static_cast<const uint32_t*>(raw);
  if (size < kMinimum) {
    return "attention table too small: struct_size " + std::to_string(size) + ", at least " +
           std::to_string(kMinimum) + " needed (through 'run')";
  }
  copy_table(raw, out, &out->struct_size);
  const kvrt_attention_api& t = *out;
  return check_slots({{"create", reinterpret_cast<const void*>(t.create)},
                      {"destroy", reinterpret_cast<const void*>(t.destroy)},
                      {"supports", reinterpret_cast<const void*>(t.supports)},
                      {"workspace_size", reinterpret_cast<const void*>(t.workspace_size)},
                      {"plan", reinterpret_cast<const void*>(t.plan)},
                      {"run", reinterpret_cast<const void*>(t.run)}},
                     {{"plan_sharded", reinterpret_cast<const void*>(t.plan_sharded)},
                      {"run_lse", reinterpret_cast<const void*>(t.run_lse)}},
                     "context-parallel");
}

std::string device_name(const kvrt_device& device) {
  return (device.kind == KVRT_DEVICE_CUDA ? std::string("cuda:") : std::string("cpu:")) +
         std::to_string(device.ordinal);
}

}  // namespace

const char* kind_name(kvrt_plugin_kind kind) {
  switch (kind) {
    case KVRT_PLUGIN_KV_STORE:
      return "kv_store";
    case KVRT_PLUGIN_ATTENTION:
      return "attention";
    default:
      return "unknown";
  }
}

std::string LoadedPlugin::capabilities() const {
  std::vector<std::string> caps;
  if (kind() == KVRT_PLUGIN_KV_STORE) {
    caps.push_back("layout");
    if (kv.gather != nullptr) caps.push_back("gather");
    if (kv.tier_info != nullptr) caps.push_back("tier");
    if (kv_1_3.format != nullptr) caps.push_back("format");
  } else {
    caps.push_back("paged");
  }
  std::string text;
  for (const std::string& c : caps) text += (text.empty() ? "" : ",") + c;
  return text;
}

std::string LoadedPlugin::input_dtype_names() const {
  std::string text;
  for (kvrt_dtype d = 1; d < 32; ++d) {
    if (desc.input_dtypes & KVRT_DTYPE_BIT(d))
      text += (text.empty() ? "" : ",") + std::string(dtype_name(d));
  }
  return text.empty() ? "-" : text;
}

Registry::Registry(kvrt_device device, uint64_t device_budget)
    : device_(device), memory_(device_budget) {
  context_.memory = &memory_;
  context_.open_kv_store = [this](const std::string& name, const kvrt_kv_store_api** api,
                                  const kvrt_host_api** store_host,
                                  const toml::table** config) -> Status {
    Result<const LoadedPlugin*> plugin = load_kv_store(name);
    if (!plugin.ok()) return plugin.status();
    *api = &(*plugin)->kv;
    *store_host = (*plugin)->host_api();
    *config = plugin_config((*plugin)->name);
    return Status::Ok();
  };
}

void Registry::add_search_dirs(const std::vector<std::string>& dirs) {
  std::lock_guard lock(mutex_);
  extra_dirs_.insert(extra_dirs_.end(), dirs.begin(), dirs.end());
}

std::vector<fs::path> Registry::search_dirs() const {
  std::vector<fs::path> dirs;
  if (const char* env = std::getenv("KVRT_PLUGIN_PATH"); env != nullptr) {
    std::string list = env;
    size_t start = 0;
    while (start <= list.size()) {
      size_t end = list.find(':', start);
      if (end == std::string::npos) end = list.size();
      if (end > start) dirs.emplace_back(list.substr(start, end - start));
      start = end + 1;
    }
  }
  {
    std::lock_guard lock(mutex_);
    for (const std::string& d : extra_dirs_) dirs.emplace_back(d);
  }
  fs::path exe = executable_dir();
  if (!exe.empty()) {
    dirs.push_back(exe);
    dirs.push_back(exe.parent_path() / "lib" / "kvrt");
  }
#ifdef KVRT_INSTALL_PLUGIN_DIR
  dirs.emplace_back(KVRT_INSTALL_PLUGIN_DIR);
#endif
  return dirs;
}

void Registry::set_config_source(
    std::function<const toml::table*(const std::string& name)> source) {
  std::lock_guard lock(mutex_);
  config_source_ = std::move(source);
}

std::function<const toml::table*(const std::string&)> Registry::config_source() const {
  std::lock_guard lock(mutex_);
  return config_source_;
}

const toml::table* Registry::plugin_config(const std::string& name) const {
  std::lock_guard lock(mutex_);
  return config_source_ ? config_source_(name) : nullptr;
}

Result<const LoadedPlugin*> Registry::load(const std::string& name_or_path) {
  std::lock_guard lock(mutex_);
  bool is_path =
      name_or_path.find('/') != std::string::npos || fs::path(name_or_path).extension() == ".so";
  if (is_path) return load_path(name_or_path);
  if (auto it = by_name_.find(name_or_path); it != by_name_.end()) return it->second;

  std::string searched;
  for (const fs::path& dir : search_dirs()) {
    for (const std::string& file : {name_or_path + ".so", "lib" + name_or_path + ".so"}) {
      std::error_code ec;
      if (fs::is_regular_file(dir / file, ec)) return load_path(dir / file);
    }
    searched += (searched.empty() ? "" : ", ") + dir.string();
  }
  return Status::NotFound("plugin '" + name_or_path + "' not found; searched: " + searched +
                          " (add a folder with KVRT_PLUGIN_PATH or [plugins] path)");
}

Result<const LoadedPlugin*> Registry::load_kv_store(const std::string& name_or_path) {
  Result<const LoadedPlugin*> plugin = load(name_or_path);
  if (plugin.ok() && (*plugin)->kind() != KVRT_PLUGIN_KV_STORE) {
    return Status::PluginError((*plugin)->path.string() + ": plugin '" + (*plugin)->name +
                               "' is an " + kind_name((*plugin)->kind()) +
                               " plugin, not a KV store");
  }
  return plugin;
}

Result<const LoadedPlugin*> Registry::load_path(const fs::path& given) {
  auto fail = [&given](const std::string& reason) -> Status {
    return Status::PluginError(given.string() + ": " + reason);
  };
  std::error_code ec;
  if (!fs::exists(given, ec)) return fail("file not found");
  fs::path path = fs::canonical(given, ec);
  if (ec) path = fs::absolute(given);
  if (auto it = by_path_.find(path.string()); it != by_path_.end()) return it->second.get();
  if (auto it = refused_.find(path.string()); it != refused_.end()) return it->second;

  // A truncated library would kill the process inside dlopen (SIGBUS), a FIFO would block it:
  // the file's own headers are checked first.
  if (Status elf = check_elf_file(path.string()); !elf.ok()) {
    refused_[path.string()] = elf;
    return elf;
  }
  boost::dll::shared_library library;
  try {
    library.load(path, boost::dll::load_mode::rtld_now | boost::dll::load_mode::rtld_local);
  } catch (const std::exception& e) {
    return fail("not a loadable shared library: " + dl_reason(e, path.string()));
  }
  if (!library.has(KVRT_PLUGIN_QUERY_SYMBOL)) {
    kept_libraries().push_back(std::move(library));
    return fail("entry symbol '" KVRT_PLUGIN_QUERY_SYMBOL
                "' not found (is it a kvrt plugin built with KVRT_PLUGIN_ENTRY?)");
  }
  auto query = library.get<std::remove_pointer_t<kvrt_plugin_query_fn>>(KVRT_PLUGIN_QUERY_SYMBOL);
  kept_libraries().push_back(std::move(library));

  auto plugin = std::make_unique<LoadedPlugin>();
  plugin->path = path;
  plugin->host = std::make_unique<PluginHost>(path.stem().string(), &context_);
  clear_last_error();
  const kvrt_plugin_desc* desc = nullptr;
  kvrt_status status = query(KVRT_ABI_MAJOR, KVRT_ABI_MINOR, plugin->host_api(), &desc);
  if (status != KVRT_OK) {
    std::string message = take_last_error();
    Status refusal = status == KVRT_ERR_ABI_MISMATCH
                         ? fail("ABI major mismatch: host is " + std::to_string(KVRT_ABI_MAJOR) +
                                (message.empty() ? "" : "; plugin says: " + message))
                         : fail(std::string("plugin init failed (") + status_name(status) + ")" +
                                (message.empty() ? "" : ": " + message));
    refused_hosts_.push_back(std::move(plugin->host));
    refused_[path.string()] = refusal;
    return refusal;
  }
  // From here on the plugin has our host: a refusal keeps it alive and is remembered.
  Result<const LoadedPlugin*> accepted = accept(std::move(plugin), desc);
  if (!accepted.ok()) {
    Status refusal = fail(accepted.status().message());
    refused_[path.string()] = refusal;
    return refusal;
  }
  return accepted;
}

Result<const LoadedPlugin*> Registry::accept(std::unique_ptr<LoadedPlugin> plugin,
                                             const kvrt_plugin_desc* desc) {
  auto refuse = [&](const std::string& reason) -> Status {
    refused_hosts_.push_back(std::move(plugin->host));
    return Status::PluginError(reason);
  };
  if (desc == nullptr) return refuse("kvrt_plugin_query returned no descriptor");
  constexpr uint32_t kMinimumDesc = offsetof(kvrt_plugin_desc, options);
  if (desc->struct_size < kMinimumDesc) {
    return refuse("plugin descriptor too small: struct_size " + std::to_string(desc->struct_size) +
                  ", at least " + std::to_string(kMinimumDesc) + " needed");
  }
  std::memcpy(&plugin->desc, desc, std::min<size_t>(desc->struct_size, sizeof(kvrt_plugin_desc)));
  const kvrt_plugin_desc& d = plugin->desc;
  if (d.abi_major != KVRT_ABI_MAJOR) {
    return refuse("ABI major mismatch: plugin built for " + std::to_string(d.abi_major) +
                  ", host is " + std::to_string(KVRT_ABI_MAJOR));
  }
  if (d.name == nullptr || d.name[0] == '\0') return refuse("plugin descriptor has no name");
  if (d.table == nullptr) return refuse("plugin descriptor has no function table");
  plugin->name = d.name;

  std::string invalid;
  if (d.kind == KVRT_PLUGIN_KV_STORE) {
    invalid = validate_kv_table(d.table, &plugin->kv_1_3);
  } else if (d.kind == KVRT_PLUGIN_ATTENTION) {
    invalid = validate_attention_table(d.table, &plugin->attention);
  } else {
    invalid = "unknown plugin kind " + std::to_string(d.kind);
  }
  if (!invalid.empty()) return refuse(invalid);

  if (d.options != nullptr) plugin->options.assign(d.options, d.options + d.num_options);
  if (d.probe != nullptr) {
    clear_last_error();
    kvrt_status probe = d.probe(plugin->host_api(), &device_);
    if (probe != KVRT_OK) {
      std::string message = take_last_error();
      return refuse("plugin '" + plugin->name + "' declines device " + device_name(device_) +
                    (message.empty() ? "" : ": " + message));
    }
  }
  if (auto it = by_name_.find(plugin->name); it != by_name_.end()) {
    return refuse("a plugin named '" + plugin->name + "' is already loaded from " +
                  it->second->path.string());
  }
  LoadedPlugin* raw = plugin.get();
  by_name_[plugin->name] = raw;
  by_path_[plugin->path.string()] = std::move(plugin);
  return static_cast<const LoadedPlugin*>(raw);
}

std::vector<LoadFailure> Registry::discover() {
  std::vector<LoadFailure> failures;
  for (const fs::path& dir : search_dirs()) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) continue;
    std::vector<fs::path> files;
    for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
      if (entry.path().extension() == ".so") files.push_back(entry.path());
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& file : files) {
      std::string stem = file.stem().string();
      if (stem.rfind("lib", 0) == 0) stem = stem.substr(3);
      {
        std::lock_guard lock(mutex_);
        if (by_name_.count(stem) != 0) continue;  // an earlier folder provides it
      }
      Result<const LoadedPlugin*> plugin = load(file.string());
      if (!plugin.ok()) failures.push_back({file, plugin.status().message()});
    }
  }
  return failures;
}

std::vector<const LoadedPlugin*> Registry::loaded() const {
  std::lock_guard lock(mutex_);
  std::vector<const LoadedPlugin*> plugins;
  for (const auto& [name, plugin] : by_name_) plugins.push_back(plugin);
  return plugins;
}

}  // namespace kvrt::plugin
