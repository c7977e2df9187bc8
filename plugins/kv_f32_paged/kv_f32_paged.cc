// kv_f32_paged: pages of f32 K and V, exactly as the model computed them (bf16 input is widened
// exactly). Twice kv_bf16_paged's bytes per token: it is the reference `kvrt eval` measures
// every other KV format against, not a format to serve with.
#include "kvrt/plugin.hpp"
#include "plugins/common/plain_paged_store.h"

namespace kvrt::plugins {
namespace {

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc =
      plain_store_desc<KVRT_DTYPE_F32>("kv_f32_paged",
                             "paged f32 K/V, exact; the reference of kvrt eval");
  return desc;
}

}  // namespace
}  // namespace kvrt::plugins

KVRT_PLUGIN_ENTRY(kvrt::plugins::describe)
