/* A complete KV store written for ABI 1.2 in C (f32 pages, [page][token][head][dim] for K then
 * V), the way a C plugin fills its structs: positional initializers of every struct a plugin
 * builds, with every 1.2 field, and a table of 1.2's size with no format(). Two checks use it:
 *  - source: it compiles against the current headers with -std=c99 -pedantic -Wall -Wextra
 *    -Werror (abi_c99_test): a minor version adds new structs (kvrt_kv_store_api_1_3,
 *    kvrt_kv_format), never fields to these;
 *  - binary: built as the plugin kv_c_1_2, today's core loads it and the conformance suite
 *    passes it with nothing skipped (conformance.abi_1_2_plugin), holding it to what the suite
 *    knows of f32 (exact) since it declares no format. */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvrt/abi.h"
#include "kvrt/attention.h"
#include "kvrt/kv_store.h"

typedef struct c_store {
  const kvrt_host_api *host;
  kvrt_kv_geometry g;
  uint64_t pages;
  uint64_t bytes;
  float *k; /* [pages][page_size][heads][k_head_dim], then V likewise */
  float *v;
} c_store;

static kvrt_status fail(const kvrt_host_api *h, kvrt_status s, const char *message) {
  h->set_error(h, s, message);
  return s;
}

static uint64_t row_floats(const kvrt_kv_geometry *g) {
  return (uint64_t)g->num_kv_heads * (g->k_head_dim + g->v_head_dim);
}

static kvrt_status page_bytes(const kvrt_host_api *h, const kvrt_kv_geometry *g,
                              const kvrt_config *c, uint64_t *out) {
  (void)c;
  if (g == NULL || out == NULL) return KVRT_ERR_INVALID_ARGUMENT;
  if (g->num_layers == 0 || g->num_kv_heads == 0 || g->k_head_dim == 0 || g->page_size == 0) {
    return fail(h, KVRT_ERR_UNSUPPORTED, "geometry has a zero dimension");
  }
  if (g->device.kind != KVRT_DEVICE_CPU) return fail(h, KVRT_ERR_UNSUPPORTED, "CPU only");
  *out = (uint64_t)g->num_layers * g->page_size * row_floats(g) * sizeof(float);
  return KVRT_OK;
}

static kvrt_status create(const kvrt_host_api *h, const kvrt_kv_geometry *g, uint64_t n,
                          const kvrt_config *c, kvrt_kv_store **out) {
  uint64_t per_page = 0;
  int32_t zero = 0;
  c_store *s;
  void *memory = NULL;
  kvrt_status st;
  if (out == NULL) return KVRT_ERR_INVALID_ARGUMENT;
  st = page_bytes(h, g, c, &per_page);
  if (st != KVRT_OK) return st;
  st = h->config_bool(h, c, "zero_pages", &zero);
  if (st == KVRT_ERR_CONFIG) return fail(h, st, "key 'zero_pages': expected a boolean");
  s = (c_store *)calloc(1, sizeof(c_store));
  if (s == NULL) return fail(h, KVRT_ERR_NO_MEMORY, "cannot allocate the store");
  s->host = h;
  s->g = *g;
  s->pages = n;
  s->bytes = per_page * n;
  if (s->bytes > 0) {
    st = h->alloc(h, KVRT_MEMORY_DEVICE, s->bytes, 64, &memory);
    if (st != KVRT_OK) {
      free(s);
      return st;
    }
    if (zero) memset(memory, 0, (size_t)s->bytes);
  }
  s->k = (float *)memory;
  s->v = s->k + n * g->page_size * g->num_kv_heads * g->k_head_dim * g->num_layers;
  *out = (kvrt_kv_store *)s;
  return KVRT_OK;
}

static void destroy(kvrt_kv_store *store) {
  c_store *s = (c_store *)store;
  if (s == NULL) return;
  if (s->k != NULL) s->host->free(s->host, KVRT_MEMORY_DEVICE, s->k, s->bytes);
  free(s);
}

