// What capacity planning needs to know about a model -- its KV shape and the size of its
// weights -- from a Hugging Face config.json (through model::read_hf_config, the same parser
// the runtime uses), a model preset or a named shape, so that architectures the executor
// cannot run yet (MLA: DeepSeek-V3, Kimi-K2) can be planned.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/capacity/capacity.h"
#include "core/model/model_config.h"
#include "core/util/status.h"

namespace kvrt::capacity {

struct ModelShape {
  std::string source;        // what was read: a config.json path, a preset or a shape name
  std::string architecture;  // architectures[0]; "" when absent
  KvShape kv;
  std::string torch_dtype;  // the weights' dtype as config.json says ("bfloat16"); may be ""
  // Parameters counted from the shape (Llama-family dense models and DeepSeek-V3-style MLA/MoE
  // models): those held at the weights' dtype, and the projections an fp8 checkpoint
  // (quantization_config.quant_method = "fp8") stores at one byte each. Both 0 when the count
  // is not derivable from the config (other MoE layouts).
  uint64_t parameters = 0;
  uint64_t fp8_parameters = 0;
  // Bytes of the safetensors checkpoint next to config.json (the index's metadata.total_size,
  // or model.safetensors' size); 0 when there is none.
  uint64_t checkpoint_bytes = 0;
};

// config.json text as model::read_hf_config reads it (the one parser), turned into a shape:
// the KV shape (MLA when kv_lora_rank > 0) and the parameter count. Only num_hidden_layers and
// num_attention_heads are required. Errors name `source` and the field.
Result<ModelShape> parse_model_shape(std::string_view config_json, const std::string& source);
// The same for a config already read (a preset's, or read_hf_config's).
Result<ModelShape> shape_of(const model::ModelConfig& config, const std::string& source);

// A directory holding config.json (plus its checkpoint's size), a config.json file, a model
// preset (model::preset_config: synth-76m, ...) or a named shape (shape_names()), tried in
// that order. An unknown name is an error listing the presets and shapes.
Result<ModelShape> read_model_shape(const std::string& dir_or_name);

// The KV shape of a model the executor runs (what kv_geometry() turns into a rank's geometry).
KvShape kv_shape(const model::ModelConfig& config);

// Shapes known by name for planning only, with no weights behind them:
//   llama3-8b-shape: Llama-3-8B (32 layers, 8 KV heads of 128, 8.03e9 parameters, bf16).
//   kimi-k2-shape:   Kimi-K2 (61 MLA layers of 512 + 64, 384 experts, fp8 checkpoint).
std::vector<std::string> shape_names();

// Bytes of weights the whole model holds when served at `dtype` ([model] dtype): "bf16" 2 and
// "f32" 4 bytes per parameter; "auto" the checkpoint's own (4 for float32, else 2, and 1 for an
// fp8 checkpoint's projections; the fp8 block scales, 1/4096 of those, are left out). Without
// a parameter count, the checkpoint's bytes; without either, an error asking for the size.
Result<uint64_t> weight_bytes(const ModelShape& shape, std::string_view dtype);

}  // namespace kvrt::capacity
