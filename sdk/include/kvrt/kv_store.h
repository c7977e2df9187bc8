/*
 * kvrt KV store table.
 *
 * The core owns the logical KV state (requests, page ids, page tables, free list); a store owns
 * the physical state: the bytes, their format (dtype, scales), their placement (device pool,
 * host tier) and copies between tiers. Attention plugins read the bytes through the layout a
 * store publishes (kvrt_kv_layout), so that struct is the contract between the two.
 *
 * Slots: token slot s lives in page s / page_size at offset s % page_size. The same page id
 * means the same token slots on every TP rank; each rank's store holds that rank's KV heads.
 *
 * Thread-safety: page_bytes is pure and may be called from any thread. For one store, write()
 * may run concurrently from several threads when they write distinct slots; tier callbacks may
 * run concurrently with write/gather on other pages; gather() runs on several threads at once
 * only when the store's format says KVRT_KV_GATHER_THREAD_SAFE (ABI 1.3); everything else is
 * called from one thread at a time.
 *
 * Units: every stride in a struct of ABI 1.3 or later is in bytes and says so in its name
 * (`_bytes`). Of the older fields, the layout's strides are in bytes and the write's token
 * strides in elements of the write's dtype; each field's comment names its unit.
 */
#ifndef KVRT_KV_STORE_H
#define KVRT_KV_STORE_H

#include "kvrt/abi.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvrt_kv_store kvrt_kv_store; /* opaque, the plugin's */

/* What the core asks a store to hold: this rank's share of the model's KV. */
typedef struct kvrt_kv_geometry {
  uint32_t struct_size;
  uint32_t num_layers;
  uint32_t num_kv_heads;   /* this rank's KV heads (>= 1; replicated when TP > KV heads) */
  uint32_t total_kv_heads; /* the model's KV heads, for information */
  uint32_t k_head_dim;
  uint32_t v_head_dim;    /* 0: V shares K's storage (MLA latent) */
  uint32_t page_size;     /* tokens per page, >= 1 */
  kvrt_dtype input_dtype; /* the dtype the core will usually write (F32 or BF16) */
  uint32_t tp_rank;
  uint32_t tp_size;
  kvrt_device device;
  /* (ABI 1.1) The V values attention reads per head: v_width elements from element v_offset of
   * the head's V row -- of its K row when v_head_dim == 0 (MLA keeps a 576-wide latent whose
   * first 512 values are V: v_width 512, v_offset 0). 0 from an ABI 1.0 host, which means
   * v_head_dim (or k_head_dim when v_head_dim == 0) and offset 0. */
  uint32_t v_width;
  uint32_t v_offset;
} kvrt_kv_geometry;

typedef uint32_t kvrt_scale_mode;
#define KVRT_SCALE_NONE 0u           /* values are stored as they are */
#define KVRT_SCALE_PER_TENSOR 1u     /* one float per layer for K and one for V */
#define KVRT_SCALE_PER_TOKEN_HEAD 2u /* one float per (token, KV head), for K and for V */

/* Totals over all layers of this rank's store. */
typedef struct kvrt_kv_info {
  uint32_t struct_size;
  kvrt_dtype k_dtype;
  kvrt_dtype v_dtype;
  kvrt_scale_mode scale_mode;
  uint64_t bytes_per_token; /* device bytes one token occupies, scales included */
  uint64_t bytes_per_page;  /* == what page_bytes() returned */
  uint64_t num_pages;       /* device pages */
  uint64_t host_tier_pages; /* pages a host tier can hold; 0 without one. Adds no decode room */
} kvrt_kv_info;

/* Where one layer's bytes are. Element (page p, token t, head h, dim d) of K is at
 *   (char *)k_base + p * k_page_stride + t * k_token_stride + h * k_head_stride + d * sizeof(k)
 * and its scale (per-token-head) at
 *   (char *)k_scale + p * scale_page_stride + t * scale_token_stride + h * scale_head_stride.
 * A dequantized value is stored_value * scale. Strides are in bytes. Pointers are device
 * pointers for a CUDA device. Valid until the store is destroyed.
 * Sub-byte dtypes (ABI 1.3): a head row is packed, element d in byte d * bits / 8 of the row in
 * the pack order of the store's kvrt_kv_format, which also gives scale groups and zero points.
 * A vendor dtype's bytes are the store's own: the strides still bound where they lie. */