static kvrt_status info(const kvrt_kv_store *store, kvrt_kv_info *out) {
  const c_store *s = (const c_store *)store;
  if (s == NULL || out == NULL) return KVRT_ERR_INVALID_ARGUMENT;
  {
    const uint64_t page = s->pages ? s->bytes / s->pages : 0;
    kvrt_kv_info i = {sizeof(kvrt_kv_info), KVRT_DTYPE_F32, KVRT_DTYPE_F32, KVRT_SCALE_NONE,
                      page / s->g.page_size, page, s->pages, 0};
    memcpy(out, &i, out->struct_size < sizeof(i) ? out->struct_size : sizeof(i));
  }
  return KVRT_OK;
}

/* Element (layer, slot, head, d) of K or V. */
static float *at(const c_store *s, int v, uint32_t layer, int64_t slot, uint32_t head) {
  const uint32_t dim = v ? s->g.v_head_dim : s->g.k_head_dim;
  const uint64_t slots = s->pages * s->g.page_size;
  float *base = v ? s->v : s->k;
  return base + (((uint64_t)layer * slots + (uint64_t)slot) * s->g.num_kv_heads + head) * dim;
}

static kvrt_status layout(const kvrt_kv_store *store, uint32_t layer, kvrt_kv_layout *out) {
  const c_store *s = (const c_store *)store;
  if (s == NULL || out == NULL) return KVRT_ERR_INVALID_ARGUMENT;
  if (layer >= s->g.num_layers) return fail(s->host, KVRT_ERR_OUT_OF_RANGE, "layer out of range");
  {
    const kvrt_kv_geometry *g = &s->g;
    const int shared = g->v_head_dim == 0;
    const int64_t kt = (int64_t)(g->num_kv_heads * g->k_head_dim * sizeof(float));
    const int64_t vt = shared ? kt : (int64_t)(g->num_kv_heads * g->v_head_dim * sizeof(float));
    float *k = at(s, 0, layer, 0, 0);
    float *v = shared ? k : at(s, 1, layer, 0, 0);
    kvrt_kv_layout l = {sizeof(kvrt_kv_layout),
                        KVRT_DTYPE_F32,
                        KVRT_DTYPE_F32,
                        KVRT_SCALE_NONE,
                        g->num_kv_heads,
                        g->k_head_dim,
                        g->v_head_dim,
                        g->page_size,
                        s->pages,
                        k,
                        v,
                        kt * g->page_size,
                        kt,
                        (int64_t)(g->k_head_dim * sizeof(float)),
                        vt * g->page_size,
                        vt,
                        shared ? (int64_t)(g->k_head_dim * sizeof(float))
                               : (int64_t)(g->v_head_dim * sizeof(float)),
                        NULL,
                        NULL,
                        0,
                        0,
                        0,
                        g->v_width ? g->v_width : (shared ? g->k_head_dim : g->v_head_dim),
                        g->v_offset};
    memcpy(out, &l, out->struct_size < sizeof(l) ? out->struct_size : sizeof(l));
  }
  return KVRT_OK;
}

/* The checks write and gather owe the core, before anything is touched. */
static kvrt_status check_slots(const c_store *s, uint32_t layer, uint32_t n, const int64_t *slots) {
  uint32_t i;
  char message[96];
  if (layer >= s->g.num_layers) return fail(s->host, KVRT_ERR_OUT_OF_RANGE, "layer out of range");
  if (n > 0 && slots == NULL) return KVRT_ERR_INVALID_ARGUMENT;
  for (i = 0; i < n; ++i) {
    if (slots[i] < 0 || (uint64_t)slots[i] >= s->pages * s->g.page_size) {
      snprintf(message, sizeof message, "slot %lld out of range", (long long)slots[i]);
      return fail(s->host, KVRT_ERR_OUT_OF_RANGE, message);
    }
  }
  return KVRT_OK;
}

