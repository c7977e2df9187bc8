#include "core/capacity/model_shape.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>

#include "core/model/model_config.h"
#include "core/model/weights.h"

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

// Reads an unsigned field; absent or null gives nullopt, any other non-integer is an error.
class Fields {
 public:
  Fields(const json& object, const std::string& source) : object_(object), source_(source) {}

  Result<std::optional<uint64_t>> get(const char* key) const {
    auto it = object_.find(key);
    if (it == object_.end() || it->is_null()) return std::optional<uint64_t>();
    if (!it->is_number_integer() || it->get<int64_t>() < 0) {
      return Status::ConfigError(source_ + ": " + key +
                                 ": expected a non-negative integer, found " + it->dump());
    }
    return std::optional<uint64_t>(it->get<uint64_t>());
  }
  // A field the count needs; nullopt (not derivable) when absent.
  std::optional<uint64_t> optional(const char* key) const {
    Result<std::optional<uint64_t>> v = get(key);
    return v.ok() ? *v : std::nullopt;
  }
  Result<uint64_t> required(const char* key) const {
    Result<std::optional<uint64_t>> v = get(key);
    if (!v.ok()) return v.status();
    if (!v->has_value()) return Status::ConfigError(source_ + ": " + key + " is missing");
    return **v;
  }
  bool flag(const char* key, bool fallback) const {
    auto it = object_.find(key);
    return it != object_.end() && it->is_boolean() ? it->get<bool>() : fallback;
  }
  bool has(const char* key) const {
    auto it = object_.find(key);
    return it != object_.end() && !it->is_null();
  }

 private:
  const json& object_;
  const std::string& source_;
};

Result<uint32_t> narrow(uint64_t v, const std::string& source, const char* key) {
  if (v > UINT32_MAX) return Status::ConfigError(source + ": " + key + " is too large");
  return static_cast<uint32_t>(v);
}

// Parameters of a DeepSeek-V2/V3-style model (MLA attention, optional MoE), split into those
// an fp8 checkpoint quantizes (the projections) and the rest (embeddings, norms, routers).
// The multi-token-prediction layers (num_nextn_predict_layers) are not counted: a server
// loads them only for speculative decoding.
void count_mla(const Fields& f, uint64_t layers, uint64_t heads, ModelShape& shape) {
  const auto h = f.optional("hidden_size"), vocab = f.optional("vocab_size"),
             inter = f.optional("intermediate_size"), nope = f.optional("qk_nope_head_dim"),
             v = f.optional("v_head_dim");
  if (!h || !vocab || !inter || !nope || !v) return;
  const uint64_t rope = shape.kv.qk_rope_head_dim, kv_rank = shape.kv.kv_lora_rank;
  const uint64_t q_rank = f.optional("q_lora_rank").value_or(0);
  const uint64_t experts = f.optional("n_routed_experts").value_or(0);
  const uint64_t shared = f.optional("n_shared_experts").value_or(0);
  const uint64_t moe_inter = f.optional("moe_intermediate_size").value_or(0);
  const uint64_t first_dense = f.optional("first_k_dense_replace").value_or(0);
  const uint64_t moe_freq = std::max<uint64_t>(1, f.optional("moe_layer_freq").value_or(1));
  if (experts > 0 && moe_inter == 0) return;

  const uint64_t q_head = *nope + rope;
  uint64_t proj = 0, other = 0;
  for (uint64_t i = 0; i < layers; ++i) {
    if (q_rank > 0) {
      proj += *h * q_rank + q_rank * heads * q_head;  // q_a_proj, q_b_proj
      other += q_rank;                                // q_a_layernorm
    } else {
      proj += *h * heads * q_head;  // q_proj
    }
    proj += *h * (kv_rank + rope) + kv_rank * heads * (*nope + *v);  // kv_a (with MQA rope), kv_b
    proj += heads * *v * *h;                                         // o_proj
    other += kv_rank + 2 * *h;  // kv_a_layernorm, input and post-attention norms
    if (experts > 0 && i >= first_dense && i % moe_freq == 0) {
      proj += (experts + shared) * 3 * *h * moe_inter;  // routed and shared experts
      other += experts * *h;                            // the router
    } else {
      proj += 3 * *h * *inter;  // gate, up, down
    }
  }
  other += *vocab * *h + *h;  // embeddings, final norm
  if (!f.flag("tie_word_embeddings", false)) other += *vocab * *h;
  shape.parameters = other;
  shape.fp8_parameters = proj;
}

// Parameters of a Llama-family dense model, counted by model::ModelConfig.
void count_dense(const Fields& f, const std::string& architecture, uint64_t layers, uint64_t heads,
                 ModelShape& shape) {
  const auto h = f.optional("hidden_size"), vocab = f.optional("vocab_size"),
             inter = f.optional("intermediate_size");
  if (!h || !vocab || !inter) return;
  model::ModelConfig c;
  c.hidden_size = static_cast<int64_t>(*h);
  c.intermediate_size = static_cast<int64_t>(*inter);
  c.vocab_size = static_cast<int64_t>(*vocab);
  c.num_hidden_layers = static_cast<int64_t>(layers);
  c.num_attention_heads = static_cast<int64_t>(heads);
  c.num_key_value_heads = shape.kv.kv_heads;
  c.head_dim = shape.kv.head_dim;
  // transformers' Qwen2 config defaults attention_bias to true; the others to false.
  c.attention_bias = f.flag("attention_bias", architecture == "Qwen2ForCausalLM");
  c.tie_word_embeddings = f.flag("tie_word_embeddings", false);
  shape.fp8_parameters = static_cast<uint64_t>(c.projection_parameter_count());
  shape.parameters = static_cast<uint64_t>(c.parameter_count()) - shape.fp8_parameters;
}

