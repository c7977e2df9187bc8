#include "core/plugin/attention.h"

#include "core/plugin/host.h"

namespace kvrt::plugin {

Result<std::unique_ptr<Attention>> Attention::create(const LoadedPlugin& plugin,
                                                     const kvrt_attention_params& params,
                                                     const kvrt_config* config) {
  if (plugin.kind() != KVRT_PLUGIN_ATTENTION) {
    return Status::PluginError("plugin " + plugin.name + " is not an attention plugin");
  }
  if (plugin.desc.abi_minor < 1 && params.v_offset != 0) {
    return Status::Unsupported("plugin " + plugin.name +
                               " is built against ABI 1.0, which has no v_offset (V at offset " +
                               std::to_string(params.v_offset) + "; rebuild it against 1.1)");
  }
  kvrt_attention* handle = nullptr;
  clear_last_error();
  if (kvrt_status st = plugin.attention.create(plugin.host_api(), &params, config, &handle);
      st != KVRT_OK) {
    return plugin_failure(plugin.name, "create", st);
  }
  if (handle == nullptr) {
    return Status::PluginError("plugin " + plugin.name + ": create returned OK and no handle");
  }
  return std::unique_ptr<Attention>(new Attention(plugin, params, handle));
}

Attention::~Attention() { plugin_->attention.destroy(handle_); }

Status Attention::supports(const kvrt_kv_layout& layout) const {
  clear_last_error();
  kvrt_status st = plugin_->attention.supports(handle_, &layout);
  return st == KVRT_OK ? Status::Ok() : plugin_failure(plugin_->name, "supports", st);
}

Status Attention::plan(const kvrt_attention_batch& batch, const kvrt_attention_shard* shard) {
  if (shard != nullptr && !shardable()) {
    return Status::Unsupported("plugin " + plugin_->name +
                               " has no plan_sharded / run_lse (ABI 1.4): it cannot attend a "
                               "sequence spread over ranks");
  }
  uint64_t bytes = 0;
  clear_last_error();
  if (kvrt_status st = plugin_->attention.workspace_size(handle_, &batch, &bytes); st != KVRT_OK) {
    return plugin_failure(plugin_->name, "workspace_size", st);
  }
  if (workspace_.size() < bytes) workspace_.resize(bytes);
  clear_last_error();
  if (shard != nullptr) {
    kvrt_status st =
        plugin_->attention.plan_sharded(handle_, &batch, shard, workspace_.data(), bytes);
    return st == KVRT_OK ? Status::Ok() : plugin_failure(plugin_->name, "plan_sharded", st);
  }
  kvrt_status st = plugin_->attention.plan(handle_, &batch, workspace_.data(), bytes);
  return st == KVRT_OK ? Status::Ok() : plugin_failure(plugin_->name, "plan", st);
}

Status Attention::run(const KvStore& store, const kvrt_kv_layout& layout,
                      kvrt_attention_run_args args, float* lse) {
  args.struct_size = sizeof(args);
  args.layout = &layout;
  args.store_api = store.api();
  args.store = store.handle();
  clear_last_error();
  if (lse != nullptr) {
    if (!shardable()) {
      return Status::Unsupported("plugin " + plugin_->name + " has no run_lse (ABI 1.4)");
    }
    kvrt_status st = plugin_->attention.run_lse(handle_, &args, lse, 0);
    return st == KVRT_OK ? Status::Ok() : plugin_failure(plugin_->name, "run_lse", st);
  }
  kvrt_status st = plugin_->attention.run(handle_, &args);
  return st == KVRT_OK ? Status::Ok() : plugin_failure(plugin_->name, "run", st);
}

}  // namespace kvrt::plugin
