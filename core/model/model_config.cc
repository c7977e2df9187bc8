#include "core/model/model_config.h"

#include <algorithm>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <tuple>

#include "core/util/file.h"

namespace kvrt::model {

using nlohmann::json;

namespace {

// An MLA model's parameters (DeepSeek-V2/V3, Kimi-K2): the projections an fp8 checkpoint
// quantizes, and the rest (embeddings, norms, routers and their biases).
struct MlaCounts {
  int64_t projections = 0, other = 0;
};
MlaCounts count_mla(const ModelConfig& c) {
  const ModelConfig::Mla& mla = c.mla;
  const ModelConfig::Moe& moe = c.moe;
  const int64_t h = c.hidden_size, heads = c.num_attention_heads, layers = c.num_hidden_layers;
  const int64_t nope = mla.qk_nope_head_dim, rope = mla.qk_rope_head_dim, v = mla.v_head_dim;
  const int64_t kv_rank = mla.kv_lora_rank, q_rank = mla.q_lora_rank;
  // Per layer: attention and norms.
  MlaCounts layer;
  if (q_rank > 0) {
    layer.projections += h * q_rank + q_rank * heads * (nope + rope);  // q_a_proj, q_b_proj
    layer.other += q_rank;                                             // q_a_layernorm
  } else {
    layer.projections += h * heads * (nope + rope);  // q_proj
  }
  layer.projections += h * (kv_rank + rope) + kv_rank * heads * (nope + v);  // kv_a (MQA), kv_b
  layer.projections += heads * v * h;                                        // o_proj
  layer.other += kv_rank + 2 * h;  // kv_a_layernorm, input and post-attention norms
  // The layers moe_layer() picks, counted without walking them: the multiples of the frequency
  // from first_k_dense_replace on.
  int64_t moe_layers = 0;
  if (moe.n_routed_experts > 0) {
    const int64_t freq = std::max<int64_t>(1, moe.moe_layer_freq);
    const int64_t first =
        (std::max<int64_t>(0, moe.first_k_dense_replace) + freq - 1) / freq * freq;
    moe_layers = first < layers ? (layers - 1 - first) / freq + 1 : 0;
  }
  MlaCounts n;
  n.projections = layers * layer.projections +
                  moe_layers * (moe.n_routed_experts + moe.n_shared_experts) * 3 * h *
                      moe.moe_intermediate_size +                       // routed and shared experts
                  (layers - moe_layers) * 3 * h * c.intermediate_size;  // dense gate, up, down
  n.other = layers * layer.other +
            moe_layers * moe.n_routed_experts * (h + 1);  // the router and its correction bias
  n.other += c.vocab_size * h + h;                        // embeddings, final norm
  if (!c.tie_word_embeddings) n.other += c.vocab_size * h;
  return n;
}

}  // namespace

int64_t ModelConfig::projection_parameter_count() const {
  if (is_mla()) return count_mla(*this).projections;
  const int64_t h = hidden_size;
  return num_hidden_layers * (h * q_dim()                    // q_proj
                              + 2 * kv_dim() * h             // k_proj, v_proj
                              + h * q_dim()                  // o_proj
                              + 3 * intermediate_size * h);  // gate, up, down
}

int64_t ModelConfig::quantized_parameter_count() const {
  if (!is_mla()) return projection_parameter_count();
  return projection_parameter_count() - num_hidden_layers * mla.kv_lora_rank * num_attention_heads *
                                            (mla.qk_nope_head_dim + mla.v_head_dim);
}

int64_t ModelConfig::parameter_count() const {
  if (is_mla()) {
    const MlaCounts n = count_mla(*this);
    return n.projections + n.other;
  }
  const int64_t h = hidden_size;
  int64_t per_layer = 2 * h;  // input and post-attention norms
  if (attention_bias) per_layer += q_dim() + 2 * kv_dim();
  if (qk_norm) per_layer += 2 * head_dim;  // q_norm, k_norm
  int64_t total = projection_parameter_count() + vocab_size * h + num_hidden_layers * per_layer +
                  h;  // + final norm
  if (!tie_word_embeddings) total += vocab_size * h;
  return total;
}

Status ModelConfig::validate(const std::string& source) const {
  auto bad = [&](const std::string& field, const std::string& why) {
    return Status::ConfigError(source + ": " + field + ": " + why);
  };
  const std::pair<const char*, int64_t> positive[] = {
      {"hidden_size", hidden_size},
      {"intermediate_size", intermediate_size},
      {"num_hidden_layers", num_hidden_layers},
      {"num_attention_heads", num_attention_heads},
      {"num_key_value_heads", num_key_value_heads},
      {"head_dim", head_dim},
      {"vocab_size", vocab_size},
      {"max_position_embeddings", max_position_embeddings},
  };
  for (const auto& [name, value] : positive) {
    if (value <= 0) return bad(name, "must be positive, found " + std::to_string(value));
  }
  // Each KV head serves a whole group of query heads (GQA); a remainder has no meaning.
  if (num_attention_heads % num_key_value_heads != 0) {
    return bad("num_key_value_heads",
               std::to_string(num_key_value_heads) +
                   " does not divide num_attention_heads = " + std::to_string(num_attention_heads));
  }
  if (!(rms_norm_eps > 0)) return bad("rms_norm_eps", "must be positive");
  if (!(rope_theta > 0)) return bad("rope_theta", "must be positive");
  if (sliding_window < 0) return bad("sliding_window", "must not be negative");
  if (bos_token_id >= vocab_size) {
    return bad("bos_token_id", std::to_string(bos_token_id) + " is outside the vocabulary of " +
                                   std::to_string(vocab_size));
  }
  for (int32_t eos : eos_token_ids) {
    if (eos < 0 || eos >= vocab_size) {
      return bad("eos_token_id", std::to_string(eos) + " is outside the vocabulary of " +
                                     std::to_string(vocab_size));
    }
  }
  return Status::Ok();
}

std::string model_type_of(const ModelConfig& config) {
  if (!config.model_type.empty()) return config.model_type;
  static const std::pair<const char*, const char*> kTypes[] = {
      {"LlamaForCausalLM", "llama"},   {"MistralForCausalLM", "mistral"},
      {"Qwen2ForCausalLM", "qwen2"},   {"Qwen3ForCausalLM", "qwen3"},
      {"DeepseekV3ForCausalLM", "deepseek_v3"}};
  for (const auto& [architecture, type] : kTypes) {
    if (config.architecture == architecture) return type;
  }
  return "";
}

const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> kSupported = {"LlamaForCausalLM", "Qwen2ForCausalLM",
                                                      "Qwen3ForCausalLM", "MistralForCausalLM",
                                                      "DeepseekV3ForCausalLM"};
  return kSupported;
}

