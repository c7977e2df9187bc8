/*
 * kvrt plugin ABI: the common part.
 *
 * C99, fixed-width types, opaque handles. Rules that keep it stable across releases:
 *  - KVRT_ABI_MAJOR changes only when a layout changes incompatibly; the host refuses a plugin
 *    whose major differs. KVRT_ABI_MINOR grows when a field or callback is appended.
 *  - Every struct that crosses the boundary begins with `uint32_t struct_size`. A reader uses
 *    only the fields that lie inside min(its own size, struct_size); a missing or NULL callback
 *    slot means "unsupported". Tables are append-only; a removed callback keeps its slot (NULL).
 *    Fields and callbacks added by a minor version are marked "(ABI 1.N)"; a plugin built
 *    against an older minor never sees them and the host reads them as 0 / NULL from it.
 *  - Status codes plus a message: a callback that fails returns a non-OK code and, where it can,
 *    first calls host->set_error() with one line saying why. Expected outcomes (unsupported
 *    layout, pool full) are documented codes, not failures of the plugin.
 *  - Each library exports exactly one function, kvrt_plugin_query (see below). Libraries are
 *    never unloaded while the process runs.
 *
 * Layout of every struct here is pinned by tests/sdk/abi_layout_test.cc.
 */
#ifndef KVRT_ABI_H
#define KVRT_ABI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define KVRT_ABI_MAJOR 1u
#define KVRT_ABI_MINOR 4u

#if defined(_WIN32)
#define KVRT_EXPORT __declspec(dllexport)
#else
#define KVRT_EXPORT __attribute__((visibility("default")))
#endif

/* ---- status codes ---------------------------------------------------------------------- */
typedef int32_t kvrt_status;
#define KVRT_OK 0
#define KVRT_ERR_INVALID_ARGUMENT 1 /* a null pointer, a bad size, a malformed struct */
#define KVRT_ERR_OUT_OF_RANGE 2     /* a page id, slot or layer beyond what was created */
#define KVRT_ERR_UNSUPPORTED 3      /* dtype, layout or device the plugin does not serve */
#define KVRT_ERR_NO_MEMORY 4        /* an allocation (host->alloc) was refused */
#define KVRT_ERR_NOT_FOUND 5        /* a config key or a tier page that is not there */
#define KVRT_ERR_ABI_MISMATCH 6     /* the host's major version is not the plugin's */
#define KVRT_ERR_CONFIG 7           /* a config value of the wrong type or out of range */
#define KVRT_ERR_INTERNAL 8         /* a bug or an unexpected exception inside the plugin */

/* ---- element types ------------------------------------------------------------------------ */
typedef uint32_t kvrt_dtype;
#define KVRT_DTYPE_INVALID 0u
#define KVRT_DTYPE_F32 1u
#define KVRT_DTYPE_BF16 2u
#define KVRT_DTYPE_F16 3u
#define KVRT_DTYPE_FP8_E4M3 4u /* OCP E4M3: bias 7, max 448, no infinities, NaN = S.1111.111 */
#define KVRT_DTYPE_INT8 5u
/* (ABI 1.3) Sub-byte codes, two per byte; a store that publishes them describes the packing,
 * the scale groups and any zero point in its kvrt_kv_format (kv_store.h). */
#define KVRT_DTYPE_INT4 6u  /* signed codes -8..7; value = code * scale */
#define KVRT_DTYPE_UINT4 7u /* unsigned codes 0..15; value = (code - zero_point) * scale */
/* (ABI 1.3) Codes with the high bit set are private to the plugins that use them: the core
 * treats such a dtype as opaque (row sizes come from the store's kvrt_kv_format or its
 * layout's strides, never from the code) and reads the values only through gather(). Pick one
 * at random in this range to keep clear of other vendors; the shipped plugins name theirs. */
#define KVRT_DTYPE_VENDOR_FIRST 0x80000000u
#define KVRT_DTYPE_IS_VENDOR(d) (((d)&KVRT_DTYPE_VENDOR_FIRST) != 0u)
/* For dtype masks (input_dtypes); only codes below 32 have a bit. */
#define KVRT_DTYPE_BIT(d) (1u << (d))