typedef struct kvrt_kv_layout {
  uint32_t struct_size;
  kvrt_dtype k_dtype;
  kvrt_dtype v_dtype;
  kvrt_scale_mode scale_mode;
  uint32_t num_kv_heads;
  uint32_t k_head_dim;
  uint32_t v_head_dim; /* 0: V is the first v_dim... of K (MLA); v_base == k_base */
  uint32_t page_size;
  uint64_t num_pages;
  void *k_base;
  void *v_base;
  int64_t k_page_stride;
  int64_t k_token_stride;
  int64_t k_head_stride;
  int64_t v_page_stride;
  int64_t v_token_stride;
  int64_t v_head_stride;
  float *k_scale; /* NULL for KVRT_SCALE_NONE; one float for per-tensor */
  float *v_scale;
  int64_t scale_page_stride; /* per-token-head only; bytes */
  int64_t scale_token_stride;
  int64_t scale_head_stride;
  /* (ABI 1.1) As the geometry's: V is v_width elements from element v_offset of each head's row
   * at v_base. A store copies them from its geometry (the core fills them in for a 1.0 store). */
  uint32_t v_width;
  uint32_t v_offset;
} kvrt_kv_layout;

/* New tokens for one layer. K rows are [num_kv_heads][k_head_dim] elements of `dtype`; row i
 * starts at k + i * k_token_stride elements (0 = dense rows). Same for V. These two strides are
 * in elements of `dtype`, not bytes (they index the caller's f32 / bf16 arrays). */
typedef struct kvrt_kv_write {
  uint32_t struct_size;
  uint32_t layer;
  kvrt_dtype dtype; /* F32 or BF16 for the shipped stores */
  uint32_t num_tokens;
  const int64_t *slots; /* [num_tokens] */
  const void *k;
  const void *v; /* NULL when v_head_dim == 0 */
  int64_t k_token_stride; /* elements */
  int64_t v_token_stride; /* elements */
  /* (ABI 1.2) For a store on a CUDA device, where k, v and these are device pointers: the same
   * slots as `slots`, in device memory (uploaded once per step by the core, so a device write
   * path needs no copy of its own), and the stream the write is ordered on (a cudaStream_t; NULL
   * for the default stream). The K/V rows are complete when the write is ordered after them on
   * that stream; the store must not synchronise it. NULL / NULL on the CPU, and from an
   * older host, which cannot give a CUDA store device rows either: the shipped stores refuse
   * a device write without device_slots. */
  const int64_t *device_slots;
  void *stream;
} kvrt_kv_write;

/* Why the core reports a page to the tier (tier_save). The store's policy decides whether to
 * copy. */
typedef uint32_t kvrt_tier_reason;
#define KVRT_TIER_INSERTED 0u /* the page just entered the prefix cache */
#define KVRT_TIER_HIT 1u      /* a new request matched this cached page on the device */
#define KVRT_TIER_EVICTING 2u /* the core is about to reuse this device page */

typedef struct kvrt_tier_info {
  uint32_t struct_size;
  uint32_t reserved;
  uint64_t capacity_pages; /* host pages the tier can hold */
  uint64_t used_pages;
  uint64_t saved_pages;   /* totals since create: pages copied device -> tier */
  uint64_t loaded_pages;  /* pages copied tier -> device */
  uint64_t evicted_pages; /* pages the tier dropped to make room */
} kvrt_tier_info;

