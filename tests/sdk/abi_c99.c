/* The ABI headers are C99: this file compiles with -std=c99 -pedantic -Wall -Werror, fills
 * each struct from C the way a C plugin would, and checks struct_size conventions at run time. */
#include <stdio.h>
#include <string.h>

#include "kvrt/abi.h"
#include "kvrt/attention.h"
#include "kvrt/kv_store.h"

#define CHECK(cond)                                              \
  do {                                                           \
    if (!(cond)) {                                               \
      fprintf(stderr, "%s:%d: %s\n", __FILE__, __LINE__, #cond); \
      return 1;                                                  \
    }                                                            \
  } while (0)

int main(void) {
  kvrt_kv_geometry g;
  kvrt_kv_layout layout;
  kvrt_kv_store_api kv;
  kvrt_attention_api attn;
  kvrt_attention_batch batch;
  kvrt_plugin_desc desc;
  kvrt_host_api host;
  memset(&g, 0, sizeof g);
  memset(&layout, 0, sizeof layout);
  memset(&kv, 0, sizeof kv);
  memset(&attn, 0, sizeof attn);
  memset(&batch, 0, sizeof batch);
  memset(&desc, 0, sizeof desc);
  memset(&host, 0, sizeof host);
  g.struct_size = sizeof g;
  g.device.struct_size = sizeof g.device;
  /* Every struct starts with its size, so a reader of an older or newer version can tell. */
  CHECK(offsetof(kvrt_kv_geometry, struct_size) == 0);
  CHECK(offsetof(kvrt_kv_layout, struct_size) == 0);
  CHECK(offsetof(kvrt_kv_store_api, struct_size) == 0);
  CHECK(offsetof(kvrt_attention_api, struct_size) == 0);
  CHECK(offsetof(kvrt_attention_batch, struct_size) == 0);
  CHECK(offsetof(kvrt_plugin_desc, struct_size) == 0);
  CHECK(offsetof(kvrt_host_api, struct_size) == 0);
  CHECK(KVRT_DTYPE_BIT(KVRT_DTYPE_BF16) == 4u);
  CHECK(KVRT_ABI_MAJOR == 1u);
  puts("abi headers compile as C99");
  return 0;
}