namespace {

// Shows a JSON value in a message without flooding it.
std::string Show(const json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return s;
}

// Reads typed fields of one config.json object; every message is "<path>: <key>: <problem>".
class Fields {
 public:
  Fields(const std::string& path, const json& j) : path_(path), j_(j) {}

  Status Error(const std::string& key, const std::string& why) const {
    return Status::ConfigError(path_ + ": " + key + ": " + why);
  }
  // The value of `key`, or nullptr when it is absent or null (HF writes null for "unset").
  const json* Find(const std::string& key) const {
    auto it = j_.find(key);
    return it == j_.end() || it->is_null() ? nullptr : &*it;
  }
  Status Missing(const std::string& key) const { return Error(key, "missing required field"); }

  Result<int64_t> Int(const std::string& key, std::optional<int64_t> fallback) const {
    const json* v = Find(key);
    if (v == nullptr) {
      if (fallback) return *fallback;
      return Missing(key);
    }
    // Every integer field is a count or a size that kvrt narrows to 32 bits (the C ABI's
    // geometry), so the range is checked here, before anything is cut: 2^32 KV heads must not
    // become 0.
    constexpr int64_t kMax = std::numeric_limits<int32_t>::max();
    const bool integer = v->is_number_integer();
    if (!integer || (v->is_number_unsigned() && v->get<uint64_t>() > uint64_t{kMax}) ||
        (!v->is_number_unsigned() && (v->get<int64_t>() < 0 || v->get<int64_t>() > kMax))) {
      return Error(key, std::string(integer ? "out of range" : "expected an integer") +
                            ": expected an integer in 0.." + std::to_string(kMax) + ", found " +
                            Show(*v));
    }
    return v->get<int64_t>();
  }
  Result<double> Double(const std::string& key, double fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_number()) return Error(key, "expected a number, found " + Show(*v));
    return v->get<double>();
  }
  Result<bool> Bool(const std::string& key, bool fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_boolean()) return Error(key, "expected true or false, found " + Show(*v));
    return v->get<bool>();
  }
  Result<std::string> String(const std::string& key, const std::string& fallback) const {
    const json* v = Find(key);
    if (v == nullptr) return fallback;
    if (!v->is_string()) return Error(key, "expected a string, found " + Show(*v));
    return v->get<std::string>();
  }
  // A token id that fits int32 and is not negative.
  Result<int32_t> TokenId(const std::string& key, const json& v) const {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
        v.get<int64_t>() > std::numeric_limits<int32_t>::max()) {
      return Error(key, "expected a token id, found " + Show(v));
    }
    return static_cast<int32_t>(v.get<int64_t>());
  }

 private:
  const std::string& path_;
  const json& j_;
};

