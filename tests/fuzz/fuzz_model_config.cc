// A model's config.json: the one parser (read_hf_config), the runnable check, and the
// capacity planner's shape, weight bytes and KV geometry for every TP size and a few page sizes.
#include <cstdint>
#include <string>

#include "core/capacity/capacity.h"
#include "core/capacity/model_shape.h"
#include "core/model/model_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  kvrt::Result<kvrt::model::ModelConfig> c = kvrt::model::read_hf_config(text, "config.json");
  if (!c.ok()) return 0;
  (void)kvrt::model::check_runnable(*c, "config.json");
  kvrt::Result<kvrt::capacity::ModelShape> shape =
      kvrt::capacity::parse_model_shape(text, "config.json");
  if (!shape.ok()) return 0;
  for (const char* dtype : {"bf16", "f32", "auto"}) {
    (void)kvrt::capacity::weight_bytes(*shape, dtype);
  }
  for (uint32_t tp : {1u, 2u, 3u, 8u}) {
    for (uint32_t page : {1u, 16u}) {
      (void)kvrt::capacity::kv_geometry(shape->kv, tp, page, KVRT_DTYPE_BF16);
    }
  }
  return 0;
}
