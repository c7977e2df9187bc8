// A model's shape as its Hugging Face config.json states it: what the executor, the capacity
// planner and the weight loader agree on. One parser (read_hf_config) reads every field kvrt
// knows, for any architecture, so `kvrt capacity` can plan models the executor cannot run yet
// (MLA: DeepSeek-V3, Kimi-K2); check_runnable() then says whether the executor can run it.
// Synthetic presets (weights.h) build one directly.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "core/util/file.h"
#include "core/model/weight_format.h"
#include "core/util/status.h"

namespace kvrt::model {

inline constexpr util::FileKind kModelConfigFile{"model config.json", 16 * util::kMiB};

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
  std::string model_type;    // config.json's "model_type" ("llama", "qwen3"); "" if it has none
  std::string torch_dtype;   // dtype of the stored weights as config.json says; "" if it doesn't
  int64_t hidden_size = 0;
  int64_t intermediate_size = 0;
  int64_t num_hidden_layers = 0;
  int64_t num_attention_heads = 0;
  int64_t num_key_value_heads = 0;
  int64_t head_dim = 0;  // per head, for Q, K and V alike
  int64_t vocab_size = 0;
  int64_t max_position_embeddings = 0;
  double rms_norm_eps = 1e-6;
  double rope_theta = 10000.0;
  bool tie_word_embeddings = false;  // lm_head shares embed_tokens
  bool attention_bias = false;       // q/k/v projections have a bias (Qwen2); o has none
  bool qk_norm = false;              // per-head RMSNorm of q and k before RoPE (Qwen3)
  // Sliding-window attention span in tokens, 0 = full attention. Mistral v0.1 sets 4096; the
  // executor decides whether it can honour it (it only matters beyond that many tokens).
  int64_t sliding_window = 0;
  int32_t bos_token_id = -1;           // -1: none
  std::vector<int32_t> eos_token_ids;  // any of them ends a sequence; may be empty

  // Multi-head latent attention (DeepSeek-V2/V3, Kimi-K2): kv_lora_rank > 0 selects it. The KV
  // cache then holds one latent of kv_lora_rank + qk_rope_head_dim per token and layer.
  struct Mla {
    int64_t kv_lora_rank = 0;
    int64_t qk_rope_head_dim = 0;
    int64_t qk_nope_head_dim = 0;
    int64_t v_head_dim = 0;
    int64_t q_lora_rank = 0;  // 0: q_proj without a low-rank factorisation
    // RoPE on interleaved pairs (x0, x1), (x2, x3), ... as DeepSeek-V3 applies it; false:
    // rotate-half, as Llama. transformers' DeepseekV3Config defaults to true.
    bool rope_interleave = true;
  } mla;
  // DeepSeek-style mixture of experts (n_routed_experts > 0).
  struct Moe {
    int64_t n_routed_experts = 0;
    int64_t n_shared_experts = 0;
    int64_t moe_intermediate_size = 0;
    int64_t first_k_dense_replace = 0;  // the first layers keep a dense MLP
    int64_t moe_layer_freq = 1;
    int64_t num_experts_per_tok = 0;
    // The router (DeepSeek-V3): sigmoid scores; e_score_correction_bias only chooses experts;
    // the experts are chosen within the topk_group best of n_group groups (a group's score is
    // the sum of its two best); the chosen weights are normalised when norm_topk_prob, then
    // multiplied by routed_scaling_factor.
    int64_t n_group = 1;
    int64_t topk_group = 1;
    bool norm_topk_prob = true;
    double routed_scaling_factor = 1.0;
    std::string scoring_func = "sigmoid";
    std::string topk_method = "noaux_tc";
  } moe;
  // rope_scaling of type "yarn" (DeepSeek-V3, Kimi-K2), as transformers computes it; factor 0
  // when rope_scaling is null or of another type (`rope_scaling_type` says which).
  struct Yarn {
    double factor = 0;
    int64_t original_max_position_embeddings = 0;
    double beta_fast = 32, beta_slow = 1;
    double mscale = 0, mscale_all_dim = 0;  // 0: absent
    double attention_factor = 0;            // 0: absent (derived from mscale)
    bool truncate = true;
  } yarn;
  // rope_scaling of type "llama3" (Llama 3.1 / 3.2): the inverse frequencies adjusted as
  // transformers' _compute_llama3_parameters does; factor 0 when rope_scaling is another type.
  struct Llama3Rope {
    double factor = 0;
    double low_freq_factor = 0, high_freq_factor = 0;
    int64_t original_max_position_embeddings = 0;
  } llama3;
  std::string rope_scaling_type;  // rope_type (or the older "type"); "" when rope_scaling is null
  bool other_moe = false;         // num_local_experts / num_experts: another MoE layout
  bool fp8_checkpoint = false;    // quantization_config.quant_method = "fp8"
  WeightFormat weight_format;     // how its Linear weights are stored (quantization_config)