typedef struct kvrt_kv_store_api {
  uint32_t struct_size;
  uint32_t reserved;

  /* ===== required ===== */

  /* Device bytes one page of `geometry` takes under `config`, scales included. Pure: no
   * allocation, no state; lets the core plan capacity before creating anything.
   * KVRT_ERR_UNSUPPORTED for a geometry the store cannot hold (message says which field). */
  kvrt_status (*page_bytes)(const kvrt_host_api *host, const kvrt_kv_geometry *geometry,
                            const kvrt_config *config, uint64_t *out_bytes);

  /* Allocates num_pages pages (through host->alloc, so the core accounts them) and returns a
   * new store in *out. Contents are unspecified until written. On failure *out is untouched
   * and everything allocated is released. */
  kvrt_status (*create)(const kvrt_host_api *host, const kvrt_kv_geometry *geometry,
                        uint64_t num_pages, const kvrt_config *config, kvrt_kv_store **out);

  /* Waits for in-flight copies, joins the store's threads, frees its memory. NULL is a no-op. */
  void (*destroy)(kvrt_kv_store *store);

  kvrt_status (*info)(const kvrt_kv_store *store, kvrt_kv_info *out);

  /* Layout of one layer. KVRT_ERR_OUT_OF_RANGE for a layer >= num_layers. */
  kvrt_status (*layout)(const kvrt_kv_store *store, uint32_t layer, kvrt_kv_layout *out);

  /* Stores tokens, converting or quantizing as the format requires. Every slot is checked
   * before anything is written: KVRT_ERR_OUT_OF_RANGE for a slot beyond num_pages * page_size
   * or a bad layer, KVRT_ERR_UNSUPPORTED for a dtype it does not take,
   * KVRT_ERR_INVALID_ARGUMENT for NULL pointers. */
  kvrt_status (*write)(kvrt_kv_store *store, const kvrt_kv_write *w);

  /* ===== optional ===== */

  /* Dequantized copy of tokens as f32: k_out [n][num_kv_heads][k_head_dim], v_out likewise
   * (NULL when v_head_dim == 0). The slow path for attention plugins that cannot read the
   * layout natively. Same argument errors as write. */
  kvrt_status (*gather)(const kvrt_kv_store *store, uint32_t layer, uint32_t n,
                        const int64_t *slots, float *k_out, float *v_out);

  /* ===== tier (optional, all five or none) =====
   * Pages are keyed by chained page hashes (XXH3-64 of the parent's hash and the page's token
   * ids) so a tier may outlive the process or be shared. The root is seeded with the model's
 * identity and the store's format (its name, K/V dtypes, scale mode, page bytes and TP size),
 * and each rank's store is given the hashes mixed with its TP rank, so a tier shared by several
 * servers never serves one format's or one rank's bytes to another. Copies are asynchronous:
 * save/load
   * return a ticket; tier_wait(ticket) returns when that call's copies (and all earlier ones)
   * are done. Until then the core must not write the device pages involved. */

  kvrt_status (*tier_info)(const kvrt_kv_store *store, kvrt_tier_info *out);

  /* How many leading pages of hashes[0..n) the tier holds now (a hint: a page may be evicted
   * before a load; tier_load reports that per page). */
  kvrt_status (*tier_lookup)(kvrt_kv_store *store, uint32_t n, const uint64_t *hashes,
                             uint32_t *out_hits);

  /* Reports n device pages with their hashes, for `reason`. The store's write policy decides
   * which to copy; a page the tier already holds is not copied again. Best effort: a full
   * tier of pinned pages skips the copy. */
  kvrt_status (*tier_save)(kvrt_kv_store *store, uint32_t n, const uint64_t *hashes,
                           const int64_t *device_pages, kvrt_tier_reason reason,
                           uint64_t *out_ticket);

  /* Copies the tier's pages into device_pages. out_loaded[i] = 1 if page i will be loaded,
   * 0 if the tier no longer holds it (the core then recomputes it). Decided at call time. */
  kvrt_status (*tier_load)(kvrt_kv_store *store, uint32_t n, const uint64_t *hashes,
                           const int64_t *device_pages, uint8_t *out_loaded, uint64_t *out_ticket);

  kvrt_status (*tier_wait)(kvrt_kv_store *store, uint64_t ticket);

  /* ===== ABI 1.1 (optional; only with the tier callbacks) ===== */

  /* Host pages the tier would hold beside a device pool of `device_pages` pages of `geometry`
   * under `config`: the store's own sizing rule, so the core's capacity report shows a tier's
   * size without creating it. Pure, like page_bytes. NULL in a 1.0 store (the report then says
   * the size is unknown). */
  kvrt_status (*tier_pages)(const kvrt_host_api *host, const kvrt_kv_geometry *geometry,
                            const kvrt_config *config, uint64_t device_pages, uint64_t *out_pages);
} kvrt_kv_store_api;

/* ===== ABI 1.3: what a store's elements mean, how exact they are, what may run in parallel =====
 *
 * Backward compatible in binary and in source: kvrt_kv_store_api above keeps its 1.2 layout, so
 * a 1.2 plugin's table (positional initializers included) stays complete. A 1.3 store's table
 * is a kvrt_kv_store_api_1_3 whose base.struct_size is sizeof(kvrt_kv_store_api_1_3); the
 * descriptor's `table` points at it (at `base`). A reader gets the 1.3 part with
 * kvrt_kv_store_api_1_3_of(), NULL for an older table. Later minors add a new struct the same
 * way (kvrt_kv_store_api_1_4 starting with a kvrt_kv_store_api_1_3), never fields to this one. */