bool is_fp8_checkpoint(const json& config) {
  auto q = config.find("quantization_config");
  if (q == config.end() || !q->is_object()) return false;
  auto method = q->find("quant_method");
  return method != q->end() && method->is_string() && method->get<std::string>() == "fp8";
}

// The checkpoint's bytes: the sharded index's own total, or the single file's size.
uint64_t checkpoint_bytes(const fs::path& dir) {
  std::ifstream index(dir / "model.safetensors.index.json");
  if (index) {
    json j = json::parse(index, nullptr, /*allow_exceptions=*/false);
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
  std::ifstream in(path);
  if (!in) return Status::NotFound("cannot read " + path.string());
  std::stringstream text;
  text << in.rdbuf();
  return parse_model_shape(text.str(), path.string());
}

}  // namespace

Result<ModelShape> parse_model_shape(std::string_view config_json, const std::string& source) {
  const json root = json::parse(config_json, nullptr, /*allow_exceptions=*/false);
  if (!root.is_object()) return Status::ConfigError(source + ": not a JSON object");
  const json* config = &root;
  auto text = root.find("text_config");
  if (!root.contains("num_hidden_layers") && text != root.end() && text->is_object()) {
    config = &*text;
  }
  Fields f(*config, source);
  ModelShape shape;
  shape.source = source;
  for (const json* c : {config, &root}) {
    auto arch = c->find("architectures");
    if (shape.architecture.empty() && arch != c->end() && arch->is_array() && !arch->empty() &&
        (*arch)[0].is_string()) {
      shape.architecture = (*arch)[0].get<std::string>();
    }
    for (const char* key : {"torch_dtype", "dtype"}) {
      auto d = c->find(key);
      if (shape.torch_dtype.empty() && d != c->end() && d->is_string()) {
        shape.torch_dtype = d->get<std::string>();
      }
    }
  }

  Result<uint64_t> layers = f.required("num_hidden_layers");
  if (!layers.ok()) return layers.status();
  Result<uint64_t> heads = f.required("num_attention_heads");
  if (!heads.ok()) return heads.status();
  Result<std::optional<uint64_t>> kv_heads = f.get("num_key_value_heads");
  Result<std::optional<uint64_t>> head_dim = f.get("head_dim");
  Result<std::optional<uint64_t>> hidden = f.get("hidden_size");
  Result<std::optional<uint64_t>> kv_rank = f.get("kv_lora_rank");
  Result<std::optional<uint64_t>> rope = f.get("qk_rope_head_dim");
  for (const Status& s :
       {kv_heads.status(), head_dim.status(), hidden.status(), kv_rank.status(), rope.status()}) {
    if (!s.ok()) return s;
  }
  if (*heads == 0) return Status::ConfigError(source + ": num_attention_heads must be positive");

  Result<uint32_t> n = narrow(*layers, source, "num_hidden_layers");
  if (!n.ok()) return n.status();
  shape.kv.layers = *n;
  if (kv_rank->value_or(0) > 0) {
    if (!rope->has_value()) return Status::ConfigError(source + ": qk_rope_head_dim is missing");
    Result<uint32_t> r = narrow(**kv_rank, source, "kv_lora_rank");
    Result<uint32_t> d = narrow(**rope, source, "qk_rope_head_dim");
    if (!r.ok()) return r.status();
    if (!d.ok()) return d.status();
    shape.kv.kv_lora_rank = *r;
    shape.kv.qk_rope_head_dim = *d;
    count_mla(f, *layers, *heads, shape);
  } else {
    uint64_t dim = 0;
    if (head_dim->has_value()) {
      dim = **head_dim;
    } else if (hidden->has_value()) {
      dim = **hidden / *heads;
    } else {
      return Status::ConfigError(source + ": head_dim is missing and so is hidden_size");
    }
    Result<uint32_t> kh = narrow(kv_heads->value_or(*heads), source, "num_key_value_heads");
    Result<uint32_t> hd = narrow(dim, source, "head_dim");
    if (!kh.ok()) return kh.status();
    if (!hd.ok()) return hd.status();
    shape.kv.kv_heads = *kh;
    shape.kv.head_dim = shape.kv.v_head_dim = *hd;
    // A mixture of experts other than DeepSeek's has its own layout: no count, ask for bytes.
    if (!f.has("num_local_experts") && !f.has("num_experts") && !f.has("n_routed_experts")) {
      count_dense(f, shape.architecture, *layers, *heads, shape);
    }
  }
  if (!is_fp8_checkpoint(*config) && !is_fp8_checkpoint(root)) {
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
    ModelShape shape;
    shape.source = dir_or_name;
    shape.architecture = preset->architecture;
    shape.torch_dtype = "bfloat16";  // presets are served as bf16 models
    shape.kv = kv_shape(*preset);
    shape.parameters = static_cast<uint64_t>(preset->parameter_count());
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