  // What check_runnable() needs beyond the shape: fields as read, and those absent.
  std::string hidden_act = "silu";
  bool rope_scaling = false;  // a non-null rope_scaling
  bool mlp_bias = false;
  bool use_sliding_window = false;   // Qwen2's switch
  bool head_dim_inexact = false;     // head_dim absent and hidden_size % heads != 0
  std::vector<std::string> missing;  // required fields absent from config.json, in order

  bool is_mla() const { return mla.kv_lora_rank > 0; }
  // Whether layer `layer` has DeepSeek's mixture of experts instead of a dense MLP.
  bool moe_layer(int64_t layer) const {
    return moe.n_routed_experts > 0 && layer >= moe.first_k_dense_replace &&
           layer % std::max<int64_t>(1, moe.moe_layer_freq) == 0;
  }
  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }

  // Number of stored parameters: embeddings, every layer's projections, norms and biases, the final
  // norm, and lm_head unless tied (a tied head is not counted twice). An MLA model counts its
  // low-rank projections, routers, routed and shared experts; the multi-token-prediction layers
  // (num_nextn_predict_layers) are not counted, as a server loads them only to speculate.
  int64_t parameter_count() const;
  // Of which the layers' projections (Llama: q, k, v, o, gate, up, down; MLA: q_a, q_b or q,
  // kv_a, kv_b, o and every expert's gate, up, down): what an fp8 checkpoint stores in one byte
  // each.
  int64_t projection_parameter_count() const;
  // Of those, what model.quantization quantizes at load: all but MLA's kv_b (whose per-head
  // parts become the absorbed matrices, kept as loaded).
  int64_t quantized_parameter_count() const;
  // Bytes of weights at `dtype_bytes` per parameter (4 for f32, 2 for bf16).
  int64_t weight_bytes(int64_t dtype_bytes) const { return parameter_count() * dtype_bytes; }
  // Checks the shape is usable (positive sizes, heads divisible by KV heads, ...). Messages name
  // the field, prefixed with `source` (a file name or preset name).
  Status validate(const std::string& source) const;
};

// config.model_type, or the one transformers gives the architecture when config.json had none
// (a preset): "llama", "mistral", "qwen2", "qwen3", "deepseek_v3"; "" for another.
std::string model_type_of(const ModelConfig& config);

// Reads config.json text (`source` names it in messages): every field above, defaulting as
// the transformers config classes do (num_key_value_heads = num_attention_heads, head_dim =
// hidden_size / num_attention_heads (Qwen3: 128), attention_bias = true for Qwen2 only, ...). A
// multimodal wrapper's "text_config" is read instead of the top level when that has no
// num_hidden_layers. Fails only on text that is not a JSON object, a field of the wrong type
// ("<source>: <field>: expected an integer, found ...") or a rope_scaling of type yarn or llama3
// without the keys it needs; other absent fields are recorded in `missing`, not refused.
Result<ModelConfig> read_hf_config(std::string_view text, const std::string& source);
// The same from a file; NotFound naming it when it cannot be read.
Result<ModelConfig> read_hf_config_file(const std::string& path);

// Whether the executor can run `config`: a supported architecture (supported_architectures()),
// the required fields present, hidden_act silu, rope_scaling absent, "default", "llama3" (the
// Llama family) or "yarn" (both families) -- "linear", "dynamic" and the rest are refused by name
// --, no mlp_bias, no Qwen2 / Qwen3 sliding window, DeepSeek-V3's MLA and router fields usable,
// and validate(). Errors name `source` and the field.
Status check_runnable(const ModelConfig& config, const std::string& source);

// read_hf_config_file, then check_runnable.
Result<ModelConfig> parse_hf_config(const std::string& path);

// The architectures parse_hf_config accepts.
const std::vector<std::string>& supported_architectures();

}  // namespace kvrt::model
