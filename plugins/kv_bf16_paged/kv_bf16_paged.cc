// kv_bf16_paged: pages of bf16 K and V. Writes take f32 (rounded to nearest even) or bf16
// (copied); the layout is what attention kernels read directly.
#include "kvrt/plugin.hpp"
#include "plugins/common/plain_paged_store.h"

namespace kvrt::plugins {
namespace {

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc = {sizeof(kvrt_plugin_desc),
                                        KVRT_ABI_MAJOR,
                                        KVRT_ABI_MINOR,
                                        KVRT_PLUGIN_KV_STORE,
                                        "kv_bf16_paged",
                                        "0.1.0",
                                        "paged bf16 K/V; the reference store",
                                        &sdk::kv_store_table<PlainPagedStore<KVRT_DTYPE_BF16>>(),
                                        nullptr,
                                        0,
                                        kPlainInputDtypes,
                                        nullptr};
  return desc;
}

}  // namespace
}  // namespace kvrt::plugins

KVRT_PLUGIN_ENTRY(kvrt::plugins::describe)
