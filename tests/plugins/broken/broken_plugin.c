/* Deliberately broken plugins, one per loader failure, written in C99 against the public
 * headers (which also shows the ABI is usable from C). Built once per BROKEN_* macro. One is
 * not broken but old: BROKEN_ABI_1_0 is a store with a tier as an ABI 1.0 build describes it
 * (minor 0, a table that ends at tier_wait), which a 1.1 host must still load. */
#include <stddef.h>

#include "kvrt/kv_store.h"

#ifdef BROKEN_NO_ENTRY
/* A shared library, but not a kvrt plugin: no kvrt_plugin_query. */
int kvrt_not_a_plugin(void) { return 0; }
#else

static kvrt_status page_bytes(const kvrt_host_api *host, const kvrt_kv_geometry *g,
                              const kvrt_config *config, uint64_t *out) {
  (void)host, (void)g, (void)config;
  *out = 1;
  return KVRT_OK;
}
static kvrt_status create(const kvrt_host_api *host, const kvrt_kv_geometry *g, uint64_t pages,
                          const kvrt_config *config, kvrt_kv_store **out) {
  (void)host, (void)g, (void)pages, (void)config, (void)out;
  return KVRT_ERR_UNSUPPORTED;
}
static void destroy(kvrt_kv_store *store) { (void)store; }
static kvrt_status info(const kvrt_kv_store *s, kvrt_kv_info *out) {
  (void)s, (void)out;
  return KVRT_ERR_UNSUPPORTED;
}
static kvrt_status layout(const kvrt_kv_store *s, uint32_t layer, kvrt_kv_layout *out) {
  (void)s, (void)layer, (void)out;
  return KVRT_ERR_UNSUPPORTED;
}
static kvrt_status write(kvrt_kv_store *s, const kvrt_kv_write *w) {
  (void)s, (void)w;
  return KVRT_ERR_UNSUPPORTED;
}
static kvrt_status tier_info(const kvrt_kv_store *s, kvrt_tier_info *out) {
  (void)s, (void)out;
  return KVRT_ERR_UNSUPPORTED;
}
static kvrt_status tier_lookup(kvrt_kv_store *s, uint32_t n, const uint64_t *h, uint32_t *hits) {
  (void)s, (void)n, (void)h;
  *hits = 0;
  return KVRT_OK;
}
static kvrt_status tier_save(kvrt_kv_store *s, uint32_t n, const uint64_t *h, const int64_t *p,
                             kvrt_tier_reason r, uint64_t *ticket) {
  (void)s, (void)n, (void)h, (void)p, (void)r;
  *ticket = 0;
  return KVRT_OK;
}
static kvrt_status tier_load(kvrt_kv_store *s, uint32_t n, const uint64_t *h, const int64_t *p,
                             uint8_t *loaded, uint64_t *ticket) {
  (void)s, (void)h, (void)p;
  for (uint32_t i = 0; i < n; ++i) loaded[i] = 0;
  *ticket = 0;
  return KVRT_OK;
}
static kvrt_status tier_wait(kvrt_kv_store *s, uint64_t ticket) {
  (void)s, (void)ticket;
  return KVRT_OK;
}
static kvrt_status probe(const kvrt_host_api *host, const kvrt_device *device) {
  (void)device;
  host->set_error(host, KVRT_ERR_UNSUPPORTED, "needs a CUDA device with compute capability 9.0");
  return KVRT_ERR_UNSUPPORTED;
}

static kvrt_kv_store_api table;
static kvrt_plugin_desc desc;

KVRT_EXPORT kvrt_status kvrt_plugin_query(uint32_t host_major, uint32_t host_minor,
                                          const kvrt_host_api *host, const kvrt_plugin_desc **out) {
  (void)host_major, (void)host_minor;
  table.struct_size = sizeof(table);
  table.page_bytes = page_bytes;
  table.create = create;
  table.destroy = destroy;
  table.info = info;
  table.layout = layout;
  table.write = write;
  desc.struct_size = sizeof(desc);
  desc.abi_major = KVRT_ABI_MAJOR;
  desc.abi_minor = KVRT_ABI_MINOR;
  desc.kind = KVRT_PLUGIN_KV_STORE;
  desc.name = BROKEN_NAME;
  desc.version = "0.0.1";
  desc.description = "a deliberately broken plugin for loader tests";
  desc.table = &table;
#if defined(BROKEN_ABI_MAJOR)
  desc.abi_major = 99;
#elif defined(BROKEN_TABLE_TOO_SMALL)
  table.struct_size = offsetof(kvrt_kv_store_api, layout);
#elif defined(BROKEN_MISSING_CALLBACK)
  table.write = NULL;
#elif defined(BROKEN_UNPAIRED_TIER)
  table.tier_info = tier_info;
#elif defined(BROKEN_DECLINES_DEVICE)
  desc.probe = probe;
#elif defined(BROKEN_ABI_1_0)
  desc.abi_minor = 0;
  table.struct_size = offsetof(kvrt_kv_store_api, tier_wait) + sizeof(void *);
  table.tier_info = tier_info;
  table.tier_lookup = tier_lookup;
  table.tier_save = tier_save;
  table.tier_load = tier_load;
  table.tier_wait = tier_wait;
#elif defined(BROKEN_INIT_ERROR)
  host->set_error(host, KVRT_ERR_CONFIG, "license file /etc/kv_vendor.lic not found");
  return KVRT_ERR_CONFIG;
#endif
  (void)host;
  (void)tier_info;
  (void)tier_lookup;
  (void)tier_save;
  (void)tier_load;
  (void)tier_wait;
  (void)probe;
  *out = &desc;
  return KVRT_OK;
}
#endif
