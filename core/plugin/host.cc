#include "core/plugin/host.h"

#include <spdlog/spdlog.h>

#include <cstdlib>
#include <cstring>

namespace kvrt::plugin {
namespace {

thread_local std::string t_last_error;

const PluginHost& self(const kvrt_host_api* host) {
  return *static_cast<const PluginHost*>(host->ctx);
}

void host_log(const kvrt_host_api* host, kvrt_log_level level, const char* message) {
  const std::string& name = self(host).plugin_name();
  const char* text = message != nullptr ? message : "";
  switch (level) {
    case KVRT_LOG_DEBUG:
      spdlog::debug("[{}] {}", name, text);
      break;
    case KVRT_LOG_INFO:
      spdlog::info("[{}] {}", name, text);
      break;
    case KVRT_LOG_WARN:
      spdlog::warn("[{}] {}", name, text);
      break;
    default:
      spdlog::error("[{}] {}", name, text);
      break;
  }
}

void host_set_error(const kvrt_host_api*, kvrt_status, const char* message) {
  t_last_error = message != nullptr ? message : "";
}

// Looks up a dotted key; `check` reads it when it has the wanted type. A type mismatch records
// no message: plugins probe types (ConfigView::has) and word their own errors, naming the key.
template <class Check>
kvrt_status lookup(const kvrt_config* config, const char* key, Check&& check) {
  if (key == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
  const toml::table* table = as_table(config);
  if (table == nullptr) return KVRT_ERR_NOT_FOUND;
  toml::node_view<const toml::node> node = table->at_path(key);
  if (!node) return KVRT_ERR_NOT_FOUND;
  if (!check(node)) return KVRT_ERR_CONFIG;
  return KVRT_OK;
}

kvrt_status host_config_string(const kvrt_host_api*, const kvrt_config* config, const char* key,
                               const char** out) {
  if (out == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
  return lookup(config, key, [&](auto node) {
    if (!node.is_string()) return false;
    *out = node.as_string()->get().c_str();
    return true;
  });
}

kvrt_status host_config_int(const kvrt_host_api*, const kvrt_config* config, const char* key,
                            int64_t* out) {
  if (out == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
  return lookup(config, key, [&](auto node) {
    if (!node.is_integer()) return false;
    *out = node.as_integer()->get();
    return true;
  });
}

kvrt_status host_config_float(const kvrt_host_api*, const kvrt_config* config, const char* key,
                              double* out) {
  if (out == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
  return lookup(config, key, [&](auto node) {
    if (node.is_integer()) {
      *out = static_cast<double>(node.as_integer()->get());
      return true;
    }
    if (!node.is_floating_point()) return false;
    *out = node.as_floating_point()->get();
    return true;
  });
}

kvrt_status host_config_bool(const kvrt_host_api*, const kvrt_config* config, const char* key,
                             int32_t* out) {
  if (out == nullptr) return KVRT_ERR_INVALID_ARGUMENT;
  return lookup(config, key, [&](auto node) {
    if (!node.is_boolean()) return false;
    *out = node.as_boolean()->get() ? 1 : 0;
    return true;
  });
}

kvrt_status host_alloc(const kvrt_host_api* host, kvrt_memory_kind kind, uint64_t bytes,
                       uint64_t alignment, void** out) {
  if (out == nullptr ||
      (kind != KVRT_MEMORY_DEVICE && kind != KVRT_MEMORY_HOST && kind != KVRT_MEMORY_PINNED_HOST)) {
    t_last_error = "alloc: unknown memory kind " + std::to_string(kind);
    return KVRT_ERR_INVALID_ARGUMENT;
  }
  if (alignment == 0) alignment = 64;
  if ((alignment & (alignment - 1)) != 0) {
    t_last_error = "alloc: alignment " + std::to_string(alignment) + " is not a power of two";
    return KVRT_ERR_INVALID_ARGUMENT;
  }
  MemoryAccount& memory = *self(host).context()->memory;
  if (!memory.reserve(kind, bytes)) {
    t_last_error = "device memory budget exceeded: " + std::to_string(bytes) +
                   " bytes requested, " + std::to_string(memory.device_used()) + " of " +
                   std::to_string(memory.device_budget()) + " in use";
    return KVRT_ERR_NO_MEMORY;
  }
  if (bytes > UINT64_MAX - alignment) {
    memory.release(kind, bytes);
    t_last_error = "alloc: " + std::to_string(bytes) + " bytes cannot be allocated";
    return KVRT_ERR_NO_MEMORY;
  }
  void* p = nullptr;
  if (DeviceMemory* device = self(host).context()->device_memory;
      device != nullptr && kind != KVRT_MEMORY_HOST) {
    // The device's allocator aligns to 256 bytes at least; a larger alignment is refused.
    if (alignment > 256) {
      memory.release(kind, bytes);
      t_last_error =
          "alloc: alignment " + std::to_string(alignment) + " above the device allocator's 256";
      return KVRT_ERR_INVALID_ARGUMENT;
    }
    if (Status s = device->allocate(kind, bytes, &p); !s.ok()) {
      memory.release(kind, bytes);
      t_last_error = s.message();
      return KVRT_ERR_NO_MEMORY;
    }
  } else {
    uint64_t rounded = (bytes + alignment - 1) / alignment * alignment;
    p = std::aligned_alloc(alignment, rounded == 0 ? alignment : rounded);
  }
  if (p == nullptr) {
    memory.release(kind, bytes);
    t_last_error = "out of memory allocating " + std::to_string(bytes) + " bytes";
    return KVRT_ERR_NO_MEMORY;
  }
  memory.track(p, bytes);
  *out = p;
  return KVRT_OK;
}

void host_free(const kvrt_host_api* host, kvrt_memory_kind kind, void* ptr, uint64_t bytes) {
  if (ptr == nullptr) return;
  MemoryAccount& memory = *self(host).context()->memory;
  memory.untrack(ptr);
  if (DeviceMemory* device = self(host).context()->device_memory;
      device != nullptr && kind != KVRT_MEMORY_HOST) {
    device->release(kind, ptr);
  } else {
    std::free(ptr);
  }
  memory.release(kind, bytes);
}

kvrt_status copy_on(const kvrt_host_api* host, void* dst, const void* src, uint64_t bytes,
                    void* stream) {
  if (bytes > 0 && (dst == nullptr || src == nullptr)) return KVRT_ERR_INVALID_ARGUMENT;
  if (bytes == 0) return KVRT_OK;
  if (DeviceMemory* device = self(host).context()->device_memory; device != nullptr) {
    if (Status s = device->copy(dst, src, bytes, stream); !s.ok()) {
      t_last_error = s.message();
      return KVRT_ERR_INTERNAL;
    }
    return KVRT_OK;
  }
  std::memcpy(dst, src, bytes);  // CPU: every kind is host RAM
  return KVRT_OK;
}

kvrt_status host_copy(const kvrt_host_api* host, void* dst, kvrt_memory_kind, const void* src,
                      kvrt_memory_kind, uint64_t bytes) {
  return copy_on(host, dst, src, bytes, nullptr);
}

// Allocation is not ordered on a stream (the pool and workspaces are made once, before the
// steps); copies are, on a device. On the CPU every call completes before it returns.
kvrt_status host_alloc_async(const kvrt_host_api* host, kvrt_memory_kind kind, uint64_t bytes,
                             uint64_t alignment, void*, void** out) {
  return host_alloc(host, kind, bytes, alignment, out);
}

void host_free_async(const kvrt_host_api* host, kvrt_memory_kind kind, void* ptr, uint64_t bytes,
                     void*) {
  host_free(host, kind, ptr, bytes);
}

kvrt_status host_copy_async(const kvrt_host_api* host, void* dst, kvrt_memory_kind, const void* src,
                            kvrt_memory_kind, uint64_t bytes, void* stream) {
  return copy_on(host, dst, src, bytes, stream);
}

kvrt_status host_open_kv_store(const kvrt_host_api* host, const char* name,
                               const kvrt_kv_store_api** api, const kvrt_host_api** store_host,
                               const kvrt_config** config) {
  if (name == nullptr || api == nullptr || store_host == nullptr || config == nullptr) {
    return KVRT_ERR_INVALID_ARGUMENT;
  }
  const KvStoreOpener& open = self(host).context()->open_kv_store;
  if (!open) {
    t_last_error = "this host cannot open other KV stores";
    return KVRT_ERR_UNSUPPORTED;
  }
  const toml::table* table = nullptr;
  Status s = open(name, api, store_host, &table);
  if (!s.ok()) {
    t_last_error = s.message();
    return KVRT_ERR_NOT_FOUND;
  }
  *config = as_config(table);
  return KVRT_OK;
}

}  // namespace

bool MemoryAccount::reserve(kvrt_memory_kind kind, uint64_t bytes) {
  if (kind != KVRT_MEMORY_DEVICE) {  // host RAM, pinned or not
    host_used_ += bytes;
    return true;
  }
  uint64_t used = device_used_.load();
  do {
    if (bytes > device_budget_ - used || used > device_budget_) return false;
  } while (!device_used_.compare_exchange_weak(used, used + bytes));
  uint64_t peak = device_peak_.load();
  while (used + bytes > peak && !device_peak_.compare_exchange_weak(peak, used + bytes)) {
  }
  return true;
}

void MemoryAccount::release(kvrt_memory_kind kind, uint64_t bytes) {
  (kind == KVRT_MEMORY_DEVICE ? device_used_ : host_used_) -= bytes;
}

void MemoryAccount::track(const void* ptr, uint64_t bytes) {
  std::lock_guard lock(live_mutex_);
  live_[reinterpret_cast<uintptr_t>(ptr)] = bytes;
}

void MemoryAccount::untrack(const void* ptr) {
  std::lock_guard lock(live_mutex_);
  live_.erase(reinterpret_cast<uintptr_t>(ptr));
}

bool MemoryAccount::covers(const void* ptr, uint64_t bytes) const {
  const uintptr_t start = reinterpret_cast<uintptr_t>(ptr);
  std::lock_guard lock(live_mutex_);
  auto it = live_.upper_bound(start);  // the first allocation starting after ptr
  if (it == live_.begin()) return false;
  --it;
  return start + bytes >= start && start + bytes <= it->first + it->second;
}

PluginHost::PluginHost(std::string plugin_name, HostContext* context)
    : name_(std::move(plugin_name)), context_(context) {
  api_.struct_size = sizeof(kvrt_host_api);
  api_.abi_major = KVRT_ABI_MAJOR;
  api_.abi_minor = KVRT_ABI_MINOR;
  api_.ctx = this;
  api_.log = host_log;
  api_.set_error = host_set_error;
  api_.config_string = host_config_string;
  api_.config_int = host_config_int;
  api_.config_float = host_config_float;
  api_.config_bool = host_config_bool;
  api_.alloc = host_alloc;
  api_.free = host_free;
  api_.copy = host_copy;
  api_.open_kv_store = host_open_kv_store;
  api_.alloc_async = host_alloc_async;
  api_.free_async = host_free_async;
  api_.copy_async = host_copy_async;
}

std::string take_last_error() {
  std::string message = std::move(t_last_error);
  t_last_error.clear();
  return message;
}

void clear_last_error() { t_last_error.clear(); }

const char* status_name(kvrt_status status) {
  switch (status) {
    case KVRT_OK:
      return "OK";
    case KVRT_ERR_INVALID_ARGUMENT:
      return "INVALID_ARGUMENT";
    case KVRT_ERR_OUT_OF_RANGE:
      return "OUT_OF_RANGE";
    case KVRT_ERR_UNSUPPORTED:
      return "UNSUPPORTED";
    case KVRT_ERR_NO_MEMORY:
      return "NO_MEMORY";
    case KVRT_ERR_NOT_FOUND:
      return "NOT_FOUND";
    case KVRT_ERR_ABI_MISMATCH:
      return "ABI_MISMATCH";
    case KVRT_ERR_CONFIG:
      return "CONFIG";
    case KVRT_ERR_INTERNAL:
      return "INTERNAL";
    default:
      return "UNKNOWN_STATUS";
  }
}

Status plugin_failure(const std::string& plugin, const std::string& what, kvrt_status status) {
  std::string message = take_last_error();
  std::string text = "plugin " + plugin + ": " + what + " failed (" + status_name(status) + ")";
  if (!message.empty()) text += ": " + message;
  switch (status) {
    case KVRT_ERR_NO_MEMORY:
      return Status::NoMemory(text);
    case KVRT_ERR_UNSUPPORTED:
      return Status::Unsupported(text);
    case KVRT_ERR_OUT_OF_RANGE:
      return Status::OutOfRange(text);
    case KVRT_ERR_CONFIG:
      return Status::ConfigError(text);
    default:
      return Status::PluginError(text);
  }
}

}  // namespace kvrt::plugin
