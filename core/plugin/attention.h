// The core's wrapper over an attention plugin's table (kvrt/attention.h): the only code that
// calls its callbacks. Statuses become Status values naming the plugin and the callback; the
// workspace plan() writes into is owned here.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "core/plugin/kv_store.h"
#include "core/plugin/registry.h"
#include "core/util/status.h"
#include "kvrt/attention.h"

namespace kvrt::plugin {

// Whether an attention plugin attends a sequence spread over ranks: its plan_sharded and run_lse
// (ABI 1.4; the registry holds them both or neither).
inline bool attends_sharded(const LoadedPlugin& plugin) {
  return plugin.attention.plan_sharded != nullptr && plugin.attention.run_lse != nullptr;
}

// One attention handle for one layer shape. Used by one thread at a time.
class Attention {
 public:
  static Result<std::unique_ptr<Attention>> create(const LoadedPlugin& plugin,
                                                   const kvrt_attention_params& params,
                                                   const kvrt_config* config);
  ~Attention();
  Attention(const Attention&) = delete;
  Attention& operator=(const Attention&) = delete;

  const std::string& name() const { return plugin_->name; }
  const kvrt_attention_params& params() const { return params_; }

  // OK when run() reads `layout` natively; Unsupported with the plugin's reason when it would
  // go through the store's gather() instead.
  Status supports(const kvrt_kv_layout& layout) const;
  // Sizes the workspace for `batch` (growing it, never shrinking) and plans into it: through
  // plan_sharded() when `shard` is given (a context-parallel rank's share of each sequence),
  // else plan(). The batch's arrays must stay valid until the next plan().
  Status plan(const kvrt_attention_batch& batch, const kvrt_attention_shard* shard = nullptr);
  // One layer of the planned batch over `store`'s pages. `args.layout`, `store_api` and
  // `store` are filled in from `store` and `layout`. With `lse`, through run_lse(), which also
  // writes each row's log-sum-exp per head there (rows x num_q_heads floats).
  Status run(const KvStore& store, const kvrt_kv_layout& layout, kvrt_attention_run_args args,
             float* lse = nullptr);
  // Whether the plugin attends a sequence spread over ranks (attends_sharded).
  bool shardable() const { return attends_sharded(*plugin_); }

 private:
  Attention(const LoadedPlugin& plugin, const kvrt_attention_params& params, kvrt_attention* handle)
      : plugin_(&plugin), params_(params), handle_(handle) {}

  const LoadedPlugin* plugin_;
  kvrt_attention_params params_;
  kvrt_attention* handle_;
  std::vector<uint8_t> workspace_;
};

}  // namespace kvrt::plugin
