// The services the core passes in to plugins (kvrt_host_api): logging, last-error reporting,
// config lookup, accounted memory, copies and access to other KV stores.
#pragma once

#include <toml++/toml.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>
#include <string>

#include "core/util/status.h"
#include "kvrt/abi.h"
#include "kvrt/kv_store.h"

namespace kvrt::plugin {

// Memory the plugins took through host->alloc, per kind. Device memory is checked against a
// budget ([device] memory on CPU) so the KV pool cannot silently exceed what was planned.
class MemoryAccount {
 public:
  explicit MemoryAccount(uint64_t device_budget = UINT64_MAX) : device_budget_(device_budget) {}
  uint64_t device_budget() const { return device_budget_; }
  void set_device_budget(uint64_t bytes) { device_budget_ = bytes; }
  uint64_t device_used() const { return device_used_.load(); }
  uint64_t host_used() const { return host_used_.load(); }
  uint64_t device_peak() const { return device_peak_.load(); }

  // Reserves bytes; false (nothing reserved) when a device reservation exceeds the budget.
  bool reserve(kvrt_memory_kind kind, uint64_t bytes);
  void release(kvrt_memory_kind kind, uint64_t bytes);

  // Live allocations by address, so a test can check that what a plugin publishes (a layout's
  // pointers and strides) stays inside memory it allocated.
  void track(const void* ptr, uint64_t bytes);
  void untrack(const void* ptr);
  bool covers(const void* ptr, uint64_t bytes) const;

 private:
  mutable std::mutex live_mutex_;
  std::map<uintptr_t, uint64_t> live_;
  uint64_t device_budget_;
  std::atomic<uint64_t> device_used_{0};
  std::atomic<uint64_t> device_peak_{0};
  std::atomic<uint64_t> host_used_{0};
};

// A plugin's config table as the ABI's opaque handle, and back.
inline const kvrt_config* as_config(const toml::table* table) {
  return reinterpret_cast<const kvrt_config*>(table);
}
inline const toml::table* as_table(const kvrt_config* config) {
  return reinterpret_cast<const toml::table*>(config);
}

// Resolves another KV store by name for kvrt_host_api::open_kv_store.
using KvStoreOpener =
    std::function<Status(const std::string& name, const kvrt_kv_store_api** api,
                         const kvrt_host_api** store_host, const toml::table** config)>;

// Where device and pinned host memory come from, and how bytes move, when the device is not
// the CPU (a CUDA device: core/backend/cuda_memory.h). Without one every kind is host RAM and a
// copy is a memcpy. Called from any thread; the accounting stays MemoryAccount's.
class DeviceMemory {
 public:
  virtual ~DeviceMemory() = default;
  // `kind` is KVRT_MEMORY_DEVICE or KVRT_MEMORY_PINNED_HOST.
  virtual Status allocate(kvrt_memory_kind kind, uint64_t bytes, void** out) = 0;
  virtual void release(kvrt_memory_kind kind, void* ptr) = 0;
  // Ordered on `stream` (complete when the stream reaches it); synchronous when it is null.
  virtual Status copy(void* dst, const void* src, uint64_t bytes, void* stream) = 0;
};

// Shared state behind every plugin's kvrt_host_api instance.
struct HostContext {
  MemoryAccount* memory = nullptr;
  KvStoreOpener open_kv_store;
  DeviceMemory* device_memory = nullptr;  // null on the CPU
};

// One kvrt_host_api per plugin, so log lines and errors name it. Never moved once built (the
// plugin keeps the pointer).
class PluginHost {
 public:
  PluginHost(std::string plugin_name, HostContext* context);
  PluginHost(const PluginHost&) = delete;
  PluginHost& operator=(const PluginHost&) = delete;

  const kvrt_host_api* api() const { return &api_; }
  const std::string& plugin_name() const { return name_; }
  HostContext* context() const { return context_; }

 private:
  std::string name_;
  HostContext* context_;
  kvrt_host_api api_{};
};

// The message the last failing plugin callback on this thread recorded through set_error,
// then cleared. Empty if it recorded none.
std::string take_last_error();
void clear_last_error();

// "<what> failed (<status name>): <message>" for a non-OK status from a plugin callback.
Status plugin_failure(const std::string& plugin, const std::string& what, kvrt_status status);
const char* status_name(kvrt_status status);

}  // namespace kvrt::plugin