static kvrt_status write(kvrt_kv_store *store, const kvrt_kv_write *w) {
  c_store *s = (c_store *)store;
  uint32_t i, h;
  int part;
  kvrt_status st;
  if (s == NULL || w == NULL) return KVRT_ERR_INVALID_ARGUMENT;
  st = check_slots(s, w->layer, w->num_tokens, w->slots);
  if (st != KVRT_OK) return st;
  if (w->dtype != KVRT_DTYPE_F32) return fail(s->host, KVRT_ERR_UNSUPPORTED, "f32 input only");
  if (w->num_tokens > 0 && (w->k == NULL || (s->g.v_head_dim != 0 && w->v == NULL))) {
    return KVRT_ERR_INVALID_ARGUMENT;
  }
  for (part = 0; part < (s->g.v_head_dim ? 2 : 1); ++part) {
    const uint32_t dim = part ? s->g.v_head_dim : s->g.k_head_dim;
    const float *in = (const float *)(part ? w->v : w->k);
    int64_t stride = part ? w->v_token_stride : w->k_token_stride; /* elements */
    if (stride == 0) stride = (int64_t)s->g.num_kv_heads * dim;
    for (i = 0; i < w->num_tokens; ++i) {
      for (h = 0; h < s->g.num_kv_heads; ++h) {
        memcpy(at(s, part, w->layer, w->slots[i], h), in + i * stride + (int64_t)h * dim,
               dim * sizeof(float));
      }
    }
  }
  return KVRT_OK;
}

static kvrt_status gather(const kvrt_kv_store *store, uint32_t layer, uint32_t n,
                          const int64_t *slots, float *k_out, float *v_out) {
  const c_store *s = (const c_store *)store;
  uint32_t i, h;
  int part;
  kvrt_status st;
  if (s == NULL) return KVRT_ERR_INVALID_ARGUMENT;
  st = check_slots(s, layer, n, slots);
  if (st != KVRT_OK) return st;
  if (n > 0 && (k_out == NULL || (s->g.v_head_dim != 0 && v_out == NULL))) {
    return KVRT_ERR_INVALID_ARGUMENT;
  }
  for (part = 0; part < (s->g.v_head_dim ? 2 : 1); ++part) {
    const uint32_t dim = part ? s->g.v_head_dim : s->g.k_head_dim;
    float *out = part ? v_out : k_out;
    for (i = 0; i < n; ++i) {
      for (h = 0; h < s->g.num_kv_heads; ++h) {
        memcpy(out + ((uint64_t)i * s->g.num_kv_heads + h) * dim, at(s, part, layer, slots[i], h),
               dim * sizeof(float));
      }
    }
  }
  return KVRT_OK;
}

static const kvrt_kv_store_api table = {sizeof(kvrt_kv_store_api),
                                        0,
                                        page_bytes,
                                        create,
                                        destroy,
                                        info,
                                        layout,
                                        write,
                                        gather,
                                        NULL,
                                        NULL,
                                        NULL,
                                        NULL,
                                        NULL,
                                        NULL};

static const kvrt_option_desc options[] = {{sizeof(kvrt_option_desc), KVRT_OPTION_BOOL,
                                            "zero_pages", "false", "zero the pages at create"}};

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

KVRT_EXPORT kvrt_status kvrt_plugin_query(uint32_t host_major, uint32_t host_minor,
                                          const kvrt_host_api *host,
                                          const kvrt_plugin_desc **out) {
  (void)host_minor, (void)host;
  if (host_major != KVRT_ABI_MAJOR) return KVRT_ERR_ABI_MISMATCH;
  *out = &abi_1_2_source_desc;
  return KVRT_OK;
}

/* An output a 1.2 plugin with a tier fills positionally too. */
kvrt_tier_info abi_1_2_tier_info(void) {
  kvrt_tier_info t = {sizeof(kvrt_tier_info), 0, 1, 0, 0, 0, 0};
  return t;
}