// Unwraps a Result into `dst`, returning its Status from the enclosing function on error.
#define KVRT_ASSIGN(dst, expr)        \
  do {                                \
    auto r_ = (expr);                 \
    if (!r_.ok()) return r_.status(); \
    dst = std::move(r_.value());      \
  } while (false)

}  // namespace

namespace {

bool is_fp8_quantized(const json& object) {
  auto q = object.find("quantization_config");
  if (q == object.end() || !q->is_object()) return false;
  auto method = q->find("quant_method");
  return method != q->end() && method->is_string() && method->get<std::string>() == "fp8";
}

}  // namespace

Result<ModelConfig> read_hf_config(std::string_view text, const std::string& source) {
  const json root = json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (root.is_discarded()) return Status::ConfigError(source + ": not valid JSON");
  if (!root.is_object()) return Status::ConfigError(source + ": expected a JSON object");
  // A multimodal wrapper keeps the language model's shape in text_config.
  const json* object = &root;
  if (auto t = root.find("text_config");
      !root.contains("num_hidden_layers") && t != root.end() && t->is_object()) {
    object = &*t;
  }
  Fields f(source, *object);
  Fields top(source, root);
  ModelConfig c;

  // The architecture decides which defaults apply, so it comes first: the first name kvrt
  // implements, else the first listed.
  const json* archs = f.Find("architectures");
  if (archs == nullptr) archs = top.Find("architectures");
  if (archs == nullptr) {
    c.missing.push_back("architectures");
  } else {
    if (!archs->is_array() || archs->empty()) {
      return f.Error("architectures",
                     "expected a non-empty list of strings, found " + Show(*archs));
    }
    for (const json& a : *archs) {
      if (!a.is_string()) {
        return f.Error("architectures", "expected a list of strings, found " + Show(*archs));
      }
      for (const std::string& s : supported_architectures()) {
        if (a.get<std::string>() == s && c.architecture.empty()) c.architecture = s;
      }
    }
    if (c.architecture.empty()) c.architecture = (*archs)[0].get<std::string>();
  }
  if (const json* t = top.Find("model_type"); t != nullptr && t->is_string()) {
    c.model_type = t->get<std::string>();
  }
  const bool qwen2 = c.architecture == "Qwen2ForCausalLM";
  const bool qwen3 = c.architecture == "Qwen3ForCausalLM";
  const bool mistral = c.architecture == "MistralForCausalLM";

  // The fields the executor cannot do without: 0 and recorded when absent.
  for (auto [key, field] : {std::pair{"hidden_size", &c.hidden_size},
                            std::pair{"intermediate_size", &c.intermediate_size},
                            std::pair{"num_hidden_layers", &c.num_hidden_layers},
                            std::pair{"num_attention_heads", &c.num_attention_heads},
                            std::pair{"vocab_size", &c.vocab_size}}) {
    if (f.Find(key) == nullptr) c.missing.push_back(key);
    KVRT_ASSIGN(*field, f.Int(key, 0));
  }
  // Without num_key_value_heads the model is plain multi-head attention (transformers' rule).
  KVRT_ASSIGN(c.num_key_value_heads, f.Int("num_key_value_heads", c.num_attention_heads));
  if (f.Find("head_dim") == nullptr && qwen3) {
    c.head_dim = 128;  // Qwen3Config's default, whatever hidden_size / heads is
  } else if (f.Find("head_dim") == nullptr) {
    c.head_dim = c.num_attention_heads > 0 ? c.hidden_size / c.num_attention_heads : 0;
    c.head_dim_inexact = c.num_attention_heads > 0 && c.hidden_size % c.num_attention_heads != 0;
  } else {
    KVRT_ASSIGN(c.head_dim, f.Int("head_dim", std::nullopt));
  }
  const int64_t default_max_pos = qwen2 || qwen3 ? 32768 : mistral ? 131072 : 2048;
  KVRT_ASSIGN(c.max_position_embeddings, f.Int("max_position_embeddings", default_max_pos));
  KVRT_ASSIGN(c.rms_norm_eps, f.Double("rms_norm_eps", 1e-6));
  KVRT_ASSIGN(c.rope_theta, f.Double("rope_theta", 10000.0));
  KVRT_ASSIGN(c.tie_word_embeddings, f.Bool("tie_word_embeddings", false));
  // Qwen2 always has q/k/v biases and its config has no field for them; honour one if present.
  KVRT_ASSIGN(c.attention_bias, f.Bool("attention_bias", qwen2));
  c.qk_norm = qwen3;  // Qwen3's q_norm and k_norm have no switch in its config
  // Newer transformers write "dtype", older ones "torch_dtype"; a wrapper may say it on top.
  for (const Fields* level : {&f, &top}) {
    for (const char* key : {"torch_dtype", "dtype"}) {
      if (c.torch_dtype.empty()) KVRT_ASSIGN(c.torch_dtype, level->String(key, ""));
    }
  }
  KVRT_ASSIGN(c.hidden_act, f.String("hidden_act", "silu"));
  c.rope_scaling = f.Find("rope_scaling") != nullptr;
  KVRT_ASSIGN(c.mlp_bias, f.Bool("mlp_bias", false));
  if (qwen2 || qwen3) {
    // Qwen2 / Qwen3 only use their window when use_sliding_window is set (check_runnable
    // refuses it).
    KVRT_ASSIGN(c.use_sliding_window, f.Bool("use_sliding_window", false));
  } else {
    KVRT_ASSIGN(c.sliding_window, f.Int("sliding_window", 0));
  }

  // MLA and DeepSeek MoE shape fields: 0 when absent (moe_layer_freq: 1, every layer).
  ModelConfig::Mla& mla = c.mla;
  ModelConfig::Moe& moe = c.moe;
  for (auto [key, field, fallback] :
       {std::tuple{"kv_lora_rank", &mla.kv_lora_rank, 0},
        std::tuple{"qk_rope_head_dim", &mla.qk_rope_head_dim, 0},
        std::tuple{"qk_nope_head_dim", &mla.qk_nope_head_dim, 0},
        std::tuple{"v_head_dim", &mla.v_head_dim, 0},
        std::tuple{"q_lora_rank", &mla.q_lora_rank, 0},
        std::tuple{"n_routed_experts", &moe.n_routed_experts, 0},
        std::tuple{"n_shared_experts", &moe.n_shared_experts, 0},
        std::tuple{"moe_intermediate_size", &moe.moe_intermediate_size, 0},
        std::tuple{"first_k_dense_replace", &moe.first_k_dense_replace, 0},
        std::tuple{"moe_layer_freq", &moe.moe_layer_freq, 1},
        std::tuple{"num_experts_per_tok", &moe.num_experts_per_tok, 0}}) {
    KVRT_ASSIGN(*field, f.Int(key, fallback));
  }
  KVRT_ASSIGN(mla.rope_interleave, f.Bool("rope_interleave", true));
  KVRT_ASSIGN(moe.n_group, f.Int("n_group", 1));
  KVRT_ASSIGN(moe.topk_group, f.Int("topk_group", 1));
  KVRT_ASSIGN(moe.norm_topk_prob, f.Bool("norm_topk_prob", true));
  KVRT_ASSIGN(moe.routed_scaling_factor, f.Double("routed_scaling_factor", 1.0));
  KVRT_ASSIGN(moe.scoring_func, f.String("scoring_func", "sigmoid"));
  KVRT_ASSIGN(moe.topk_method, f.String("topk_method", "noaux_tc"));
  if (const json* scaling = f.Find("rope_scaling")) {
    if (!scaling->is_object()) {
      return f.Error("rope_scaling", "expected an object or null, found " + Show(*scaling));
    }
    const std::string where = source + ": rope_scaling";  // Fields keeps a reference
    const Fields r(where, *scaling);
    KVRT_ASSIGN(c.rope_scaling_type, r.String("type", ""));
    if (c.rope_scaling_type.empty()) KVRT_ASSIGN(c.rope_scaling_type, r.String("rope_type", ""));
    if (c.rope_scaling_type == "yarn") {
      ModelConfig::Yarn& y = c.yarn;
      KVRT_ASSIGN(y.factor, r.Double("factor", 0));
      if (y.factor <= 0) return r.Error("factor", "a positive number is required for yarn");
      KVRT_ASSIGN(y.original_max_position_embeddings,
                  r.Int("original_max_position_embeddings", c.max_position_embeddings));
      KVRT_ASSIGN(y.beta_fast, r.Double("beta_fast", 32));
      KVRT_ASSIGN(y.beta_slow, r.Double("beta_slow", 1));
      KVRT_ASSIGN(y.mscale, r.Double("mscale", 0));
      KVRT_ASSIGN(y.mscale_all_dim, r.Double("mscale_all_dim", 0));
      KVRT_ASSIGN(y.attention_factor, r.Double("attention_factor", 0));
      KVRT_ASSIGN(y.truncate, r.Bool("truncate", true));
    } else if (c.rope_scaling_type == "llama3") {
      // transformers' _validate_llama3_parameters requires all four.
      ModelConfig::Llama3Rope& l = c.llama3;
      for (auto [key, field] :
           {std::pair{"factor", &l.factor}, std::pair{"low_freq_factor", &l.low_freq_factor},
            std::pair{"high_freq_factor", &l.high_freq_factor}}) {
        if (r.Find(key) == nullptr) return r.Error(key, "missing (required by rope_type llama3)");
        KVRT_ASSIGN(*field, r.Double(key, 0));
      }
      if (r.Find("original_max_position_embeddings") == nullptr) {
        return r.Error("original_max_position_embeddings",
                       "missing (required by rope_type llama3)");
      }
      KVRT_ASSIGN(l.original_max_position_embeddings,
                  r.Int("original_max_position_embeddings", std::nullopt));
    }
  }
  c.other_moe = f.Find("num_local_experts") != nullptr || f.Find("num_experts") != nullptr;
  c.fp8_checkpoint = is_fp8_quantized(*object) || is_fp8_quantized(root);
  {
    // The language model's own, else the wrapper's (a multimodal config may carry it either way).
    const json* q = nullptr;
    if (auto it = object->find("quantization_config"); it != object->end()) q = &*it;
    if (auto it = root.find("quantization_config"); q == nullptr && it != root.end()) q = &*it;
    Result<WeightFormat> format = WeightFormat::parse(q, source);
    if (!format.ok()) return format.status();
    c.weight_format = std::move(*format);
  }

  // Llama and Mistral configs default to <s> = 1, </s> = 2; Qwen's to none.
  const bool llama_ids = !qwen2 && !qwen3;
  if (const json* bos = f.Find("bos_token_id")) {
    KVRT_ASSIGN(c.bos_token_id, f.TokenId("bos_token_id", *bos));
  } else if (llama_ids) {
    c.bos_token_id = 1;
  }
  if (const json* eos = f.Find("eos_token_id")) {
    if (eos->is_array()) {
      for (const json& e : *eos) {
        int32_t id = 0;
        KVRT_ASSIGN(id, f.TokenId("eos_token_id", e));
        c.eos_token_ids.push_back(id);
      }
    } else {
      int32_t id = 0;
      KVRT_ASSIGN(id, f.TokenId("eos_token_id", *eos));
      c.eos_token_ids.push_back(id);
    }
  } else if (llama_ids) {
    c.eos_token_ids = {2};
  }
  // Each field fits 32 bits, but their products are what the counts and sizes use: a config
  // whose largest weight matrices already hold more than 2^48 parameters (100 times the
  // largest published model) describes no real model, and would overflow 64-bit byte counts.
  const long double h = c.hidden_size, layers = c.num_hidden_layers;
  const long double q =
      static_cast<long double>(c.num_attention_heads) *
      std::max<int64_t>(
          {c.head_dim, c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim, c.mla.v_head_dim});
  const long double experts = std::max<int64_t>(1, c.moe.n_routed_experts + c.moe.n_shared_experts);
  const long double inter = std::max(c.intermediate_size, c.moe.moe_intermediate_size);
  const long double kv = static_cast<long double>(c.num_key_value_heads) * c.head_dim +
                         c.mla.kv_lora_rank + c.mla.q_lora_rank;
  // MLA's low-rank products: q_b_proj [heads (nope + rope)][q_lora], kv_b_proj [heads (nope +
  // v)][kv_lora].
  const long double heads = c.num_attention_heads;
  const long double mla_b =
      layers * heads *
      (static_cast<long double>(c.mla.q_lora_rank) *
           (c.mla.qk_nope_head_dim + c.mla.qk_rope_head_dim) +
       static_cast<long double>(c.mla.kv_lora_rank) * (c.mla.qk_nope_head_dim + c.mla.v_head_dim));
  const long double biggest = std::max(
      {h * c.vocab_size, layers * h * q, layers * h * kv, layers * experts * h * inter, mla_b});
  if (biggest > 0x1p48L) {
    return Status::ConfigError(source +
                               ": the dimensions (hidden_size, num_hidden_layers, heads, "
                               "intermediate and expert sizes, vocab_size) describe over 2^48 "
                               "parameters: not a real model");
  }
  return c;
}

