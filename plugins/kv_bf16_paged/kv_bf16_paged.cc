// kv_bf16_paged: pages of bf16 K and V. Writes take f32 (rounded to nearest even) or bf16
// (copied); the layout is what attention kernels read directly.
#include "kvrt/plugin.hpp"
#include "plugins/common/plain_paged_store.h"

namespace kvrt::plugins {
namespace {

const kvrt_plugin_desc& describe(const kvrt_host_api*) {
  static const kvrt_plugin_desc desc =
      plain_store_desc<KVRT_DTYPE_BF16>("kv_bf16_paged",
                             "paged bf16 K/V; the reference store");
  return desc;
}

}  // namespace
}  // namespace kvrt::plugins

KVRT_PLUGIN_ENTRY(kvrt::plugins::describe)