typedef uint32_t kvrt_pack_order;
#define KVRT_PACK_LOW_FIRST 0u  /* sub-byte: element 2i of a row in bits 0..3 of byte i */
#define KVRT_PACK_HIGH_FIRST 1u /* sub-byte: element 2i of a row in bits 4..7 of byte i */

/* kvrt_kv_format.capabilities */
#define KVRT_KV_GATHER_THREAD_SAFE 1u /* gather() may run on several threads at once (any
                                       * layers and slots) while no write() runs */

/* kvrt_kv_format.bound_flags: which of the format's error bounds the store guarantees. */
#define KVRT_BOUND_ELEMENT 1u /* the element bound */
#define KVRT_BOUND_ROW_RMS 2u /* the row bound */

/* The format of one layer's K and V, beside its layout: how to read the elements and how far a
 * round trip (write x, read back y, through the layout or gather) may move them. An output
 * struct: fill it by member (it gains fields at its end in later minors; write_output in the
 * SDK writes no more than the caller's struct_size). */
typedef struct kvrt_kv_format {
  uint32_t struct_size;
  uint32_t capabilities;       /* KVRT_KV_* bits */
  uint32_t k_bits;             /* bits per stored K element: 4, 8, 16, 32 (never 0, vendor
                                * dtypes included: a row holds ceil(dim * bits / 8) bytes) */
  uint32_t v_bits;             /* the same for V (equal to k_bits when V is in the K row) */
  kvrt_pack_order pack_order;  /* for k_bits / v_bits below 8 */
  uint32_t group_size;         /* elements of a head row that share one scale (and zero point),
                                * from the row's start; 0: the whole row (the layout's
                                * per-token-head scale). A multiple of 2 for sub-byte codes */
  int64_t scale_group_bytes;   /* bytes from one group's scale to the next one's; the layout's
                                * scale strides reach the row's first group. 0 without groups */
  const float *k_zero_point;   /* NULL: symmetric codes. Else value = (code - zero) * scale, a
                                * zero point per scale, at the scales' offsets from here */
  const float *v_zero_point;
  uint32_t bound_flags;        /* KVRT_BOUND_* */
  uint32_t reserved;
  /* Element bound, per element x_i with scale s_i (1 without scales):
   *   |y_i - x_i| <= bound_element_relative * |x_i| + bound_element_scale_units * s_i.
   * Row bound, per head row x of K or V, with s the row's scale (the RMS of its groups' scales):
   *   rms(y - x) <= bound_row_rms_relative * rms(x) + bound_row_rms_scale_units * s.
   * A store that declares neither (of a dtype the suite does not know) is held, with
   * e = rms(y - x) / rms(x) per row, to e <= 0.3 per row and sqrt(mean(e^2)) <= 0.2 over the
   * rows of each check (docs/writing-a-kv-store.md, section 3). */
  float bound_element_relative;
  float bound_element_scale_units;
  float bound_row_rms_relative;
  float bound_row_rms_scale_units;
} kvrt_kv_format;

typedef struct kvrt_kv_store_api_1_3 {
  kvrt_kv_store_api base; /* base.struct_size = sizeof(kvrt_kv_store_api_1_3) */

  /* (optional) The format of one layer. KVRT_ERR_OUT_OF_RANGE for a layer >= num_layers;
   * KVRT_ERR_UNSUPPORTED when the store has none to give (a wrapper over an older store), which
   * reads as NULL does: the core and the suites assume whole-byte elements of the layout's
   * (known) dtypes, gather() on one thread at a time, and the default bound. The answer is the
   * same for every layer but its pointers (zero points). */
  kvrt_status (*format)(const kvrt_kv_store *store, uint32_t layer, kvrt_kv_format *out);
} kvrt_kv_store_api_1_3;

/* The 1.3 table behind `api`, or NULL for a table built against 1.2 or older. */
static inline const kvrt_kv_store_api_1_3 *kvrt_kv_store_api_1_3_of(
    const kvrt_kv_store_api *api) {
  return api != NULL && api->struct_size >= sizeof(kvrt_kv_store_api_1_3)
             ? (const kvrt_kv_store_api_1_3 *)(const void *)api
             : NULL;
}

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVRT_KV_STORE_H */