Result<ModelConfig> read_hf_config_file(const std::string& path) {
  Result<std::string> text = util::read_file(path, kModelConfigFile);
  if (!text.ok()) return text.status();
  return read_hf_config(*text, path);
}

namespace {

// DeepSeek-V3's MLA and router fields, as the executor (core/model/deepseek_v3.cc) runs them.
Status check_deepseek(const ModelConfig& c, const std::string& source) {
  auto error = [&](const std::string& key, const std::string& why) {
    return Status::Unsupported(source + ": " + key + ": " + why);
  };
  for (auto [key, value] : {std::pair{"kv_lora_rank", c.mla.kv_lora_rank},
                            std::pair{"qk_rope_head_dim", c.mla.qk_rope_head_dim},
                            std::pair{"qk_nope_head_dim", c.mla.qk_nope_head_dim},
                            std::pair{"v_head_dim", c.mla.v_head_dim}}) {
    if (value <= 0) return error(key, "a positive value is required (MLA)");
  }
  if (c.mla.qk_rope_head_dim % 2 != 0) return error("qk_rope_head_dim", "must be even");
  const ModelConfig::Moe& m = c.moe;
  if (m.n_routed_experts == 0) return Status::Ok();
  if (m.moe_intermediate_size <= 0) return error("moe_intermediate_size", "must be positive");
  if (m.num_experts_per_tok <= 0 || m.num_experts_per_tok > m.n_routed_experts) {
    return error("num_experts_per_tok", "must lie in 1..n_routed_experts (" +
                                            std::to_string(m.n_routed_experts) + "), found " +
                                            std::to_string(m.num_experts_per_tok));
  }
  if (m.n_group <= 0 || m.n_routed_experts % m.n_group != 0) {
    return error("n_group", std::to_string(m.n_group) + " does not divide n_routed_experts " +
                                std::to_string(m.n_routed_experts));
  }
  if (m.topk_group <= 0 || m.topk_group > m.n_group) {
    return error("topk_group", "must lie in 1..n_group (" + std::to_string(m.n_group) +
                                   "), found " + std::to_string(m.topk_group));
  }
  if (m.n_group > 1 && m.n_routed_experts / m.n_group < 2) {
    return error("n_group", "a group's score sums its two best experts: groups need two");
  }
  if (m.num_experts_per_tok > m.topk_group * (m.n_routed_experts / m.n_group)) {
    return error("num_experts_per_tok", "exceeds the experts of topk_group groups");
  }
  if (m.scoring_func != "sigmoid") {
    return error("scoring_func", "unsupported '" + m.scoring_func + "' (DeepSeek-V3: sigmoid)");
  }
  if (m.topk_method != "noaux_tc") {
    return error("topk_method", "unsupported '" + m.topk_method + "' (DeepSeek-V3: noaux_tc)");
  }
  return Status::Ok();
}

// rope_scaling as the executor runs it: "default" (plain RoPE) and yarn everywhere, llama3 in
// the Llama family; every other type is refused by name rather than run as plain RoPE.
Status check_rope_scaling(const ModelConfig& c, bool deepseek, const std::string& source) {
  const std::string& type = c.rope_scaling_type;
  const std::string implemented =
      deepseek ? "DeepSeek-V3 runs \"default\" and \"yarn\""
               : "the Llama family (Llama, Mistral, Qwen2, Qwen3) runs \"default\", \"llama3\" "
                 "and \"yarn\"";
  if (type.empty()) {
    return Status::Unsupported(source + ": rope_scaling: no rope_type (" + implemented + ")");
  }
  if (type == "default") return Status::Ok();
  if (type == "yarn") {
    const ModelConfig::Yarn& y = c.yarn;
    if (!(y.beta_fast > 0 && y.beta_slow > 0 && y.original_max_position_embeddings > 0)) {
      return Status::Unsupported(source +
                                 ": rope_scaling: yarn needs positive beta_fast, beta_slow and "
                                 "original_max_position_embeddings");
    }
    if (!(c.rope_theta > 1)) {
      return Status::Unsupported(source + ": rope_theta: yarn needs a base above 1");
    }
    return Status::Ok();
  }
  if (deepseek || type != "llama3") {
    return Status::Unsupported(source + ": rope_scaling: unsupported type '" + type + "' (" +
                               implemented + ")");
  }
  const ModelConfig::Llama3Rope& l = c.llama3;
  auto error = [&](const std::string& key, const std::string& why) {
    return Status::ConfigError(source + ": rope_scaling: " + key + ": " + why);
  };
  if (!(l.factor > 0)) return error("factor", "must be positive for llama3");
  if (!(l.low_freq_factor > 0)) return error("low_freq_factor", "must be positive for llama3");
  // The medium band's interpolation divides by their difference.
  if (!(l.high_freq_factor > l.low_freq_factor)) {
    return error("high_freq_factor", "must exceed low_freq_factor for llama3");
  }
  if (l.original_max_position_embeddings <= 0) {
    return error("original_max_position_embeddings", "must be positive for llama3");
  }
  return Status::Ok();
}

}  // namespace

