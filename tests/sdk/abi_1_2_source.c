/* A KV store written for ABI 1.2 in C, the way a C plugin fills its structs: positional
 * initializers of every struct a plugin builds, with every 1.2 field. It must still compile
 * against the current headers with -std=c99 -pedantic -Wall -Wextra -Werror: a minor version
 * adds new structs (kvrt_kv_store_api_1_3, kvrt_kv_format), never fields to these. */
#include <stddef.h>

#include "kvrt/abi.h"
#include "kvrt/attention.h"
#include "kvrt/kv_store.h"

static kvrt_status page_bytes(const kvrt_host_api *h, const kvrt_kv_geometry *g,
                              const kvrt_config *c, uint64_t *out) {
  (void)h, (void)c;
  *out = (uint64_t)g->page_size * g->num_kv_heads * (g->k_head_dim + g->v_head_dim) * 4u;
  return KVRT_OK;
}
static kvrt_status create(const kvrt_host_api *h, const kvrt_kv_geometry *g, uint64_t n,
                          const kvrt_config *c, kvrt_kv_store **out) {
  (void)h, (void)g, (void)n, (void)c, (void)out;
  return KVRT_ERR_UNSUPPORTED;
}
static void destroy(kvrt_kv_store *s) { (void)s; }
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

static const kvrt_kv_store_api table = {sizeof(kvrt_kv_store_api),
                                        0,
                                        page_bytes,
                                        create,
                                        destroy,
                                        info,
                                        layout,
                                        write,
                                        NULL,
                                        NULL,
                                        NULL,
                                        NULL,
                                        NULL,
                                        NULL,
                                        NULL};

static const kvrt_option_desc options[] = {
    {sizeof(kvrt_option_desc), KVRT_OPTION_INT, "rows", "1", "an option"}};

const kvrt_plugin_desc abi_1_2_source_desc = {sizeof(kvrt_plugin_desc),
                                              KVRT_ABI_MAJOR,
                                              2u,
                                              KVRT_PLUGIN_KV_STORE,
                                              "kv_c_1_2",
                                              "0.1.0",
                                              "a 1.2 store in C",
                                              &table,
                                              options,
                                              1,
                                              KVRT_DTYPE_BIT(KVRT_DTYPE_F32),
                                              NULL};

/* Outputs and inputs a 1.2 plugin fills positionally too. */
kvrt_kv_info abi_1_2_info(void) {
  kvrt_kv_info i = {sizeof(kvrt_kv_info), KVRT_DTYPE_F32, KVRT_DTYPE_F32, KVRT_SCALE_NONE, 1, 1,
                    1, 0};
  return i;
}
kvrt_tier_info abi_1_2_tier_info(void) {
  kvrt_tier_info t = {sizeof(kvrt_tier_info), 0, 1, 0, 0, 0, 0};
  return t;
}
