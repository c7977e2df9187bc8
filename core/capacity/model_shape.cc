#include "core/capacity/model_shape.h"

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/model/model_config.h"
#include "core/model/safetensors.h"
#include "core/model/weights.h"
#include "core/util/file.h"

namespace kvrt::capacity {
namespace {

using nlohmann::json;
namespace fs = std::filesystem;

// The fields of these models' published config.json files that planning reads.
struct NamedShape {
  std::string_view name;
  std::string_view config_json;
};

constexpr NamedShape kNamedShapes[] = {
    {"llama3-8b-shape", R"({
      "architectures": ["LlamaForCausalLM"], "torch_dtype": "bfloat16",
      "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
      "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 128256,
      "tie_word_embeddings": false})"},
    {"kimi-k2-shape", R"({
      "architectures": ["DeepseekV3ForCausalLM"], "torch_dtype": "bfloat16",
      "hidden_size": 7168, "intermediate_size": 18432, "moe_intermediate_size": 2048,
      "num_hidden_layers": 61, "first_k_dense_replace": 1, "moe_layer_freq": 1,
      "num_attention_heads": 64, "num_key_value_heads": 64, "q_lora_rank": 1536,
      "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
      "n_routed_experts": 384, "n_shared_experts": 1, "num_experts_per_tok": 8,
      "vocab_size": 163840, "tie_word_embeddings": false,
      "quantization_config": {"quant_method": "fp8", "fmt": "e4m3",
                              "weight_block_size": [128, 128]}})"},
};

// Parameters of a DeepSeek-V2/V3-style model (MLA attention, optional MoE), counted by
// model::ModelConfig, when its config gives every size the count needs.
void count_mla(const model::ModelConfig& c, ModelShape& shape) {
  const model::ModelConfig::Mla& mla = c.mla;
  if (c.hidden_size <= 0 || c.vocab_size <= 0 || c.intermediate_size <= 0 ||
      mla.qk_nope_head_dim <= 0 || mla.v_head_dim <= 0) {
    return;
  }
  if (c.moe.n_routed_experts > 0 && c.moe.moe_intermediate_size <= 0) return;
  shape.fp8_parameters = static_cast<uint64_t>(c.projection_parameter_count());
  shape.parameters = static_cast<uint64_t>(c.parameter_count()) - shape.fp8_parameters;
}

// Parameters of a Llama-family dense model, counted by model::ModelConfig.
void count_dense(const model::ModelConfig& c, ModelShape& shape) {
  if (c.hidden_size <= 0 || c.vocab_size <= 0 || c.intermediate_size <= 0) return;
  shape.fp8_parameters = static_cast<uint64_t>(c.projection_parameter_count());
  shape.parameters = static_cast<uint64_t>(c.parameter_count()) - shape.fp8_parameters;
}

Result<uint32_t> narrow(int64_t v, const std::string& source, const char* key) {
  if (v < 0) {
    return Status::ConfigError(source + ": " + key + ": expected a non-negative integer, found " +
                               std::to_string(v));
  }
  if (v > UINT32_MAX) return Status::ConfigError(source + ": " + key + " is too large");
  return static_cast<uint32_t>(v);
}

// The checkpoint's bytes: the sharded index's own total, or the single file's size.
uint64_t checkpoint_bytes(const fs::path& dir) {
  Result<std::string> index = util::read_file((dir / "model.safetensors.index.json").string(),
                                              model::kSafetensorsIndexFile);
  if (index.ok()) {
    json j = json::parse(*index, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.contains("metadata") && j["metadata"].is_object()) {
      const json& total = j["metadata"].value("total_size", json());
      if (total.is_number_unsigned()) return total.get<uint64_t>();
    }
  }
  std::error_code ec;
  const uint64_t size = fs::file_size(dir / "model.safetensors", ec);
  return ec ? 0 : size;
}

Result<ModelShape> from_file(const fs::path& path) {
  Result<model::ModelConfig> c = model::read_hf_config_file(path.string());
  if (!c.ok()) return c.status();
  return shape_of(*c, path.string());
}

}  // namespace

Result<ModelShape> parse_model_shape(std::string_view config_json, const std::string& source) {
  Result<model::ModelConfig> c = model::read_hf_config(config_json, source);
  if (!c.ok()) return c.status();
  return shape_of(*c, source);
}

