// The shape of a Llama-family decoder (Llama, Mistral, Qwen2): what the executor, the capacity
// planner and the weight loader agree on. Parsed from a Hugging Face config.json or built by a
// synthetic preset (weights.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/util/status.h"

namespace kvrt::model {

struct ModelConfig {
  std::string architecture;  // e.g. "LlamaForCausalLM"
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
  // Sliding-window attention span in tokens, 0 = full attention. Mistral v0.1 sets 4096; the
  // executor decides whether it can honour it (it only matters beyond that many tokens).
  int64_t sliding_window = 0;
  int32_t bos_token_id = -1;           // -1: none
  std::vector<int32_t> eos_token_ids;  // any of them ends a sequence; may be empty

  int64_t q_dim() const { return num_attention_heads * head_dim; }
  int64_t kv_dim() const { return num_key_value_heads * head_dim; }

  // Number of stored parameters: embeddings, every layer's projections, norms and biases, the final
  // norm, and lm_head unless tied (a tied head is not counted twice).
  int64_t parameter_count() const;
  // Of which the layers' projections (q, k, v, o, gate, up, down): what an fp8 checkpoint
  // stores in one byte each.
  int64_t projection_parameter_count() const;
  // Bytes of weights at `dtype_bytes` per parameter (4 for f32, 2 for bf16).
  int64_t weight_bytes(int64_t dtype_bytes) const { return parameter_count() * dtype_bytes; }
  // Checks the shape is usable (positive sizes, heads divisible by KV heads, ...). Messages name
  // the field, prefixed with `source` (a file name or preset name).
  Status validate(const std::string& source) const;
};

// Parses a Hugging Face config.json. Supported architectures: LlamaForCausalLM,
// Qwen2ForCausalLM, MistralForCausalLM. The shape fields (hidden_size, intermediate_size,
// num_hidden_layers, num_attention_heads, vocab_size) are required; the others default as the
// transformers config classes do (num_key_value_heads = num_attention_heads, head_dim =
// hidden_size / num_attention_heads, attention_bias = true for Qwen2 only, ...). Errors name the
// file and the field: an unsupported architecture, a missing or mistyped field, a hidden_act
// other than silu, a non-null rope_scaling (not implemented yet), mlp_bias = true.
Result<ModelConfig> parse_hf_config(const std::string& path);

// The architectures parse_hf_config accepts.
const std::vector<std::string>& supported_architectures();

}  // namespace kvrt::model