Status check_runnable(const ModelConfig& c, const std::string& source) {
  auto error = [&](const std::string& key, const std::string& why) {
    return Status::ConfigError(source + ": " + key + ": " + why);
  };
  auto missing = [&](const char* key) {
    return std::find(c.missing.begin(), c.missing.end(), key) != c.missing.end();
  };
  if (missing("architectures")) return error("architectures", "missing required field");
  const std::vector<std::string>& supported = supported_architectures();
  if (std::find(supported.begin(), supported.end(), c.architecture) == supported.end()) {
    std::string list;
    for (const std::string& a : supported) list += (list.empty() ? "" : ", ") + a;
    return error("architectures", "unsupported '" + c.architecture + "' (supported: " + list + ")");
  }
  for (const std::string& key : c.missing) return error(key, "missing required field");
  if (c.head_dim_inexact && !c.is_mla()) {
    return error("head_dim", "absent, and hidden_size = " + std::to_string(c.hidden_size) +
                                 " is not a multiple of num_attention_heads = " +
                                 std::to_string(c.num_attention_heads));
  }
  if (c.hidden_act != "silu") {
    return Status::Unsupported(source + ": hidden_act: unsupported '" + c.hidden_act +
                               "' (only silu, i.e. SwiGLU, is implemented)");
  }
  const bool deepseek = c.architecture == "DeepseekV3ForCausalLM";
  if (c.rope_scaling) {
    if (Status s = check_rope_scaling(c, deepseek, source); !s.ok()) return s;
  }
  if (deepseek) {
    if (Status s = check_deepseek(c, source); !s.ok()) return s;
  }
  if (c.mlp_bias) return Status::Unsupported(source + ": mlp_bias: true is not implemented");
  if (c.use_sliding_window) {
    // Qwen2 then windows only some layers (max_window_layers): refuse rather than compute
    // something else.
    return Status::Unsupported(source + ": use_sliding_window: true is not implemented");
  }
  return c.validate(source);
}

Result<ModelConfig> parse_hf_config(const std::string& path) {
  Result<ModelConfig> c = read_hf_config_file(path);
  if (!c.ok()) return c;
  if (Status s = check_runnable(*c, path); !s.ok()) return s;
  return c;
}

#undef KVRT_ASSIGN

}  // namespace kvrt::model