Result<ModelShape> shape_of(const model::ModelConfig& c, const std::string& source) {
  ModelShape shape;
  shape.source = source;
  shape.architecture = c.architecture;
  shape.torch_dtype = c.torch_dtype;
  for (const char* key : {"num_hidden_layers", "num_attention_heads"}) {
    if (std::find(c.missing.begin(), c.missing.end(), key) != c.missing.end()) {
      return Status::ConfigError(source + ": " + key + " is missing");
    }
  }
  if (c.num_attention_heads <= 0) {
    return Status::ConfigError(source + ": num_attention_heads must be positive");
  }
  for (auto [key, value] :
       {std::pair{"num_hidden_layers", c.num_hidden_layers},
        std::pair{"num_key_value_heads", c.num_key_value_heads}, std::pair{"head_dim", c.head_dim},
        std::pair{"kv_lora_rank", c.mla.kv_lora_rank},
        std::pair{"qk_rope_head_dim", c.mla.qk_rope_head_dim}}) {
    if (Result<uint32_t> n = narrow(value, source, key); !n.ok()) return n.status();
  }
  if (c.mla.kv_lora_rank > 0 && c.mla.qk_rope_head_dim == 0) {
    return Status::ConfigError(source + ": qk_rope_head_dim is missing");
  }
  if (c.mla.kv_lora_rank == 0 && c.head_dim == 0) {
    return Status::ConfigError(source + ": head_dim is missing and so is hidden_size");
  }
  shape.kv = kv_shape(c);
  if (c.mla.kv_lora_rank > 0) {
    count_mla(c, shape);
  } else if (!c.other_moe && c.moe.n_routed_experts == 0) {
    // A mixture of experts other than DeepSeek's has its own layout: no count, ask for bytes.
    count_dense(c, shape);
  }
  if (!c.fp8_checkpoint) {
    shape.parameters += shape.fp8_parameters;
    shape.fp8_parameters = 0;
  }
  return shape;
}

Result<ModelShape> read_model_shape(const std::string& dir_or_name) {
  std::error_code ec;
  const fs::path path(dir_or_name);
  if (fs::is_directory(path, ec)) {
    Result<ModelShape> shape = from_file(path / "config.json");
    if (shape.ok()) shape->checkpoint_bytes = checkpoint_bytes(path);
    return shape;
  }
  if (fs::is_regular_file(path, ec)) return from_file(path);
  if (Result<model::ModelConfig> preset = model::preset_config(dir_or_name); preset.ok()) {
    Result<ModelShape> shape = shape_of(*preset, dir_or_name);
    if (shape.ok()) shape->torch_dtype = "bfloat16";  // presets are served as bf16 models
    return shape;
  }
  for (const NamedShape& s : kNamedShapes) {
    if (s.name == dir_or_name) return parse_model_shape(s.config_json, std::string(s.name));
  }
  std::string known;
  for (const std::string& name : model::preset_names()) known += (known.empty() ? "" : ", ") + name;
  for (const std::string& name : shape_names()) known += ", " + name;
  return Status::NotFound("model '" + dir_or_name +
                          "' is not a directory with a config.json, a config.json file, a preset "
                          "or a named shape (known: " +
                          known + ")");
}

KvShape kv_shape(const model::ModelConfig& config) {
  KvShape kv;
  kv.layers = static_cast<uint32_t>(config.num_hidden_layers);
  if (config.mla.kv_lora_rank > 0) {
    kv.kv_lora_rank = static_cast<uint32_t>(config.mla.kv_lora_rank);
    kv.qk_rope_head_dim = static_cast<uint32_t>(config.mla.qk_rope_head_dim);
    return kv;
  }
  kv.kv_heads = static_cast<uint32_t>(config.num_key_value_heads);
  kv.head_dim = kv.v_head_dim = static_cast<uint32_t>(config.head_dim);
  return kv;
}

std::vector<std::string> shape_names() {
  std::vector<std::string> out;
  for (const NamedShape& s : kNamedShapes) out.emplace_back(s.name);
  return out;
}

Result<uint64_t> weight_bytes(const ModelShape& shape, std::string_view dtype) {
  if (shape.parameters == 0 && shape.fp8_parameters == 0) {
    if (shape.checkpoint_bytes > 0) return shape.checkpoint_bytes;
    return Status::InvalidArgument(
        shape.source + ": the weights' size of " +
        (shape.architecture.empty() ? std::string("this model") : shape.architecture) +
        " cannot be derived from its config and no checkpoint is there; give --weights-gib");
  }
  if (dtype == "bf16") return (shape.parameters + shape.fp8_parameters) * 2;
  if (dtype == "f32") return (shape.parameters + shape.fp8_parameters) * 4;
  if (dtype != "auto") {
    return Status::InvalidArgument("model dtype: expected bf16, f32 or auto, found \"" +
                                   std::string(dtype) + "\"");
  }
  const uint64_t per = shape.torch_dtype == "float32" ? 4 : 2;
  return shape.parameters * per + shape.fp8_parameters;
}

}  // namespace kvrt::capacity