/* ---- devices and memory ------------------------------------------------------------------- */
typedef uint32_t kvrt_device_kind;
#define KVRT_DEVICE_CPU 0u
#define KVRT_DEVICE_CUDA 1u

typedef struct kvrt_device {
  uint32_t struct_size;
  kvrt_device_kind kind;
  int32_t ordinal; /* CUDA device index; 0 for CPU */
  uint32_t reserved;
} kvrt_device;

typedef uint32_t kvrt_memory_kind;
#define KVRT_MEMORY_DEVICE 0u      /* counted against the device budget (KV pool, workspaces) */
#define KVRT_MEMORY_HOST 1u        /* host RAM, e.g. a host tier; counted separately */
#define KVRT_MEMORY_PINNED_HOST 2u /* page-locked host RAM that a device copies to and from
                                    * asynchronously (ABI 1.1); counted as host memory. On the CPU
                                    * it is plain host RAM. */

typedef uint32_t kvrt_log_level;
#define KVRT_LOG_DEBUG 0u
#define KVRT_LOG_INFO 1u
#define KVRT_LOG_WARN 2u
#define KVRT_LOG_ERROR 3u

struct kvrt_kv_store_api; /* kv_store.h */

/* Opaque: a plugin's own table of the configuration (e.g. [kv.kv_fp8_e4m3]). */
typedef struct kvrt_config kvrt_config;

/* ---- services the host passes in ----------------------------------------------------------- */
/* The host gives each loaded library its own instance (so log lines and errors name the
 * plugin). All callbacks are required and thread-safe; the struct outlives the library. */
typedef struct kvrt_host_api {
  uint32_t struct_size;
  uint32_t abi_major; /* the host's version */
  uint32_t abi_minor;
  uint32_t reserved;
  void *ctx; /* host-private; plugins never touch it */

  /* One line, without trailing newline. The host adds the plugin's name. */
  void (*log)(const struct kvrt_host_api *host, kvrt_log_level level, const char *message);

  /* Records why the callback about to return `status` failed. The host copies `message` (a
   * thread-local "last error"), so the pointer need only live for the call. */
  void (*set_error)(const struct kvrt_host_api *host, kvrt_status status, const char *message);

  /* Config lookup in the plugin's table. `key` may be dotted ("inner.policy").
   * Returns KVRT_OK and writes *out; KVRT_ERR_NOT_FOUND when absent (use the default);
   * KVRT_ERR_CONFIG when present with another type (no message is recorded: the plugin says
   * what it expected).
   * `config` may be NULL (an empty table). A string stays valid as long as the config does. */
  kvrt_status (*config_string)(const struct kvrt_host_api *host, const kvrt_config *config,
                               const char *key, const char **out);
  kvrt_status (*config_int)(const struct kvrt_host_api *host, const kvrt_config *config,
                            const char *key, int64_t *out);
  kvrt_status (*config_float)(const struct kvrt_host_api *host, const kvrt_config *config,
                              const char *key, double *out);
  kvrt_status (*config_bool)(const struct kvrt_host_api *host, const kvrt_config *config,
                             const char *key, int32_t *out);

  /* Memory the core accounts byte by byte. `alignment` is a power of two (0 = 64).
   * Returns KVRT_ERR_NO_MEMORY (with a message giving the budget) when the request does not
   * fit. Memory from alloc must go back through free with the same kind and size. */
  kvrt_status (*alloc)(const struct kvrt_host_api *host, kvrt_memory_kind kind, uint64_t bytes,
                       uint64_t alignment, void **out);
  void (*free)(const struct kvrt_host_api *host, kvrt_memory_kind kind, void *ptr, uint64_t bytes);

  /* Synchronous copy between memories of the given kinds (a memcpy on CPU, cudaMemcpy on
   * CUDA). Safe to call from plugin threads. */
  kvrt_status (*copy)(const struct kvrt_host_api *host, void *dst, kvrt_memory_kind dst_kind,
                      const void *src, kvrt_memory_kind src_kind, uint64_t bytes);

  /* Another KV store by plugin name, for stores that wrap one (kv_host_tiered). On KVRT_OK,
   * *api is the store's validated table, *store_host the host instance to pass to its
   * callbacks and *config its own table ([kv.<name>], may be NULL); all live as long as the
   * process. KVRT_ERR_NOT_FOUND (with the loader's message) if it cannot be loaded. */
  kvrt_status (*open_kv_store)(const struct kvrt_host_api *host, const char *name,
                               const struct kvrt_kv_store_api **api,
                               const struct kvrt_host_api **store_host, const kvrt_config **config);

  /* ===== ABI 1.1: memory and copies ordered on a stream =====
   * Present when host->abi_minor >= 1. `kind` is DEVICE, HOST or PINNED_HOST. `stream` is the
   * compute backend's (a cudaStream_t on CUDA) or NULL for the default; the operation is
   * ordered on it and may complete after the call returns, so a copy's buffers must stay valid
   * until the stream has reached it (on the CPU every call completes before it returns).
   * Errors and accounting as alloc / free / copy; memory from alloc_async goes back through
   * free_async (or free) with the same kind and size. */
  kvrt_status (*alloc_async)(const struct kvrt_host_api *host, kvrt_memory_kind kind,
                             uint64_t bytes, uint64_t alignment, void *stream, void **out);
  void (*free_async)(const struct kvrt_host_api *host, kvrt_memory_kind kind, void *ptr,
                     uint64_t bytes, void *stream);
  kvrt_status (*copy_async)(const struct kvrt_host_api *host, void *dst,
                            kvrt_memory_kind dst_kind, const void *src, kvrt_memory_kind src_kind,
                            uint64_t bytes, void *stream);
} kvrt_host_api;

/* ---- plugin options (for config validation and `kvrt plugins`) ---------------------------- */
typedef uint32_t kvrt_option_type;
#define KVRT_OPTION_STRING 0u
#define KVRT_OPTION_INT 1u
#define KVRT_OPTION_FLOAT 2u
#define KVRT_OPTION_BOOL 3u
#define KVRT_OPTION_TABLE 4u /* a nested table the plugin reads itself */

typedef struct kvrt_option_desc {
  uint32_t struct_size;
  kvrt_option_type type;
  const char *name;          /* key in the plugin's table */
  const char *default_value; /* as text, for display; NULL if none */
  const char *help;          /* one line */
} kvrt_option_desc;

/* ---- the descriptor a library returns ------------------------------------------------------ */
typedef uint32_t kvrt_plugin_kind;
#define KVRT_PLUGIN_KV_STORE 1u
#define KVRT_PLUGIN_ATTENTION 2u

typedef struct kvrt_plugin_desc {
  uint32_t struct_size;
  uint32_t abi_major; /* the version the plugin was built against */
  uint32_t abi_minor;
  kvrt_plugin_kind kind;
  const char *name;        /* e.g. "kv_fp8_e4m3"; [a-z0-9_]+ */
  const char *version;     /* the plugin's own version, e.g. "0.1.0" */
  const char *description; /* one line */
  /* const kvrt_kv_store_api * or const kvrt_attention_api *, per kind */
  const void *table;
  const kvrt_option_desc *options; /* [num_options], may be NULL */
  uint32_t num_options;
  uint32_t input_dtypes; /* KVRT_DTYPE_BIT mask of the K/V (or Q) dtypes it accepts */
  /* Optional: KVRT_OK to serve `device`, KVRT_ERR_UNSUPPORTED (with set_error) to decline.
   * Called by the loader before the plugin is used. NULL = serves every device. */
  kvrt_status (*probe)(const kvrt_host_api *host, const kvrt_device *device);
} kvrt_plugin_desc;

/* The one entry point. The plugin returns KVRT_ERR_ABI_MISMATCH when host_major is not its
 * own major, otherwise sets *out to a descriptor that lives as long as the library. `host`
 * outlives the library; the plugin may keep the pointer. Called once per library. */
typedef kvrt_status (*kvrt_plugin_query_fn)(uint32_t host_major, uint32_t host_minor,
                                            const kvrt_host_api *host,
                                            const kvrt_plugin_desc **out);
#define KVRT_PLUGIN_QUERY_SYMBOL "kvrt_plugin_query"

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVRT_ABI_H */
